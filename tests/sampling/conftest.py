"""A real tiny decoder shared by the sampler tests (random weights, float32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aepo_jax.models import Decoder, get_preset


@pytest.fixture(scope="session")
def tiny_model():
    """(model, graphdef, state) of the `tiny` preset, initialised from seed 0."""
    model = Decoder(get_preset("tiny"), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    return model, graphdef, state


def random_prompts(seed: int, lengths, vocab: int = 512) -> list[list[int]]:
    """Prompts of the given lengths with ids in [2, vocab) (0 and 1 are kept for pad and EOS)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, size=n).tolist() for n in lengths]


@pytest.fixture(scope="session")
def greedy_sampler(tiny_model):
    """One greedy Sampler shared by tests so that equal shape buckets reuse compiled programs."""
    from aepo_jax.sampling import Sampler, SamplingParams

    _, graphdef, state = tiny_model
    return Sampler(graphdef, state, params=SamplingParams(greedy=True))


REFERENCE_LENGTH = 64  # sequences are right-padded to this; causal attention ignores the padding


@pytest.fixture(scope="session")
def full_logits(tiny_model):
    """ids -> float32[len(ids), V]: the plain causal forward (no cache), one compiled shape."""
    _, graphdef, state = tiny_model
    forward = jax.jit(lambda params, ids: nnx.merge(graphdef, params)(ids))

    def run(ids):
        if len(ids) > REFERENCE_LENGTH:
            raise ValueError(f"reference forward takes at most {REFERENCE_LENGTH} tokens, got {len(ids)}")
        padded = np.zeros((1, REFERENCE_LENGTH), np.int32)
        padded[0, : len(ids)] = ids
        return np.asarray(forward(state, jnp.asarray(padded))[0, : len(ids)])

    return run
