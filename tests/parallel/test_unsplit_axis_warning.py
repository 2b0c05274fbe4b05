"""A mesh that cannot split parameters as their logical axes say is reported, once per model.

`logical_to_spec` leaves a dimension unsplit when its mesh axes do not divide it (every result must be
valid for `device_put`); `state_shardings` says so in one `UnsplitAxisWarning` naming the dimensions,
the axes, the arrays and the fraction of the model's bytes left replicated.
"""

from __future__ import annotations

import warnings

import jax
import pytest
from flax import nnx

from aepo_jax.models import Decoder, get_preset
from aepo_jax.parallel import make_mesh, state_shardings
from aepo_jax.parallel.sharding import UnsplitAxisWarning


def tiny_state(vocab_size: int = 512):
    """The tiny model's parameters as ShapeDtypeStructs (d_model 64, mlp 128, 4 heads, 2 KV heads)."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(get_preset("tiny", vocab_size=vocab_size), rngs=nnx.Rngs(0))))[1]


def unsplit_warnings(state, mesh) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state_shardings(state, mesh)
    return [str(w.message) for w in caught if issubclass(w.category, UnsplitAxisWarning)]


def test_fsdp_that_does_not_divide_d_model_warns_once_naming_the_arrays_and_the_bytes():
    # 64 % 3: every weight with an `embed` axis stays whole on each fsdp device (no ZeRO-3 at all)
    [message] = unsplit_warnings(tiny_state(), make_mesh({"data": 2, "fsdp": 3}, jax.devices()[:6]))
    assert "'embed' dimension 64 is not divisible by fsdp=3 (8 arrays: embed [512, 64], " in message
    assert "cannot split 8 arrays" in message and "holding 99.7% of the state's" in message


def test_tensor_that_does_not_divide_the_vocabulary_warns_once_naming_the_embedding():
    [message] = unsplit_warnings(tiny_state(vocab_size=501), make_mesh({"data": 3, "tensor": 2}, jax.devices()[:6]))
    assert "'vocab' dimension 501 is not divisible by tensor=2 (1 array: embed [501, 64])" in message
    assert "holding 30.2% of the state's" in message


@pytest.mark.parametrize("shape", [{"data": 2, "fsdp": 2, "tensor": 2}, {"fsdp": 8}, {"data": -1}])
def test_a_mesh_that_divides_every_dimension_does_not_warn(shape):
    assert unsplit_warnings(tiny_state(), make_mesh(shape)) == []
