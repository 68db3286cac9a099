"""Write-ahead: what the daemon reads reaches the spool before any of it reaches librdkafka.

Each read burst is appended to the spool as it came from the clients (Dory's own message
bytes: topic, key, value, timestamp and partition key, each framed with its length and
CRC), in one write, before intake admits a single message of it. A segment of the spool
is deleted once every message in it is settled, so what a crashed daemon leaves on disk
is exactly what it had not finished with; the next start replays it (``spool/lifecycle.py``).

Settling needs no bookkeeping per message: :class:`WriteAhead` stands in for the commit
point before intake and the delivery ledger, and folds the spool segment into the token
every accepted message already carries to its outcome. ``close(token, n)`` then settles
``n`` messages of the commit point's generation *and* of the segment. Messages of a burst
that are never accepted (malformed, too long, rate limited...) are settled when the burst
ends: they are reported by then.

Each message of a burst is named where it was written (``identity``: its segment's stream,
its frame number; a replayed message keeps the name it was first given), and its name
goes to Kafka with it (``begin_burst`` returns the headers). The tokens are also the
groups whose settled frames are marked in the spool (``acks.SettledGroups``): a burst
joins the group of its first accepted message, and a crash replays only the frames of
groups not wholly settled. What became of a group's messages is marked with its frames,
and what became of a segment's is folded into the run's books file before the segment
goes (``tallies``: the ledger tells :meth:`WriteAhead.settled_as` first).

When the spool cannot take a burst (its size cap, a full or failing disk), the burst is
processed without the write-ahead, counted (``spool_unprotected`` messages), and the
caller's overload policy decides whether the inputs pause until the spool has room.

Rule: a burst reaches admission's checks only after it is in the spool (or counted as
unprotected when the disk refuses it; datagrams over their sender's quota, discarded
unread, are never spooled), and a spool segment is settled only through the tokens
:class:`WriteAhead` hands out.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import DiscardReason
from pydory.daemon.spool.acks import SettledGroups
from pydory.daemon.spool.corrupt import CorruptRegion
from pydory.daemon.spool.errors import SpoolError
from pydory.daemon.spool.identity import Headers, MessageIds
from pydory.daemon.spool.records import SpoolRecord
from pydory.daemon.spool.recovery import RecoveryReport
from pydory.daemon.spool.segments import Spool
from pydory.daemon.spool.tallies import SegmentTallies, Tally
from pydory.wire import encode_any_partition, encode_partition_key

log = logging.getLogger(__name__)

__all__ = [
    "REPLAY_BURST",
    "SEGMENT_SHIFT",
    "Replay",
    "SpoolWriter",
    "WriteAhead",
    "delete_replayed_segments_when_settled",
    "replay_spool",
]

#: Replayed messages are admitted this many at a time, each burst once the pool has room:
#: memory stays bounded by the pool plus one burst, however large the spool.
REPLAY_BURST = 1000

#: A token is ``segment << SEGMENT_SHIFT | generation``: commit point generations are
#: 10 ms epochs, so 2**48 of them outlast any process; segment 0 means "not spooled".
SEGMENT_SHIFT = 48
_GENERATION_MASK = (1 << SEGMENT_SHIFT) - 1


class SpoolWriter(Protocol):
    """The part of :class:`pydory.daemon.spool.segments.Spool` the write-ahead uses."""

    last_append: tuple[int, int]
    last_identity: tuple[int, int]

    def append_payloads(
        self, payloads: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> int: ...
    def read_frames(self, segment_id: int, start: int, end: int) -> list[SpoolRecord]: ...
    def settle(self, segment_id: int, count: int) -> None: ...
    def acknowledge(
        self, segment_id: int, stream: int, ranges: list[tuple[int, int]], tally: Tally
    ) -> None: ...

    before_fold: Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class _DeferredBurst:
    """A burst kept on disk only (the ``spool`` overload policy): where its frames are,
    and the commit point generation that counts its messages until they settle."""

    segment: int
    start: int
    end: int
    count: int
    generation: int
    stream: int
    first: int


class WriteAhead:
    """The commit point's ``open``/``close`` for intake and the ledger, spool included."""

    def __init__(
        self,
        commit_point: CommitPoint,
        spool: SpoolWriter,
        counters: Counters,
        on_spool_trouble: Callable[[SpoolError], None] = lambda error: None,
        ids: MessageIds | None = None,
        on_fold: Callable[[int, int, Tally], None] = lambda segment, stream, tally: None,
    ) -> None:
        """``on_spool_trouble`` hears every refused write (the overload policy's cue);
        ``ids`` names the messages (the daemon's; a headerless one by default);
        ``on_fold(segment, stream, tally)``: a segment stream's outcomes, just before the
        segment is deleted or cut back (the run's books file keeps them)."""
        self._commit_point = commit_point
        self._spool = spool
        self._counters = counters
        self._on_spool_trouble = on_spool_trouble
        self._segment = 0  # the segment of the burst being admitted; 0 outside a burst
        self._burst_size = 0
        self._opened = 0
        self._ids = ids if ids is not None else MessageIds("-", 1, headers=False)
        self._stream = self._first = 0  # where the burst's frames are, in its segment
        self._burst_token = 0  # the group the burst joined (its first accepted message's)
        self._groups: SettledGroups | None = SettledGroups(spool.acknowledge)
        self._tallies = SegmentTallies()
        self._on_fold = on_fold
        spool.before_fold = self._fold
        self._failing = False  # log a spool problem once per episode, not per burst
        self._deferred: collections.deque[_DeferredBurst] = collections.deque()
        #: While a deferred burst is admitted: the generation its messages already hold.
        self._resumed_generation: int | None = None
        #: Set while bursts wait on disk for memory (``spool/lifecycle.py``'s drainer waits on it).
        self.deferred_waiting = asyncio.Event()

    # -- a burst -------------------------------------------------------------------------

    def begin_burst(
        self, burst: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> Sequence[Headers | None]:
        """Write ``burst`` ahead, in one write, before intake admits any of it; return
        each message's headers for ``produce`` (its identity). ``origins``: a replayed
        burst's first identities (None for one that had none)."""
        self._opened = self._burst_token = 0
        self._burst_size = len(burst)
        try:
            self._segment = self._spool.append_payloads(burst, origins)
        except SpoolError as error:  # the size cap or the disk: reported, the policy decides
            self._segment = 0
            self._counters.inc(counter_names.SPOOL_UNPROTECTED, len(burst))
            if not self._failing:
                log.warning("spool: cannot write ahead (%s); messages go unprotected", error)
                self._failing = True
            self._on_spool_trouble(error)
            return self._headers(origins, self._ids.unspooled_run(len(burst)))
        if self._failing:
            log.warning("spool: writing ahead again")
            self._failing = False
        self._stream, self._first = stream, first = self._spool.last_identity
        return self._headers(origins, self._ids.spooled_run(stream, first, self._burst_size))

    def _headers(
        self, origins: Sequence[bytes | None] | None, fresh: Sequence[Headers | None]
    ) -> Sequence[Headers | None]:
        return fresh if origins is None else self._ids.replayed(origins, fresh)

    def end_burst(self) -> None:
        """Settle the burst's messages that were never accepted: they are reported now."""
        unaccepted = self._burst_size - self._opened
        if self._resumed_generation is not None and unaccepted:
            self._commit_point.close(self._resumed_generation, unaccepted)
        if self._segment and unaccepted:  # marked before they settle (see close)
            if self._groups is not None and self._burst_token:
                self._groups.settled(self._burst_token, unaccepted)
            elif self._groups is not None:  # none accepted: all settled now
                ranges = [(self._first, unaccepted)]
                self._spool.acknowledge(self._segment, self._stream, ranges, {})
            self._spool.settle(self._segment, unaccepted)
        self._segment = self._burst_size = self._opened = self._burst_token = 0
        self._resumed_generation = None

    # -- the spool overload policy: bursts kept on disk only while memory is short ---------

    @property
    def deferring(self) -> bool:
        """Whether bursts wait on disk: new ones must wait behind them, in order."""
        return bool(self._deferred)

    def defer_burst(self) -> bool:
        """Keep the burst just written on disk only, to be admitted once memory frees
        (:meth:`resume_deferred`); False if it did not reach the spool. Its messages hold
        the commit point back from now on: they were received."""
        if not self._segment:
            return False
        start, end = self._spool.last_append
        generation = self._commit_point.open(self._burst_size)
        self._deferred.append(
            _DeferredBurst(
                self._segment, start, end, self._burst_size, generation, self._stream, self._first
            )
        )
        self._counters.inc(counter_names.SPOOL_DEFERRED, self._burst_size)
        self._segment = self._burst_size = self._opened = 0  # nothing to settle now
        self.deferred_waiting.set()
        return True

    def resume_deferred(self) -> tuple[list[bytes], Sequence[Headers | None]] | None:
        """Read the oldest deferred burst back and begin admitting it (end with
        :meth:`end_burst`): its messages and their headers; None when none waits. A burst
        that cannot be read back stays in the spool for the next start, and is reported."""
        while self._deferred:
            burst = self._deferred.popleft()
            if not self._deferred:
                self.deferred_waiting.clear()
            try:
                frames = self._spool.read_frames(burst.segment, burst.start, burst.end)
            except SpoolError:
                log.exception("spool: a deferred burst cannot be read back; left for replay")
                self._commit_point.close(burst.generation, burst.count)
                self._counters.inc(counter_names.SPOOL_DEFERRED_UNREADABLE, burst.count)
                continue
            self._segment, self._burst_size, self._opened = burst.segment, burst.count, 0
            self._burst_token = 0
            self._stream, self._first = burst.stream, burst.first
            self._resumed_generation = burst.generation
            fresh = self._ids.spooled_run(burst.stream, burst.first, burst.count)
            origins = [frame.key or None for frame in frames]
            payloads = [frame.value for frame in frames]
            return payloads, self._headers(origins if any(origins) else None, fresh)
        return None

    def abandon_deferred(self) -> int:
        """Shutdown: what still waits on disk stays there for the next start (replayed
        then); it no longer holds this run's commit point. Returns how many messages."""
        left = 0
        while self._deferred:
            burst = self._deferred.popleft()
            self._commit_point.close(burst.generation, burst.count)
            left += burst.count
        self.deferred_waiting.clear()
        return left

    # -- the commit point's interface ------------------------------------------------------

    def open(self, n: int = 1) -> int:
        """``n`` messages were accepted: their token names their generation and their
        segment. A message of a deferred burst keeps the generation it was counted in
        when read."""
        self._opened += n
        generation = self._resumed_generation
        if generation is None:
            generation = self._commit_point.open(n)
        token = generation | (self._segment << SEGMENT_SHIFT)
        if token != self._burst_token and self._segment:
            self._join_group(token)
        return token

    def _join_group(self, token: int) -> None:
        """The burst's first accepted message: the burst joins its token's group. (A
        burst's generation never changes within it; if it did, marking would stop for
        the rest of the run, the old full replay.)"""
        groups = self._groups
        if groups is None:
            return
        if self._burst_token:
            log.warning("spool: a burst spans two commit point generations: no more marks")
            self._groups = None
            return
        self._burst_token = token
        groups.joined(token, self._segment, self._stream, self._first, self._burst_size)

    def close(self, token: int, n: int = 1) -> None:
        """``n`` messages under ``token`` are settled: in the commit point and the spool."""
        self._commit_point.close(token & _GENERATION_MASK, n)
        segment = token >> SEGMENT_SHIFT
        if segment:
            # The group's mark first: once the segment settles it may be folded (a crash
            # then must find every frame of it marked, none handed over a second time).
            if self._groups is not None:
                self._groups.settled(token, n)
            self._spool.settle(segment, n)

    def settled_as(self, token: int, topic: str, outcome: str, n: int = 1) -> None:
        """``n`` accepted messages of ``topic`` under ``token`` met their final
        ``outcome`` (told before :meth:`close`, which may mark or fold them)."""
        segment = token >> SEGMENT_SHIFT
        if segment:
            self._tallies.settled(segment, topic, outcome, n)
            if self._groups is not None:
                self._groups.tally(token, topic, outcome, n)

    def _fold(self, segment: int, stream: int) -> None:
        self._on_fold(segment, stream, self._tallies.take(segment))

    def keep(self, token: int, n: int = 1) -> None:
        """Shutdown: ``n`` messages under ``token`` stay in their segment for the next
        start (which replays them); only this run's commit point lets them go."""
        self._commit_point.close(token & _GENERATION_MASK, n)

    @staticmethod
    def in_spool(token: int) -> bool:
        """Whether the message under ``token`` is in a spool segment (one the write-ahead
        could not write is accepted unprotected: its token names no segment)."""
        return token >> SEGMENT_SHIFT != 0


class Replayer(Protocol):
    """Where replayed messages go (``Intake``)."""

    hold_when_memory_short: bool

    def replayed(
        self, burst: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Replay:
    """What :func:`replay_spool` did: the recovery's report, and how many replayed
    messages the spool could not take again (a full disk): while any of those is
    unsettled the old segments are their only copy, so they stay (``old_segments_kept``)
    until :func:`delete_replayed_segments_when_settled`."""

    report: RecoveryReport
    unprotected: int

    @property
    def old_segments_kept(self) -> bool:
        """Whether the previous run's segments are still on disk, waiting."""
        return self.unprotected > 0


async def replay_spool(
    spool: Spool,
    intake: Replayer,
    wait_for_room: Callable[[], Awaitable[None]],
    books: Books,
) -> Replay:
    """Admit again, oldest first, every message an earlier run left unsettled in ``spool``;
    then delete the old segments (their messages are in this run's segments by then), unless
    the spool refused some of them (:class:`Replay`).

    Runs before the inputs open. A message is never discarded for memory here: each burst
    waits until the pool has room, and is charged whole. The messages of a damaged region
    are discarded in ``books`` as ``spool_corrupt``, one discard per message lost.
    """
    held = intake.hold_when_memory_short
    intake.hold_when_memory_short = True
    burst: list[bytes] = []
    origins: list[bytes | None] = []
    unprotected = 0
    try:
        for record, origin in spool.recover_identified(functools.partial(_count_corrupt, books)):
            burst.append(record.value if record.is_payload else _as_client_message(record))
            origins.append(origin)
            if len(burst) >= REPLAY_BURST:
                unprotected += await _replay_burst(spool, intake, burst, origins, wait_for_room)
                burst, origins = [], []
        if burst:
            unprotected += await _replay_burst(spool, intake, burst, origins, wait_for_room)
    finally:
        intake.hold_when_memory_short = held
    if not unprotected:
        spool.finish_recovery()
    return Replay(spool.recovery_report, unprotected)


async def _replay_burst(
    spool: Spool,
    intake: Replayer,
    burst: list[bytes],
    origins: list[bytes | None],
    wait_for_room: Callable[[], Awaitable[None]],
) -> int:
    """Admit one replayed burst; return how many of its messages the spool refused."""
    await wait_for_room()
    appended = spool.appended_total
    # synchronous: nothing else appends meanwhile
    intake.replayed(burst, origins if any(origins) else None)
    refused = len(burst) - (spool.appended_total - appended)
    await asyncio.sleep(0)  # let delivery reports be served between bursts
    return refused


def _count_corrupt(books: Books, region: CorruptRegion) -> None:
    """Each message of a damaged region, discarded before acceptance in this run's books
    (no topic: its bytes cannot be trusted), with the region's first bytes."""
    where = f"{region.segment} bytes [{region.start}, {region.end})"
    detail = where if region.saved_as is None else f"{where}, saved as {region.saved_as}"
    for _ in range(region.messages):
        books.discarded(DiscardReason.SPOOL_CORRUPT, None, None, region.sample, detail)


async def delete_replayed_segments_when_settled(
    spool: Spool, commit_point: CommitPoint, replay_ended_at: float
) -> None:
    """The previous run's segments, kept because some replayed messages went unprotected
    (:class:`Replay`), deleted once every message replayed before ``replay_ended_at``
    (the commit point's wall clock) is settled. A stop first leaves them for the next
    start, which replays them again (counted as possible duplicates, as always)."""
    while not await commit_point.wait_past(replay_ended_at, 60.0):
        if commit_point.shutting_down:
            return
    problems = len(spool.recovery_report.problems)
    spool.finish_recovery()
    log.log(25, "spool: every replayed message settled: the previous run's segments deleted")
    for problem in spool.recovery_report.problems[problems:]:  # one it could not delete
        log.warning("spool: %s", problem)


def _as_client_message(record: SpoolRecord) -> bytes:
    """A structured spool record as the client message it stands for."""
    if record.partition_key is None:
        return encode_any_partition(record.topic, record.value, record.key, record.timestamp_ms)
    return encode_partition_key(
        record.topic, record.value, record.partition_key, record.key, record.timestamp_ms
    )
