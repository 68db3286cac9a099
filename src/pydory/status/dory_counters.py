"""Dory's counters under Dory's names, so that Dory's own monitoring works unchanged.

Dory's ``/counters`` lists every counter it has, zeros included, and its Nagios check
(``status_monitoring/check_dory_counters.py``) answers UNKNOWN when one it reads is
missing. pydory lists each of those names, always, with an honest value: where pydory has
the same event, its count (read at render time from the books, the metadata service
and pydory's own counters); where the event cannot happen in
pydory (a hand-parsed Kafka response, a Mongoose web-server exception, Dory's internal
bug checks), 0. docs/status.md has the table, name by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.events import Transport

if TYPE_CHECKING:
    from pydory.status.view import DaemonView

__all__ = ["DORY_COUNTERS", "NEVER_IN_PYDORY", "dory_counters"]

Reading = Callable[["DaemonView"], int]


def _counter(name: str) -> Reading:
    return lambda view: view.counters.get(name)


def _messages_created(view: DaemonView) -> int:
    """Dory's count from a message's receipt: the accepted ones, those waiting for metadata
    (accepted, or found a bad topic, when it comes), and those that waited and were found
    a bad topic. A waiting message moves from the second term to one of the others, so
    the count never goes down."""
    accepted = sum(t.accepted for t in view.books.per_topic().values())
    waited_then_bad = view.counters.get(counter_names.WAITED_THEN_BAD_TOPIC)
    return accepted + view.pending_topic_messages() + waited_then_bad


def _messages_destroyed(view: DaemonView) -> int:
    """Created messages with an outcome (delivered, possibly delivered, left in the spool
    for the next start, discarded): every one but those in flight or waiting."""
    in_flight = sum(t.in_flight for t in view.books.per_topic().values())
    return _messages_created(view) - in_flight - view.pending_topic_messages()


#: Dory's counters that pydory counts, and where each value comes from.
COUNTED: Mapping[str, Reading] = {
    # A message enters the pool when accepted; it leaves delivered or discarded, so
    # MsgCreate - MsgDestroy is what is outstanding, as in Dory.
    "MsgCreate": _messages_created,
    "MsgDestroy": _messages_destroyed,
    "GetMetadataSuccess": lambda view: view.metadata.fetch_successes,
    "GetMetadataFail": lambda view: view.metadata.fetch_failures,
    "MetadataUpdated": lambda view: view.metadata.updates,
    # librdkafka reports each to the producers' error callback (delivery/broker_trouble.py);
    # counted as they happen, so they never go down (Dory's check: UNKNOWN if one does).
    "ConnectorConnectFail": _counter(counter_names.KAFKA_CONNECT_FAILED),
    "ConnectorSocketBrokerClose": _counter(counter_names.KAFKA_CLOSED_BY_BROKER),
    "ConnectorSocketError": _counter(counter_names.KAFKA_SOCKET_ERROR),
    "ConnectorSocketTimeout": _counter(counter_names.KAFKA_REQUEST_TIMED_OUT),
    "UnixStreamInputInvalidSizeField": _counter(
        counter_names.STREAM_FRAMING_ERROR[Transport.UNIX_STREAM]
    ),
    "UnixStreamInputMsgBodyTooLarge": _counter(
        counter_names.STREAM_OVERSIZED_FRAME[Transport.UNIX_STREAM]
    ),
    "UnixStreamInputSocketError": _counter(
        counter_names.STREAM_SOCKET_ERROR[Transport.UNIX_STREAM]
    ),
    "UnixStreamInputUncleanDisconnect": _counter(
        counter_names.UNCLEAN_DISCONNECT[Transport.UNIX_STREAM]
    ),
    "TcpInputInvalidSizeField": _counter(counter_names.STREAM_FRAMING_ERROR[Transport.TCP]),
    "TcpInputMsgBodyTooLarge": _counter(counter_names.STREAM_OVERSIZED_FRAME[Transport.TCP]),
    "TcpInputSocketError": _counter(counter_names.STREAM_SOCKET_ERROR[Transport.TCP]),
    "TcpInputUncleanDisconnect": _counter(counter_names.UNCLEAN_DISCONNECT[Transport.TCP]),
    # Nobody asked for the discard report during a whole report interval (Dory's check).
    "NoDiscardQuery": _counter(counter_names.DISCARD_REPORT_UNREAD),
    # Every partition's leader is down or unknown: routed anyway, librdkafka holds them.
    "TopicHasNoAvailablePartitions": _counter(counter_names.TOPIC_NO_AVAILABLE_PARTITIONS),
}

#: Dory's counters of events that cannot happen in pydory, always 0: librdkafka parses
#: Kafka's responses (a malformed one is its error, reported per message), the status
#: server is aiohttp, and Dory's "Bug..." checks guard code pydory does not have.
NEVER_IN_PYDORY: tuple[str, ...] = (
    "BadKafkaResponseSize",
    "BadMetadataResponse",
    "BadMetadataResponseSize",
    "BadProduceResponse",
    "BadProduceResponseSize",
    "BugAllTopicsEmpty",
    "BugDispatchBatchOutOfRangeIndex",
    "BugDispatchMsgOutOfRangeIndex",
    "BugGetAckWaitQueueOutOfRangeIndex",
    "BugMsgListMultipleTopics",
    "BugMsgSetEmpty",
    "BugMultiPartitionGroupEmpty",
    "BugProduceRequestEmpty",
    "ConnectFailOnTryGetMetadata",
    "ConnectorTruncateLongTimeout",
    "CorrelationIdMismatch",
    "MetadataHasEmptyBrokerList",
    "MetadataHasEmptyTopicList",
    "MetadataResponseBadBrokerHostLen",
    "MetadataResponseBadBrokerPort",
    "MetadataResponseBadTopicNameLen",
    "MetadataResponseInvalidLeaderNodeId",
    "MetadataResponseNegativeBrokerCount",
    "MetadataResponseNegativeBrokerNodeId",
    "MetadataResponseNegativeCaughtUpReplicaNodeId",
    "MetadataResponseNegativePartitionCaughtUpReplicaCount",
    "MetadataResponseNegativePartitionCount",
    "MetadataResponseNegativePartitionId",
    "MetadataResponseNegativePartitionReplicaCount",
    "MetadataResponseNegativeReplicaNodeId",
    "MetadataResponseNegativeTopicCount",
    "MetadataResponseReadLostTcpConnection",
    "MetadataResponseReadTimeout",
    "MetadataSanityCheckFail",
    "MongooseStdException",
    "MongooseUnknownException",
    "MongooseUrlDecodeError",
    "MsgSetCompressionError",
    "MsgUnprocessedDestroy",
    "ProduceResponseBadPartitionCount",
    "ProduceResponseBadTopicCount",
    "ProduceResponseBadTopicNameLength",
    "ProduceResponseShortPartitionList",
    "ProduceResponseShortTopicList",
    "ProduceResponseUnexpectedPartition",
    "ProduceResponseUnexpectedTopic",
    "SendMetadataRequestFail",
    "SendMetadataRequestLostTcpConnection",
    "ShortMetadataResponse",
    "StreamClientWorkerStdException",
    "StreamClientWorkerUnknownException",
)

#: Every Dory counter pydory serves, in name order.
DORY_COUNTERS: tuple[str, ...] = tuple(sorted((*COUNTED, *NEVER_IN_PYDORY)))


def dory_counters(view: DaemonView) -> dict[str, int]:
    """Every Dory counter and its value now, in name order (call on the daemon's loop)."""
    return {name: COUNTED[name](view) if name in COUNTED else 0 for name in DORY_COUNTERS}
