"""Quotas on the inputs (seed 004's part on Kafka's quotas): pure logic.

Two quotas on each stream listener, and a rate quota on the datagram socket, all off
unless ``<quotas>`` sets them:

- **Connection quota** (Kafka's ``ConnectionQuotas``, per listener): above
  ``maxConnections`` open connections a new one is refused: closed at once and counted.
  The connections already open are not touched. Kafka makes the acceptor wait instead; a
  daemon on one event loop must not stop accepting for everyone, so pydory closes the
  newcomer and lets it retry.
- **Client rate quota by delay, not by error** (KIP-13): a client above its byte or
  message rate is not refused anything; its reads are paused for the throttle time, the
  time it takes for the rate measured over the window to fall back to the quota if the
  client sent nothing more meanwhile. A runaway client is slowed (its writes block on its
  full socket buffer); it loses nothing, and the other clients never wait for it.
- **A client is a uid** on every transport (pydory.daemon.inputs.peers: SO_PEERCRED on a
  UNIX stream, the owner of the client's socket on loopback TCP, SCM_CREDENTIALS on a
  datagram): every connection of one uid on a listener shares one measurement, so
  opening eight connections buys a program nothing. Each listener (and the datagram
  socket) measures its own clients against its own quota: a uid sending on two
  transports is held to each one's quota apart, as each is sized apart in the config
  (a TCP listener's IPv4 and IPv6 sockets are one listener). A connection whose uid the
  kernel does not name is a client of its own.
- **Datagrams over the quota are discarded** (:class:`DatagramQuota`), counted as
  ``rate_limit`` discards of their topic, as Dory's per-topic rate limit does, and apart
  in ``quota_discards_unix_dgram``. Slowing the client, as on a stream, is impossible:
  one socket carries every client's datagrams, and not reading it would stall them all.
  Holding the excess in memory would only move the flood into the daemon, and a bounded
  hold must discard at its bound anyway, later and at a cost. A datagram sender already
  accepts loss (fire and forget: the kernel drops what a full queue cannot take, and
  tells no one); here each loss is counted and its topic named.

The throttle is KIP-13's: ``(rate - quota) / quota * window``, i.e. ``total / quota -
elapsed``, the time it takes for the rate measured over the window to fall back to the
quota if the client sends nothing more. One thing differs from Kafka's sampled window
(``SampledStat``: samples older than the window are forgotten, the elapsed time at least
``samples - 1`` samples): there, a throttle longer than the window forgets the bytes that
caused it, and the next read gets most of a window of credit again; with reads as large
as a socket read (256 KiB under uvloop) against a small quota, a client obeying every
throttle runs above its quota (256 KiB reads against 100 KiB/s over a 1 s window of 10
samples: waits of 2.56 - 0.9 s, 1.5 times the quota). Here the window is the last
``window`` seconds, reaching further back only over time the client has not yet paid for,
so nothing is forgotten before it is paid. Kept as one number per quantity: the moment
everything the client sent is paid for at the quota (:class:`RateWindow`, the generic
cell rate algorithm of ATM networks in other words). What follows, and is checked by a
property test: a client never sends more than ``quota * (T + window)`` plus one read over
any T seconds, its long-run rate is its quota, and a client that keeps within its quota
(reads no larger than a window's worth) is never throttled.

Rule: nothing here (:class:`ListenerQuota`, :class:`ClientQuota`, :class:`DatagramQuota`)
does I/O or reads a clock of its own: the caller passes ``now`` (the
input agent reads its injected clock), and the input agents act: the pausing
(pydory.daemon.inputs.stream_connection), the discarding (pydory.daemon.inputs.datagram).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

from pydory.config.model import ClientRate, ListenerQuotas

#: Float rounding forgiven when a datagram exactly fills the window (50 * 0.2 s != 10 s).
_ROUNDING_S = 1e-9

__all__ = [
    "ClientQuota",
    "DatagramQuota",
    "ListenerQuota",
    "RateWindow",
]


class RateWindow:
    """One quantity (bytes or messages) a client sends, measured against its quota over
    a window.

    The state is one time, :attr:`paid_at`: when everything the client sent will have
    been paid for at the quota, counting from one window back at most. The client sent
    ``total = (paid_at - start) * quota`` since its window's ``start``, which is
    ``now - window`` for a client within its quota and earlier for one that is not, so
    ``paid_at - now`` is KIP-13's throttle ``total / quota - (now - start)``.
    """

    __slots__ = ("_seconds_per_unit", "paid_at", "quota_per_s", "window_s")

    def __init__(self, quota_per_s: float, window_s: float) -> None:
        if quota_per_s <= 0 or window_s <= 0:
            raise ValueError("a rate window needs a positive quota and length")
        self.quota_per_s = quota_per_s
        self.window_s = window_s
        self._seconds_per_unit = 1.0 / quota_per_s
        self.paid_at = -math.inf

    def record(self, now: float, amount: float) -> float:
        """Count ``amount`` sent at ``now``; return how long the client must now wait for
        its rate over the window to be back at the quota (0.0: it is within it)."""
        paid_at = self.paid_at
        start = now - self.window_s
        if paid_at < start:
            paid_at = start  # paid up: the credit is one window's worth, no more
        paid_at += amount * self._seconds_per_unit
        self.paid_at = paid_at
        wait = paid_at - now
        return wait if wait > 0.0 else 0.0

    def fits(self, now: float, amount: float) -> bool:
        """Whether ``amount`` sent at ``now`` keeps the rate over the window within the
        quota; if so it is counted, else nothing is (a refused datagram costs nothing)."""
        paid_at = self.paid_at
        start = now - self.window_s
        if paid_at < start:
            paid_at = start
        paid_at += amount * self._seconds_per_unit
        if paid_at > now + _ROUNDING_S:
            return False
        self.paid_at = paid_at
        return True

    def rate(self, now: float) -> float:
        """The rate measured over the window at ``now``: what was sent in the last window
        and is not yet paid for, per second of the window. It is back at the quota
        exactly when the throttle :meth:`record` returned is over."""
        unpaid_s = self.paid_at - (now - self.window_s)
        return unpaid_s * self.quota_per_s / self.window_s if unpaid_s > 0.0 else 0.0


class ClientQuota:
    """One client's rate quota: its windows for bytes and messages (shared by every
    connection of a UNIX uid on one listener)."""

    __slots__ = ("bytes", "connections", "key", "messages")

    def __init__(self, key: Hashable, rate: ClientRate) -> None:
        self.key = key
        self.connections = 0  # connections of this client open on the listener
        window_s = rate.window_ms / 1000
        self.bytes = (
            None if rate.bytes_per_sec is None else RateWindow(rate.bytes_per_sec, window_s)
        )
        self.messages = (
            None if rate.msgs_per_sec is None else RateWindow(rate.msgs_per_sec, window_s)
        )

    def on_read(self, now: float, nbytes: int, messages: int) -> float:
        """Count a read of ``nbytes`` bytes holding ``messages`` whole messages; return how
        long this client must wait before its next read (0.0: read on), the longer of
        the byte and the message quotas' throttles."""
        wait = 0.0
        if self.bytes is not None:
            wait = self.bytes.record(now, nbytes)
        if self.messages is not None:
            wait = max(wait, self.messages.record(now, messages))
        return wait

    def admits(self, now: float, nbytes: int) -> bool:
        """Whether one datagram of ``nbytes`` keeps this client within both its rates; if
        so it is counted in both, else in neither."""
        bytes_window, messages = self.bytes, self.messages
        if bytes_window is not None:
            saved = bytes_window.paid_at
            if not bytes_window.fits(now, nbytes):
                return False
            if messages is not None and not messages.fits(now, 1):
                bytes_window.paid_at = saved
                return False
            return True
        return messages is None or messages.fits(now, 1)


