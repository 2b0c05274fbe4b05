"""The Qwen2 ("qwen2") and Llama-3 ("llama-bpe") pre-tokenizers of GGUF tokenizers.

Each is checked on a small BPE trained the way the model's was, against the `tokenizers` pipeline the
model's own tokenizer.json describes (its regex with `(?i:...)`, Qwen's NFC normaliser, Llama-3's
`ignore_merges`), against a plain-python BPE over the `regex` module's split with llama.cpp's regex,
and for Qwen2 against transformers' GGUF loader.
"""

from __future__ import annotations

import itertools
import json
import unicodedata

import pytest
from gguf_files import byte_level_tokens, write_gguf
from hypothesis import given, settings
from hypothesis import strategies as st

from aepo_jax.tokenizers import GGUFTokenizer
from aepo_jax.tokenizers.hf_tokenizer import byte_level_alphabet
from tests.property_budget import examples

# The regexes of the models' tokenizer.json files (Qwen2.5 / Qwen3 and Meta-Llama-3).
TOKENIZER_JSON_SPLIT = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
# llama.cpp's versions (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2 and _LLAMA3).
LLAMA_CPP_SPLIT = {
    "qwen2": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
NFC = {"qwen2": True, "llama-bpe": False}
IGNORE_MERGES = {"qwen2": False, "llama-bpe": True}

CORPUS = [
    "I'm here, you're there; they've 12345 apples and 678 pears.\r\n\nThe year 2024: it's 42!",
    "def f(x):\n    return x ** 2  # square\n\n\n", "Привет, мир! 你好世界 1,234.56 café naïve",
    "HELLO WORLD, I'LL DO IT. We'd SAY it's 99 problems...   spaced   out\t\ttabs",
] * 10
TEXTS = [
    "I'M 12345 here", "they've 678 pears.\r\n\n  x", "  leading and trailing  ", "a\n\n\nb", "x ... !!! ??",
    "Привет, мир! 你好世界 1,234.56", "café naïve ²³ ½", "WE'LL SEE, YOU'D SAY", "tab\there\r\nnext", "",
    "1234567 digits 12 3", "don't'S 'm' 're",
]


@pytest.fixture(scope="module", params=["qwen2", "llama-bpe"])
def trained(request, tmp_path_factory):
    """(pre name, GGUF path, vocab, merges) of a BPE trained on CORPUS with that model's split."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    pre = request.param
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TOKENIZER_JSON_SPLIT[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    trainer_tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(trainer_tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get) + ["<|im_end|>"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    assert len(merges) > 100
    folder = tmp_path_factory.mktemp(pre)
    path = write_gguf(folder / f"{pre}.gguf", arch="qwen2" if pre == "qwen2" else "llama", tokens=tokens,
                      merges=merges, pre=pre, tensors=False)
    return pre, path, {t: i for i, t in enumerate(tokens)}, merges


def tokenizer_json_reference(pre: str, vocab: dict[str, int], merges: list[str]):
    """The `tokenizers` pipeline of the model's own tokenizer.json over the same vocabulary."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    ref = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                               ignore_merges=IGNORE_MERGES[pre]))
    if NFC[pre]:
        ref.normalizer = normalizers.NFC()
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TOKENIZER_JSON_SPLIT[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return ref


def python_reference(text: str, pre: str, vocab: dict[str, int], merges: list[str]) -> list[int]:
    """Byte-level BPE in plain python: llama.cpp's split (the `regex` module), then in each piece merge
    the adjacent pair of lowest merge rank until none is left (a piece that is a token is kept whole
    where llama.cpp ignores merges)."""
    import regex

    alphabet = byte_level_alphabet()
    ranks = {tuple(m.split(" ")): rank for rank, m in enumerate(merges)}
    if NFC[pre]:
        text = unicodedata.normalize("NFC", text)
    ids = []
    for piece in regex.findall(LLAMA_CPP_SPLIT[pre], text):
        word = "".join(alphabet[b] for b in piece.encode("utf-8"))
        if IGNORE_MERGES[pre] and word in vocab:
            ids.append(vocab[word])
            continue
        parts = list(word)
        while len(parts) > 1:
            ranked = [(ranks[pair], i) for i, pair in enumerate(itertools.pairwise(parts)) if pair in ranks]
            if not ranked:
                break
            _, i = min(ranked)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids += [vocab[part] for part in parts]
    return ids


def test_gguf_pre_tokenizers_match_the_models_tokenizer_json_and_llama_cpps_split(trained):
    pre, path, vocab, merges = trained
    ours = GGUFTokenizer(path)
    reference = tokenizer_json_reference(pre, vocab, merges)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == reference.encode(text).ids == python_reference(text, pre, vocab, merges), text
        assert ours.decode(ids) == text


def test_qwen2_gguf_tokenizer_matches_transformers_gguf_loader(trained):
    from transformers import AutoTokenizer

    pre, path, _, _ = trained
    if pre != "qwen2":
        pytest.skip("transformers' GGUF loader leaves out Llama-3's ignore_merges")
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = GGUFTokenizer(path)
    for text in TEXTS:  # NFC texts: the loader leaves out Qwen's normaliser
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False), text


# Letters, digits, contractions, whitespace runs and punctuation, the cases the splits tell apart. Not
# "ſ" (U+017F): `(?i:'s)` matches "'ſ" and llama.cpp's `'[sS]` does not.
PIECES = st.sampled_from(list("aAsStTdDmMlLrReEvVxX'’ 0123456789\r\n\t.,!?-_()#éüЖж你²½\u0301") + [" '", "  ", "'ll"])


@settings(max_examples=examples(60))
@given(text=st.lists(PIECES, max_size=30).map("".join))
def test_gguf_pre_tokenizers_match_the_references_on_arbitrary_text(trained, text):
    pre, path, vocab, merges = trained
    ids = _cached_tokenizer(path).encode(text)
    assert ids == python_reference(text, pre, vocab, merges)
    assert ids == tokenizer_json_reference(pre, vocab, merges).encode(text).ids


_TOKENIZERS: dict = {}


def _cached_tokenizer(path):
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = GGUFTokenizer(path)
    return _TOKENIZERS[path]


@pytest.mark.parametrize(("pre", "pieces"), [
    ("qwen2", ["I", "'M", " ", "1", "2", "3", "4", "5", " here", "\r\n\n", "ok"]),
    ("llama-bpe", ["I", "'M", " ", "123", "45", " here", "\r\n\n", "ok"]),
])
def test_qwen2_isolates_digits_and_llama3_groups_three(tmp_path, pre, pieces):
    tok = GGUFTokenizer(write_gguf(tmp_path / "t.gguf", pre=pre, tensors=False))
    alphabet = byte_level_alphabet()
    spelt = ["".join(alphabet[b] for b in p.encode()) for p in pieces]
    assert [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str("I'M 12345 here\r\n\nok")] == spelt


def test_llama3_keeps_a_piece_that_is_a_token_whole_and_qwen2_merges_it(tmp_path):
    tokens = byte_level_tokens()[:-1] + ["bc", "abc", "<|im_end|>"]  # no merge makes "abc"
    ids = {}
    for pre in ("llama-bpe", "qwen2"):
        tok = GGUFTokenizer(write_gguf(tmp_path / f"{pre}.gguf", pre=pre, tokens=tokens, merges=["b c"],
                                       tensors=False))
        ids[pre] = [tok.id_to_token(i) for i in tok.encode("abc")]
    assert ids == {"llama-bpe": ["abc"], "qwen2": ["a", "bc"]}


def test_llama3_adds_bos_unless_the_file_says_not_to(tmp_path):
    tokens = byte_level_tokens() + ["<|begin_of_text|>"]
    types = [1] * 256 + [3, 3]
    bos = [("add_uint32", "tokenizer.ggml.bos_token_id", 257)]
    tok = GGUFTokenizer(write_gguf(tmp_path / "a.gguf", pre="llama-bpe", tokens=tokens, token_types=types,
                                   metadata=bos, tensors=False))
    assert tok.bos_id == 257
    tok = GGUFTokenizer(write_gguf(tmp_path / "b.gguf", pre="llama-bpe", tokens=tokens, token_types=types,
                                   metadata=[*bos, ("add_bool", "tokenizer.ggml.add_bos_token", False)],
                                   tensors=False))
    assert tok.bos_id is None


def test_qwen2_normalises_to_nfc_as_qwens_tokenizer_does(tmp_path):
    tok = GGUFTokenizer(write_gguf(tmp_path / "q.gguf", pre="qwen2", tensors=False))
    assert tok.encode("cafe\u0301") == tok.encode("café")
