"""The short path for a whole burst: the compiled producer takes every well-formed
AnyPartition message of a known, unlimited topic in one call per topic (issue 25, step 5).

The intake's reference (``Intake._admit_messages``) judges and sends one message at a time
in Python: the pool, a commit-point token, the router's partition, ``send``. Here the same
decisions are taken once per topic of a burst: the pool charged the topic's messages at
once, one token for them (the commit point hands every message of a burst the same one),
the router's AnyPartition runs for as many messages (``Router.any_partition_runs``: the
very partitions it would give one by one), and ``produce_burst`` in C sends them in burst
order. Everything else in the burst (malformed, too long, a topic unknown, rate-limited or
traced) is left to the reference, which the intake runs next.

Rule: a burst takes the :class:`BurstPath` only when its outcome is the reference's, message for
message: the pool and its client's share have room for every message of the burst
whatever the order (so none can be refused or held for memory), and no message of it is
traced; else none of it does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pydory.daemon.books.charges import ClientTokens
from pydory.daemon.books.msg_debug import MsgDebug
from pydory.daemon.books.pool import POOL_OVERHEAD_BYTES, MemoryPool, message_cost, messages_cost
from pydory.daemon.delivery.compiled_producer import burst_topics
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.outcomes import EnqueueRefused, produce_refusal
from pydory.daemon.delivery.router import Router
from pydory.daemon.spool.identity import IdentityRun
from pydory.hotpath import WHOLE_PARSES

__all__ = ["BurstPath"]

#: Bursts shorter than this go one by one: the path's fixed cost per burst (the bound,
#: the per-topic counts, a token, the runs) is more than it saves on a few messages.
MIN_BURST = 8

#: ``burst_topics(parsed, max_data)``: per topic, how many messages fit and their bytes.
TopicCounts = Callable[[Any, int], "dict[str, tuple[int, int]] | None"]
#: ``refused(refusal, topic, value, timestamp_ms, cost, token)``: the intake's.
Refused = Callable[[EnqueueRefused, str, bytes, int, int, int], None]


class BurstPath:
    """The intake's parts a burst's short path uses; :meth:`admit` runs it."""

    @staticmethod
    def usable() -> bool:
        """Whether the compiled producer (which the burst path sends through) runs here."""
        return burst_topics() is not None

    def __init__(
        self,
        pool: MemoryPool,
        router: Router,
        is_unlimited: Callable[[str], bool],
        tokens: ClientTokens,
        dispatcher: Dispatcher,
        msg_debug: MsgDebug,
        refused: Refused,
    ) -> None:
        counts = burst_topics()
        assert counts is not None, "BurstPath.usable() is false"
        self._burst_topics: TopicCounts = counts
        self._pool = pool
        self._router = router
        self._is_unlimited = is_unlimited
        self._tokens = tokens
        self._dispatcher = dispatcher
        self._msg_debug = msg_debug
        self._refused = refused

    def admit(
        self,
        burst: Sequence[bytes],
        parsed: Any,
        identities: Iterable[Any] | None,
        accepted: dict[str, int],
        max_data: int,
    ) -> tuple[frozenset[str], int]:
        """Send what this path can of ``burst`` (``parsed``: its fields, made whole at
        once: a ParsedBurst or a list; its
        ``identities``: a list of headers per message, an IdentityRun, or None), adding the accepted
        messages to ``accepted`` per topic. The topics it took (their messages whose key
        and value fit ``max_data`` are done) and how many messages it took;
        ``(frozenset(), 0)`` if it took none."""
        nothing: tuple[frozenset[str], int] = (frozenset(), 0)
        if len(burst) < MIN_BURST or not isinstance(parsed, WHOLE_PARSES) or self._msg_debug.active:
            return nothing
        headers: list[Any] | tuple[str, bytes, int] | None
        if isinstance(identities, IdentityRun):
            headers = identities.compiled  # formatted in C, message by message
        elif isinstance(identities, list) or identities is None:
            headers = identities
        else:
            return nothing  # an iterator of headers would be consumed: not this path
        pool = self._pool
        # A message costs at most its frame and the overhead: with room for all of that,
        # the reference would grant every message, whatever the order.
        bound = sum(map(len, burst)) + POOL_OVERHEAD_BYTES * len(burst)
        if pool.used + bound >= pool.budget or not self._tokens.has_room(bound):
            return nothing  # the client's share too: none of its messages may meet it
        counts = self._burst_topics(parsed, max_data)
        if not counts:
            return nothing
        taken: list[str] = []
        total = 0
        for topic, (count, data_bytes) in counts.items():
            sent = (parsed, headers, max_data, accepted)
            if self._send_topic(topic, count, data_bytes, *sent):
                taken.append(topic)
                total += count
        return frozenset(taken), total

    def _send_topic(
        self,
        topic: str,
        count: int,
        data_bytes: int,
        parsed: Any,
        headers: list[Any] | tuple[str, bytes, int] | None,
        max_data: int,
        accepted: dict[str, int],
    ) -> bool:
        router = self._router
        if not (router.knows(topic) and self._is_unlimited(topic)):
            return False
        send = self._dispatcher.burst_sender(topic)
        if send is None:
            return False
        cost = messages_cost(topic, count, data_bytes)
        granted = self._pool.try_allocate_all(cost, count)
        assert granted, "the bound above leaves room for every message of the burst"
        token = self._tokens.open(count, cost)
        runs = router.any_partition_runs(topic, count)
        refused = send(parsed, headers, topic, max_data, runs, token)
        self._dispatcher.note_sent(token)
        for index, code in refused:
            _, key, value, timestamp_ms = parsed[index]
            cost = message_cost(topic, len(key) + len(value))
            self._refused(produce_refusal(code), topic, value, timestamp_ms, cost, token)
        accepted[topic] = accepted.get(topic, 0) + count - len(refused)
        return True
