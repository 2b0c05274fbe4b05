"""One process of `test_multihost_batches.py`: an `RLTrainer` on a mesh spanning two processes, each
holding one group of a two-group step, scores its sequences ("tree" and "flat") and computes their
advantages through the trainer's own methods; the process then compares them with what one process
holding the whole step computes (the flat scorer of `train_step`, `compute_advantages` on all rows).

Run as `python -m tests.training.multihost_batches_worker WORKDIR` with `JAX_COORDINATOR_ADDRESS`,
`JAX_NUM_PROCESSES=2`, `JAX_PROCESS_ID` and 2 fake CPU devices per process.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from aepo_jax.parallel.distributed import maybe_initialize_distributed

PROMPT_LEN = 6
# Process 0's group: two 16-token rows sharing the prompt, 26 trie nodes, so with `train.row_len = 32`
# its packed rows are 32 slots long; process 1's: two 8-token rows, 10 nodes, rows of 16 slots (= T).
RESPONSE_LENS = (10, 2)
T = 16
ROW_LEN = 32
REWARDS = ((1.0, 0.0), (0.75, 0.25))


def group_sequences(process: int) -> list[dict[str, np.ndarray]]:
    """The two trajectories of `process`'s group (the same arrays on every process)."""
    rng = np.random.default_rng(process)
    prompt = rng.integers(1, 64, PROMPT_LEN)
    out = []
    for _ in range(2):
        tokens = np.concatenate([prompt, rng.integers(1, 64, RESPONSE_LENS[process])]).astype(np.int32)
        mask = (np.arange(len(tokens)) >= PROMPT_LEN).astype(np.float32)
        # Entropies spread differently on each process: per-process statistics would differ from the batch's.
        entropy = (rng.uniform(0.0, 1.0 + 3.0 * process, len(tokens)) + 2.0 * process).astype(np.float32) * mask
        out.append({"tokens": tokens, "mask": mask, "logp_old": np.zeros(len(tokens), np.float32),
                    "entropy": entropy})
    return out


def step_sequences(processes: list[int]):
    """`RolloutSequences` of the groups of `processes` (one group each), in that order."""
    from aepo_jax.training.rollout_batch import RolloutSequences

    sequences = [s for p in processes for s in group_sequences(p)]
    return RolloutSequences(
        sequences=sequences, group_ids=np.repeat(np.arange(len(processes)), 2).astype(np.int32),
        rewards=np.asarray([r for p in processes for r in REWARDS[p]], np.float32),
        response_lengths=np.asarray([len(s["tokens"]) - PROMPT_LEN for s in sequences], np.int32),
        step_starts=[[PROMPT_LEN] for _ in sequences], length=T)


def main(workdir: str) -> None:
    index, count = maybe_initialize_distributed("auto")
    assert count == 2, count
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from aepo_jax.objectives import compute_advantages, get_preset, kl_penalty
    from aepo_jax.training.batch import pad_sequences
    from aepo_jax.training.packing import build_train_batch
    from aepo_jax.training.rl_trainer import RLTrainer
    from aepo_jax.training.train_step import sequence_logprobs
    from configs.aepo_tiny import get_config

    def config(pack: str):
        cfg = get_config()
        cfg.model.vocab_size = 64
        cfg.model.n_layers = 1
        cfg.data.prompts_per_step = 2  # global: one group per process
        cfg.rollout.k = 2
        cfg.rollout.max_prompt_len = PROMPT_LEN
        cfg.rollout.max_response_len = T - PROMPT_LEN
        cfg.train.mini_batch_prompts = 2
        cfg.train.micro_batch_size = 1  # one row per forward: the flat scorer's rows cannot follow the mesh
        cfg.train.max_seq_len = T
        cfg.train.length_bucket = T
        cfg.train.pack = pack
        cfg.train.row_len = ROW_LEN
        cfg.mesh.shape = {"data": -1, "fsdp": 2, "tensor": 1}  # 2 x 2 over the 4 devices of both processes
        cfg.log.progress_bar = False
        cfg.log.tensorboard = False
        return cfg

    def unused_rollout(*args):
        raise AssertionError("this worker rolls nothing out")

    trainers = {}
    for pack in ("tree", "flat"):
        trainers[pack] = RLTrainer(config(pack), f"{workdir}/{pack}", rollout_fn=unused_rollout, pipeline=iter(()),
                                   encode_prompt=lambda ex: ex, reward_fn=lambda ex, traj: 0.0,
                                   process_index=index)
    tree = trainers["tree"]

    # The reference: one process's flat forward over this process's sequences with the whole parameters.
    local_params = jax.tree.map(jnp.asarray, multihost_utils.process_allgather(tree.state.params, tiled=True))
    mine = step_sequences([index])
    flat = pad_sequences(mine.sequences, max_len=T, length_multiple=T)
    ref_logp, ref_entropy = (np.asarray(x) for x in sequence_logprobs(
        tree.run.graphdef, local_params, jax.tree.map(jnp.asarray, flat)))
    valid = np.arange(T)[None, :] < np.asarray([len(s["tokens"]) for s in mine.sequences])[:, None]
    score_error = {}
    for pack, trainer in trainers.items():
        logp, entropy = trainer._score(trainer.state.params, mine, [np.arange(len(mine))])
        score_error[pack] = float(max(np.abs((logp - ref_logp) * valid).max(),
                                      np.abs((entropy - ref_entropy) * valid).max()))

    # Advantages of this process's group through the trainer, against all groups on one process.
    whole = step_sequences([0, 1])
    rows = slice(2 * index, 2 * index + 2)
    advantage_error = {}
    padded = whole.padded()
    logp_ref = -0.5 * padded["entropy"]  # [4, T] reference log-probs for REINFORCE++'s KL in the reward
    for name in ("aepo", "reinforce_pp", "reinforce_pp_baseline"):
        tree.preset = preset = get_preset(name)
        part = step_sequences([index])
        tree._advantages(part, logp_ref[rows])
        ours = part.padded()["advantages"]
        kl = None
        if preset.kl_in_reward:
            kl = kl_penalty(jnp.asarray(padded["logp_old"]), jnp.asarray(logp_ref), preset.kl_estimator)
            kl = kl * jnp.asarray(padded["mask"])
        expected, _ = compute_advantages(
            preset, whole.rewards, whole.group_ids, padded["mask"], entropy=padded["entropy"],
            response_lengths=whole.response_lengths, max_response_len=T - PROMPT_LEN, kl=kl)
        advantage_error[name] = float(np.abs(ours - np.asarray(expected)[rows]).max())
    for trainer in trainers.values():
        trainer.close()
    local, _ = build_train_batch(mine.sequences, "tree", group_ids=mine.group_ids, length=T, row_len=ROW_LEN,
                                 data_parallel=tree.local_data_parallel)
    print("RESULT " + json.dumps({"process": index, "score_error": score_error,
                                  "advantage_error": advantage_error,
                                  "local_row_len": int(np.shape(local["packed_ids"])[2])}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
