"""Who the Fleet gateway serves when strangers crowd it: connection slots, per-prefix rates and the body budget.

Everything here is bookkeeping in O(1) per event, with no I/O, so it is tested without sockets. The one rule it
enforces: a connection on which the SuperLink has accepted a call (a registered site's) is never evicted, rate-limited
or refused budget because of anyone else's traffic. Strangers are grouped by network prefix (/24 for IPv4, /64 for
IPv6 by default), since one host can hold a whole IPv6 /64 and a NAT puts many hosts behind one IPv4 address.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


def prefix(ip: str, v4: int = 24, v6: int = 64) -> str:
    """The network an address is counted in (`10.1.2.0/24`, `2001:db8::/64`); a name that is no address is itself."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    bits = v4 if addr.version == 4 else v6
    return str(ipaddress.ip_network(f"{addr}/{bits}", strict=False))


@dataclass(eq=False)
class Conn:
    """One served connection. `authed`: the SuperLink accepted a call on it (a site's: never evicted). `busy`: a call
    of it is with the SuperLink now (not evicted either: its answer must reach the client, and its log line be true).
    `handle` is what closes it (the gateway's handler task)."""
    ip: str
    prefix: str
    opened: float
    handle: Any = None
    authed: bool = False
    busy: bool = False
    evicted: bool = False  # closed by the gateway for a newcomer
    closed: bool = False


FEW = 2  # evictable connections a prefix may hold and keep their grace period
KNOWN_FOR = 3600.0  # seconds a prefix counts as a site's after its last connection with an accepted call closed


