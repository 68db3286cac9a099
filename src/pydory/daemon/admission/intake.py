"""Intake: from raw client bytes to an accepted message handed to dispatch.

Every step either passes the message on or discards it with a reason, in this order:

1. decode (pydory.wire)         -> malformed | unsupported_api_key | unsupported_version
                                   | bad_topic (illegal name)
2. size against messageMaxBytes -> too_long
3. memory pool (KIP-72)         -> no_memory (the pool, or its client's share of it:
                                   books/charges.py, counted no_memory_client_share)
4. per-topic rate limit         -> rate_limit
5. topic known to the cluster?  -> bad_topic (unless topicAutocreate: held, then routed);
                                   no metadata yet: held until the first metadata, then
                                   routed (or found bad, or auto-created)
6. partition choice and enqueue -> accepted; librdkafka refusing at once is a discard too

A message held at step 5 waits in the waiting room (``admission/waiting_room.py``), which
routes it through step 6 here when the metadata comes. It is charged to the memory pool like
any other (the overload policy applies to it), and holds the commit point back from the
moment it is held.

A burst is written ahead to the spool (``spool/write_ahead.py``) before any of its
messages is judged here; with the spool overload policy and memory short, it is kept on
disk and judged later (:meth:`Intake.admit_deferred`).

From "accepted" on, the message is the daemon's: dispatch reports it delivered or
discarded, and delivery's ``DeliveryLedger`` (delivery/outcomes.py) releases its pool
bytes at that moment. The commit point counts it from acceptance (or from being held for
metadata or autocreation) to that outcome: the token it hands out travels with the
message through dispatch and comes back to the ledger. Its identity (``produce``'s
headers: :mod:`pydory.daemon.spool.identity`) is given per burst, by the write-ahead
(or by ``ids`` without a spool), and travels with it to ``send``.

Rule: the moment a message is accepted is in :class:`Intake` alone (the ``BurstPath`` it hands a
burst to decides as its reference path would): a message passes every check above, in that
order, or is discarded with the reason of the first it fails; nothing after this module
refuses a message without an outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

from pydory.daemon.admission.burst_path import BurstPath
from pydory.daemon.admission.ratelimit import TopicRateLimiter
from pydory.daemon.admission.waiting_room import WaitingRoom
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import DEFAULT_UNKNOWN_TOPIC_LIMIT, Books
from pydory.daemon.books.charges import ClientTokens
from pydory.daemon.books.events import AFTER_ACCEPTANCE, DiscardReason, Transport
from pydory.daemon.books.msg_debug import MsgDebug
from pydory.daemon.books.pool import MemoryPool, message_cost, pool_cost
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.outcomes import EnqueueRefused, Tokens
from pydory.daemon.delivery.router import Router
from pydory.daemon.log_limits import ClientLines
from pydory.daemon.spool.identity import Headers, MessageIds
from pydory.daemon.spool.write_ahead import WriteAhead
from pydory.errors import (
    BadTopic,
    ClientProtocolError,
    MalformedMessage,
    OversizedFrame,
    UnsupportedApiKey,
    UnsupportedApiVersion,
)
from pydory.hotpath import parse_burst
from pydory.wire import Message, decode

log = logging.getLogger(__name__)

#: Kafka's per-record overhead in a v2 record batch, and the batch header: a message whose
#: key + value + this exceeds messageMaxBytes can never be accepted by the broker.
KAFKA_RECORD_OVERHEAD = 61 + 21
#: The topics the burst path sent when there is no burst path: none.
_NONE_TAKEN = frozenset[str]()


class Intake:
    """Admission and routing for every message the input agents receive."""

    def __init__(
        self,
        *,
        books: Books,
        pool: MemoryPool,
        limiter: TopicRateLimiter,
        router: Router,
        dispatcher: Dispatcher,
        commit_point: Tokens,
        message_max_bytes: int,
        prefix_size: int,
        on_unknown_topic: Callable[[str], None] = lambda topic: None,
        autocreate: Callable[[str], None] | None = None,
        msg_debug: MsgDebug | None = None,
        write_ahead: WriteAhead | None = None,
        unknown_topic_limit: int = DEFAULT_UNKNOWN_TOPIC_LIMIT,
        ids: MessageIds | None = None,
    ) -> None:
        """``ids``: names the messages without a spool (the write-ahead does with one);
        ``write_ahead``: spool every burst before admitting it (``<spool>``);
        ``unknown_topic_limit``: at most this many topics wait for their creation at once
        (``<maxUnknownTopics>``; a message for one more is a bad topic)."""
        self._books = books
        self._counters = books.counters
        # A client's errors come as fast as it sends them: a line per kind per minute.
        self._lines = ClientLines(log)
        self._pool = pool
        self._limiter = limiter
        self._router = router
        self._dispatcher = dispatcher
        #: The tokens name each accepted message's client and charge it to its share
        #: (books/charges.py); assembly hands the ClientTokens the ledger releases.
        tokens = (
            commit_point
            if isinstance(commit_point, ClientTokens)
            else ClientTokens(commit_point, pool.shares)
        )
        self._commit_point = self._tokens = tokens
        self._max_data = message_max_bytes - KAFKA_RECORD_OVERHEAD
        self._prefix_size = prefix_size
        #: Messages whose topic the metadata does not show yet (admission's step 5).
        self.waiting_room = WaitingRoom(
            books=books,
            pool=pool,
            router=router,
            tokens=tokens,
            enqueue=self._enqueue,
            on_unknown_topic=on_unknown_topic,
            autocreate=autocreate,
            write_ahead=write_ahead,
            creation_limit=unknown_topic_limit,
        )
        self._msg_debug = msg_debug if msg_debug is not None else MsgDebug.disabled()
        self._write_ahead = write_ahead
        self._ids = ids
        self._burst_path: BurstPath | None = None
        if BurstPath.usable():
            self._burst_path = BurstPath(
                pool,
                router,
                limiter.is_unlimited,
                tokens,
                dispatcher,
                self._msg_debug,
                self._refused,
            )
        #: When the pool is short, hold on to a message read (charging it anyway) instead
        #: of discarding it: the backpressure policy pauses the inputs meanwhile, and a
        #: spool replay waits for room between bursts. Either way the overshoot is one burst.
        self.hold_when_memory_short = False
        #: The spool overload policy: while memory is short (or bursts already wait on
        #: disk, so that order is kept), a burst written ahead is kept on disk only and
        #: admitted later by :meth:`admit_deferred`.
        self.defer_when_memory_short = False

    def reconfigure(self, message_max_bytes: int, autocreate: Callable[[str], None] | None) -> None:
        """A config reload: the largest message and topic autocreation, from the next
        message on (messages already admitted keep the decisions taken for them)."""
        self._max_data = message_max_bytes - KAFKA_RECORD_OVERHEAD
        self.waiting_room.autocreate = autocreate

    # -- from the input agents -------------------------------------------------------------

    def datagrams(self, burst: Sequence[bytes], client: object | None = None) -> None:
        """The datagrams of one read burst, one whole message each (see :meth:`messages`)."""
        self.messages(burst, Transport.UNIX_DGRAM, client)

    def messages(
        self, burst: Sequence[bytes], transport: Transport, client: object | None = None
    ) -> None:
        """Whole messages read in one burst from ``transport``, sent by ``client`` (the
        key of its share of the pool, ``books/shares.py``; None: charged to no client).
        Well-formed AnyPartition messages of a known, unlimited, untraced topic of an
        acceptable size, while the pool and the client's share have room, take a short
        path (the burst path, or ``_admit_each``'s): the same decisions as :meth:`admit`
        (the reference), fewer steps, acceptances booked once per topic per burst."""
        self._books.received(transport, len(burst))
        tokens = self._tokens
        tokens.client = client
        try:
            self._admit_burst(burst)
        finally:
            tokens.client = None

    def frames(
        self, frames: Sequence[bytes], transport: Transport, client: object | None = None
    ) -> None:
        """The whole frames one read of a stream connection completed: admitted as a
        burst, like the datagrams of one read (see :meth:`messages`)."""
        self.messages(frames, transport, client)

    def replayed(
        self, burst: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> None:
        """Messages an earlier run read and never settled, from the spool: admitted again
        like new ones (spooled again too, so the old segments can go) and counted as
        possible duplicates, since the earlier run may have delivered them."""
        self._counters.inc(counter_names.SPOOL_REPLAYED, len(burst))
        for data in burst:
            try:
                message = decode(data, self._prefix_size)
            except ClientProtocolError:
                continue  # it was discarded as malformed the first time, and will be again
            self._books.possible_duplicate(message.topic, message.timestamp_ms)
        self._admit_burst(burst, origins)

    def _admit_burst(
        self, burst: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> None:
        """Write ``burst`` ahead to the spool (if any), then admit it, or (the spool
        overload policy, memory short) keep it on disk. ``origins``: a replay's identities."""
        write_ahead = self._write_ahead
        if write_ahead is None:
            self._admit_messages(burst, True, self._unspooled_headers(burst, origins))
            return
        headers = write_ahead.begin_burst(burst, origins)
        try:
            if self.defer_when_memory_short and (write_ahead.deferring or self._pool.is_depleted):
                if write_ahead.defer_burst():
                    return
                self._admit_messages(burst, False, headers)  # not on disk: Dory's discard
                return
            self._admit_messages(burst, True, headers)
        finally:
            write_ahead.end_burst()

    def _unspooled_headers(
        self, burst: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> Sequence[Headers | None]:
        ids = self._ids
        if ids is None or not ids.headers:
            return [None] * len(burst)
        fresh = ids.unspooled_run(len(burst))
        return fresh if origins is None else ids.replayed(origins, fresh)

    def admit_deferred(self) -> bool:
        """Admit the oldest burst the spool policy kept on disk; False if none waits."""
        write_ahead = self._write_ahead
        resumed = None if write_ahead is None else write_ahead.resume_deferred()
        if write_ahead is None or resumed is None:
            return False
        payloads, headers = resumed
        try:
            self._admit_messages(payloads, True, headers)
        finally:
            write_ahead.end_burst()
        return True

    def _admit_messages(
        self,
        burst: Sequence[bytes],
        hold: bool = True,
        identities: Iterable[Headers | None] | None = None,
    ) -> None:
        """Admit each message of ``burst``, with its headers (``identities``: None for
        none); ``hold=False`` forbids holding messages when memory is short (see
        ``hold_when_memory_short``) for this burst. The compiled producer's burst path
        takes what it can first (admission/burst_path.py); the rest goes one by one."""
        held = self.hold_when_memory_short
        self.hold_when_memory_short = held and hold
        parsed = parse_burst(burst)  # pydory.hotpath: compiled, one call per burst
        accepted: dict[str, int] = {}
        try:
            taken, count = _NONE_TAKEN, 0
            if self._burst_path is not None:
                taken, count = self._burst_path.admit(
                    burst, parsed, identities, accepted, self._max_data
                )
            if count < len(burst):
                each = repeat(None) if identities is None else identities
                self._admit_each(burst, parsed, each, taken, accepted)
        finally:
            for topic, n in accepted.items():
                self._books.accepted(topic, n)
            self.hold_when_memory_short = held

    def _admit_each(
        self,
        burst: Sequence[bytes],
        parsed: Iterable[tuple[str, bytes, bytes, int] | None],
        identities: Iterable[Headers | None],
        taken: frozenset[str],
        accepted: dict[str, int],
    ) -> None:
        """The reference, a message at a time (but the ``taken`` topics' that fit: the
        burst path sent them); ``accepted`` counts per topic."""
        books = self._books
        knows, is_unlimited = self._router.knows, self._limiter.is_unlimited
        pool, max_data, cost_of = self._pool, self._max_data, message_cost
        any_partition, send = self._router.any_partition, self._dispatcher.send
        tokens = self._tokens
        open_token, admits = tokens.open, tokens.admits
        # Per topic: known and unlimited? Neither changes during a burst, except that the
        # reference path may learn a topic's limit (then this burst keeps using it).
        short_path: dict[str, bool] = {}
        msg_debug = self._msg_debug
        tracing = msg_debug.active
        for data, fields, headers in zip(burst, parsed, identities, strict=False):
            if fields is None:
                self._decode_and_admit(data, headers)
                continue
            topic, key, value, timestamp_ms = fields
            size = len(key) + len(value)
            if topic in taken and size <= max_data:
                continue  # sent by the burst path
            eligible = short_path.get(topic)
            if eligible is None:
                eligible = short_path[topic] = (
                    knows(topic)
                    and is_unlimited(topic)
                    and not (tracing and msg_debug.traces(topic))
                )
            if not eligible or size > max_data:
                self._decode_and_admit(data, headers)
                continue
            cost = cost_of(topic, size)
            if (not admits() and self._over_share()) or (
                not pool.try_allocate(cost) and not self._held_anyway(cost)
            ):
                # The message goes to the discard log (if enabled); the report ignores it.
                books.discarded(DiscardReason.NO_MEMORY, topic, timestamp_ms, prefix=value, key=key)
                continue
            token = open_token(1, cost)
            try:  # AnyPartition (no PartitionKey), the first attempt
                send(
                    topic,
                    any_partition(topic),
                    value,
                    key or None,
                    max(timestamp_ms, 0),
                    None,
                    1,
                    token,
                    headers=headers,
                )
            except EnqueueRefused as refusal:
                self._refused(refusal, topic, value, timestamp_ms, cost, token)
            else:
                accepted[topic] = accepted.get(topic, 0) + 1

    def _over_share(self) -> bool:
        """The burst's client holds its share of the pool: its message meets
        ``no_memory`` (counted apart, so an operator can tell it from a full pool)."""
        self._counters.inc(counter_names.NO_MEMORY_CLIENT_SHARE)
        return True

    def _held_anyway(self, cost: int) -> bool:
        """The pool refused ``cost``: charged anyway if ``hold_when_memory_short``."""
        if self.hold_when_memory_short:
            self._pool.force_allocate(cost)
            self._counters.inc(counter_names.HELD_WHEN_MEMORY_SHORT)
            return True
        return False

    def datagram_too_large(self, size: int, prefix: bytes) -> None:
        self._books.received(Transport.UNIX_DGRAM)
        self._counters.inc(counter_names.DATAGRAM_OVER_MAX_SIZE)
        self._lines.log(
            logging.DEBUG,
            "datagram too large",
            "datagram of %d bytes exceeds maxDatagramMsgSize",
            size,
        )
        self._books.discarded(DiscardReason.MALFORMED, None, None, prefix=prefix)

    def over_quota(self, burst: Sequence[bytes]) -> None:
        """Datagrams whose sender's uid was over its ``<quotas>`` rate: each a
        ``rate_limit`` discard of its topic (malformed ones as malformed), never spooled,
        and counted apart (pydory.daemon.inputs.quotas says why datagrams are discarded)."""
        self._books.received(Transport.UNIX_DGRAM, len(burst))
        self._counters.inc(counter_names.QUOTA_DISCARDS_UNIX_DGRAM, len(burst))
        for data in burst:
            try:
                message = decode(data, self._prefix_size)
            except ClientProtocolError as error:
                self._bad_message(error)
                continue
            self._refuse(DiscardReason.RATE_LIMIT, message)

    def frame(self, data: bytes, transport: Transport) -> None:
        """One whole message, through the reference path (decode, then :meth:`admit`)."""
        self._books.received(transport)
        write_ahead = self._write_ahead
        if write_ahead is None:
            self._decode_and_admit(data, self._unspooled_headers((data,))[0])
            return
        headers = write_ahead.begin_burst((data,))[0]
        try:
            self._decode_and_admit(data, headers)
        finally:
            write_ahead.end_burst()

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None:
        if isinstance(error, OversizedFrame):
            self._counters.inc(counter_names.STREAM_OVERSIZED_FRAME[transport])
            self._lines.log(
                logging.ERROR,
                ("oversized frame", transport),
                "%s client announced a %d-byte message, above maxStreamMsgSize: "
                "closing the connection; counted in %s",
                transport,
                error.size,
                counter_names.STREAM_OVERSIZED_FRAME[transport],
            )
        else:
            self._counters.inc(counter_names.STREAM_FRAMING_ERROR[transport])
            self._lines.log(
                logging.ERROR,
                ("framing error", transport),
                "%s client sent an unframeable stream (%s): closing; counted in %s",
                transport,
                error,
                counter_names.STREAM_FRAMING_ERROR[transport],
            )
        self._books.discarded(DiscardReason.MALFORMED, None, None, prefix=error.prefix)

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None:
        self._counters.inc(counter_names.UNCLEAN_DISCONNECT[transport])
        self._books.discarded(
            DiscardReason.UNCLEAN_DISCONNECT, None, None, prefix=prefix, transport=transport
        )

    def connection_opened(self, transport: Transport) -> None:
        self._counters.inc(counter_names.CONNECTION_OPENED[transport])

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        self._counters.inc(counter_names.CONNECTION_CLOSED[transport])
        if error is not None:  # reset by the client, or a read that failed
            self._counters.inc(counter_names.STREAM_SOCKET_ERROR[transport])

    # -- admission ---------------------------------------------------------------------------

    def _decode_and_admit(self, data: bytes, headers: Headers | None = None) -> None:
        try:
            message = decode(data, self._prefix_size)
        except ClientProtocolError as error:
            self._bad_message(error)
            return
        self.admit(message, headers)

    def _bad_message(self, error: ClientProtocolError) -> None:
        books = self._books
        if isinstance(error, UnsupportedApiKey):
            books.discarded(DiscardReason.UNSUPPORTED_API_KEY, None, None, prefix=error.prefix)
        elif isinstance(error, UnsupportedApiVersion):
            books.discarded(
                DiscardReason.UNSUPPORTED_VERSION,
                None,
                None,
                prefix=error.prefix,
                api_version=error.api_version,
            )
        elif isinstance(error, BadTopic):
            topic = error.topic.decode("ascii", "backslashreplace")
            books.discarded(DiscardReason.BAD_TOPIC, topic, None, prefix=error.prefix)
        else:
            assert isinstance(error, MalformedMessage), error
            books.discarded(DiscardReason.MALFORMED, None, None, prefix=error.prefix)

    def admit(self, message: Message, headers: Headers | None = None) -> None:
        """Steps 2-6 for one decoded message (``headers``: its identity)."""
        topic = message.topic
        books = self._books
        msg_debug = self._msg_debug
        if msg_debug.active and msg_debug.traces(topic):
            msg_debug.received(topic, message.key, message.value, message.timestamp_ms)
        if len(message.key) + len(message.value) > self._max_data:
            books.discarded(
                DiscardReason.TOO_LONG, topic, message.timestamp_ms, prefix=message.value
            )
            return
        cost = pool_cost(topic, message.key, message.value)
        if not self._tokens.admits() and self._over_share():
            self._refuse(DiscardReason.NO_MEMORY, message)
            return
        if not self._pool.try_allocate(cost) and not self._held_anyway(cost):
            self._refuse(DiscardReason.NO_MEMORY, message)
            return
        known = self._router.knows(topic)
        if not self._limiter.admit(topic, known=known):
            self._pool.release(cost)
            self._refuse(DiscardReason.RATE_LIMIT, message)
            return
        if not known:
            self.waiting_room.unknown_topic(message, cost, headers)
            return
        self._enqueue(message, cost, self._tokens.open(1, cost), headers)

    def _refuse(self, reason: DiscardReason, message: Message) -> None:
        """A whole, well-formed message turned away at admission: the discard log gets
        its key and value, so an operator can see what was lost."""
        self._books.discarded(
            reason, message.topic, message.timestamp_ms, prefix=message.value, key=message.key
        )

    def _enqueue(
        self, message: Message, cost: int, token: int, headers: Headers | None = None
    ) -> None:
        """Hand an accepted message to dispatch; ``token`` is its commit point count."""
        topic = message.topic
        router = self._router
        partition_key = message.partition_key
        if partition_key is None:
            partition = router.any_partition(topic)
        else:
            partition = router.partition_key_partition(topic, partition_key)
        try:
            self._dispatcher.send(
                topic,
                partition,
                message.value,
                message.key or None,
                message.timestamp_ms if message.timestamp_ms > 0 else 0,
                partition_key,
                token=token,
                headers=headers,
            )
        except EnqueueRefused as refusal:
            self._refused(refusal, topic, message.value, message.timestamp_ms, cost, token)
            return
        self._books.accepted(topic)
        msg_debug = self._msg_debug
        if msg_debug.active and msg_debug.traces(topic):
            msg_debug.sent(topic, partition, message.key, message.value, message.timestamp_ms)

    def _refused(
        self,
        refusal: EnqueueRefused,
        topic: str,
        value: bytes,
        timestamp_ms: int,
        cost: int,
        token: int,
    ) -> None:
        """librdkafka refused a message at once: free what it held, book the discard."""
        self._pool.release(cost)
        self._tokens.released(token, cost)
        self._commit_point.close(token)
        if refusal.reason in AFTER_ACCEPTANCE:
            # Admitted, then refused by librdkafka on Kafka's behalf (e.g. a topic it
            # knows to be unauthorized): the daemon took it, Kafka said no.
            self._books.accepted(topic)
        self._books.discarded(
            refusal.reason, topic, timestamp_ms, prefix=value, detail=refusal.detail
        )

    # -- the waiting room (admission/waiting_room.py) ---------------------------------------

    def topic_creation_settled(self, topic: str) -> None:
        """Metadata was refreshed after trying to create ``topic``: route what waited for it."""
        self.waiting_room.topic_creation_settled(topic)

    def metadata_arrived(self) -> None:
        """The first metadata is in: route what waited for it, in the order received."""
        self.waiting_room.metadata_arrived()

    @property
    def pending_topic_messages(self) -> int:
        """Messages held for metadata: Dory's "new" queue."""
        return self.waiting_room.waiting

    def settle_pending_topics(self) -> None:
        """Shutdown: settle every message still waiting for metadata."""
        self.waiting_room.settle_all()
