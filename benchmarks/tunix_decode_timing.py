"""Runs the tunix peer driver unchanged, then times tunix's decode loop alone in extra calls.

    <tunix venv>/bin/python benchmarks/tunix_decode_timing.py --driver ../shared/bench/tunix_sampler_bench.py \
        --batch 8 --new-tokens 64 ...   # every flag after --driver goes to the driver

Runs in the peer's venv, so it imports neither this project nor anything outside the standard
library and tunix's own dependencies. The driver's `main` runs first, as is: its end-to-end
figures (`tokens_per_s`, `call_s_mean`, ...) are its own timed calls, untouched (the only addition
is that tunix's `Sampler.__call__` records its last arguments, one attribute store per call). Then
`--iters` more calls of the same sampler with the same arguments run with its jitted prefill and
decode wrapped to wait for their results: `decode_s` is the wall time of the `lax.while_loop`
decode program alone (its start waits for the prefill), `prefill_s` the prefill's, and the rest
of each call (`init_sample_state`, tokenising, padding, device to host, detokenising) is
`host_s`. tunix's prefill samples the first token, so its decode loop runs new_tokens - 1 model
steps where ours runs new_tokens (ours feeds its last token too).

Prints the driver's JSON line (and with `--json OUT` writes it to OUT) with `decode` added: {"decode_s", "prefill_s", "host_s",
"decode_tokens_per_s"} (tokens = batch x new tokens, over the mean decode seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import statistics
import sys
import time


def load_driver(path: str):
    spec = importlib.util.spec_from_file_location("tunix_peer_driver", path)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    return driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", required=True, help="the peer's driver script (its main(argv) runs as is)")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the JSON line's object to OUT")
    ours, driver_argv = parser.parse_known_args(argv)
    driver = load_driver(ours.driver)
    driver_args = argparse.Namespace(iters=5, batch=8, new_tokens=64)
    for flag in ("iters", "batch", "new_tokens"):  # the three the decode-only figures need
        name = "--" + flag.replace("_", "-")
        if name in driver_argv:
            setattr(driver_args, flag, int(driver_argv[driver_argv.index(name) + 1]))

    import jax
    from tunix.generate import sampler as sampler_lib

    calls = []  # (sampler, args, kwargs) of every call, the last one is replayed below
    original_call = sampler_lib.Sampler.__call__

    def recording_call(self, *args, **kwargs):
        calls.append((self, args, kwargs))
        return original_call(self, *args, **kwargs)

    sampler_lib.Sampler.__call__ = recording_call
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = driver.main(driver_argv)
    if code:
        return code
    result = json.loads(printed.getvalue().strip().splitlines()[-1])
    sampler_lib.Sampler.__call__ = original_call
    sampler, args, kwargs = calls[-1]

    seconds = {"prefill": 0.0, "decode": 0.0}

    def timed(name, program):
        def run(*a, **k):
            start = time.perf_counter()
            out = jax.block_until_ready(program(*a, **k))
            seconds[name] += time.perf_counter() - start
            return out
        return run

    prefill, decode = sampler._compiled_prefill_fn, sampler._compiled_decode_fn
    sampler._compiled_prefill_fn, sampler._compiled_decode_fn = timed("prefill", prefill), timed("decode", decode)
    prefill_s, decode_s, host_s = [], [], []
    for _ in range(driver_args.iters):
        seconds.update(prefill=0.0, decode=0.0)
        start = time.perf_counter()
        sampler(*args, **kwargs)
        total = time.perf_counter() - start
        prefill_s.append(seconds["prefill"])
        decode_s.append(seconds["decode"])
        host_s.append(total - seconds["prefill"] - seconds["decode"])
    sampler._compiled_prefill_fn, sampler._compiled_decode_fn = prefill, decode
    result["decode"] = {"decode_s": decode_s, "prefill_s": prefill_s, "host_s": host_s,
                        "decode_tokens_per_s": driver_args.batch * driver_args.new_tokens / statistics.mean(decode_s)}
    print(json.dumps(result))
    if ours.json:  # this runs in the peer's venv: no benchmarks.bench_json there
        with open(ours.json, "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