@dataclass
class QuotaStats:
    """What the quotas of one listener did (the input agent also counts them in the
    daemon's counters)."""

    refused_connections: int = 0
    throttles: int = 0
    throttled_s: float = 0.0


class ListenerQuota:
    """The quotas of one listener: its connection limit and its clients' rate windows.

    The input agent asks :meth:`admit` when a connection is made (with the number open),
    :meth:`attach` for the connection's :class:`ClientQuota` (None when no rate quota is
    set: the read path then does nothing), :meth:`detach` when it closes.
    :meth:`configure` replaces the settings at run time (a config reload).
    """

    def __init__(self, settings: ListenerQuotas) -> None:
        self.settings = settings
        self._clients: dict[Hashable, ClientQuota] = {}
        self.stats = QuotaStats()

    @property
    def rate_limited(self) -> bool:
        """Whether a client rate quota is set (connections then carry a ClientQuota)."""
        return self.settings.client_rate.limited

    def configure(self, settings: ListenerQuotas) -> None:
        """New settings. The connection limit applies to connections made from now on
        (those open stay open); clients attached afterwards get fresh rate windows."""
        self.settings = settings
        self._clients.clear()

    def admit(self, open_connections: int) -> bool:
        """Whether a new connection may stay, ``open_connections`` being open already;
        a refusal is counted."""
        limit = self.settings.max_connections
        if limit is None or open_connections < limit:
            return True
        self.stats.refused_connections += 1
        return False

    def attach(self, key: Hashable) -> ClientQuota | None:
        """The rate quota of the client ``key`` for one more of its connections (the one
        its other connections on this listener share), or None if no rate is limited."""
        rate = self.settings.client_rate
        if not rate.limited:
            return None
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = ClientQuota(key, rate)
        client.connections += 1
        return client

    def detach(self, client: ClientQuota) -> None:
        """One connection of ``client`` closed; forget the client with its last one."""
        client.connections -= 1
        if client.connections <= 0 and self._clients.get(client.key) is client:
            del self._clients[client.key]

    def throttled(self, seconds: float) -> None:
        """Count a throttle of ``seconds`` imposed on a connection."""
        self.stats.throttles += 1
        self.stats.throttled_s += seconds

    @property
    def clients(self) -> int:
        """Clients with a rate window now (connected and rate limited)."""
        return len(self._clients)

    def connections_by_client(self) -> dict[Hashable, int]:
        """Each client with a rate window now, and its connections open on the listener
        (a uid is ``("uid", n)``; a connection the kernel named no uid for is itself)."""
        return {key: client.connections for key, client in self._clients.items()}


