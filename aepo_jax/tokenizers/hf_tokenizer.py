"""Hugging Face `tokenizer.json` tokenizers (through the `tokenizers` package).

Also the base of `GGUFTokenizer`, which builds the same kind of
`tokenizers.Tokenizer` from GGUF metadata instead of a JSON file.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.tokenizers.chat import (
    CHATML,
    ChatFormat,
    Message,
    chat_format_from_template,
    template_differences,
)

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")  # must be single tokens for the ChatML default
# Tried in order when tokenizer_config.json names no EOS token.
_EOS_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>", "<eos>")


class HFTokenizer:
    """A `tokenizers.Tokenizer` behind the `Tokenizer` protocol.

    Args:
      backend: the `tokenizers.Tokenizer`.
      eos_token / bos_token / pad_token: special token strings (must be in the
        vocabulary); pad defaults to EOS, BOS may be None.
      chat_format: how chats render; defaults to ChatML where its markers are tokens of the vocabulary
        (else None: rendering a chat is refused).
      add_agent_tokens: register the agent tags (spec section 4) as special
        tokens; see `add_special_tokens` for what that does to the vocabulary.
      extra_eos_ids: more ids that end a generation besides EOS (`generation_config.json`'s
        `eos_token_id`, e.g. Qwen's `<|endoftext|>` beside `<|im_end|>`); `eos_ids` holds all.
    """

    def __init__(
        self,
        backend,
        *,
        eos_token: str,
        bos_token: str | None = None,
        pad_token: str | None = None,
        chat_format: ChatFormat | None = None,
        add_agent_tokens: bool = False,
        extra_eos_ids: Sequence[int] = (),
    ):
        self.backend = backend
        self.base_vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.eos_id: int = self._require_id(eos_token, "EOS")
        self.bos_id: int | None = None if bos_token is None else self._require_id(bos_token, "BOS")
        self.pad_id: int = self.eos_id if pad_token is None else self._require_id(pad_token, "pad")
        vocab = self.base_vocab_size
        bad = [int(i) for i in extra_eos_ids if not 0 <= int(i) < vocab]
        if bad:
            raise ValueError(f"end-of-generation ids {bad} are outside the tokenizer's {vocab} ids")
        self.eos_ids: list[int] = list(dict.fromkeys([self.eos_id, *(int(i) for i in extra_eos_ids)]))
        self.chat_format = chat_format or self._chatml_default()
        self.num_added = 0
        if add_agent_tokens:
            self.add_special_tokens(AGENT_SPECIAL_TOKENS)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike,
        *,
        chat_format: ChatFormat | None = None,
        add_agent_tokens: bool = False,
    ) -> HFTokenizer:
        """Load `tokenizer.json` (a file, or a directory holding it).

        Special tokens come from `tokenizer_config.json` beside it when present, the chat
        template from the files transformers reads (`_chat_template`); the template is used
        if it is a simple ChatML, Llama-3 or Llama-3.1 one (see `chat_format_from_template`), else
        ChatML. The ids that end a
        generation are EOS plus `generation_config.json`'s `eos_token_id` beside it, as
        transformers' `generate` stops on them.
        """
        import tokenizers

        path = Path(path)
        json_path = path / "tokenizer.json" if path.is_dir() else path
        if not json_path.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {json_path}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(json_path))
        except Exception as err:  # the Rust side raises plain Exception
            raise ValueError(f"cannot read {json_path} as a Hugging Face tokenizer: {err}") from err
        config_path = json_path.parent / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        vocab = backend.get_vocab(with_added_tokens=True)
        eos = _token_string(config.get("eos_token")) or next((t for t in _EOS_CANDIDATES if t in vocab), None)
        if eos is None:
            raise ValueError(f"{json_path}: no EOS token (set eos_token in tokenizer_config.json)")
        template = _chat_template(json_path.parent, config)
        return cls(
            backend,
            eos_token=eos,
            bos_token=_token_string(config.get("bos_token")),
            pad_token=_token_string(config.get("pad_token")),
            chat_format=chat_format or _known_format(template, json_path.parent),
            add_agent_tokens=add_agent_tokens,
            extra_eos_ids=_generation_eos_ids(json_path.parent / "generation_config.json"),
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids, including added special tokens."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def _chatml_default(self) -> ChatFormat | None:
        """ChatML, the default chat format, only where its markers are single tokens of this vocabulary;
        None otherwise (a tokenizer without a chat, e.g. a base model's), and rendering a chat is refused.

        Without them ChatML would spell made-up role markers as ordinary pieces the model never
        learnt, and it could never write the `<|im_end|>` that ends its turn."""
        missing = [t for t in CHATML_MARKERS if self.backend.token_to_id(t) is None]
        return None if missing else CHATML

    def _require_id(self, token: str, what: str) -> int:
        idx = self.backend.token_to_id(token)
        if idx is None:
            raise ValueError(f"{what} token {token!r} is not in the vocabulary")
        return idx

    def add_special_tokens(self, tokens: Sequence[str]) -> int:
        """Register `tokens` as special tokens, each then encoded as one id.

        Tokens missing from the vocabulary get new ids appended after it, so
        `vocab_size` grows: a model's embedding (and untied output) must then be
        resized to `vocab_size` rows. Returns how many ids were appended; the
        running total is `num_added`.
        """
        from tokenizers import AddedToken

        before = self.vocab_size
        self.backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
        added = self.vocab_size - before
        self.num_added += added
        return added

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special-token strings map to their ids), no BOS/EOS added."""
        try:
            return self.backend.encode(text, add_special_tokens=False).ids
        except TypeError:
            # The Rust backend rejects strings that are not valid Unicode scalar values.
            if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
                raise ValueError("text contains lone surrogate code points, which no tokenizer can encode") from None
            raise

    def text_control_tokens(self) -> tuple[str, ...]:
        """The strings `encode` turns into an added token's id wherever they stand in a text (control tokens
        such as `<|im_end|>` and SmolLM2's `<filename>`, added ones such as Qwen's `<tool_response>`): what a
        tool's result must not hold as such (`tools.base.inert_tags`)."""
        return tuple(sorted({token.content for token in self.backend.get_added_tokens_decoder().values()}))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens included as their strings."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_bytes(self) -> list[bytes]:
        """The bytes each id stands for (added tokens as their UTF-8 strings).

        Exact for byte-level BPE vocabularies (Qwen, Llama-3, GPT-2 style), including ids holding part
        of a multi-byte character; other vocabularies fall back to each id decoded alone, where such a
        piece reads as U+FFFD."""
        exact = _byte_level_token_bytes(self.backend, self.vocab_size)
        if exact is not None:
            return exact
        texts = self.backend.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=False)
        return [t.encode("utf-8") for t in texts]

    def token_to_id(self, piece: str) -> int | None:
        return self.backend.token_to_id(piece)

    def id_to_token(self, idx: int) -> str | None:
        return self.backend.id_to_token(int(idx))

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat rendered with `self.chat_format`."""
        if self.chat_format is None:
            raise ValueError(
                "this tokenizer has no chat template that aepo_jax reads (a ChatML or Llama-3 one), and the "
                f"ChatML default's markers {list(CHATML_MARKERS)} are not tokens of its vocabulary: a base "
                "checkpoint without tokenizer_config.json's chat_template, or a tokenizer.json copied without "
                "that file. Copy the instruct model's tokenizer_config.json beside it, or pass chat_format=")
        return self.chat_format.render_ids(messages, add_generation_prompt, self.encode, self.eos_id)


def byte_level_alphabet() -> dict[int, str]:
    """The byte-level BPE alphabet: byte value -> the printable character a vocabulary writes it as.

    Printable Latin-1 bytes stand for themselves; the other 68 take the characters from U+0100 on,
    in byte order (the GPT-2 convention every byte-level BPE vocabulary follows)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = iter(range(0x100, 0x200))
    return {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}


def _byte_level_token_bytes(backend, vocab_size: int) -> list[bytes] | None:
    """Each id's bytes read from a byte-level BPE vocabulary, or None when `backend` is not one."""
    from tokenizers import decoders

    if not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    to_byte = {char: b for b, char in byte_level_alphabet().items()}
    added = {i: token.content.encode("utf-8") for i, token in backend.get_added_tokens_decoder().items()}
    pieces: list[bytes | None] = [None] * vocab_size
    for piece, i in backend.get_vocab(with_added_tokens=False).items():
        if i in added or not 0 <= i < vocab_size:
            continue
        if any(char not in to_byte for char in piece):
            return None  # not written in the byte alphabet after all
        pieces[i] = bytes(to_byte[char] for char in piece)
    pieces = [added.get(i, piece) for i, piece in enumerate(pieces)]
    if any(piece is None for piece in pieces):
        return None  # ids with no entry: leave them to the decoder
    return pieces


def _chat_template(folder: Path, config: dict) -> str | None:
    """The default chat template beside tokenizer.json, where transformers finds it: `chat_template.jinja`
    (what transformers 5.x `save_pretrained` writes; as in transformers, it wins over the config's),
    else tokenizer_config.json's "chat_template", else a processor's legacy `chat_template.json`
    ({"chat_template": ...}). A list of named templates gives its "default" one."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    legacy = folder / "chat_template.json"
    if template is None and legacy.is_file():
        try:
            template = json.loads(legacy.read_text(encoding="utf-8")).get("chat_template")
        except (json.JSONDecodeError, AttributeError) as err:
            raise ValueError(f"{legacy}: expected a JSON object with a \"chat_template\" entry ({err})") from err
    if isinstance(template, list):  # named templates: take the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template


def _generation_eos_ids(path: Path) -> list[int]:
    """`eos_token_id` of a `generation_config.json` (an int or a list), or [] without the file."""
    if not path.is_file():
        return []
    value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{path}: eos_token_id must be an int or a list of ints, got {value!r}")
    return values


def _token_string(value) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _known_format(template: str | None, where: object) -> ChatFormat | None:
    """The `ChatFormat` of a template of a shape this library reads; None (the ChatML default) otherwise.

    Warns when there is a template it cannot read, or one it reads but renders otherwise than transformers
    does (`template_differences`, e.g. a Llama-3.2 template's date of today), since prompts then differ
    from the model's."""
    known = chat_format_from_template(template)
    if known is None and template:
        warnings.warn(f"{where}: the chat template is neither ChatML- nor Llama-3-shaped; chats are rendered "
                      "as ChatML where its markers are tokens of the vocabulary (else refused), which may not be "
                      "what the model was trained on (pass chat_format= to choose)", stacklevel=3)
    for difference in template_differences(template):
        warnings.warn(f"{where}: chats are rendered otherwise than by the chat template in transformers: "
                      f"{difference} (pass chat_format= to choose)", stacklevel=3)
    return known
