"""A stand-in for vLLM's OpenAI server, for launcher tests that must not need vLLM.

It has the one trait the launcher must handle: ``/health`` answers 200 as soon as the HTTP
server is up, while completions fail (503) until the engine is "warm", FAKE_VLLM_WARM_S
seconds later.  Flags are vLLM's spelling; only ``--host``/``--port``/``--served-model-name``
matter.  ``/version`` answers like vLLM's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTED = time.monotonic()
WARM_S = float(os.environ.get("FAKE_VLLM_WARM_S", "1.0"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-model-name", default="fake-model")
    args, _unknown = ap.parse_known_args()
    model = args.served_model_name

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            print(f"{self.command} {self.path} " + fmt % a, flush=True)

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's spelling
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/version":
                self._send(200, {"version": "0.0-fake"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/completions" or body.get("model") != model:
                self._send(404, {"error": "not found"})
            elif time.monotonic() - STARTED < WARM_S:
                self._send(503, {"error": "engine core not ready"})
            else:
                self._send(
                    200,
                    {
                        "choices": [{"text": "x", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
                    },
                )

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"fake vLLM on {args.host}:{args.port}, warm after {WARM_S} s", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
