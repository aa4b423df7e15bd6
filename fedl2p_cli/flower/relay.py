"""Moving a call's bytes through the gateway without copying them whole, and without waiting on a client for ever.

A request body is held once, in the buffer the gateway read it into (what the body budget counts); it goes to the
SuperLink in `CHUNK`-sized views of that buffer, so that HTTP framing and TLS encryption copy one chunk at a time,
never the whole body (handed over whole, h11 joins it into one bytes object and the TLS layer encrypts it into two
more: about five bodies at once, measured). The SuperLink's answer is relayed the same way, a chunk at a time, so an
answer of any size costs a chunk, not its size. Each write to the client must drain within `write_timeout`: a client
that stops reading (a slow read) is cut there, instead of holding its connection and the SuperLink's for ever.
"""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import AsyncIterator

import h11
import httpx

CHUNK = 64 * 1024  # bytes handed to the SuperLink's connection, or to the client's, at a time


class Body:
    """A request body of a declared `size`, filled as its bytes arrive. Up to `CHUNK` bytes it is a bytearray; above,
    an anonymous private mapping of `size` bytes, whose pages become resident only as they are written: a declared
    length costs no memory, and the body never moves (a growing bytearray is reallocated, copied and leaves freed
    holes behind: about five bodies' worth of resident memory for one 4 MiB body, measured). Unmapped when dropped."""

    def __init__(self, size: int):
        self.n = 0
        self.buf: bytearray | mmap.mmap = (bytearray() if size <= CHUNK else
                                           mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE))

    def __len__(self) -> int:
        return self.n

    def add(self, data: bytes) -> None:
        if isinstance(self.buf, bytearray):
            self.buf += data
        else:
            self.buf[self.n:self.n + len(data)] = data
        self.n += len(data)

    def view(self) -> memoryview:
        return memoryview(self.buf)[:self.n]


class Chunks(httpx.AsyncByteStream):
    """An httpx request stream over a body: views of `CHUNK` bytes of it, no copy (the caller sets Content-Length).
    `drop` lets go of the body once it is sent: httpx keeps each request in a reference cycle (a response and its
    stream name each other), which would hold the body until the cyclic collector runs."""

    def __init__(self, body: Body):
        self.body: Body | None = body

    async def __aiter__(self) -> AsyncIterator[memoryview]:  # type: ignore[override]  # h11 sends any bytes-like
        view = self.body.view() if self.body is not None else memoryview(b"")
        for i in range(0, len(view), CHUNK):
            yield view[i:i + CHUNK]

    def drop(self) -> None:
        self.body = None

    async def aclose(self) -> None:
        self.drop()


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The SuperLink answer's Content-Length when it declares exactly one, as digits, and no Content-Encoding (httpx
    decodes one: the length would change); else None (relayed chunked)."""
    if any(k.lower() == b"content-encoding" for k, _ in headers):
        return None
    values = [v for k, v in headers if k.lower() == b"content-length"]
    return int(values[0]) if len(values) == 1 and values[0].isdigit() else None


async def drained(writer: asyncio.StreamWriter, timeout: float) -> None:
    """Wait until the client has taken what was written, at most `timeout` s (TimeoutError: a client that does not
    read its answer)."""
    await asyncio.wait_for(writer.drain(), timeout)


async def relay_body(conn: h11.Connection, writer: asyncio.StreamWriter, head: bytes,
                     chunks: AsyncIterator[bytes], timeout: float) -> int:
    """The answer's `head` (bytes h11 made of it) and body from `chunks` to the client through h11 connection `conn`,
    the head with the first chunk (one write: a client may read the head alone and leave), then one chunk at a time;
    the body's bytes sent."""
    sent = 0
    async for data in chunks:
        if data:
            writer.write(head + conn.send(h11.Data(data=data)))
            head = b""
            sent += len(data)
            await drained(writer, timeout)
    writer.write(head + conn.send(h11.EndOfMessage()))  # not waited for: a client that read it all may close at once
    return sent
