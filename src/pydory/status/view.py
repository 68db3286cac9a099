"""What the status interface may read of a running daemon: one narrow, read-only view.

The daemon's ``Server`` owns everything; the status pages, the Prometheus collector, the
dashboard feed and the commit point's routes get a :class:`DaemonView` instead, built by
the server (``Server.status_view()``). Each field is typed by a small Protocol naming
only the reads a page makes, so a reader of this package sees exactly what it depends on,
and nothing here imports the server. The actions the interface offers (a metadata
refresh, the commit point's long-poll) are in the view too, as plain callables, and the
message debugging switches as :class:`MsgDebugControl`.

Every method is called on the daemon's event loop (aiohttp runs there), the thread that
owns the books, so each page is a consistent snapshot without locks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pydory.config.model import HttpInterfaceConfig
    from pydory.daemon.books.accounting import TopicTotals
    from pydory.daemon.books.commit_point import CommitPointView
    from pydory.daemon.books.discard_report import DiscardReport
    from pydory.daemon.books.events import DiscardReason, Transport
    from pydory.daemon.books.msg_debug import Selection
    from pydory.daemon.delivery.kafka_stats import StatsSnapshot
    from pydory.daemon.delivery.router import MetadataSnapshot

__all__ = [
    "BooksReader",
    "CommitPointReader",
    "CounterReader",
    "DaemonView",
    "DatagramReading",
    "MetadataTimes",
    "MsgDebugControl",
    "OverloadSensors",
    "PoolSensors",
    "ReloadHistoryReader",
    "SpoolSensors",
    "StatsReader",
]


class BooksReader(Protocol):
    """The accounting: lifetime totals and Dory's discard report."""

    def per_topic(self) -> Mapping[str, TopicTotals]: ...
    def received_by_transport(self) -> Mapping[Transport, int]: ...
    def lifetime_discards_by_reason(self) -> Mapping[DiscardReason, int]: ...
    def discard_report(self) -> DiscardReport: ...
    @property
    def unknown_topic_limit(self) -> int: ...
    @property
    def unknown_topics_named(self) -> int: ...


class ShareSensors(Protocol):
    """The clients' shares of the pool (``daemon/books/shares.py``)."""

    @property
    def holders(self) -> int: ...
    def share(self) -> int: ...
    def largest_held(self) -> int: ...


class PoolSensors(Protocol):
    """KIP-72's memory pool sensors."""

    @property
    def shares(self) -> ShareSensors: ...

    @property
    def budget(self) -> int: ...
    @property
    def used(self) -> int: ...
    @property
    def available(self) -> int: ...
    @property
    def over_budget(self) -> int: ...
    def percent_time_depleted(self) -> float: ...
    def depleted_seconds(self) -> float: ...


class SpoolSensors(Protocol):
    """The write-ahead spool (``<spool>``): what is on disk and what it has done."""

    @property
    def directory(self) -> str: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def fsync_interval_ms(self) -> int | None: ...
    @property
    def bytes_on_disk(self) -> int: ...
    @property
    def segments(self) -> int: ...
    @property
    def outstanding(self) -> int: ...
    @property
    def appended_total(self) -> int: ...
    @property
    def fsyncs_total(self) -> int: ...
    @property
    def errors_total(self) -> int: ...
    @property
    def full_total(self) -> int: ...


class OverloadSensors(Protocol):
    """The overload policy: whether the inputs are paused for memory, and for how long."""

    @property
    def policy_name(self) -> str: ...
    @property
    def paused(self) -> bool: ...
    def paused_seconds(self) -> float: ...


