"""aepo-jax: Agentic Entropy-Balanced Policy Optimization and baselines in JAX."""

__version__ = "0.1.0"
