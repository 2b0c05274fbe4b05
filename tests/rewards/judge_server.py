"""A loopback OpenAI-compatible judge for the judge tests: `POST /v1/chat/completions` that grades answers.

It reads the candidate and the reference answers from the judge prompt
(`aepo_jax.tools.llm_judge.JUDGE_PROMPT`) and says yes when the candidate
contains a reference answer (case-insensitive), else no. A thinking judge
(`think_words > 0`) first writes that many words inside `<think>...</think>`,
and, as a real server does, the reply stops after the request's `max_tokens`
(one word per token here), so a judge given too few tokens never reaches its
verdict.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class JudgeServer:
    """Serves on a free 127.0.0.1 port (`url`); `requests` holds (headers, JSON body) of each request.

    Args:
      think_words: words of reasoning before the verdict (0: the verdict alone).
      yes, no: the verdict replies.
    """

    def __init__(self, think_words: int = 0, yes: str = "yes", no: str = "no"):
        self.requests: list[tuple[dict[str, str], dict]] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append((dict(self.headers), body))
                if self.path != "/v1/chat/completions":
                    return self._reply(404, {"error": f"no route {self.path}"})
                prompt = body["messages"][-1]["content"]
                refs = prompt.split("Reference answer(s): ", 1)[1].split("\n", 1)[0].lower().split(" | ")
                candidate = prompt.split("Candidate answer: ", 1)[1].split("\n", 1)[0].strip().lower()
                verdict = yes if candidate and any(ref.strip() in candidate for ref in refs) else no
                thoughts = ["<think>"] + ["hmm"] * think_words + ["</think>"] if think_words else []
                words = [*thoughts, verdict]
                content = " ".join(words[: int(body.get("max_tokens", len(words)))])
                self._reply(200, {"choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": content}}]})

            def _reply(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

