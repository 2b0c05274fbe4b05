"""LLM-as-judge client (spec §5): ask an OpenAI-compatible `/v1/chat/completions` for a yes/no equivalence verdict."""

from __future__ import annotations

import re

from aepo_jax.tools.http_client import HttpError, pooled_session, request_with_retries

JUDGE_PROMPT = """You are grading an answer to a question.
Question: {question}
Reference answer(s): {gold}
Candidate answer: {prediction}
Does the candidate answer mean the same as a reference answer? Reply with exactly one word: yes or no."""

# A reasoning judge may think first: its `<think>` block (or, cut off by max_tokens, everything after
# an unclosed `<think>`) is not its verdict.
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_VERDICT = re.compile(
    r"(?:\bnot\s+|n't\s+)(?:correct|true)\b|\b(?:yes|no|correct|incorrect|true|false)\b", re.IGNORECASE
)
_POSITIVE = {"yes", "correct", "true"}
# Room for a reasoning judge's think block before its one-word verdict; a judge that answers at once
# stops after the word (max_tokens is only a ceiling).
DEFAULT_MAX_TOKENS = 1024


def parse_verdict(text: str | None) -> bool | None:
    """True for yes, False for no, None when the reply has no verdict.

    Think blocks are dropped; the verdict is the first verdict word ("yes", "no", "correct",
    "incorrect", "not correct", "true", "false", "not true") of the last line that has one, so
    "<think>...</think>No" is no, "The answer is yes, no doubt" is yes and "Not correct." is no.
    """
    answer = _THINK_BLOCK.sub("", text or "").rsplit("</think>", 1)[-1]
    for line in reversed(answer.splitlines()):
        match = _VERDICT.search(line)
        if match is not None:
            return match.group(0).lower() in _POSITIVE  # "not correct" is not positive
    return None


class LLMJudgeClient:
    """Judges answer equivalence with a chat model behind an OpenAI-compatible HTTP endpoint.

    Args:
      url: server base URL (`.../v1/chat/completions` is appended unless already there).
      model: model name sent in the request.
      api_key: optional bearer token.
      max_tokens: the reply's token ceiling, with room for a reasoning judge's think block
        (a reply cut off inside it has no verdict and scores as wrong).
    """

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: tuple[float, float] = (2.0, 60.0),
                 retries: int = 2, backoff_seconds: float = 0.5, max_tokens: int = DEFAULT_MAX_TOKENS):
        url = url.rstrip("/")
        self.endpoint = url if url.endswith("/chat/completions") else url + "/v1/chat/completions"
        self.model, self.timeout, self.retries = model, timeout, retries
        self.backoff_seconds, self.max_tokens = backoff_seconds, max_tokens
        self.session = pooled_session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def complete(self, prompt: str) -> str:
        """The assistant message for one user prompt. Raises HttpError saying what failed."""
        payload = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                   "temperature": 0.0, "max_tokens": self.max_tokens}
        response = request_with_retries(self.session, "POST", self.endpoint, json=payload, timeout=self.timeout,
                                        retries=self.retries, backoff_seconds=self.backoff_seconds)
        if response.status_code != 200:
            raise HttpError(f"judge answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise HttpError(f"judge sent an unexpected response: {response.text[:200]}") from error

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        self.session.close()

    def judge(self, question: str, gold: list[str], prediction: str) -> bool | None:
        """Whether `prediction` matches one of `gold`; None if the reply has no verdict. Raises HttpError."""
        prompt = JUDGE_PROMPT.format(question=question, gold=" | ".join(gold), prediction=prediction)
        return parse_verdict(self.complete(prompt))
