"""The paper configs start as they are written (`launch/tpu_vm.sh run configs/aepo_qwen3_14b.py`): their
own tokenizer kind ("hf", the checkpoint's tokenizer.json), data layout (a local JSONL), reward and tools,
with only the `/path/to/...` placeholders pointed at small local files. No other test built their
environment, and `tokenizer.kind="hf"` was refused there. One launch runs a whole RL step of the 14B
config on this CPU with the model cut to the tiny preset."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from aepo_jax.agent.loop_config import agent_stops
from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS, ANSWER_CLOSE, TOOL_CLOSE_TAGS
from aepo_jax.experiment import environment_from
from aepo_jax.tokenizers import HFTokenizer
from configs import aepo_qwen2_5_7b, aepo_qwen3_14b
from tests.child_process import child_env
from tests.hf_tokenizer_files import write_hf_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOWNS = ["Brindle", "Ostwick", "Marrow", "Kelden", "Pyrford", "Tallis", "Wenlow", "Ashby"]


@pytest.fixture(scope="module")
def local_files(tmp_path_factory):
    """(tokenizer.json, training rows JSONL, search corpus JSONL) in a temporary folder."""
    root = tmp_path_factory.mktemp("paper_inputs")
    corpus = [{"id": t.lower(), "contents": f"{t}\n{t} is a town of {1000 + 37 * i} people founded in {1800 + 7 * i}."}
              for i, t in enumerate(TOWNS)]
    rows = [{"id": f"q{i}", "question": f"When was {t} founded?", "answer": str(1800 + 7 * (i % len(TOWNS)))}
            for i, t in enumerate(TOWNS * 2)]
    for name, records in (("corpus.jsonl", corpus), ("train.jsonl", rows)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    texts = [c["contents"] for c in corpus] + [r["question"] for r in rows] + [
        "<think>search first</think> <search>Brindle founded</search> <result>1800</result> <answer>1800</answer>"]
    tokenizer_json = write_hf_tokenizer(root / "hf", texts * 20)
    return tokenizer_json, root / "train.jsonl", root / "corpus.jsonl"


@pytest.mark.parametrize("module", [aepo_qwen3_14b, aepo_qwen2_5_7b], ids=lambda m: m.__name__.split(".")[-1])
def test_paper_config_builds_its_environment_from_local_files(module, local_files, tmp_path):
    tokenizer_json, rows, corpus = local_files
    cfg = module.get_config()
    assert (cfg.tokenizer.kind, cfg.tokenizer.path.startswith("/path/to/")) == ("hf", True)
    assert cfg.tokenizer.agent_tags == "text"  # the checkpoint's own pieces, as its SFT data wrote them
    # The deep-search config names a search corpus to serve; the reasoning config has no search tool.
    searches = module is aepo_qwen3_14b
    assert cfg.data.corpus_path.startswith("/path/to/") == searches
    cfg.tokenizer.path, cfg.data.path = str(tokenizer_json), str(rows)
    if searches:
        cfg.data.corpus_path = str(corpus)
    env = environment_from(cfg, str(tmp_path))
    try:
        assert isinstance(env.tokenizer, HFTokenizer)
        # The tags stay the tokenizer's own text (no new ids), and a segment stops on their text.
        assert env.tokenizer.vocab_size == env.tokenizer.base_vocab_size
        assert all(env.tokenizer.token_to_id(tag) is None for tag in AGENT_SPECIAL_TOKENS)
        assert agent_stops(env.tokenizer) == ([], [*TOOL_CLOSE_TAGS, ANSWER_CLOSE])
        by_id = {example["id"]: example for example in env.examples}
        assert len(by_id) == 16 and by_id["q9"]["answers"] == ["1807"]
        prompt = env.tokenizer.decode(env.encode_prompt(by_id["q9"]))
        assert prompt.count("When was Ostwick founded?") == 1
        # The system prompt offers the tools the run has, and no other.
        assert sorted(env.tools.tools) == (["browse", "python", "search"] if searches else ["python"])
        assert [f"<{tag}>" in prompt for tag in ("search", "python", "browse")] == [searches, True, searches]
        if searches:
            assert "Brindle" in env.tools.tools["search"].run("Brindle founded").text  # the server answers
            assert "1000 people" in env.tools.tools["browse"].run("brindle people").text  # a document by id
            assert env.tools.tools["browse"].run("http://example.com x").status != "ok"  # no URLs by default
    finally:
        env.close()


def test_the_system_prompt_refuses_a_tool_it_has_no_line_for():
    from aepo_jax.agent.prompts import DEFAULT_SYSTEM_PROMPT, system_prompt_for_tools

    assert system_prompt_for_tools(["search", "python", "browse"]) == DEFAULT_SYSTEM_PROMPT
    with pytest.raises(ValueError, match=r"no system prompt line for tools \['calculator'\]"):
        system_prompt_for_tools(["python", "calculator"])


@pytest.mark.parametrize(("kind", "path", "message"), [
    ("hf", "", r"tokenizer.kind='hf' needs tokenizer.path"),
    ("hf", "tokenizer.model", r"needs a tokenizer.json or its folder, got tokenizer.path='tokenizer.model'"),
    ("tiktoken", "x", r"tokenizer.kind 'tiktoken' is not supported; use '', 'hf' or 'gguf'"),
    ("hf", "tags:plain", r"tokenizer.agent_tags must be 'special' or 'text', got 'plain'"),
    ("", "", r"tokenizer.agent_tags='text' needs a tokenizer file"),
])
def test_a_tokenizer_setting_that_cannot_work_is_refused_by_name(kind, path, message, local_files, tmp_path):
    cfg = aepo_qwen3_14b.get_config()
    if path.startswith("tags:"):
        cfg.tokenizer.agent_tags, path = path[len("tags:"):], str(local_files[0])
    cfg.tokenizer.kind, cfg.tokenizer.path = kind, path
    cfg.data.path = str(local_files[1])
    with pytest.raises(ValueError, match=message):
        environment_from(cfg, str(tmp_path))


@pytest.mark.slow  # a launch: starts the tools and compiles the sampler and the train step
def test_the_14b_config_launches_one_rl_step_with_only_the_model_cut_down(local_files, tmp_path):
    tokenizer_json, rows, corpus = local_files
    overrides = {
        "tokenizer.path": tokenizer_json, "data.path": rows, "data.corpus_path": corpus,
        # This CPU: the tiny preset from scratch, no TPU kernel, every device in `data`.
        "model.preset": "tiny", "model.checkpoint_dir": "", "model.attention": "dense",
        "model.compute_dtype": "float32", "mesh.shape": '{"data": -1, "fsdp": 1, "tensor": 1}',
        # One small step.
        "total_steps": 1, "data.prompts_per_step": 2, "rollout.k": 2, "rollout.initial_rollouts": 1,
        "rollout.max_prompt_len": 512, "rollout.max_response_len": 16, "rollout.max_tool_calls": 1,
        "train.max_seq_len": 1024, "train.mini_batch_prompts": 2, "train.micro_batch_size": 2,
        "checkpoint.async_save": False, "log.progress_bar": False, "log.tensorboard": False,
    }
    args = [f"--config.{key}={value}" for key, value in overrides.items()]
    out = subprocess.run([sys.executable, "-m", "launch.train", "--config", "configs/aepo_qwen3_14b.py",
                          "--workdir", str(tmp_path / "run"), *args], cwd=REPO, env=child_env(),
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1] and records[0]["trajectories"] == 4.0
    assert os.listdir(tmp_path / "run" / "checkpoints") == ["1"]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["tokenizer"]["kind"], saved["tokenizer"]["agent_tags"], saved["reward"]["name"],
            saved["rollout"]["strategy"]) == ("hf", "text", "qa_f1", "aepo")


@pytest.mark.parametrize("room", [False, True], ids=["no_room", "room"])
def test_a_checkpoint_without_rows_for_the_agent_tags_is_refused_before_its_weights_are_read(room, local_files,
                                                                                               tmp_path):
    """With `agent_tags="special"` a checkpoint is paired with its tokenizer.json plus the agent tags, whose ids follow
    the tokenizer's own. Qwen's embedding has rows to spare past its tokenizer; a checkpoint without
    them would give the last tag ids no embedding (NaN). One row short: refused by name; 32 rows
    to spare: the model loads with the checkpoint's rows."""
    from flax import nnx

    from aepo_jax.experiment import model_from
    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.models.hf_export import save_hf_checkpoint

    tokenizer_json, rows_path, corpus = local_files
    cfg = aepo_qwen3_14b.get_config()
    cfg.tokenizer.path, cfg.data.path, cfg.data.corpus_path = str(tokenizer_json), str(rows_path), str(corpus)
    cfg.tokenizer.agent_tags = "special"  # a checkpoint trained with the tags as tokens of their own
    env = environment_from(cfg, str(tmp_path / "env"))
    env.close()
    ids = env.tokenizer.vocab_size
    assert env.tokenizer.encode(AGENT_SPECIAL_TOKENS[-1]) == [ids - 1]  # the tags come last
    rows = ids + 32 if room else ids - 1
    save_hf_checkpoint(Decoder(get_preset("tiny", vocab_size=rows), rngs=nnx.Rngs(0)), tmp_path / "hf")
    cfg.model.preset, cfg.model.checkpoint_dir, cfg.model.attention = "tiny", str(tmp_path / "hf"), "dense"
    cfg.model.vocab_size = rows  # the configured model is the checkpoint's (`require_checkpoint_matches`)
    if not room:
        with pytest.raises(ValueError, match=rf"tokenizer has {ids} ids .* has {rows} vocabulary rows"):
            model_from(cfg, env)
    else:
        _, params = model_from(cfg, env)
        assert params["embed"].value.shape[0] == rows


