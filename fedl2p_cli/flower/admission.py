"""Who the Fleet gateway serves when strangers crowd it: connection slots, calls in flight, rates and the body budget.

Everything here is bookkeeping in O(1) per event, with no I/O, so it is tested without sockets. The one rule it
enforces: a connection on which the SuperLink has accepted a call (a registered site's) is never evicted, rate-limited
or refused budget because of anyone else's traffic. Strangers are grouped by network prefix (/24 for IPv4, /64 for
IPv6 by default), since one host can hold a whole IPv6 /64 and a NAT puts many hosts behind one IPv4 address; but a
per-prefix limit alone does not hold against an attacker with hundreds of prefixes, so strangers together share one
bounded pool of each resource (connections, calls in flight, body bytes), and sites keep the rest.
"""

from __future__ import annotations

import ipaddress
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
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
    site_room: bool = False  # admitted in the sites' lane (its prefix is a site's), not the strangers'
    evicted: bool = False  # closed by the gateway for a newcomer
    closed: bool = False


FEW = 2  # evictable connections a prefix may hold and keep their grace period
KNOWN_FOR = 3600.0  # seconds a prefix counts as a site's after its last connection with an accepted call closed


class Evictable:
    """One lane's evictable connections (no accepted call, not busy), indexed so that choosing a victim is O(1): per
    prefix, its connections oldest first; per count, the prefixes holding that many (an LFU-style bucket list), and
    the largest count."""

    def __init__(self) -> None:
        self.order: OrderedDict[Conn, None] = OrderedDict()  # every one, oldest first
        self.idle: dict[str, OrderedDict[Conn, None]] = {}  # prefix -> its connections, oldest first
        self.buckets: dict[int, OrderedDict[str, None]] = {}  # n -> prefixes with n connections
        self.top = 0

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

    def add(self, c: Conn) -> None:
        self.order[c] = None
        d = self.idle.setdefault(c.prefix, OrderedDict())
        d[c] = None
        self._move(c.prefix, len(d) - 1, len(d))

    def remove(self, c: Conn) -> None:
        d = self.idle.get(c.prefix)
        if d is None or c not in d:
            return
        del d[c]
        del self.order[c]
        self._move(c.prefix, len(d) + 1, len(d))
        if not d:
            del self.idle[c.prefix]

    def oldest(self, pfx: str | None = None) -> Conn | None:
        """The oldest connection of `pfx`, or of all."""
        d = self.order if pfx is None else self.idle.get(pfx)
        return next(iter(d)) if d else None

    def victim(self, now: float, grace: float, min_age: float, tries: int = 8) -> Conn | None:
        """The oldest connection of the prefix holding the most. The grace period protects a prefix's connections
        only while it holds at most `FEW` (a site opens one or two at a time; a storm, many): such a prefix whose
        oldest is in its grace is passed over, and at most `tries` are looked at (bounded: O(1)). When every one looked
        at is in its grace (a storm from many prefixes keeps all slots fresh), the oldest of all goes, if it is
        `min_age` old: a site's new connection has that long for its first call."""
        for n in range(self.top, 0, -1):  # top is at most --max-per-peer
            for pfx in self.buckets.get(n, ()):
                c = next(iter(self.idle[pfx]))
                if n > FEW or now - c.opened >= grace:
                    return c
                tries -= 1
                if tries <= 0:
                    return self.past(now, min_age)
        return self.past(now, min_age)

    def past(self, now: float, min_age: float) -> Conn | None:
        c = self.oldest()
        return c if c is not None and now - c.opened >= min_age else None