class Slots:
    """The served connections, with the evictable ones (no accepted call, not busy) indexed so that choosing a
    victim is O(1): per prefix, its evictable connections oldest first; per count, the prefixes holding that many
    (an LFU-style bucket list), and the largest count."""

    def __init__(self, capacity: int, per_prefix: int, grace: float, min_age: float = 0.0):
        self.capacity, self.per_prefix, self.grace, self.min_age = capacity, per_prefix, grace, min_age
        self.order: OrderedDict[Conn, None] = OrderedDict()  # every evictable connection, oldest first
        self.total = 0
        self.strangers: dict[str, int] = {}  # prefix -> its connections without an accepted call (busy ones too)
        self.idle: dict[str, OrderedDict[Conn, None]] = {}  # prefix -> its evictable connections, oldest first
        self.buckets: dict[int, OrderedDict[str, None]] = {}  # n -> prefixes with n evictable connections
        self.top = 0
        self.sites: dict[str, int] = {}  # prefix -> its open connections with an accepted call
        self.known: dict[str, float] = {}  # prefix -> when its last such connection closed (forgotten after KNOWN_FOR)

    def __len__(self) -> int:
        return self.total

    # the evictable index -------------------------------------------------------------------------------------------
    def _move(self, pfx: str, old: int, new: int) -> None:
        if old:
            b = self.buckets[old]
            del b[pfx]
            if not b:
                del self.buckets[old]
        if new:
            self.buckets.setdefault(new, OrderedDict())[pfx] = None
        if new > self.top:
            self.top = new
        while self.top and self.top not in self.buckets:  # falls by at most one per call
            self.top -= 1

    def _index(self, c: Conn) -> None:
        self.order[c] = None
        d = self.idle.setdefault(c.prefix, OrderedDict())
        d[c] = None
        self._move(c.prefix, len(d) - 1, len(d))

    def _unindex(self, c: Conn) -> None:
        d = self.idle.get(c.prefix)
        if d is None or c not in d:
            return
        del d[c]
        del self.order[c]
        self._move(c.prefix, len(d) + 1, len(d))
        if not d:
            del self.idle[c.prefix]

    # events ----------------------------------------------------------------------------------------------------------
    def admit(self, ip: str, pfx: str, now: float | None = None) -> tuple[Conn | None, Conn | None, str]:
        """A slot for a new connection: (the connection, a stranger's connection to close for it, or why not)."""
        now = time.monotonic() if now is None else now
        victim = None
        if self.strangers.get(pfx, 0) >= self.per_prefix:
            victim = self._oldest_past_grace(pfx, now)  # the prefix's own oldest makes way (a site behind a NAT)
            if victim is None:
                return None, None, f"{self.strangers[pfx]} connections without an accepted call from {pfx} " \
                                   "(--max-per-peer)"
        elif self.total >= self.capacity:
            victim = self._victim(now) or self._for_site(pfx, now)
            if victim is None:
                return None, None, f"all {self.capacity} slots taken by sites, calls in flight or fresh connections " \
                                   "(--max-connections)"
        if victim is not None:
            self.drop(victim)
            victim.evicted = True
        c = Conn(ip, pfx, now)
        self.total += 1
        self.strangers[pfx] = self.strangers.get(pfx, 0) + 1
        self._index(c)
        return c, victim, ""

    def _oldest_past_grace(self, pfx: str, now: float) -> Conn | None:
        d = self.idle.get(pfx)
        c = next(iter(d)) if d else None
        return c if c is not None and now - c.opened >= self.grace else None

    def _victim(self, now: float, tries: int = 8) -> Conn | None:
        """The oldest evictable connection of the prefix holding the most. The grace period protects a prefix's
        connections only while it holds at most `FEW` (a site opens one or two at a time; a storm, many): such a
        prefix whose oldest is in its grace is passed over, and at most `tries` are looked at (bounded: O(1)). When
        every one looked at is in its grace (a storm from many prefixes keeps all slots fresh), the oldest evictable
        connection of all goes, if it is `min_age` old: a site's new connection has that long for its first call."""
        for n in range(self.top, 0, -1):  # top is at most --max-per-peer
            for pfx in self.buckets.get(n, ()):
                c = next(iter(self.idle[pfx]))
                if n > FEW or now - c.opened >= self.grace:
                    return c
                tries -= 1
                if tries <= 0:
                    return self._oldest(now)
        return self._oldest(now)

    def _for_site(self, pfx: str, now: float) -> Conn | None:
        """A newcomer from a site's prefix (one holding a connection with an accepted call, or that held one within
        KNOWN_FOR) takes the oldest evictable connection's place, however young: a storm of new connections from many
        prefixes keeps every slot younger than `min_age`, and a site reconnecting would lose every freed slot to it."""
        if pfx not in self.sites:
            seen = self.known.get(pfx)
            if seen is None or now - seen > KNOWN_FOR:
                self.known.pop(pfx, None)
                return None
        return next(iter(self.order), None)

    def _oldest(self, now: float) -> Conn | None:
        c = next(iter(self.order), None)
        return c if c is not None and now - c.opened >= self.min_age else None

    def busy(self, c: Conn, on: bool) -> None:
        """A call of `c` goes to the SuperLink (on) or came back (off)."""
        if c.closed or c.busy == on:
            return
        c.busy = on
        if on:
            self._unindex(c)
        elif not c.authed:
            self._index(c)

    def accepted(self, c: Conn) -> None:
        """The SuperLink accepted a call on `c`: it is a site's from now on."""
        if c.authed or c.closed:
            return
        c.authed = True
        self._unindex(c)
        self._stranger_gone(c.prefix)
        self.sites[c.prefix] = self.sites.get(c.prefix, 0) + 1

    def drop(self, c: Conn) -> None:
        """`c` is closed (or about to be, by eviction)."""
        if c.closed:
            return
        c.closed = True
        self._unindex(c)
        self.total -= 1
        if not c.authed:
            self._stranger_gone(c.prefix)
        else:
            self._site_gone(c.prefix)

    def _site_gone(self, pfx: str) -> None:
        n = self.sites[pfx] - 1
        if n:
            self.sites[pfx] = n
        else:
            del self.sites[pfx]
            self.known[pfx] = time.monotonic()

    def _stranger_gone(self, pfx: str) -> None:
        n = self.strangers[pfx] - 1
        if n:
            self.strangers[pfx] = n
        else:
            del self.strangers[pfx]


