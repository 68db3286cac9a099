"""Issue 30: the books stay true when a produce request is written but its response comes
too late (a busy host or network), on both producer backends.

librdkafka's mock cluster injects what contention causes, so that this fails without a
loaded machine: a broker writes a produce request but holds its response back longer than
the request timeout, so librdkafka retries it; the retry then gets an error, permanent on
one broker (TOPIC_AUTHORIZATION_FAILED) and retriable on the other (NOT_LEADER, and its
leader moved). The messages of the first request are in Kafka whatever the retry's
error: not one may be reported discarded (possibly delivered instead), and every second
copy in Kafka must be flagged a possible duplicate (in the runs so far Kafka held none:
the mock's idempotence check drops the retried copies, so that check is a safety net here,
the first is the one that fails on the error-code-only rule).

A written request need not have timed out itself: a broker answers a connection's
requests in order, so one written behind the late response waits too, and when
librdkafka gives up on the late one it drops the connection, failing every request in
flight on it at once, however young its messages. That is what a loaded machine did to
the confluent-kafka backend (issue 30: Kafka held 412 messages, the books 228), which
judged by a message's age alone; the second test makes it happen on a quiet one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

import producer_backends
from helpers import assert_balanced, settled, wait_until
from pydory.client import UnixStreamSender
from pydory.wire import encode_any_partition, encode_partition_key
from pydory_tools.testing.daemon import DaemonConfig, running_daemon
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import ApiKey, ErrorCode, MockCluster

# Every test on both producer backends (the compiled one and confluent-kafka's).
producer_backend = producer_backends.module_fixture()

WARM = 20
COUNT = 400
#: Longer than the request timeout below: the client gives up on the written request.
LATE_RESPONSE_MS = 2_500


def test_a_written_request_answered_late_then_failed_is_never_a_discard(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_topic("late")
    mock_cluster.create_topic(topic, 2)
    mock_cluster.set_partition_leader(topic, 0, 1)
    mock_cluster.set_partition_leader(topic, 1, 2)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(tmp_path),
        replication_timeout_ms=500,
        kafka_socket_timeout_s=1,
        books_topic="",  # no books publisher: its requests would take the injected errors
    )
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, b"w%d" % i) for i in range(WARM))
        wait_until(settled(daemon, topic, WARM), what="the warm-up delivered")
        late = (0, LATE_RESPONSE_MS)  # written, answered after the client gave up
        mock_cluster.push_broker_request_errors(
            1, ApiKey.PRODUCE, [late] + [(ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)] * 8
        )
        mock_cluster.push_broker_request_errors(
            2, ApiKey.PRODUCE, [late] + [(ErrorCode.NOT_LEADER_FOR_PARTITION, 0)] * 3
        )
        stream.send_many(encode_any_partition(topic, b"m%d" % i) for i in range(COUNT))
        mock_cluster.set_partition_leader(topic, 1, 3)  # the leader moves meanwhile
        wait_until(settled(daemon, topic, WARM + COUNT), timeout_s=120, what="every report")
        snapshot = daemon.snapshot()
        server = daemon.server
        flagged = daemon.call(lambda: server.books.counters.get("possible_duplicate"))
    assert_balanced(snapshot)
    books = snapshot["topics"][topic]
    # Read to the end of every partition (Kafka holds at least what was delivered).
    records = consume_all(mock_cluster.bootstrap_servers, topic, books["delivered"])
    in_kafka = Counter(r.value for r in records)
    # Every message Kafka holds is counted delivered or possibly delivered: none of them
    # is among the discards.
    assert len(in_kafka) <= books["delivered"] + books["possibly_delivered"], books
    # Every second copy in Kafka is flagged.
    second_copies = sum(n - 1 for n in in_kafka.values())
    assert second_copies <= flagged, (second_copies, flagged)
    # On a quiet machine the late requests' retries meet the permanent error, so some
    # messages are possibly delivered; on a busy one (a suite run at load 6) librdkafka
    # may send them when the injected errors are used up by other requests, and every
    # message is plainly delivered. Either way nothing Kafka holds is a discard (above).
    assert books["possibly_delivered"] > 0 or books["delivered"] == WARM + COUNT, books


#: The request timeout (socket.timeout.ms, and request.timeout.ms no shorter: what the
#: confluent-kafka backend's age rule waits for); librdkafka looks for timed-out
#: requests once a second, so it drops the connection 5 to 6 s after the late request.
SOCKET_TIMEOUT_S = 5  # not a deadline: the timeout under test
#: From the late request's write to the next request's produce(): the next one's messages
#: are then younger than the request timeout when the dropped connection fails them (and
#: it is still written before the drop, up to 3.5 s later).
SECOND_REQUEST_AFTER_S = 1.5


@contextmanager
def log_ends_of(bootstrap_servers: str, topic: str) -> Iterator[Callable[[int], int]]:
    """A call reading a partition's log end (on a connection of its own)."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "log-end"})
    with closing(consumer):
        yield lambda p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=60)[1]


def test_a_request_written_behind_a_late_response_then_refused_is_never_a_discard(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    # Two partitions led by one broker: one connection, and a request of each in flight
    # (librdkafka sends a partition's next request only after its last is answered).
    topic = unique_topic("behind")
    mock_cluster.create_topic(topic, 2)
    mock_cluster.set_partition_leader(topic, 0, 1)
    mock_cluster.set_partition_leader(topic, 1, 1)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(tmp_path),
        replication_timeout_ms=SOCKET_TIMEOUT_S * 1000,
        kafka_socket_timeout_s=SOCKET_TIMEOUT_S,
        books_topic="",  # no books publisher: its requests would take the injected errors
    )
    first, second = 50, 50
    with (
        running_daemon(config) as daemon,
        UnixStreamSender(config.stream_path) as stream,
        log_ends_of(mock_cluster.bootstrap_servers, topic) as log_end,
    ):
        stream.send_many(encode_any_partition(topic, b"w%d" % i) for i in range(WARM))
        wait_until(settled(daemon, topic, WARM), what="the warm-up delivered")
        warm_ends = log_end(0), log_end(1)
        late = (0, 3 * SOCKET_TIMEOUT_S * 1000)  # written, answered long after the drop
        behind = (0, 0)  # written, its answer queued behind the late one's
        mock_cluster.push_broker_request_errors(
            1, ApiKey.PRODUCE, [late, behind] + [(ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)] * 8
        )
        stream.send_many(encode_partition_key(topic, b"a%d" % i, 0) for i in range(first))
        wait_until(lambda: log_end(0) >= warm_ends[0] + first, what="the late request written")
        time.sleep(SECOND_REQUEST_AFTER_S)  # not a deadline: the second request's age
        stream.send_many(encode_partition_key(topic, b"b%d" % i, 1) for i in range(second))
        wait_until(settled(daemon, topic, WARM + first + second), what="every report")
        snapshot = daemon.snapshot()
    assert_balanced(snapshot)
    books = snapshot["topics"][topic]
    records = consume_all(mock_cluster.bootstrap_servers, topic, books["delivered"])
    in_kafka = Counter(r.value for r in records)
    # Every message Kafka holds is counted delivered or possibly delivered. On a quiet
    # machine Kafka holds all of them; one so busy that the second request left only
    # after the drop has it refused and not written (a true discard): it only does not
    # reproduce the case then.
    assert len(in_kafka) <= books["delivered"] + books["possibly_delivered"], books