class Slots:
    """The served connections, in two lanes. A newcomer from a site's prefix (one holding a connection with an
    accepted call, or that held one within KNOWN_FOR) is in the sites' lane; anyone else is a stranger. Strangers
    together hold at most `stranger_max` connections, whatever the number of their prefixes, so the rest of
    `capacity` is the sites' room; one site prefix holds at most `per_site` of it (a second site is admitted at once).
    A connection on which the SuperLink accepted a call is never a victim, nor one whose call is with it now."""

    def __init__(self, capacity: int, per_prefix: int, grace: float, min_age: float = 0.0,
                 stranger_max: int | None = None, per_site: int | None = None,
                 suspect: Callable[[str], bool] = lambda pfx: False):
        self.capacity, self.per_prefix, self.grace, self.min_age = capacity, per_prefix, grace, min_age
        self.suspect = suspect  # whether the SuperLink refused a call from a prefix lately
        self.stranger_max = max(1, capacity // 2) if stranger_max is None else stranger_max
        self.per_site = max(FEW, (capacity - self.stranger_max) // 4) if per_site is None else per_site
        self.total = 0
        self.strangers: dict[str, int] = {}  # prefix -> strangers' connections (no accepted call; busy ones too)
        self.n_strangers = 0
        self.stranger_lane, self.site_lane = Evictable(), Evictable()
        self.newcomers: dict[str, int] = {}  # site prefix -> its sites'-lane connections without an accepted call
        self.sites: dict[str, int] = {}  # prefix -> its open connections with an accepted call
        self.known: dict[str, float] = {}  # prefix -> when its last such connection closed (forgotten after KNOWN_FOR)

    def __len__(self) -> int:
        return self.total

    @property
    def top(self) -> int:
        return self.stranger_lane.top

    def is_site(self, pfx: str) -> bool:
        """Whether `pfx` holds a connection with an accepted call, or held one within KNOWN_FOR."""
        if pfx in self.sites:
            return True
        seen = self.known.get(pfx)
        if seen is not None and time.monotonic() - seen > KNOWN_FOR:
            del self.known[pfx]
            return False
        return seen is not None

    def _lane(self, c: Conn) -> Evictable:
        return self.site_lane if c.site_room else self.stranger_lane

    # events ----------------------------------------------------------------------------------------------------------
    def admit(self, ip: str, pfx: str, now: float | None = None) -> tuple[Conn | None, Conn | None, str]:
        """A slot for a new connection: (the connection, a connection without an accepted call to close for it, or
        why not)."""
        now = time.monotonic() if now is None else now
        c = Conn(ip, pfx, now, site_room=self.is_site(pfx))
        victim, why = self._for_site(pfx, now) if c.site_room else self._for_stranger(pfx, now)
        if why:
            return None, None, why
        if victim is not None:
            self.drop(victim)
            victim.evicted = True
        self.total += 1
        if c.site_room:
            self.newcomers[pfx] = self.newcomers.get(pfx, 0) + 1
        else:
            self.strangers[pfx] = self.strangers.get(pfx, 0) + 1
            self.n_strangers += 1
        self._lane(c).add(c)
        return c, victim, ""

    def _for_stranger(self, pfx: str, now: float) -> tuple[Conn | None, str]:
        lane = self.stranger_lane
        if self.strangers.get(pfx, 0) >= self.per_prefix:
            c = lane.oldest(pfx)  # the prefix's own oldest makes way (a site behind a NAT)
            if c is None or now - c.opened < self.grace:
                return None, f"{self.strangers[pfx]} connections without an accepted call from {pfx} (--max-per-peer)"
            return c, ""
        if self.n_strangers < self.stranger_max and self.total < self.capacity:
            return None, ""
        c = lane.victim(now, self.grace, self.min_age) or self._for_clean(pfx)
        if c is None:
            full = (f"all {self.stranger_max} strangers' slots (half of --max-connections)"
                    if self.n_strangers >= self.stranger_max else f"all {self.capacity} slots")
            return None, f"{full} taken by calls in flight or fresh connections; the rest is the sites'"
        return c, ""

    def _for_clean(self, pfx: str, tries: int = 8) -> Conn | None:
        """A newcomer from a prefix not refused lately, by the SuperLink or the gateway (a new site's, as far as the
        gateway can tell) takes the place of the oldest of a refused prefix's connections, however young: a flood of refused
        strangers reconnecting keeps every slot fresh, and would take every freed slot before a new site's handshake.
        At most `tries` are looked at (O(1))."""
        if self.suspect(pfx):
            return None
        for c in itertools.islice(self.stranger_lane.order, tries):
            if self.suspect(c.prefix):
                return c
        return None

    def _for_site(self, pfx: str, now: float) -> tuple[Conn | None, str]:
        """A site's newcomer (a site reconnecting, or its second connection) takes the place of its own oldest past
        the grace period when its prefix holds its share of the sites' room; else, when every slot is taken, of the
        oldest stranger's, however young (a storm keeps every slot younger than `min_age`), or of the oldest
        sites'-lane newcomer past its grace."""
        held = self.sites.get(pfx, 0) + self.newcomers.get(pfx, 0)
        if held >= self.per_site:
            c = self.site_lane.oldest(pfx)
            if c is None or now - c.opened < self.grace:
                return None, f"{pfx} holds {held} connections of the sites' room (a quarter of the half of " \
                             "--max-connections that strangers cannot take)"
            return c, ""
        if self.total < self.capacity:
            return None, ""
        c = self.stranger_lane.oldest() or self.site_lane.past(now, self.grace)
        if c is None:
            return None, f"all {self.capacity} slots taken by sites and calls in flight (--max-connections)"
        return c, ""

    def busy(self, c: Conn, on: bool) -> None:
        """A call of `c` goes to the SuperLink (on) or came back (off)."""
        if c.closed or c.busy == on:
            return
        c.busy = on
        if on:
            self._lane(c).remove(c)
        elif not c.authed:
            self._lane(c).add(c)

    def accepted(self, c: Conn) -> None:
        """The SuperLink accepted a call on `c`: it is a site's from now on."""
        if c.authed or c.closed:
            return
        self._lane(c).remove(c)
        self._newcomer_gone(c)
        c.authed = True
        self.sites[c.prefix] = self.sites.get(c.prefix, 0) + 1

    def drop(self, c: Conn) -> None:
        """`c` is closed (or about to be, by eviction)."""
        if c.closed:
            return
        c.closed = True
        self._lane(c).remove(c)
        self.total -= 1
        if not c.authed:
            self._newcomer_gone(c)
        else:
            self._site_gone(c.prefix)

    def _site_gone(self, pfx: str) -> None:
        n = self.sites[pfx] - 1
        if n:
            self.sites[pfx] = n
        else:
            del self.sites[pfx]
            self.known[pfx] = time.monotonic()

    def _newcomer_gone(self, c: Conn) -> None:
        """`c`, without an accepted call, leaves its lane's counts."""
        counts = self.newcomers if c.site_room else self.strangers
        n = counts[c.prefix] - 1
        if n:
            counts[c.prefix] = n
        else:
            del counts[c.prefix]
        if not c.site_room:
            self.n_strangers -= 1


class Calls:
    """Strangers' calls with the SuperLink at once: `total` together, whatever the number of their prefixes, at most
    an eighth of them from one prefix, and at most half from prefixes refused lately (by the SuperLink, or by the gateway
    for load), so a
    new site (a prefix never refused) always finds room that a flood of refused calls cannot take. Sites' calls are not
    counted: they go to the SuperLink on a connection pool of their own."""

    def __init__(self, total: int):
        self.total = max(1, total)
        self.held = self.refused = 0
        self.per_prefix: dict[str, int] = {}

    @property
    def prefix_max(self) -> int:
        return max(1, self.total // 8)

    def take(self, pfx: str, refused: bool) -> str:
        """A slot for a stranger's call from `pfx` (`refused`: the prefix was refused lately); why not, or ''."""
        mine = self.per_prefix.get(pfx, 0)
        if self.held >= self.total:
            return f"{self.held} calls of connections without an accepted call are with the SuperLink"
        if refused and self.refused >= self.total // 2:
            return f"{self.refused} calls from prefixes refused lately are with the SuperLink"
        if mine >= self.prefix_max:
            return f"{mine} calls from {pfx} without an accepted call are with the SuperLink"
        self.held += 1
        self.refused += refused
        self.per_prefix[pfx] = mine + 1
        return ""

    def give(self, pfx: str, refused: bool) -> None:
        self.held -= 1
        self.refused -= refused
        left = self.per_prefix[pfx] - 1
        if left:
            self.per_prefix[pfx] = left
        else:
            del self.per_prefix[pfx]


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

    def fresh(self, pfx: str, now: float | None = None) -> bool:
        """Whether nothing was taken for `pfx` in the last burst / rate seconds (2 s: what `sweep` forgets): a new
        site's first try is, a storm's prefixes coming back every second or faster are not."""
        now = time.monotonic() if now is None else now
        seen = self.buckets.get(pfx)
        return seen is None or now - seen[1] >= self.burst / self.rate

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

    def seen(self, pfx: str, now: float | None = None) -> bool:
        """Whether `pfx` was counted in the current window."""
        return self._current(pfx, time.monotonic() if now is None else now)[1] > 0

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
