"""A pass-through HTTP proxy that writes down what a client sends: for a closed client (Claude Code) whose
requests are the thing measured.

Every request is forwarded to ``upstream`` unchanged (its body, its headers but ``host``) and the answer
streamed back; each exchange is kept as a :class:`Exchange` (method, path, query, headers, the parsed JSON
body, the status, and the answer's first ``ERROR_BYTES`` when it is not a 2xx). Starlette and httpx are
what ``vllm serve`` already runs on; uvicorn serves it from a thread of the bench.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

ERROR_BYTES = 2000
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass
class Exchange:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: object
    status: int | None = None
    error: str | None = None
    started: float = field(default_factory=time.time)


class RecordingProxy:
    """``with RecordingProxy(upstream, port) as proxy: ... proxy.exchanges``."""

    def __init__(self, upstream: str, port: int) -> None:
        self.upstream, self.port = upstream, port
        self.base_url = f"http://127.0.0.1:{port}"
        self.exchanges: list[Exchange] = []
        self._server = None
        self._thread: threading.Thread | None = None

    def _app(self):
        import httpx
        from starlette.applications import Starlette
        from starlette.responses import Response, StreamingResponse
        from starlette.routing import Route

        client = httpx.AsyncClient(base_url=self.upstream, timeout=None)

        async def forward(request):
            raw = await request.body()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw[:ERROR_BYTES].decode("utf-8", "replace")
            seen = Exchange(request.method, request.url.path, request.url.query, dict(request.headers), body)
            self.exchanges.append(seen)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            answer = await client.send(client.build_request(request.method, target, headers=headers, content=raw),
                                       stream=True)
            seen.status = answer.status_code
            back = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS | {"content-encoding"}}
            if answer.status_code >= 300:
                text = (await answer.aread())[:ERROR_BYTES].decode("utf-8", "replace")
                seen.error = text
                return Response(text, status_code=answer.status_code, headers=back)
            return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=back)

        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
        return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])

    def __enter__(self) -> "RecordingProxy":
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(self._app(), host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the recording proxy did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
