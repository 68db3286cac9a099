"""Dory's own Nagios counters check, run against a live pydory.

``check_dory_counters`` below is our equivalent of Dory's
``status_monitoring/check_dory_counters.py`` (written from its rules, not copied): it
reads ``/counters/json``, answers UNKNOWN when the report is malformed or a counter it
reads is missing, compares with the previous report of the same process, and is CRITICAL
when any counter of a critical event moved, WARNING on metadata oddities and socket
errors, and judges ``MsgCreate - MsgDestroy`` (messages outstanding) against thresholds.
Run against pydory before the Dory counters were served, it answered UNKNOWN: "Counter
MsgUnprocessedDestroy not found".
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from dory_check import CRITICAL_EVENTS
from helpers import settled, wait_until
from pydory.client import UnixStreamSender
from pydory.status.dory_counters import DORY_COUNTERS, NEVER_IN_PYDORY
from pydory.status.server import PAGE_REUSE_S
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster
from test_status import fetch

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3

#: Every counter Dory's check reads (issue 12's list).
READ_BY_THE_CHECK: tuple[str, ...] = (
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
    "ConnectorConnectFail",
    "ConnectorSocketBrokerClose",
    "ConnectorSocketError",
    "ConnectorSocketTimeout",
    "ConnectorTruncateLongTimeout",
    "CorrelationIdMismatch",
    "GetMetadataFail",
    "GetMetadataSuccess",
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
    "MetadataUpdated",
    "MongooseStdException",
    "MongooseUnknownException",
    "MongooseUrlDecodeError",
    "MsgCreate",
    "MsgDestroy",
    "MsgSetCompressionError",
    "MsgUnprocessedDestroy",
    "NoDiscardQuery",
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
    "TcpInputInvalidSizeField",
    "TcpInputMsgBodyTooLarge",
    "TcpInputSocketError",
    "TcpInputUncleanDisconnect",
    "TopicHasNoAvailablePartitions",
    "UnixStreamInputInvalidSizeField",
    "UnixStreamInputMsgBodyTooLarge",
    "UnixStreamInputSocketError",
    "UnixStreamInputUncleanDisconnect",
)

# Dory's check: one more of any of these since the last report is critical (the
# list is tests/dory_check.py's, the port of Dory's script).
# ... and any of these a warning.
WARNING_EVENTS = (
    *(n for n in READ_BY_THE_CHECK if n.startswith("MetadataResponse") and "Read" not in n),
    "ShortMetadataResponse",
)
SOCKET_ERRORS = (
    "ConnectFailOnTryGetMetadata",
    "ConnectorConnectFail",
    "ConnectorSocketBrokerClose",
    "ConnectorSocketError",
    "ConnectorSocketTimeout",
    "MetadataResponseReadLostTcpConnection",
    "MetadataResponseReadTimeout",
    "SendMetadataRequestFail",
    "SendMetadataRequestLostTcpConnection",
    "UnixStreamInputSocketError",
    "TcpInputSocketError",
)


@dataclass
class Verdict:
    code: int
    problems: list[str] = field(default_factory=list)

    def report(self, code: int, problem: str) -> None:
        self.code = max(self.code, code)
        self.problems.append(problem)


def parse_report(report: Any) -> dict[str, int] | str:
    """The counters by name, or why the report is not one Dory's check accepts."""
    if not isinstance(report, dict):
        return "Counter report is not a dictionary"
    for key, kind in (("now", int), ("since", int), ("pid", int), ("version", str)):
        if not isinstance(report.get(key), kind):
            return f'Item "{key}" missing or of the wrong type'
    if not isinstance(report.get("counters"), list):
        return 'Item "counters" in counter report is not a list'
    counters: dict[str, int] = {}
    for item in report["counters"]:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("value"), int)
            and isinstance(item.get("location"), str)
        ):
            return f"Bad counter item {item!r}"
        if item["name"] in counters:
            return f"Duplicate counter name [{item['name']}]"
        counters[item["name"]] = item["value"]
    return counters


def check_dory_counters(
    report: Any,
    previous: Any | None,
    *,
    outstanding_warning: int = 10_000,
    outstanding_critical: int = 50_000,
    socket_error_warning: int = 0,
    socket_error_critical: int = 10,
) -> Verdict:
    counters = parse_report(report)
    if isinstance(counters, str):
        return Verdict(UNKNOWN, [counters])
    missing = [name for name in READ_BY_THE_CHECK if name not in counters]
    if missing:
        return Verdict(UNKNOWN, [f"Counter {missing[0]} not found"])
    deltas = dict(counters)
    if previous is not None and previous["pid"] == report["pid"]:
        before = parse_report(previous)
        assert isinstance(before, dict)
        for name in READ_BY_THE_CHECK:
            deltas[name] = counters[name] - before[name]
            if deltas[name] < 0:
                return Verdict(UNKNOWN, [f"Key [{name}] decreased by {-deltas[name]}"])
    verdict = Verdict(OK)
    for name in CRITICAL_EVENTS:
        if deltas[name] > 0:
            verdict.report(CRITICAL, f"{name}={deltas[name]}")
    for name in WARNING_EVENTS:
        if deltas[name] > 0:
            verdict.report(WARNING, f"{name}={deltas[name]}")
    socket_errors = sum(deltas[name] for name in SOCKET_ERRORS)
    if socket_errors > socket_error_critical:
        verdict.report(CRITICAL, f"{socket_errors} socket errors")
    elif socket_errors > socket_error_warning:
        verdict.report(WARNING, f"{socket_errors} socket errors")
    outstanding = counters["MsgCreate"] - counters["MsgDestroy"]
    if outstanding > outstanding_critical:
        verdict.report(CRITICAL, f"{outstanding} messages outstanding")
    elif outstanding > outstanding_warning:
        verdict.report(WARNING, f"{outstanding} messages outstanding")
    return verdict