class DatagramQuota:
    """The rate quota of the datagram socket: one :class:`ClientQuota` per sender's uid,
    judged per datagram (admitted and counted, or refused and not counted).

    A uid's window is forgotten once it is paid up (it then equals a fresh one), when
    more than FORGET_ABOVE uids are known: root can claim any uid in its credentials,
    and must not grow this without bound.
    """

    FORGET_ABOVE = 1024

    def __init__(self, rate: ClientRate) -> None:
        if not rate.limited:
            raise ValueError("a datagram quota needs a byte or message rate")
        self.rate = rate
        self._clients: dict[int, ClientQuota] = {}
        self.discarded = 0

    def admits(self, uid: int, now: float, nbytes: int) -> bool:
        """Whether the datagram of ``nbytes`` from ``uid`` is within its quota; a
        refusal is counted in :attr:`discarded`."""
        client = self._clients.get(uid)
        if client is None:
            if len(self._clients) >= self.FORGET_ABOVE:
                self._forget_paid_up(now)
            client = self._clients[uid] = ClientQuota(uid, self.rate)
        if client.admits(now, nbytes):
            return True
        self.discarded += 1
        return False

    def _forget_paid_up(self, now: float) -> None:
        idle = [
            uid
            for uid, client in self._clients.items()
            if all(w is None or w.rate(now) == 0.0 for w in (client.bytes, client.messages))
        ]
        for uid in idle:
            del self._clients[uid]

    @property
    def clients(self) -> int:
        """Senders with a rate window now."""
        return len(self._clients)