class Rate:
    """Per-prefix token buckets (`per_second`, a burst of twice that); idle prefixes are forgotten by `sweep`."""

    def __init__(self, per_second: float):
        self.rate, self.burst = per_second, 2 * per_second
        self.buckets: dict[str, tuple[float, float]] = {}

    def take(self, pfx: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        tokens, then = self.buckets.get(pfx, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1:
            self.buckets[pfx] = (tokens, now)
            return False
        self.buckets[pfx] = (tokens - 1, now)
        return True

    def sweep(self, now: float | None = None) -> None:
        """Forget prefixes whose bucket has refilled (they would start full anyway): memory bounded by recent peers."""
        now = time.monotonic() if now is None else now
        full = self.burst / self.rate if self.rate else 0.0
        for pfx in [p for p, (_, t) in self.buckets.items() if now - t >= full]:
            del self.buckets[pfx]


class Window:
    """Per-prefix counts in a fixed window (`seconds`): the refused calls of connections without an accepted call.
    A stale window is dropped by `sweep`, so memory is bounded by the prefixes seen in the last window."""

    def __init__(self, limit: int, seconds: float = 60.0):
        self.limit, self.seconds = limit, seconds
        self.counts: dict[str, tuple[float, int]] = {}

    def _current(self, pfx: str, now: float) -> tuple[float, int]:
        start, n = self.counts.get(pfx, (now, 0))
        return (now, 0) if now - start >= self.seconds else (start, n)

    def add(self, pfx: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        start, n = self._current(pfx, now)
        self.counts[pfx] = (start, n + 1)

    def over(self, pfx: str, now: float | None = None) -> float:
        """Seconds until `pfx` may call again (0: it may now)."""
        now = time.monotonic() if now is None else now
        start, n = self._current(pfx, now)
        return max(0.0, start + self.seconds - now) if n >= self.limit else 0.0

    def sweep(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for pfx in [p for p, (s, _) in self.counts.items() if now - s >= self.seconds]:
            del self.counts[pfx]


@dataclass
class Budget:
    """Bytes of request bodies held at once. Bytes are taken as they arrive (never by a declared length). Connections
    without an accepted call may hold at most half of `total` together and an eighth per prefix; the other half is
    kept for sites' connections, which may also use whatever strangers leave."""
    total: int
    held: int = 0
    strangers: int = 0
    per_prefix: dict[str, int] = field(default_factory=dict)

    @property
    def strangers_max(self) -> int:
        return self.total // 2

    @property
    def prefix_max(self) -> int:
        return max(1, self.total // 8)

    def take(self, c: Conn, n: int) -> str:
        """Take `n` bytes for `c` (a site's when `c.authed`); why not, or '' when taken."""
        if self.held + n > self.total:
            return f"{self.held} bytes of bodies held (--body-budget)"
        if not c.authed:
            mine = self.per_prefix.get(c.prefix, 0)
            if self.strangers + n > self.strangers_max:
                return f"connections without an accepted call hold {self.strangers} bytes (half of --body-budget)"
            if mine + n > self.prefix_max:
                return f"{c.prefix} holds {mine} bytes of bodies (an eighth of --body-budget)"
            self.strangers += n
            self.per_prefix[c.prefix] = mine + n
        self.held += n
        return ""

    def give(self, c: Conn, n: int, as_stranger: bool) -> None:
        """Give back `n` bytes taken for `c` (`as_stranger`: taken while it had no accepted call)."""
        self.held -= n
        if as_stranger:
            self.strangers -= n
            left = self.per_prefix.get(c.prefix, 0) - n
            if left > 0:
                self.per_prefix[c.prefix] = left
            else:
                self.per_prefix.pop(c.prefix, None)
