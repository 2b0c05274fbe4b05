"""The composition root is the only place the rollout pieces are built from a config (DESIGN.md).

Outside tests/ and benchmarks/, `LoopConfig(`, `RolloutConfig(` and `Sampler(`
are each constructed in exactly one module (a default inside the class's own
module aside), so the wiring cannot drift apart in parallel copies again.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("aepo_jax", "launch", "configs", "notebooks")
# class -> (the module allowed to construct it, the class's own module)
EXPECTED = {
    "LoopConfig": ("aepo_jax/experiment.py", "aepo_jax/agent/loop.py"),
    "RolloutConfig": ("aepo_jax/experiment.py", "aepo_jax/rollout/strategies.py"),
    "Sampler": ("aepo_jax/rollout/agent_sampler.py", "aepo_jax/sampling/sampler.py"),
}


def constructing_modules(name: str) -> set[str]:
    pattern = re.compile(r"(?<![\w.])" + name + r"\(")
    found = set()
    for top in SOURCES:
        for path in (REPO / top).rglob("*"):
            if path.suffix not in (".py", ".ipynb") or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8")
            lines = [line for line in text.splitlines() if not line.lstrip().startswith(("#", "class "))]
            if any(pattern.search(line) for line in lines):
                found.add(path.relative_to(REPO).as_posix())
    return found


def test_each_rollout_piece_is_constructed_in_exactly_one_module():
    for name, (builder, own_module) in EXPECTED.items():
        others = constructing_modules(name) - {own_module}
        assert others == {builder}, f"{name}( is constructed in {sorted(others)}; only {builder} should build it"


def test_the_search_finds_constructions():
    assert "aepo_jax/experiment.py" in constructing_modules("LoopConfig")
    assert "aepo_jax/evaluation/driver.py" in constructing_modules("EvalConfig")


def test_the_trainers_mesh_reaches_the_rollout_sampler(tmp_path):
    """`rl_trainer_from` builds one mesh: the train state lives on it, and the rollout sampler's KV cache on
    its devices: on the run's mesh itself with `rollout.sampler_weights="run_mesh"`, and by default (the mesh
    splits the weights over fsdp) on a data x tensor mesh of weight replicas over the same devices."""
    from types import SimpleNamespace

    import jax

    from aepo_jax.experiment import rl_trainer_from
    from aepo_jax.tokenizers import train_sentencepiece
    from aepo_jax.training.build import init_model, model_config_from
    from configs.aepo_tiny import get_config

    if jax.device_count() < 8:
        return  # the 8 fake CPU devices of tests/conftest.py are not there
    cfg = get_config()
    cfg.mesh.shape = {"data": 2, "fsdp": 2, "tensor": 2}
    cfg.log.progress_bar = False
    cfg.log.tensorboard = False
    tokenizer = train_sentencepiece(["a town of people", "print(6 * 7)", "search the answer"] * 20, vocab_size=300)
    cfg.model.vocab_size = tokenizer.vocab_size
    graphdef, params = init_model(cfg, model_config_from(cfg).replace(n_layers=1))
    env = SimpleNamespace(tokenizer=tokenizer, tools=None, examples=[{"question": "q", "answers": ["a"]}] * 4,
                          encode_prompt=lambda ex: tokenizer.encode(ex["question"]), reward_fn=lambda ex, t: 0.0)
    for weights in ("run_mesh", "auto"):
        cfg.rollout.sampler_weights = weights
        trainer = rl_trainer_from(cfg, env, str(tmp_path / weights), graphdef, params)
        try:
            sampler, run_mesh = trainer.rollout_fn.sampler, trainer.run.mesh
            # the cache layout itself is checked in tests/sampling/test_sampler_mesh.py
            if weights == "run_mesh":
                assert sampler.mesh is run_mesh and sampler.layout.mesh is run_mesh
                assert sampler.layout.batch_devices == 4
            else:
                assert dict(sampler.mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2}
                assert set(sampler.mesh.devices.flat) == set(run_mesh.devices.flat)
                assert sampler.layout.mesh is sampler.mesh and sampler.layout.batch_devices == 4
        finally:
            trainer.close()


def test_truncated_training_sampling_warns_that_the_ratio_is_not_corrected():
    """logp_old is the full-vocabulary log-prob (spec §1); with top-p < 1 the tokens come from another
    distribution, which nothing in the objective corrects: said once, where the rollout decoding is built."""
    import warnings

    import pytest

    from aepo_jax.experiment import sampling_params_from
    from configs.aepo_tiny import get_config

    cfg = get_config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not sampling_params_from(cfg).truncates  # the paper's top-p 1.0: silent
    cfg.rollout.top_p = 0.9
    with pytest.warns(UserWarning, match=r"rollout.top_p=0.9 .*importance ratio"):
        assert sampling_params_from(cfg).top_p == 0.9


def test_a_vocab_size_the_config_sets_must_be_the_tokenizers():
    """`--config.model.vocab_size=1024` was printed as resolved, then replaced by the tokenizer's size."""
    from types import SimpleNamespace

    import pytest

    from aepo_jax.experiment import fit_model_to_tokenizer
    from configs.aepo_tiny import get_config

    env = SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=512), pretrained=None)
    cfg = get_config()
    fit_model_to_tokenizer(cfg, env)
    assert cfg.model.vocab_size == 512  # unset: sized to the tokenizer
    fit_model_to_tokenizer(cfg, env)  # set to the tokenizer's: kept
    for wrong in (1024, 256):
        cfg.model.vocab_size = wrong
        with pytest.raises(ValueError, match=rf"model.vocab_size={wrong} but the tokenizer has 512 ids"):
            fit_model_to_tokenizer(cfg, env)
