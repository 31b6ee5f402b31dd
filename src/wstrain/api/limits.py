"""Request-body limit: no body over WSTRAIN_MAX_BODY_BYTES (1 MiB) is read. A JobSpec is a
few hundred bytes (an hf_config a few KiB), so 1 MiB leaves room for any real one while a
hostile client cannot make the API buffer and parse megabytes per request.

A declared Content-Length over the limit answers 413 before a byte is read; a chunked body
is counted as it streams and answers 413 at the chunk that crosses the limit.

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)   # create_app does this
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._reject(send)
            return
        seen = 0
        started = refused = False

        async def counted() -> Message:
            # Past the limit: answer 413 now and tell the app the client left, so the route
            # stops reading (FastAPI would turn an exception here into a 400).
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    if not started:
                        await self._reject(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out; the app's own answer to a cut body is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, tracked)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(
            {
                "detail": f"request body over {self.max_bytes} bytes; send a "
                "smaller one (WSTRAIN_MAX_BODY_BYTES on the API)"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
