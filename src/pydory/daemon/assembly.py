"""The daemon's components, built from one ``Config`` (uvicorn's ``Config.load()`` is the model).

:func:`assemble` wires the data path once: the books and their counters, the memory pool,
the rate limiter, the router and the metadata service, the spool and its write-ahead (when
the config names a spool directory), the dispatcher with its delivery ledger, the intake,
the inputs, the overload policy, the spool's life on the loop and the heap's trim. It
starts nothing: ``Server`` runs what it returns (opens the spool and the inputs, starts the
background tasks, stops it all).

Which tokens count a message follows from the spool: with one, the write-ahead's (settling
a message settles its spool segment as well as the commit point); without, the commit
point's.

Rule: :func:`assemble` is the one place the daemon's components are created from the
config and handed to each other; a component builds only its own parts (the intake its
waiting room, the dispatcher its producers, the spool its syncs and marks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydory.config import Config
from pydory.daemon.admission.intake import Intake
from pydory.daemon.admission.overload import Overload
from pydory.daemon.admission.ratelimit import TopicRateLimiter
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.charges import ClientTokens
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.discard_log import DiscardLog
from pydory.daemon.books.keeper import DurableBooks
from pydory.daemon.books.msg_debug import MsgDebug
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.books.publisher import BooksPublisher
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.kafka_stats import KafkaStats
from pydory.daemon.delivery.librdkafka_settings import delivery_settings, producer_profile
from pydory.daemon.delivery.metadata import MetadataService
from pydory.daemon.delivery.outcomes import DeliveryLedger
from pydory.daemon.delivery.router import Router
from pydory.daemon.heap_trim import HeapTrim
from pydory.daemon.inputs.input_set import InputSet
from pydory.daemon.spool.disk_worker import DiskWorker
from pydory.daemon.spool.identity import MessageIds, new_incarnation, resolve_host_id
from pydory.daemon.spool.lifecycle import SpoolLifecycle
from pydory.daemon.spool.segments import Spool
from pydory.daemon.spool.write_ahead import WriteAhead


@dataclass(eq=False)
class Components:
    """Every component of one daemon, wired to each other. ``discard_log`` is the one a
    reload replaces (``daemon/reloading.py``); the others live as long as the daemon."""

    counters: Counters
    discard_log: DiscardLog
    msg_debug: MsgDebug
    books: Books
    pool: MemoryPool
    limiter: TopicRateLimiter
    router: Router
    kafka_stats: KafkaStats
    commit_point: CommitPoint
    spool: Spool | None
    message_ids: MessageIds
    durable_books: DurableBooks
    write_ahead: WriteAhead | None
    metadata: MetadataService
    dispatcher: Dispatcher
    intake: Intake
    inputs: InputSet
    overload: Overload
    spool_life: SpoolLifecycle
    heap_trim: HeapTrim


def assemble(config: Config, *, create_topic: Callable[[str], None]) -> Components:
    """The components ``config`` describes, wired; ``create_topic`` starts a topic's
    auto-creation (used when ``<topicAutocreate>`` is on)."""
    counters = Counters()
    discard_log = DiscardLog.from_config(config, counters)
    msg_debug = MsgDebug(config.msg_debug, counters)
    router = Router(counters=counters)
    books = Books(
        config.http.discard_report_interval_s,
        config.http.bad_msg_prefix_size,
        counters=counters,
        discard_sink=discard_log.sink,
        # Client-given names Kafka does not have get bounded records (issue 21).
        unknown_topic_limit=config.http.max_unknown_topics,
        topic_known=router.knows,
    )
    pool = MemoryPool(config.input_config.max_buffer)
    pool.shares.admit_frames_up_to(config.input_config.max_stream_msg_size)
    limiter = TopicRateLimiter(
        config.rate_limit_for, unknown_topic_limit=config.http.max_unknown_topics
    )
    kafka_stats = KafkaStats()  # every producer's librdkafka statistics, merged
    settings = delivery_settings(config)
    # The inputs are built last (they hand their bytes to the intake); the commit point
    # marks them only once the daemon runs.
    commit_point = CommitPoint(lambda: inputs.mark())
    spool = spool_of(config)
    identity = config.message_identity  # every message's name (issue 24)
    message_ids = MessageIds(
        resolve_host_id(identity.host_id, config.spool.path),
        new_incarnation() if spool is None else spool.incarnation,
        headers=identity.headers,
    )
    # The run's books, kept in the spool directory and published (issue 24, item 3).
    durable_books = DurableBooks(
        books,
        message_ids.host_id,
        message_ids.incarnation,
        config.spool.path,
        unprotected=lambda: counters.get(counter_names.SPOOL_UNPROTECTED),
        publisher=books_publisher(config, settings.properties()),
    )
    write_ahead = (
        None
        if spool is None
        else WriteAhead(commit_point, spool, counters, ids=message_ids, on_fold=durable_books.fold)
    )
    # Intake and the ledger count messages under tokens: the write-ahead's, which
    # settle the spool as well as the commit point, when there is a spool.
    # Wrapped so that each token names its message's client, charged to its share of the
    # pool until the ledger releases the message's bytes (books/charges.py).
    tokens = ClientTokens(
        commit_point if write_ahead is None else write_ahead, pool.shares, tallies=write_ahead
    )
    metadata = MetadataService(settings.properties(), router, **metadata_timings(config))
    # Asks the dispatcher (made next) whether librdkafka holds messages, once it runs.
    heap_trim = HeapTrim(busy=lambda: dispatcher.in_librdkafka() > 0)
    dispatcher = Dispatcher(
        settings,
        functools.partial(producer_profile, config),
        router,
        DeliveryLedger(
            books, pool, tokens, tallies=None if write_ahead is None else tokens, charges=tokens
        ),
        on_partition_trouble=metadata.request_refresh,
        stats=kafka_stats,
        counters=counters,
        in_flight_by_topic=books.in_flight_by_topic,
        msg_debug=msg_debug,
        kept_on_disk=(lambda token: False) if write_ahead is None else write_ahead.in_spool,
        on_quiet=heap_trim.quiet,
    )
    intake = Intake(
        books=books,
        pool=pool,
        limiter=limiter,
        router=router,
        dispatcher=dispatcher,
        commit_point=tokens,
        message_max_bytes=config.batching.message_max_bytes,
        prefix_size=config.http.bad_msg_prefix_size,
        on_unknown_topic=lambda topic: metadata.request_refresh(),
        autocreate=autocreate_of(config, create_topic),
        msg_debug=msg_debug,
        write_ahead=write_ahead,
        unknown_topic_limit=config.http.max_unknown_topics,
        ids=message_ids,
    )
    inputs = InputSet(intake, counters, pool)
    overload = Overload(config.spool.overload_policy, pool, intake, inputs.all, counters)
    spool_life = SpoolLifecycle(
        spool,
        write_ahead,
        intake=intake,
        wait_for_room=overload.wait_for_room,
        books=books,
        durable_books=durable_books,
        commit_point=commit_point,
        counters=counters,
    )
    return Components(
        counters=counters,
        discard_log=discard_log,
        msg_debug=msg_debug,
        books=books,
        pool=pool,
        limiter=limiter,
        router=router,
        kafka_stats=kafka_stats,
        commit_point=commit_point,
        spool=spool,
        message_ids=message_ids,
        durable_books=durable_books,
        write_ahead=write_ahead,
        metadata=metadata,
        dispatcher=dispatcher,
        intake=intake,
        inputs=inputs,
        overload=overload,
        spool_life=spool_life,
        heap_trim=heap_trim,
    )


def autocreate_of(
    config: Config, create_topic: Callable[[str], None]
) -> Callable[[str], None] | None:
    """What the intake calls for a topic Kafka does not have: ``create_topic`` when
    ``<topicAutocreate>`` is on, else nothing (the message is a ``bad_topic`` discard)."""
    return create_topic if config.delivery.topic_autocreate else None


def metadata_timings(config: Config) -> dict[str, Any]:
    """The metadata service's refresh settings, from <msgDelivery>."""
    delivery = config.delivery
    return {
        "refresh_interval_s": delivery.metadata_refresh_interval_min * 60,
        "compare_on_refresh": delivery.compare_metadata_on_refresh,
        "min_pause_delay_s": delivery.min_pause_delay_ms / 1000,
        "pause_initial_s": delivery.pause_rate_limit_initial_ms / 1000,
        "pause_max_double": delivery.pause_rate_limit_max_double,
    }


def configured_topics(config: Config) -> list[str]:
    """A topic of the default profile ("" is never configured) and every topic that the
    config gives its own batching or compression."""
    return ["", *config.batching.topic_configs, *config.compression.topic_configs]


def books_publisher(config: Config, properties: dict[str, Any]) -> BooksPublisher | None:
    """The books topic's publisher (None: ``<booksTopic>`` empty)."""
    topic = config.message_identity.books_topic
    if topic is None:
        return None
    return BooksPublisher(properties, topic, create=config.delivery.topic_autocreate)


def spool_of(config: Config) -> Spool | None:
    """The spool ``<spool>`` names (None: no spool directory), not yet opened."""
    spool = config.spool
    if spool.path is None:
        return None
    return Spool(
        spool.path,
        segment_bytes=spool.segment_bytes,
        max_bytes=spool.max_bytes,
        fsync_interval_ms=spool.fsync_interval_ms,
        disk_worker=DiskWorker(),  # the interval's syncs and the deletions off the loop
    )
