"""A scripted `Generator` and a byte tokenizer: drive the agent loop without a model.

The branching and budget logic of the rollout strategies is host-side
bookkeeping; testing it against chosen token and entropy streams (instead of
a random-weight model's noise) is what makes its invariants checkable. The
scripted generator honours the same contract as the real Sampler: per-row
budgets, stop reasons, append/fork/concat over rows, and forward-token counters.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS


class ByteTokenizer:
    """Ids 0 pad, 1 eos, then one id per agent tag, then one id per UTF-8 byte."""

    pad_id = 0
    eos_id = 1
    bos_id = None

    def __init__(self) -> None:
        self.specials = list(AGENT_SPECIAL_TOKENS)
        self.byte_offset = 2 + len(self.specials)
        self.vocab_size = self.byte_offset + 256

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for j, tag in enumerate(self.specials):
                if text.startswith(tag, i):
                    ids.append(2 + j)
                    i += len(tag)
                    break
            else:
                ids.extend(self.byte_offset + b for b in text[i].encode("utf-8"))
                i += 1
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out, pending = [], bytearray()
        for t in ids:
            t = int(t)
            if t >= self.byte_offset:
                pending.append(t - self.byte_offset)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            if 2 <= t < self.byte_offset:
                out.append(self.specials[t - 2])
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_to_id(self, piece: str) -> int | None:
        return 2 + self.specials.index(piece) if piece in self.specials else None


class ChatByteTokenizer(ByteTokenizer):
    """`ByteTokenizer` with a chat format (`tokenizers.chat.ChatFormat`), as `render_prompt` and
    `response_text` read it: tests of chat templates without a vocabulary file."""

    def __init__(self, chat_format):
        super().__init__()
        self.chat_format = chat_format

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return self.chat_format.render_ids(messages, add_generation_prompt, self.encode, self.eos_id)


@dataclass
class ScriptedSegment:
    """What a row generates next: token ids, their entropies (and log-probs), and how it ends."""

    tokens: list[int]
    entropy: list[float]
    end: str  # "stop" (the last token closes a stop sequence) or "eos" (the last token is EOS)
    logp: list[float] | None = None


# script(row_ids, rng) -> the row's next segment; row_ids = prompt + everything so far.
Script = Callable[[list[int], np.random.Generator], ScriptedSegment]


@dataclass
class _Row:
    ids: list[int]
    queue: list[tuple[int, float, float]] = field(default_factory=list)  # (token, logp, entropy)
    end: str = "stop"


@dataclass
class ScriptedState:
    rows: list[_Row]
    cursor: int = 0  # lockstep write cursor, as in the real sampler's cache (only grows; concat aligns)

    @property
    def num_rows(self) -> int:
        return len(self.rows)


@dataclass
class ScriptedOutput:
    tokens: np.ndarray
    logp: np.ndarray
    entropy: np.ndarray
    num_tokens: np.ndarray
    stop_reason: list[str]


class ScriptedGenerator:
    """Plays `script` for every row; `fork` copies rows (a pending segment included)."""

    def __init__(self, script: Script, seed: int = 0, max_cache_len: int | None = None) -> None:
        self.script = script
        self.max_cache_len = max_cache_len  # when set, generate/append refuse to run past it, like the Sampler
        self.rng = np.random.default_rng(seed)
        self._counters = {"prefill_tokens": 0, "append_tokens": 0, "decode_tokens": 0}

    @property
    def counters(self) -> dict[str, int]:
        return dict(self._counters)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> ScriptedState:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prefill needs non-empty prompts")
        self._counters["prefill_tokens"] += sum(len(p) for p in prompts)
        return ScriptedState([_Row(list(map(int, p))) for p in prompts], max(len(p) for p in prompts))

    def _check_room(self, state: ScriptedState, needed: int) -> None:
        if self.max_cache_len is not None and state.cursor + needed > self.max_cache_len:
            raise ValueError(f"cache cursor {state.cursor} + {needed} exceeds max_cache_len {self.max_cache_len}")

    def generate(self, state: ScriptedState, max_new_tokens, rng=None) -> tuple[ScriptedState, ScriptedOutput]:
        budgets = [max_new_tokens] * state.num_rows if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(budgets) != state.num_rows:
            raise ValueError(f"generate got {len(budgets)} budgets for {state.num_rows} rows")
        self._check_room(state, max([0, *budgets]))
        rows = copy.deepcopy(state.rows)
        width = max([0, *budgets])
        tokens = np.zeros((len(rows), width), np.int32)
        logp = np.zeros((len(rows), width), np.float32)
        entropy = np.zeros((len(rows), width), np.float32)
        num, reasons = np.zeros((len(rows),), np.int32), []
        for i, (row, budget) in enumerate(zip(rows, budgets, strict=True)):
            if not row.queue and budget > 0:
                seg = self.script(list(row.ids), self.rng)
                lp = seg.logp if seg.logp is not None else [-1.0] * len(seg.tokens)
                if not (len(seg.tokens) == len(seg.entropy) == len(lp)) or not seg.tokens:
                    raise ValueError("a scripted segment needs equally many tokens, entropies and log-probs (>= 1)")
                row.queue = list(zip(seg.tokens, lp, seg.entropy, strict=True))
                row.end = seg.end
            n = min(budget, len(row.queue))
            for j, (t, lp_t, h_t) in enumerate(row.queue[:n]):
                tokens[i, j], logp[i, j], entropy[i, j] = t, lp_t, h_t
            row.ids.extend(t for t, _, _ in row.queue[:n])
            row.queue = row.queue[n:]
            num[i] = n
            reasons.append("length" if row.queue or n == 0 else row.end)
        self._counters["decode_tokens"] += int(num.sum())
        return ScriptedState(rows, state.cursor + int(num.max(initial=0))), ScriptedOutput(
            tokens, logp, entropy, num, reasons)

    def append(self, state: ScriptedState, tokens: Sequence[Sequence[int]]) -> ScriptedState:
        if len(tokens) != state.num_rows:
            raise ValueError(f"append got {len(tokens)} token lists for {state.num_rows} rows")
        longest = max([0, *(len(t) for t in tokens)])
        self._check_room(state, longest)
        rows = copy.deepcopy(state.rows)
        for row, ids in zip(rows, tokens, strict=True):
            row.ids.extend(int(t) for t in ids)
        self._counters["append_tokens"] += sum(len(t) for t in tokens)
        return ScriptedState(rows, state.cursor + longest)

    def fork(self, state: ScriptedState, rows: Sequence[int]) -> ScriptedState:
        if not rows:
            raise ValueError("fork needs at least one row")
        return ScriptedState([copy.deepcopy(state.rows[r]) for r in rows], state.cursor)

    def concat(self, states: Sequence[ScriptedState]) -> ScriptedState:
        return ScriptedState([copy.deepcopy(r) for s in states for r in s.rows], max(s.cursor for s in states))

    def place(self, state: ScriptedState, dst_rows: Sequence[int], source: ScriptedState,
              src_rows: Sequence[int]) -> ScriptedState:
        """Row dst_rows[i] becomes a copy of source row src_rows[i]; the shared cursor aligns to the larger."""
        if len(dst_rows) != len(src_rows) or len(set(dst_rows)) != len(dst_rows):
            raise ValueError(f"place needs distinct destination rows, one per source row: {dst_rows}, {src_rows}")
        rows = copy.deepcopy(state.rows)
        for d, s in zip(dst_rows, src_rows, strict=True):
            rows[d] = copy.deepcopy(source.rows[s])
        return ScriptedState(rows, max(state.cursor, source.cursor))

    @staticmethod
    def row_ids(state: ScriptedState, row: int) -> list[int]:
        """Everything row `row` holds (prompt, generated and appended ids), for checks."""
        return list(state.rows[row].ids)


def tool_use_script(
    tokenizer: ByteTokenizer,
    tool_probability: float = 0.7,
    max_calls: int = 4,
    entropy: Callable[[np.random.Generator], float] | None = None,
    tools: Sequence[str] = ("search", "python"),
) -> Script:
    """A script whose rows think, call a tool with `tool_probability` (at most `max_calls` times), then answer.

    Every token of a segment gets the same entropy, drawn per segment from
    `entropy(rng)` (default U(0, 2)), so a segment's entropy is known exactly.
    """
    result_id = tokenizer.token_to_id("<result>")

    def script(ids: list[int], rng: np.random.Generator) -> ScriptedSegment:
        calls = ids.count(result_id)
        h = float(entropy(rng)) if entropy is not None else float(rng.uniform(0.0, 2.0))
        think = "<think>" + "r" * int(rng.integers(1, 6)) + "</think>"
        if calls < max_calls and rng.uniform() < tool_probability:
            tag = tools[int(rng.integers(len(tools)))]
            text = f"{think}<{tag}>q{calls}</{tag}>"
        else:
            text = think + "<answer>\\boxed{" + str(int(rng.integers(10))) + "}</answer>"
        tokens = tokenizer.encode(text)
        return ScriptedSegment(tokens, [h] * len(tokens), "stop")

    return script
