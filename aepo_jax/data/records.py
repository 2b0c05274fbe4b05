"""Rows of the dataset layouts users have, turned into our example dicts.

An example is `{"id": str, "question": str, "answers": list[str],
"data_source": str}` (docs/interfaces.md). Layouts:

- `arpo`: the released ARPO/AEPO training files. The question is `question`,
  `problem` or `prompt` (a string, or a chat message list as exported from
  verl parquet files: the last user message is used, its content a string or
  OpenAI-style text parts `[{"type": "text", "text": ...}]`); the gold answer(s) are
  `answer`, `answers`, `golden_answers` or `reward_model.ground_truth`
  (a string, a list, or `{"target": ...}`; a number is written as a response
  would, 72.0 as "72", and a bool is refused); `data_source` tags the source.
- `gsm8k`: `question`, `answer` whose final line is `#### N` (the last `####` line).
- `math`: `problem`, `solution` with the answer in the last `\\boxed{}`
  (or an explicit `answer` field; a null one, as parquet writes, counts as absent).
- `multihop`: `question`, `answer`, optional `aliases` (more gold answers).
- `auto`: pick one of the above from the keys of each row.

Files are JSONL (one object per line, also what a parquet export writes) or
`.parquet` (read with pyarrow if installed). Errors name the file and line.

`PARSER_VERSION` is bumped whenever a change here changes the examples a file
gives: prepared tfds copies are keyed on it (`tfds_builder.load_local_examples`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

Example = dict[str, Any]
LAYOUTS = ("auto", "arpo", "gsm8k", "math", "multihop")
# 2: chat content parts joined (not their repr), the last `####` line of GSM8K, a null MATH `answer` absent.
# 3: numeric gold answers as a response writes them (72.0 -> "72", not "72.0"); bools refused inside lists too.
# 4: a chat prompt without a user message and text with a lone surrogate refused (another role's text was the
#    question; tfds failed naming no line).
PARSER_VERSION = 4
# Joins the text parts of one chat message, as vLLM's OpenAI server flattens them for string-content templates.
_TEXT_PART_SEPARATOR = "\n"


class DatasetFormatError(ValueError):
    """A row that does not fit its layout; the message names the file and line."""


def decode_text(value: Any) -> str:
    """Text from tfds (bytes) or from JSON (str): the one place where bytes become str."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalar
        return decode_text(value.item())
    return str(value)


def decode_example(raw: Mapping[str, Any]) -> Example:
    """An example as read back from tfds (bytes, numpy arrays) in our plain-Python form."""
    return {
        "id": decode_text(raw["id"]),
        "question": decode_text(raw["question"]),
        "answers": [decode_text(a) for a in raw["answers"]],
        "data_source": decode_text(raw["data_source"]),
    }


def iter_rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number from 1, row dict) for each row of a JSONL or parquet file; blank lines skipped."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; pass one JSONL or parquet file")
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(
                f"reading {path} needs pyarrow; or export it to JSONL"
            ) from exc
        for index, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield index, row
        return
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            line = _decode_line(raw, f"{path}:{line_no}")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetFormatError(
                    f"{path}:{line_no}: not valid JSON ({exc.msg})"
                ) from exc
            if not isinstance(row, dict):
                raise DatasetFormatError(
                    f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}"
                )
            yield line_no, row


