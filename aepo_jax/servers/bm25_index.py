"""A BM25 index over a JSONL corpus of `{"id", "contents"}` documents (DESIGN "Search server").

Ranking is `bm25s`'s; this module only loads the corpus, builds or reloads the
index (cached on disk, keyed by the corpus file's content hash) and maps
results back to documents.
"""

from __future__ import annotations

import json
import os

import bm25s
import numpy as np

from aepo_jax.file_digests import file_digest


def _repaired(text: str) -> str:
    """`text` with lone surrogate code points (half of an escaped emoji, `"\\ud83d"`) replaced by "?".

    JSON can spell them and `json.loads` returns them, but they cannot be encoded as
    UTF-8, so the agent's tokenizer raises on a search result that carries one.
    """
    return text.encode("utf-8", "replace").decode("utf-8")


def load_corpus(path: str) -> list[dict[str, str]]:
    """Documents of a JSONL file; each line needs string `id` and `contents`. Raises ValueError naming the line.

    Text that is not valid Unicode is repaired, not refused: bytes that are not UTF-8
    become U+FFFD and lone surrogates "?" (`_repaired`), so one broken line in a dump of
    millions does not stop the server, and no search result carries them.
    """
    documents, seen = [], set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error})") from error
            if not isinstance(record, dict) or not isinstance(record.get("contents"), str) or "id" not in record:
                raise ValueError(f'{path}:{number}: a document needs "id" and string "contents"')
            doc_id = _repaired(str(record["id"]))
            if doc_id in seen:
                raise ValueError(f"{path}:{number}: duplicate document id {doc_id!r}")
            seen.add(doc_id)
            documents.append({"id": doc_id, "contents": _repaired(record["contents"])})
    if not documents:
        raise ValueError(f"{path}: the corpus has no documents")
    return documents


def _tokenize(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


def _corpus_tokens(corpus_path: str, documents: list[dict[str, str]]) -> list[list[str]]:
    """The documents' tokens; raises ValueError naming the corpus when none has a word to index (bm25s
    failed on the empty vocabulary with a bare `max() arg is an empty sequence`)."""
    tokens = _tokenize([doc["contents"] for doc in documents])
    if not any(tokens):
        raise ValueError(f"{corpus_path}: no document has a word to index (all {len(documents)} are empty or hold "
                         "only English stop words and one-character words)")
    return tokens


class Bm25Index:
    """BM25 retrieval over a corpus; `search` is safe to call from many threads.

    Args:
      corpus_path: the JSONL corpus.
      cache_dir: if given, the index is saved under it and reloaded when the
        corpus content is unchanged.
    """

    def __init__(self, corpus_path: str, cache_dir: str | None = None):
        self.documents = load_corpus(corpus_path)
        self.by_id = {doc["id"]: doc for doc in self.documents}
        self.loaded_from_cache = False
        index_dir = os.path.join(cache_dir, f"bm25-{file_digest(corpus_path, length=16)}") if cache_dir else None
        if index_dir and os.path.exists(os.path.join(index_dir, "params.index.json")):
            self.retriever = bm25s.BM25.load(index_dir, show_progress=False)
            self.loaded_from_cache = True
        else:
            self.retriever = bm25s.BM25()
            self.retriever.index(_corpus_tokens(corpus_path, self.documents), show_progress=False)
            if index_dir:
                self.retriever.save(index_dir, show_progress=False)

    def __len__(self) -> int:
        return len(self.documents)

    def search(self, queries: list[str], topk: int) -> list[list[tuple[dict[str, str], float]]]:
        """For each query, up to `topk` (document, score) pairs, best first; zero-score hits are dropped."""
        k = min(topk, len(self.documents))
        indices, scores = self.retriever.retrieve(
            _tokenize(queries), k=k, show_progress=False, n_threads=1
        )  # [Q, k], [Q, k]
        results = []
        for row_indices, row_scores in zip(np.asarray(indices), np.asarray(scores)):
            results.append([
                (self.documents[int(i)], float(s)) for i, s in zip(row_indices, row_scores) if s > 0
            ])
        return results
