"""Data: local dataset layouts, tfds builders, the prompt pipeline, demo sets and converters."""

from aepo_jax.data.pipeline import PromptPipeline
from aepo_jax.data.records import (
    LAYOUTS,
    DatasetFormatError,
    Example,
    decode_example,
    read_examples,
)
from aepo_jax.data.tfds_builder import (
    LocalQaConfig,
    LocalQaDataset,
    load_local_examples,
    load_prepared,
    prepare_local_dataset,
)

__all__ = [
    "LAYOUTS",
    "DatasetFormatError",
    "Example",
    "LocalQaConfig",
    "LocalQaDataset",
    "PromptPipeline",
    "decode_example",
    "load_local_examples",
    "load_prepared",
    "prepare_local_dataset",
    "read_examples",
]