# --- a live daemon --------------------------------------------------------------------------


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("dm", numbered=True))


@pytest.fixture
def daemon(mock_cluster: MockCluster, socket_dir: str) -> Iterator[RunningDaemon]:
    mock_cluster.create_topic("orders", 4)
    with running_daemon(DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)) as running:
        yield running


def counters_report(daemon: RunningDaemon) -> Any:
    time.sleep(PAGE_REUSE_S)  # a fresh page, not the one served a moment ago
    return fetch(daemon.daemon_config.http_port, "/counters/json").json()


def counter(daemon: RunningDaemon, name: str) -> Callable[[], int]:
    def value() -> int:
        report = parse_report(counters_report(daemon))
        assert isinstance(report, dict)
        return report[name]

    return value


def test_every_counter_the_check_reads_is_served_zeros_included(daemon: RunningDaemon) -> None:
    counters = parse_report(counters_report(daemon))

    assert isinstance(counters, dict)
    assert set(READ_BY_THE_CHECK) <= set(counters)
    assert set(DORY_COUNTERS) == set(READ_BY_THE_CHECK)
    assert all(counters[name] == 0 for name in NEVER_IN_PYDORY)
    plain = fetch(daemon.daemon_config.http_port, "/counters/plain").body
    assert "\n[, 1].MsgUnprocessedDestroy=0\n" in plain


def test_a_healthy_daemon_under_traffic_passes_the_check(daemon: RunningDaemon) -> None:
    first = counters_report(daemon)
    with UnixStreamSender(daemon.daemon_config.stream_path) as stream:
        stream.send_many(encode_any_partition("orders", b"v%d" % i) for i in range(500))
    wait_until(settled(daemon, "orders", 500), what="500 deliveries")
    second = counters_report(daemon)

    verdict = check_dory_counters(second, first)

    assert verdict == Verdict(OK), verdict.problems
    counters = parse_report(second)
    assert isinstance(counters, dict)
    assert counters["MsgCreate"] == counters["MsgDestroy"] == 500


def test_outstanding_messages_are_judged_against_the_thresholds(
    daemon: RunningDaemon, mock_cluster: MockCluster
) -> None:
    for broker in (1, 2, 3):
        mock_cluster.broker_down(broker)
    with UnixStreamSender(daemon.daemon_config.stream_path) as stream:
        stream.send_many(encode_any_partition("orders", b"v%d" % i) for i in range(300))
    wait_until(lambda: counter(daemon, "MsgCreate")() == 300, what="300 accepted")

    verdict = check_dory_counters(counters_report(daemon), None, outstanding_warning=100)

    assert verdict.code >= WARNING
    assert "300 messages outstanding" in verdict.problems


def test_get_metadata_success_grows_over_a_refresh(daemon: RunningDaemon) -> None:
    before = counter(daemon, "GetMetadataSuccess")()
    assert before >= 1  # the start-up fetch

    fetch(daemon.daemon_config.http_port, "/metadata_update", method="POST")

    wait_until(lambda: counter(daemon, "GetMetadataSuccess")() > before, what="a refresh")
    assert counter(daemon, "MetadataUpdated")() >= 1


def test_a_failed_metadata_fetch_is_critical(
    daemon: RunningDaemon, mock_cluster: MockCluster
) -> None:
    first = counters_report(daemon)
    for broker in (1, 2, 3):
        mock_cluster.broker_down(broker)

    fetch(daemon.daemon_config.http_port, "/metadata_update", method="POST")
    wait_until(lambda: counter(daemon, "GetMetadataFail")() > 0, 60, "a failed fetch")

    verdict = check_dory_counters(counters_report(daemon), first)
    assert verdict.code == CRITICAL
    assert any(problem.startswith("GetMetadataFail=") for problem in verdict.problems)


def test_stream_input_troubles_are_counted_under_dorys_names(daemon: RunningDaemon) -> None:
    config = daemon.daemon_config
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(config.stream_path)
        client.sendall(struct.pack(">i", -5))  # an impossible size field
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(config.stream_path)
        client.sendall(encode_any_partition("orders", b"cut")[:10])  # then hang up mid-frame

    wait_until(
        lambda: counter(daemon, "UnixStreamInputUncleanDisconnect")() == 1, what="the hang-up"
    )
    invalid = counter(daemon, "UnixStreamInputInvalidSizeField")()
    too_large = counter(daemon, "UnixStreamInputMsgBodyTooLarge")()
    assert invalid + too_large == 1


def test_the_check_refuses_a_report_without_dorys_counters() -> None:
    report = {"pid": 1, "version": "x", "since": 1, "now": 2, "counters": []}

    verdict = check_dory_counters(report, None)

    assert verdict == Verdict(UNKNOWN, ["Counter BadKafkaResponseSize not found"])
