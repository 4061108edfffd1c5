"""The link's HTTP connections, kept across calls: an SSE answer's connection goes back to the
pool instead of being thrown away.

The SDK's streamable HTTP client closes a POST's SSE response as soon as the reply event is read
(`_handle_sse_response`: `response.aclose()`), before the stream's end (the chunked body's last
chunk, which the server sends right after the reply). httpx cannot pool a connection whose
response was not read to its end, so it closes it: every call on a 2025-era session (whose
upstream answers calls as SSE) opened a new TCP connection (python-sdk#2707, #2712, #3281). The
SDK is not forked: this transport, under the link's `http_client_factory` client, reads what is
left of an SSE response when it is closed (the reply is already delivered: nothing waits on it),
for at most `DRAIN_SECONDS`; a stream the server keeps open past that is closed as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx2

#: How long a closed SSE response is read for its end before its connection is given up.
DRAIN_SECONDS = 0.5


class _DrainOnClose(httpx2.AsyncByteStream):
    """A response body whose `aclose` first reads it to its end (bounded), on the one iterator
    of the inner body (a second iteration of a half-read body is not something httpx promises)."""

    def __init__(self, inner: httpx2.AsyncByteStream) -> None:
        self._inner = inner
        self._chunks: AsyncIterator[bytes] | None = None

    def _iterator(self) -> AsyncIterator[bytes]:
        if self._chunks is None:
            self._chunks = aiter(self._inner)
        return self._chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._iterator():
            yield chunk

    async def aclose(self) -> None:
        try:
            with anyio.move_on_after(DRAIN_SECONDS):
                async for _ in self._iterator():
                    pass
        except httpx2.TransportError:
            pass  # the connection broke while draining: closed below, as it would have been
        finally:
            await self._inner.aclose()


class DrainingTransport(httpx2.AsyncBaseTransport):
    """`httpx2.AsyncHTTPTransport` whose SSE answers to a POST return their connection to the
    pool when closed early (see the module)."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        post = request.method == "POST"  # a GET's stream is the session's own: not drained
        if (
            post
            and kind == "text/event-stream"
            and isinstance(response.stream, httpx2.AsyncByteStream)
        ):
            response.stream = _DrainOnClose(response.stream)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
