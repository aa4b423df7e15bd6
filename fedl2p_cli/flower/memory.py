"""The gateway's memory: bodies within `--body-budget`, and each connection within a stated overhead.

asyncio's TLS protocol allocates a read buffer of `SSLProtocol.max_size` (256 KiB, zero-filled, so resident) for
every connection it serves, from the moment the handshake begins, and lets 256 KiB of ciphertext wait in its input
before it stops reading; a closed connection's protocol sits in reference cycles that only the cyclic collector
frees, and glibc keeps freed memory mapped until it is trimmed. So the gateway reads TLS `TLS_READ` bytes at a time
(two TLS records), lets at most that much ciphertext wait, collects closed TLS connections once a second or after
`COLLECT_EVERY` of them (whichever comes first) and hands freed memory back to the system then.

`OVERHEAD_KIB` is what one connection may cost beyond the bodies the budget counts, measured with
bench/edge_memory.py and held by tests/test_gateway_memory.py: the gateway's resident memory stays within its idle
size + `--body-budget` + connections x `OVERHEAD_KIB`.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from asyncio import sslproto

TLS_READ = 16 * 1024  # bytes of TLS read, decrypted and waiting at a time, per connection (one TLS record)
READ = 16 * 1024      # bytes of a body read at a time
COLLECT_EVERY = 128   # closed TLS connections after which their buffers are collected at once
OVERHEAD_KIB = 256    # stated: resident memory per connection, whatever its state, beyond the bodies' bytes


def small_tls_buffers() -> None:
    """asyncio's TLS protocol reads `TLS_READ` bytes at a time (its class default, 256 KiB, would be allocated and
    zero-filled for every connection). Set once, before serving; it affects only how much is read per call."""
    sslproto.SSLProtocol.max_size = TLS_READ


def limit_tls_input(writer: asyncio.StreamWriter) -> None:
    """At most `TLS_READ` bytes of ciphertext wait in a connection's TLS input before it stops reading the socket."""
    transport = writer.transport
    if hasattr(transport, "set_read_buffer_limits"):
        transport.set_read_buffer_limits(high=TLS_READ)


def release() -> None:
    """Free closed connections' buffers now (they sit in reference cycles) and hand freed memory back to the system."""
    gc.collect()
    _trim()


def _trim() -> None:
    """glibc's malloc_trim: freed pages back to the system (elsewhere, musl or macOS, there is none: nothing to do)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols, libc's among them (dlopen of itself: cheap)
    except (OSError, AttributeError):
        return
    trim(0)
