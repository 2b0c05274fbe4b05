"""LLM-judge client against a local stub that speaks the OpenAI chat-completions API."""

import pytest
from tools_stub_http import StubServer, closed_port_url, json_reply

from aepo_jax.tools import LLMJudgeClient, parse_verdict
from aepo_jax.tools.http_client import HttpError


def chat_reply(content: str):
    return json_reply({"id": "c1", "object": "chat.completion",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}]})


def grader(method, path, body, n):
    """Says yes when the candidate line contains a reference answer; fails the first request with a 500."""
    if n == 1:
        return json_reply({"error": "warming up"}, 500)
    if path != "/v1/chat/completions" or method != "POST":
        return json_reply({"error": "not found"}, 404)
    prompt = body["messages"][0]["content"]
    gold = prompt.split("Reference answer(s): ")[1].split("\n")[0].split(" | ")
    candidate = prompt.split("Candidate answer: ")[1].split("\n")[0]
    return chat_reply("Yes." if any(g.lower() in candidate.lower() for g in gold) else "No, they differ.")


@pytest.mark.parametrize(
    "text, verdict",
    [("Yes", True), ("yes.", True), ("No", False), ("Answer: NO", False), ("Correct", True),
     ("incorrect", False), ("The answer is yes, no doubt", True), ("maybe", None), ("", None), ("yesterday", None)],
)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) is verdict


def test_judge_asks_the_endpoint_and_parses_its_verdict():
    with StubServer(grader) as stub:
        judge = LLMJudgeClient(stub.url, model="judge-model", api_key="k", backoff_seconds=0.01)
        assert judge.judge("Capital of France?", ["Paris"], "It is paris.") is True
        assert judge.judge("Capital of France?", ["Paris", "Paname"], "Lyon") is False
    # The first request got a 500 and was retried; the request speaks the OpenAI shape.
    assert len(stub.requests) == 3
    method, path, body = stub.requests[-1]
    assert (method, path, body["model"]) == ("POST", "/v1/chat/completions", "judge-model")
    assert body["messages"][0]["role"] == "user" and "yes or no" in body["messages"][0]["content"]


def test_judge_errors_are_clear():
    with pytest.raises(HttpError, match="failed after 2 attempts"):
        LLMJudgeClient(closed_port_url(), "m", retries=1, backoff_seconds=0.01).judge("q", ["a"], "a")
    with StubServer(lambda *a: json_reply({"choices": []})) as stub, \
            pytest.raises(HttpError, match="unexpected response"):
        LLMJudgeClient(stub.url, "m").judge("q", ["a"], "a")
    with StubServer(lambda *a: json_reply({"error": "no such model"}, 404)) as stub, \
            pytest.raises(HttpError, match="HTTP 404"):
        LLMJudgeClient(stub.url + "/v1/chat/completions", "m").judge("q", ["a"], "a")