def _decode_line(raw: bytes, where: str) -> str:
    """One JSONL line as text; a byte that is not UTF-8 is an error naming the line (not a bare codec error)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(
            f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
            f"re-encode the file as UTF-8"
        ) from exc


def is_empty(path: str | Path) -> bool:
    """Whether a JSONL/parquet file has no rows (parquet: from its footer, without reading the table)."""
    path = Path(path)
    if path.suffix == ".parquet" and path.is_file():
        try:
            import pyarrow.parquet as pq
        except ImportError:
            pass  # iter_rows says what to install
        else:
            return pq.ParquetFile(path).metadata.num_rows == 0
    return next(iter_rows(path), None) is None


def detect_layout(row: Mapping[str, Any]) -> str:
    """Guess the layout of one row from its keys (a null field, as parquet writes, counts as absent)."""
    if "problem" in row and "solution" in row and row.get("answer") is None:
        return "math"
    if isinstance(row.get("answer"), str) and "####" in row["answer"]:
        return "gsm8k"
    if "aliases" in row:
        return "multihop"
    return "arpo"


def _prompt_text(prompt: Any) -> str:
    """The question of a `prompt` field: a string, or the last user message of a chat."""
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(m, Mapping) for m in prompt)
    ):
        users = [m for m in prompt if m.get("role") == "user"]
        if not users:  # another role's text (a system prompt) was taken for the question
            roles = [m.get("role") for m in prompt]
            raise ValueError(f"the chat prompt has no user message (its roles: {roles})")
        return _message_text(users[-1].get("content"))
    raise TypeError(
        f"prompt must be a string or a list of chat messages, got {type(prompt).__name__}"
    )


def _message_text(content: Any) -> str:
    """A chat message's text: a string, or its `text` parts in order (OpenAI/verl content parts).

    Parts are joined with a newline, as vLLM's OpenAI server flattens them; any other part (an image,
    audio, ...) is refused: a text-only policy would silently train on the question without it.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(p, Mapping) for p in content):
        raise TypeError(
            f"chat message content must be a string or a list of content parts, got {content!r:.80}"
        )
    for part in content:
        if part.get("type") != "text":
            raise ValueError(
                f"chat message has a content part of type {part.get('type')!r}; only 'text' parts are supported"
            )
        if not isinstance(part.get("text"), str):
            raise TypeError(f"chat message text part has no string 'text': {dict(part)!r:.80}")
    return _TEXT_PART_SEPARATOR.join(part["text"] for part in content)


def _answer_list(value: Any) -> list[str]:
    """Gold answers of a field: a string or number, a non-empty list of them, or `{"target": ...}` of either."""
    if isinstance(value, Mapping) and "target" in value:
        value = value["target"]
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or not all(isinstance(v, (str, int, float)) for v in values):
        raise TypeError(
            f"answer must be a string, a number or a non-empty list of them, got {value!r:.80}"
        )
    return _non_blank([_answer_text(v) for v in values])


def _answer_text(value: str | float) -> str:
    """One gold answer as text a response can match: an integral float as an integer (72.0 -> "72": "72.0"
    is matched by no answer "72"), another float as its repr. A bool is refused: whether True means "True",
    "yes" or "1" is the data's to say, and `str` would silently pick "True"."""
    if isinstance(value, bool):
        raise TypeError(f"a gold answer is a bool ({value!r}); write the answer a response should give as a string")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a gold answer is the float {value!r}, which no answer can match (a missing value?)")
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _non_blank(answers: list[str]) -> list[str]:
    """`answers`, refused when one is blank: a blank gold answer normalises to "", which an empty or
    all-article answer (`\\boxed{}`, `\\boxed{The}`) then matches with full reward."""
    if any(not a.strip() for a in answers):
        raise ValueError(f"a gold answer is blank: {answers!r:.80}")
    return answers