def test_a_mesh_whose_tensor_axis_cannot_split_the_checkpoints_heads_is_refused_before_its_weights_are_read(
        local_files, tmp_path):
    """Qwen2.5-7B has 28 query and 4 key-value heads: over tensor=8 its attention weights were left
    unsplit, silently. The checkpoint here is its config.json alone, so reading any weight would fail
    differently; the refusal names the head counts and the tensor size. tensor=4 passes the check."""
    from aepo_jax.experiment import model_from
    from aepo_jax.experiment_sft import sft_config_from, sft_trainer_from
    from aepo_jax.models import get_preset
    from aepo_jax.models.config import config_to_hf
    from aepo_jax.parallel import make_mesh

    tokenizer_json, rows_path, _ = local_files
    cfg = aepo_qwen2_5_7b.get_config()
    cfg.tokenizer.path, cfg.data.path = str(tokenizer_json), str(rows_path)
    env = environment_from(cfg, str(tmp_path / "env"))
    env.close()
    checkpoint = tmp_path / "qwen2_5_7b"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(config_to_hf(get_preset("qwen2_5_7b"))))
    cfg.model.checkpoint_dir = str(checkpoint)
    with pytest.raises(ValueError, match=r"model.checkpoint_dir=.* has 28 query heads and 4 key-value heads: the "
                                         r"mesh's tensor size 8 does not divide its 28 query heads.* one of \[1, 2, 4\]"):
        model_from(cfg, env, make_mesh({"data": 1, "fsdp": 1, "tensor": 8}))
    with pytest.raises(FileNotFoundError, match="no weights in"):  # past the check: the first weight read
        model_from(cfg, env, make_mesh({"data": 1, "fsdp": 2, "tensor": 4}))
    # SFT reads the model before its trainer builds the config's mesh: it checks that mesh first.
    cfg.mesh.shape = {"data": 1, "fsdp": 1, "tensor": 8}
    with pytest.raises(ValueError, match=r"has 28 query heads and 4 key-value heads: the mesh's tensor size 8"):
        sft_trainer_from(sft_config_from(cfg), env, str(tmp_path / "sft"), records=[])


