"""LLM-as-judge reward through the tools package's client against a real loopback HTTP server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aepo_jax import tools
from aepo_jax.rewards import compute_reward


class _JudgeHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that says yes when the candidate names a reference word."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        refs = prompt.split("Reference answer(s):", 1)[1].split("\n", 1)[0].lower()
        candidate = (
            prompt.split("Candidate answer:", 1)[1].split("\n", 1)[0].strip().lower()
        )
        verdict = (
            "yes"
            if candidate and any(candidate in ref for ref in refs.split("|"))
            else "no"
        )
        self.server.prompts.append(prompt)
        payload = json.dumps(
            {"choices": [{"message": {"role": "assistant", "content": verdict}}]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def judge_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JudgeHandler)
    server.prompts = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_llm_judge_reward_over_http(judge_server):
    client = tools.LLMJudgeClient(
        f"http://127.0.0.1:{judge_server.server_address[1]}", model="judge"
    )
    good = "<think>x</think><answer>\\boxed{Marie Curie}</answer>"
    bad = "<answer>\\boxed{Isaac Newton}</answer>"
    kw = {"judge": client, "question": "Who won two Nobel prizes?"}
    assert compute_reward("llm_judge", good, ["marie curie"], **kw) == 1.0
    assert compute_reward("llm_judge", bad, ["marie curie"], **kw) == 0.0
    assert (
        compute_reward("llm_judge", "<answer>no box</answer>", ["marie curie"], **kw)
        == -1.0
    )
    assert len(judge_server.prompts) == 2  # the format gate runs before any request
    assert "Who won two Nobel prizes?" in judge_server.prompts[0]


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("Not correct.", False),
        ("The candidate is not correct", False),
        ("That isn't correct.", False),
        ("Incorrect", False),
        ("<think>\nIs it the same? Paris is Paris, so yes.\n</think>\n\nNo", False),
        ("<think>\nThe two differ, no.\n</think>\nyes", True),
        ("<think>\nThe candidate", None),  # cut off inside its think block: no verdict yet
        ("Paris is named in both.\nYes.", True),
        ("Paris is named in both, yes, no doubt", True),
        ("I think yes.\nWait, the years differ.\nNo", False),
    ],
)
def test_verdict_is_read_after_the_think_block_and_negations_are_negative(reply, verdict):
    assert tools.parse_verdict(reply) is verdict


def test_a_judge_that_thinks_first_has_room_for_its_verdict():
    """A reasoning judge writes a think block before its yes/no: with the old 8-token ceiling its reply
    was cut inside the block and every answer silently scored 0."""
    from tests.rewards.judge_server import JudgeServer

    good = "<think>x</think><answer>\\boxed{Paris}</answer>"
    bad = "<think>x</think><answer>\\boxed{Lyon}</answer>"
    with JudgeServer(think_words=200, no="Not correct.") as server:
        client = tools.LLMJudgeClient(server.url, model="judge")
        assert client.judge("Capital of France?", ["Paris"], "Paris") is True
        assert client.judge("Capital of France?", ["Paris"], "Lyon") is False
        kw = {"judge": client, "question": "Capital of France?"}
        assert compute_reward("llm_judge", good, ["Paris"], **kw) == 1.0
        assert compute_reward("llm_judge", bad, ["Paris"], **kw) == 0.0
        cut_short = tools.LLMJudgeClient(server.url, model="judge", max_tokens=8)
        assert cut_short.judge("Capital of France?", ["Paris"], "Paris") is None