def _first(row: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """The first of `keys` with a value; a null one (parquet's missing value) counts as absent."""
    for key in keys:
        value = row.get(key)
        if value is not None:
            return value
    nulls = [key for key in keys if key in row]
    null_note = f"; {nulls} present but null" if nulls else ""
    raise KeyError(
        f"none of the fields {list(keys)} has a value{null_note} (row has {sorted(row)})"
    )


def _arpo(row: Mapping[str, Any]) -> tuple[str, list[str]]:
    question = _prompt_text(_first(row, ("question", "problem", "prompt")))
    reward_model = row.get("reward_model")
    nested = (
        {"ground_truth": reward_model["ground_truth"]}
        if isinstance(reward_model, Mapping) and "ground_truth" in reward_model
        else {}
    )
    answers = _answer_list(
        _first(
            {**nested, **row}, ("answers", "golden_answers", "answer", "ground_truth")
        )
    )
    return question, answers


def _gsm8k(row: Mapping[str, Any]) -> tuple[str, list[str]]:
    solution = str(_first(row, ("answer",)))
    return str(_first(row, ("question",))), [_gsm8k_final(solution)]


def _gsm8k_final(solution: str) -> str:
    """The number after `####` on the last line that has one (an earlier `####` is working, not the answer)."""
    marked = [line for line in solution.splitlines() if "####" in line]
    final = marked[-1].rsplit("####", 1)[1].replace(",", "").strip() if marked else ""
    if not final:
        raise ValueError("GSM8K-style answer has no '#### N' final line")
    return final


def _math(row: Mapping[str, Any]) -> tuple[str, list[str]]:
    from aepo_jax.rewards.answer_rewards import last_boxed

    problem = str(_first(row, ("problem", "question")))
    if row.get("answer") is not None:
        return problem, _answer_list(row["answer"])
    boxed = last_boxed(str(_first(row, ("solution",))))
    if boxed is None:
        raise ValueError("MATH-style solution has no \\boxed{} answer")
    return problem, _non_blank([boxed.strip()])


def _multihop(row: Mapping[str, Any]) -> tuple[str, list[str]]:
    answers = _answer_list(_first(row, ("answer", "answers")))
    aliases = _answer_list(row["aliases"]) if row.get("aliases") else []
    answers += [alias for alias in aliases if alias not in answers]
    return str(_first(row, ("question",))), answers


_PARSERS = {"arpo": _arpo, "gsm8k": _gsm8k, "math": _math, "multihop": _multihop}


def _require_encodable(text: str, where: str) -> None:
    """Refuse text that is not valid Unicode: a lone surrogate (`"\\ud800"`, half of an escaped emoji) that
    JSON spells and `json.loads` returns, but no UTF-8 writer (tfds' prepared copy, a tokenizer) can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DatasetFormatError(
            f"{where}: the text holds a lone surrogate code point (U+{ord(text[exc.start]):04X} at character "
            f"{exc.start + 1} of {text[:60]!r}), half of an escaped emoji pair; repair the row"
        ) from exc


def example_from_row(
    row: Mapping[str, Any],
    *,
    layout: str,
    data_source: str,
    where: str,
    fallback_id: str | None = None,
) -> Example:
    """Turn one row into an example; `where` ("file:line") goes into any error message.

    Args:
      row: the parsed JSON object.
      layout: one of `LAYOUTS`.
      data_source: tag used when the row has no `data_source` field.
      where: location for error messages.
      fallback_id: id for rows without `id`/`idx`/`extra_info.index` (default `where`).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown dataset layout {layout!r}; choose one of {LAYOUTS}")
    chosen = detect_layout(row) if layout == "auto" else layout
    try:
        question, answers = _PARSERS[chosen](row)
    except (KeyError, TypeError, ValueError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise DatasetFormatError(
            f"{where}: row does not fit the {chosen!r} layout: {message}"
        ) from exc
    if not question.strip():
        raise DatasetFormatError(f"{where}: empty question")
    for text in (question, *answers):
        _require_encodable(text, where)
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    row_id = row.get("id", row.get("idx", extra.get("index")))
    return {
        "id": str(row_id) if row_id is not None else (fallback_id or where),
        "question": question,
        "answers": answers,
        "data_source": str(row.get("data_source") or data_source),
    }


def read_examples(
    path: str | Path, *, layout: str = "auto", data_source: str | None = None
) -> list[Example]:
    """Every example of a JSONL/parquet file (data source defaults to the file's stem)."""
    path = Path(path)
    source = data_source or path.stem
    return [
        example_from_row(
            row,
            layout=layout,
            data_source=source,
            where=f"{path}:{line_no}",
            fallback_id=f"{source}-{line_no}",
        )
        for line_no, row in iter_rows(path)
    ]
