"""Jitted KV-cache sampling: prefill, generate (one while_loop), append, fork, concat (DESIGN.md, Sampler)."""

from aepo_jax.sampling.params import SamplingParams
from aepo_jax.sampling.sampler import Sampler
from aepo_jax.sampling.state import DecodeState, SampleOutput

__all__ = ["DecodeState", "SampleOutput", "Sampler", "SamplingParams"]
