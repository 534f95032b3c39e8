"""A small OpenAI-compatible completions server (vLLM's token-id conventions) backed by HFEngine.

Used by the OpenAIEngine test: it listens on 127.0.0.1 for real HTTP requests.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fr_agents.policy.base import SamplingOptions
from fr_agents.policy.hf import HFEngine


def serve(engine: HFEngine, model_name: str = "tiny") -> ThreadingHTTPServer:
    """Start serving in a daemon thread on a free port of 127.0.0.1; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _send(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body.get("model") != model_name or not isinstance(body.get("prompt"), list):
                self._send(400, {"error": {"message": "model must be 'tiny' and prompt a token list"}})
                return
            opts = SamplingOptions(
                temperature=float(body.get("temperature", 1.0)),
                max_tokens=int(body.get("max_tokens", 16)),
                stop_token_ids=tuple(body.get("stop_token_ids", ())),
                seed=body.get("seed"),
            )
            gen = engine.generate_sync(body["prompt"], opts)
            self._send(
                200,
                {
                    "object": "text_completion",
                    "model": model_name,
                    "choices": [
                        {
                            "index": 0,
                            "text": "",
                            "finish_reason": gen.finish_reason,
                            "logprobs": {
                                "tokens": [f"token_id:{t}" for t in gen.token_ids],
                                "token_logprobs": gen.logprobs,
                            },
                        }
                    ],
                },
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