def test_a_checkpoint_of_another_model_than_the_configured_one_is_refused_by_field(tmp_path):
    """Training would load the checkpoint's own architecture while shardings, the sampler and evaluation
    follow the configured preset: each differing field is named."""
    from flax import nnx

    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.models.hf_export import save_hf_checkpoint
    from aepo_jax.training.build import model_config_from

    save_hf_checkpoint(Decoder(get_preset("tiny", n_layers=3, mlp_dim=96), rngs=nnx.Rngs(0)), tmp_path / "hf")
    cfg = aepo_qwen3_14b.get_config()
    cfg.model.checkpoint_dir = str(tmp_path / "hf")
    with pytest.raises(ValueError, match=r"model.preset='qwen3_14b' does not describe .*vocab_size: 151936 vs 512.*"
                                         r"n_layers: 40 vs 3"):
        model_config_from(cfg)
    cfg.model.preset, cfg.model.n_layers, cfg.model.mlp_dim = "tiny", 3, 96
    assert model_config_from(cfg).n_layers == 3  # the same model: accepted


def test_preset_checkpoint_takes_an_architecture_no_preset_has_from_config_json(tmp_path):
    """A tied Llama with llama3 rope scaling of factor 32 (Llama-3.2's shape): no preset and no model.* key
    can state its tie or its scaling, so `require_checkpoint_matches` refused every config for it."""
    from flax import nnx

    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.models.hf_checkpoint import checkpoint_config
    from aepo_jax.models.hf_export import save_hf_checkpoint
    from aepo_jax.training.build import model_config_from

    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    saved = get_preset("tiny", tie_embeddings=True, rope_scaling=scaling, rope_theta=5e5)
    save_hf_checkpoint(Decoder(saved, rngs=nnx.Rngs(0)), tmp_path / "hf")
    cfg = aepo_qwen3_14b.get_config()
    cfg.model.checkpoint_dir = str(tmp_path / "hf")
    cfg.model.preset = "checkpoint"
    got = model_config_from(cfg)
    assert got == checkpoint_config(tmp_path / "hf").replace(
        param_dtype="float32", remat=cfg.model.remat, dtype=cfg.model.compute_dtype, attention=cfg.model.attention)
    assert (got.tie_embeddings, got.rope_scaling["factor"], got.n_layers) == (True, 32.0, saved.n_layers)
    cfg.model.n_layers = saved.n_layers + 1  # a size override that contradicts the checkpoint is still refused
    with pytest.raises(ValueError, match=r"model.preset='checkpoint' does not describe .*n_layers"):
        model_config_from(cfg)
    cfg.model.n_layers, cfg.model.checkpoint_dir = None, ""
    with pytest.raises(ValueError, match=r"model.preset='checkpoint' takes the architecture .* set model.checkpoint_dir"):
        model_config_from(cfg)
