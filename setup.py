"""Package metadata for aepo-jax: AEPO and its baselines for agentic RL in JAX."""

from setuptools import find_packages, setup

RUNTIME = [
    "jax>=0.10.2",
    "jaxlib>=0.10.2",
    "flax>=0.12.8",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8",
    "sentencepiece>=0.2.0",
    "tensorflow-datasets>=4.9.10",
    "array-record>=0.8",
    "ml-collections>=1.1.0",
    "requests>=2.31",
    "numpy>=1.26",
    "safetensors>=0.4",
    "tqdm>=4.66",
    "sympy>=1.12",
    "matplotlib>=3.8",
]

EXTRAS = {
    # Parity tests compare against PyTorch `transformers`; torch 2.13.0 is the
    # CPU build that lies on the project's machines.
    "test": [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.5",  # `make test` runs the suite on 2 workers, one test file per worker at a time
        "hypothesis>=6.100",
        "torch==2.13.0",
        "transformers>=4.51",
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
        "ruff>=0.5",
        "tensorboardX>=2.6",
    ],
    "hf": ["tokenizers>=0.19", "gguf>=0.10", "jinja2>=3.1.6"],  # jinja2: the generation prompt of a chat template
    "server": ["bm25s>=0.2", "beautifulsoup4>=4.12"],
    "tensorboard": ["tensorboardX>=2.6"],  # log.tensorboard's writer (metrics.jsonl needs nothing)
}

setup(
    name="aepo-jax",
    version="0.1.0",
    description="Agentic Entropy-Balanced Policy Optimization (AEPO) and baselines in JAX/Flax",
    # configs: the experiment files import `configs.base`, wherever a launch runs from
    packages=find_packages(include=["aepo_jax", "aepo_jax.*", "launch", "launch.*", "configs"]),
    python_requires=">=3.11",  # typing.Self; the pinned jax needs 3.11
    install_requires=RUNTIME,
    extras_require=EXTRAS,
    include_package_data=True,
    package_data={"aepo_jax.data": ["demo/*.jsonl"]},
)