class ReloadHistoryReader(Protocol):
    """The running config's file, load time and reload outcomes (``/config/json``)."""

    @property
    def loaded_at(self) -> float: ...
    @property
    def succeeded(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def last_ok(self) -> bool: ...
    def as_json(self) -> dict[str, object]: ...


class DatagramReading(Protocol):
    """How the UNIX datagram input reads its socket (``daemon/inputs/datagram.py``)."""

    @property
    def reader(self) -> str: ...
    @property
    def ring_datagrams(self) -> int: ...
    @property
    def kernel_queue_datagrams(self) -> int | None: ...


class StreamReading(Protocol):
    """How the UNIX stream input reads its connections (``daemon/inputs/stream.py``)."""

    @property
    def reader(self) -> str: ...
    @property
    def held_bytes(self) -> int: ...
    @property
    def connection_held_bytes(self) -> int: ...


class CounterReader(Protocol):
    """The event counters (Dory's /counters)."""

    def get(self, name: str) -> int: ...
    def snapshot(self) -> Mapping[str, int]: ...


class StatsReader(Protocol):
    """librdkafka's latest statistics, merged over the producers."""

    def latest(self) -> StatsSnapshot: ...


class MetadataTimes(Protocol):
    """When cluster metadata was last fetched and last changed (epoch ms; None = never),
    and how many fetches failed, succeeded, and replaced the routing layout."""

    @property
    def last_updated_ms(self) -> int | None: ...
    @property
    def last_modified_ms(self) -> int | None: ...
    @property
    def fetch_failures(self) -> int: ...
    @property
    def fetch_successes(self) -> int: ...
    @property
    def updates(self) -> int: ...


class CommitPointReader(Protocol):
    """The commit point, and waiting for it to pass a moment (the long-poll)."""

    @property
    def shutting_down(self) -> bool: ...
    def current(self, sweep: bool = True) -> CommitPointView: ...
    def wall_now(self) -> float: ...
    async def wait_past(self, wall_s: float | None, timeout_s: float) -> bool: ...


class MsgDebugControl(Protocol):
    """Message debugging (``<msgDebug>``): which topics are traced, and switching it."""

    @property
    def directory(self) -> str: ...
    @property
    def byte_limit(self) -> int: ...
    @property
    def time_limit_s(self) -> int: ...
    @property
    def bytes_written(self) -> int: ...
    @property
    def stopped_reason(self) -> str | None: ...
    @property
    def selection(self) -> Selection: ...
    def seconds_left(self) -> float | None: ...
    def add_topic(self, topic: str) -> bool: ...
    def del_topic(self, topic: str) -> bool: ...
    def add_all_topics(self) -> None: ...
    def del_all_topics(self) -> None: ...
    def truncate_files(self) -> None: ...


@dataclass(frozen=True)
class DaemonView:
    """Everything the status interface reads, handed in by the server."""

    started_at: float  # epoch seconds
    http: HttpInterfaceConfig  # the <httpInterface> settings: port, loopback only
    books: BooksReader
    pool: PoolSensors
    counters: CounterReader
    kafka_stats: StatsReader
    metadata: MetadataTimes
    commit_point: CommitPointReader
    #: The routing layout now: partitions and leaders per topic, brokers by node id.
    layout: Callable[[], MetadataSnapshot]
    #: Messages waiting for their topic's metadata (Dory's "new" queue).
    pending_topic_messages: Callable[[], int]
    #: Messages sent again to another partition after a delivery failure.
    rerouted: Callable[[], int]
    #: Ask for a metadata refresh now (``POST /metadata_update``, the dashboard's button).
    request_metadata_refresh: Callable[[], None]
    #: Message debugging; None when ``<msgDebug>`` is off (its URLs then say so).
    msg_debug: MsgDebugControl | None = None
    #: The write-ahead spool; None when ``<spool>`` is off.
    spool: SpoolSensors | None = None
    #: The overload policy (``<spool><overloadPolicy>``); None in views built by hand.
    overload: OverloadSensors | None = None
    #: The config file and its reloads; None in views built by hand.
    reloads: ReloadHistoryReader | None = None
    #: The UNIX datagram input now (None: none configured, or a view built by hand).
    datagram_input: Callable[[], DatagramReading | None] | None = None
    stream_input: Callable[[], StreamReading | None] | None = None
    #: Whether a shutdown has begun (the inputs stop taking messages: ``/ready`` says so
    #: from that moment); None in views built by hand.
    stopping: Callable[[], bool] | None = None
