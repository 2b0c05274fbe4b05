"""The tunix peer of `benchmarks/sampler_bench.py`: its driver's command line, one run of it in the
peer's own venv, and the round-by-round comparison with our sampler (see sampler_bench's docstring).

Both sides run in the same environment: the peer's subprocess gets ours, less PYTHONPATH (which
points at this project, not the peer's venv), so XLA_FLAGS a user set apply to both sides alike;
the JSON records them (`xla_flags`). With `--peer-decode on` (the default) the driver runs under
`benchmarks/tunix_decode_timing.py`, which leaves the driver's end-to-end calls as they are and
then times tunix's decode loop alone in extra calls, for a decode-only ratio beside the
end-to-end one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

DECODE_TIMING_SCRIPT = Path(__file__).resolve().parent / "tunix_decode_timing.py"


def peer_max_prompt_length(prompt_len: int) -> int:
    """The `--max-prompt-length` the tunix driver gets: the prompt's tokens plus tunix's BOS.

    tunix 0.1.7's `Sampler.__call__` prepends BOS to each prompt and left-pads
    every prompt to `max_prompt_length`, unless that is shorter than the
    longest prompt, in which case it pads to the next power of two of the
    longest prompt instead; it then refuses (ValueError) a call whose
    `max_prompt_length + max_generation_steps` exceeds the cache, which the
    driver sizes `--max-prompt-length + --new-tokens`. The driver's words are
    one token each, so `prompt_len + 1` is the smallest value tunix accepts
    as given: no padding slot, and a cache of exactly prompt + BOS + new
    tokens (the driver's default of 32 pads a 16-token prompt to 32 and crashes
    on prompts of 32 tokens or more).
    """
    return prompt_len + 1


def peer_command(args: argparse.Namespace) -> list[str]:
    """The peer driver's command line for this benchmark's shapes (under the decode timer with `peer_decode`)."""
    driver = ([str(DECODE_TIMING_SCRIPT), "--driver", args.peer_script] if getattr(args, "peer_decode", "off") == "on"
              else [args.peer_script])
    return [args.peer_python, *driver, "--batch", str(args.batch), "--new-tokens", str(args.new_tokens),
            "--prompt-len", str(args.prompt_len), "--max-prompt-length", str(peer_max_prompt_length(args.prompt_len)),
            "--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads),
            "--kv-heads", str(args.kv_heads), "--vocab", str(args.vocab), "--dtype", args.dtype,
            "--mode", args.mode, "--iters", str(args.iters)]


def run_peer(args: argparse.Namespace) -> dict:
    """One run of the peer's driver on this benchmark's shapes (its own compile, warm-up and timing)."""
    if not args.peer_python:
        raise SystemExit("--peer tunix needs --peer-python (a scratch venv with google-tunix installed)")
    if not Path(args.peer_script).is_file():
        raise SystemExit(f"--peer-script {args.peer_script} does not exist")
    command = peer_command(args)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # XLA_FLAGS as ours: same for both sides
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the peer failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    if peer.get("max_prompt_length") != peer_max_prompt_length(args.prompt_len):
        raise RuntimeError(f"the peer ran with max_prompt_length {peer.get('max_prompt_length')}, "
                           f"not {peer_max_prompt_length(args.prompt_len)}")
    if peer.get("generated_tokens_per_call") != args.batch * args.new_tokens:
        raise RuntimeError(f"the peer generated {peer.get('generated_tokens_per_call')} tokens per call, not "
                           f"batch x new tokens = {args.batch * args.new_tokens}: its tokens/s would not compare")
    return peer


def peer_comparison(name: str, ours: list[dict], peers: list[dict], prompt_len: int, new_tokens: int) -> dict:
    """Ours against the peer, round by round (`ours[i]` and `peers[i]` ran back to back): each side's
    tokens/s per round is the mean of that round's calls, and the speedup is the ratio of the two sides'
    means over the same rounds. Where every peer run also timed its decode loop alone
    (`tunix_decode_timing.py`), the same for decode-only tokens/s (ours: the generate call after
    the prefill; the peer's: its decode program after its prefill)."""
    ours_tps = [r["tokens_per_s_mean"] for r in ours]
    peer_tps = [r["tokens_per_s"] for r in peers]
    max_prompt = peer_max_prompt_length(prompt_len)
    out = {"name": name, "runs": peers, "tokens_per_s": peer_tps, "ours_tokens_per_s": ours_tps,
           "max_prompt_length": max_prompt, "cache_size": max_prompt + new_tokens,
           "speedup_of_means": statistics.mean(ours_tps) / statistics.mean(peer_tps),
           "speedup_per_round": [o / q for o, q in zip(ours_tps, peer_tps, strict=True)]}
    if all("decode" in p for p in peers):
        ours_decode = [r["decode_tokens_per_s_mean"] for r in ours]
        peer_decode = [p["decode"]["decode_tokens_per_s"] for p in peers]
        out |= {"decode_tokens_per_s": peer_decode, "ours_decode_tokens_per_s": ours_decode,
                "decode_speedup_of_means": statistics.mean(ours_decode) / statistics.mean(peer_decode),
                "decode_speedup_per_round": [o / q for o, q in zip(ours_decode, peer_decode, strict=True)]}
    return out
