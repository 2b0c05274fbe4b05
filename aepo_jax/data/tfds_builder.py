"""A tensorflow-datasets builder over local JSONL/parquet question files (no downloads).

Written as `array_record` and read with `as_data_source()`, the only tfds
path that works without TensorFlow (`tfds.load` / `as_dataset` need it).
The source files come from the builder config; the data directory from the
caller. A prepared dataset is self-describing on disk, so another process
reads it back with `load_prepared(path)` without the config.

    builder = prepare_local_dataset("gsm8k_demo", {"train": "demo/arithmetic.jsonl"}, data_dir)
    examples = load_prepared(builder.data_path, split="train")
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import tensorflow_datasets as tfds

from aepo_jax.data import records
from aepo_jax.data.records import (
    LAYOUTS,
    Example,
    decode_example,
    detect_layout,
    example_from_row,
    is_empty,
    iter_rows,
)
from aepo_jax.file_digests import file_digest


@dataclasses.dataclass(eq=False)
class LocalQaConfig(tfds.core.BuilderConfig):
    """Which local files make which split, in which layout.

    Attributes:
      splits: split name -> path of a JSONL or parquet file.
      layout: one of `records.LAYOUTS`.
      data_source: tag for rows without a `data_source` field (default: the config name).
    """

    splits: Mapping[str, str] = dataclasses.field(default_factory=dict)
    layout: str = "auto"
    data_source: str | None = None


class LocalQaDataset(tfds.core.GeneratorBasedBuilder):
    """Question/answers examples read from local files given by a `LocalQaConfig`."""

    # 1.1.0: examples in file order (1.0.0 datasets were stored shuffled; a new version prepares again).
    VERSION = tfds.core.Version("1.1.0")
    # tfds looks for a checksums file next to the builder's code through `code_path`, which
    # needs the `importlib_resources` backport on Python >= 3.9; nothing is downloaded here,
    # so there is no checksums file and no code path to find.
    code_path = None

    def __init__(self, *, config: LocalQaConfig, data_dir: str | Path, **kwargs):
        if not config.splits:
            raise ValueError(
                f"LocalQaConfig {config.name!r} has no splits (split name -> file path)"
            )
        if config.layout not in LAYOUTS:
            raise ValueError(
                f"unknown dataset layout {config.layout!r}; choose one of {LAYOUTS}"
            )
        for split, path in config.splits.items():
            if not Path(path).is_file():
                raise FileNotFoundError(
                    f"dataset file for split {split!r} not found: {path}"
                )
            if is_empty(path):  # tfds' own error ("No examples were yielded") names no file
                raise ValueError(f"dataset file for split {split!r} has no rows: {path}")
        super().__init__(
            config=config, data_dir=str(data_dir), file_format="array_record", **kwargs
        )

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Questions with gold answers from local files (aepo_jax.data).",
            # File order, not tfds' hashed-key order: `--max_questions N` reads the first N questions and
            # `data.shuffle=False` keeps the file's order.
            disable_shuffling=True,
            features=tfds.features.FeaturesDict(
                {
                    "id": tfds.features.Text(),
                    "question": tfds.features.Text(),
                    "answers": tfds.features.Sequence(tfds.features.Text()),
                    "data_source": tfds.features.Text(),
                }
            ),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing is downloaded
        return {
            split: self._generate_examples(split, Path(path))
            for split, path in self.builder_config.splits.items()
        }

    def _generate_examples(
        self, split: str, path: Path
    ) -> Iterator[tuple[str, Example]]:
        config = self.builder_config
        source = config.data_source or config.name
        detected: dict[str, list[int]] = {}  # auto layout -> its row count and first line
        for line_no, row in iter_rows(path):
            if config.layout == "auto":
                seen = detected.setdefault(detect_layout(row), [0, line_no])
                seen[0] += 1
            example = example_from_row(
                row,
                layout=config.layout,
                data_source=source,
                where=f"{path}:{line_no}",
                fallback_id=f"{source}-{split}-{line_no}",
            )
            yield f"{line_no:09d}", example
        if len(detected) > 1:
            _warn_mixed_layouts(path, detected)


def _warn_mixed_layouts(path: Path, detected: Mapping[str, list[int]]) -> None:
    """Say that layout "auto" read one file's rows as several layouts: a file of one dataset has one, and a
    GSM8K row that lost its `#### N` line reads as "arpo" with the whole solution as its gold answer."""
    counts = ", ".join(f"{layout}: {count} rows (first at line {first})"
                       for layout, (count, first) in sorted(detected.items(), key=lambda item: (-item[1][0], item[0])))
    warnings.warn(f"{path}: layout 'auto' read its rows as several layouts ({counts}); if the file is one "
                  "dataset, set its layout (data.layout) so that a row not fitting it is an error naming "
                  "its line", stacklevel=2)


def prepare_local_dataset(
    name: str,
    splits: Mapping[str, str | Path],
    data_dir: str | Path,
    *,
    layout: str = "auto",
    data_source: str | None = None,
) -> LocalQaDataset:
    """Build (or reuse) the array_record files of a local dataset and return its builder.

    Args:
      name: config name; the data lands in `data_dir/local_qa_dataset/<name>/<VERSION>`.
      splits: split name -> source file.
      data_dir: where tfds writes the prepared dataset.
      layout: row layout of the source files (`records.LAYOUTS`).
      data_source: tag for rows without their own (default `name`).
    """
    config = LocalQaConfig(
        name=name,
        version=LocalQaDataset.VERSION,
        splits={split: str(path) for split, path in splits.items()},
        layout=layout,
        data_source=data_source,
    )
    builder = LocalQaDataset(config=config, data_dir=data_dir)
    builder.download_and_prepare()
    return builder


def load_prepared(dataset_path: str | Path, split: str = "train") -> list[Example]:
    """Every example of one split of a prepared dataset directory, decoded to str (any process)."""
    dataset_path = Path(dataset_path)
    if not (dataset_path / "dataset_info.json").is_file():
        raise FileNotFoundError(
            f"no prepared tfds dataset at {dataset_path} (dataset_info.json missing)"
        )
    builder = tfds.builder_from_directory(str(dataset_path))
    sources = builder.as_data_source()
    if split not in sources:
        raise KeyError(
            f"split {split!r} not in {dataset_path}; splits: {sorted(sources)}"
        )
    source = sources[split]
    return [decode_example(source[i]) for i in range(len(source))]


def load_local_examples(
    path: str | Path,
    data_dir: str | Path,
    *,
    name: str | None = None,
    layout: str = "auto",
    data_source: str | None = None,
) -> list[Example]:
    """One-call path for configs: prepare a single-file dataset through tfds and read it back.

    The prepared copy is named by everything its rows depend on (`prepared_name`): an edited or replaced
    file, another layout or data source, or changed parsers prepare it again instead of silently reading
    rows parsed before.

    Args:
      path: JSONL or parquet file.
      data_dir: tfds data directory (prepared once per file contents, reused afterwards).
      name: config name (default: the file's stem).
      layout: row layout (`records.LAYOUTS`).
      data_source: tag for rows without their own (default: the name).
    """
    path = Path(path)
    base = name or path.stem
    source = data_source or base
    builder = prepare_local_dataset(
        prepared_name(path, base, layout=layout, data_source=source),
        {"train": path},
        data_dir,
        layout=layout,
        data_source=source,
    )
    return load_prepared(builder.data_path, "train")


def prepared_name(path: str | Path, base: str, *, layout: str, data_source: str) -> str:
    """`<base>_<layout>_<digest>`: the config name of a file's prepared copy.

    The digest covers the file's bytes, the data source and `records.PARSER_VERSION`, so a copy is
    reused only when it holds the rows this call would parse now.
    """
    identity = f"{file_digest(path, length=64)}\0{data_source}\0parser-v{records.PARSER_VERSION}"
    return f"{base}_{layout}_{hashlib.sha256(identity.encode('utf-8')).hexdigest()[:12]}"
