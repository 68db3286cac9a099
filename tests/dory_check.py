"""Dory's Nagios counters check, ported: its rules, its exit codes, its answers.

Written from the rules of Dory's ``status_monitoring/check_dory_counters.py`` (Dory 3.2.6,
read with the search tool's fetch; not copied): every run reads ``/counters/json``, keeps
the report, and compares it with the previous report of the same process (same ``pid``).
The script's counter files become a list here, and its ``Die(code, message)`` an
exception; everything else is the script's logic, in its order:

1. the report must be a dict with integer ``now``, ``since``, ``pid``, a string
   ``version`` and a list ``counters`` of ``{location: str, name: str, value: int}``
   with no name twice, else UNKNOWN;
2. against the previous report of the same pid, the two sets of names must be equal
   ("Old/New counter file has unmatched keys", UNKNOWN) and no counter may decrease
   (UNKNOWN); without one, the deltas are the values themselves;
3. any increase of a critical event is CRITICAL, of a warning event WARNING; the sum of
   the socket-error counters above ``-c`` is CRITICAL, above ``-w`` WARNING; a Mongoose
   exception counter up by more than 1 is UNKNOWN; a counter it reads that is missing is
   UNKNOWN ("Counter X not found");
4. ``MsgCreate - MsgDestroy`` (outstanding messages) above ``-C`` is CRITICAL, above
   ``-W`` WARNING; ``MsgDestroy > MsgCreate`` is CRITICAL;
5. with a report of the same pid at least ``-i`` seconds older, ``GetMetadataSuccess``
   must have grown, else CRITICAL (the script prints it as a Warning, and returns
   CRITICAL);
6. the exit code is the worst of these; on success the script prints ``Ok``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

# Nagios exit codes, as the script's EC_*.
OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
CODE_NAMES = {OK: "Success", WARNING: "Warning", CRITICAL: "Critical", UNKNOWN: "Unknown"}

#: One more of any of these since the last run is CRITICAL.
CRITICAL_EVENTS = (
    "MsgUnprocessedDestroy",
    "NoDiscardQuery",
    "MetadataHasEmptyTopicList",
    "MetadataHasEmptyBrokerList",
    "BugDispatchBatchOutOfRangeIndex",
    "BugDispatchMsgOutOfRangeIndex",
    "TopicHasNoAvailablePartitions",
    "MetadataSanityCheckFail",
    "GetMetadataFail",
    "StreamClientWorkerStdException",
    "StreamClientWorkerUnknownException",
)
#: One more of any of these is WARNING.
WARNING_EVENTS = (
    "MetadataResponseBadTopicNameLen",
    "MetadataResponseBadBrokerHostLen",
    "MetadataResponseNegativeCaughtUpReplicaNodeId",
    "MetadataResponseNegativePartitionCaughtUpReplicaCount",
    "MetadataResponseNegativeReplicaNodeId",
    "MetadataResponseNegativePartitionReplicaCount",
    "MetadataResponseInvalidLeaderNodeId",
    "MetadataResponseNegativePartitionId",
    "MetadataResponseNegativePartitionCount",
    "MetadataResponseNegativeTopicCount",
    "MetadataResponseBadBrokerPort",
    "MetadataResponseNegativeBrokerNodeId",
    "MetadataResponseNegativeBrokerCount",
    "ShortMetadataResponse",
    "BadMetadataResponseSize",
    "BadMetadataResponse",
    "ProduceResponseBadPartitionCount",
    "ProduceResponseBadTopicNameLength",
    "ProduceResponseBadTopicCount",
    "BadKafkaResponseSize",
    "BugGetAckWaitQueueOutOfRangeIndex",
    "ProduceResponseUnexpectedTopic",
    "ProduceResponseUnexpectedPartition",
    "ProduceResponseShortPartitionList",
    "ProduceResponseShortTopicList",
    "CorrelationIdMismatch",
    "BadProduceResponseSize",
    "BadProduceResponse",
    "BugAllTopicsEmpty",
    "BugMsgListMultipleTopics",
    "BugMsgSetEmpty",
    "BugMultiPartitionGroupEmpty",
    "BugProduceRequestEmpty",
    "MsgSetCompressionError",
    "ConnectorTruncateLongTimeout",
    "UnixStreamInputUncleanDisconnect",
    "TcpInputUncleanDisconnect",
    "TcpInputInvalidSizeField",
    "TcpInputMsgBodyTooLarge",
    "UnixStreamInputInvalidSizeField",
    "UnixStreamInputMsgBodyTooLarge",
)
#: Summed, and judged against the socket-error thresholds.
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
#: An increase of more than 1 makes the whole answer UNKNOWN (the status server is broken).
WEB_SERVER_TROUBLE = ("MongooseUrlDecodeError", "MongooseStdException", "MongooseUnknownException")


class _Die(Exception):
    """The script's Die(): print the message, exit with the code, at once."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Answer:
    """One run: the exit code and what the script printed."""

    code: int
    lines: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return CODE_NAMES[self.code]


@dataclass
class DoryCountersCheck:
    """The check's options (``-w -c -W -C -i``) and its counter files (earlier reports)."""

    socket_error_warn: int
    socket_error_critical: int
    msg_count_warn: int
    msg_count_critical: int
    interval_s: int = 3600
    reports: list[dict[str, Any]] = field(default_factory=list)

    def run(self, report: Any) -> Answer:
        """One run of the check on ``report`` (a parsed ``/counters/json``)."""
        lines: list[str] = []
        try:
            code = self._run(report, lines)
        except _Die as die:
            return Answer(die.code, [*lines, die.message])
        if code == OK:
            lines.append("Ok")
        return Answer(code, lines)

    def _run(self, report: Any, lines: list[str]) -> int:
        _parse(report)
        now = report["now"]
        older = sorted((r for r in self.reports if r["now"] < now), key=lambda r: r["now"])
        # The script's counter file is named by "now": a second run in the same second
        # replaces the first.
        self.reports = [r for r in self.reports if r["now"] != now] + [report]
        last = older[-1] if older and older[-1]["pid"] == report["pid"] else None
        deltas = _deltas(None if last is None else last["counters"], report["counters"])
        code = self._analyze(deltas, lines)
        code = max(code, self._outstanding(_by_name(report["counters"]), lines))
        old = self._old_report(report, older)
        if old is not None:
            code = max(code, _metadata_updates(report, old, lines))
        return code

    def _analyze(self, deltas: dict[str, int], lines: list[str]) -> int:
        code = OK
        for names, severity in ((CRITICAL_EVENTS, CRITICAL), (WARNING_EVENTS, WARNING)):
            for name in names:
                count = _lookup(deltas, name)
                if count > 0:
                    code = max(code, severity)
                    lines.append(f"{CODE_NAMES[severity]}: {name}={count}")
        socket_errors = sum(_lookup(deltas, name) for name in SOCKET_ERRORS)
        if socket_errors > self.socket_error_critical:
            code = max(code, CRITICAL)
            lines.append(f"Critical: {socket_errors} socket errors:")
        elif socket_errors > self.socket_error_warn:
            code = max(code, WARNING)
            lines.append(f"Warning: {socket_errors} socket errors:")
        for name in WEB_SERVER_TROUBLE:
            count = _lookup(deltas, name)
            if count > 1:
                code = max(code, UNKNOWN)
                lines.append(f"Unknown: {name}={count}")
        return code

    def _outstanding(self, counters: dict[str, int], lines: list[str]) -> int:
        created = _lookup(counters, "MsgCreate")
        destroyed = _lookup(counters, "MsgDestroy")
        if destroyed > created:
            lines.append(
                f"Critical: MsgDestroy counter value {destroyed} is greater than "
                f"MsgCreate counter value {created}"
            )
            return CRITICAL
        outstanding = created - destroyed
        if outstanding > self.msg_count_critical:
            lines.append(f"Critical: MsgCreate - MsgDestroy is {outstanding}")
            return CRITICAL
        if outstanding > self.msg_count_warn:
            lines.append(f"Warning: MsgCreate - MsgDestroy is {outstanding}")
            return WARNING
        return OK

    def _old_report(self, report: dict[str, Any], older: list[dict[str, Any]]) -> Any:
        """The newest earlier report at least ``interval_s`` old, if of the same pid."""
        if not older:
            return None
        times = [r["now"] for r in older]
        latest_ok = report["now"] - self.interval_s
        i = bisect.bisect_left(times, latest_ok)
        if i == len(times):
            chosen = older[-1]
        elif times[i] <= latest_ok:
            chosen = older[i]
        elif i == 0:
            return None
        else:
            chosen = older[i - 1]
        return chosen if chosen["pid"] == report["pid"] else None


def _parse(report: Any) -> None:
    if not isinstance(report, dict):
        raise _Die(UNKNOWN, "Counter report is not a dictionary")
    for key, kind in (("now", int), ("since", int), ("pid", int), ("version", str)):
        if key not in report:
            raise _Die(UNKNOWN, f'Counter report missing "{key}" item')
        if not isinstance(report[key], kind):
            raise _Die(UNKNOWN, f'Item "{key}" in counter report is of the wrong type')
    if not isinstance(report.get("counters"), list):
        raise _Die(UNKNOWN, 'Item "counters" in counter report is not a list')
    names: set[str] = set()
    for item in report["counters"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _Die(UNKNOWN, "Counter item has no name")
        if item["name"] in names:
            raise _Die(UNKNOWN, f"Duplicate counter name [{item['name']}]")
        names.add(item["name"])
        if not isinstance(item.get("value"), int):
            raise _Die(UNKNOWN, f"Value of counter item [{item['name']}] is not an integer")
        if not isinstance(item.get("location"), str):
            raise _Die(UNKNOWN, f"Location of counter item [{item['name']}] is not a string")


def _by_name(counters: list[dict[str, Any]]) -> dict[str, int]:
    return {item["name"]: item["value"] for item in counters}


def _deltas(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> dict[str, int]:
    current = _by_name(new)
    if old is None:
        return current
    before = _by_name(old)
    if set(before) - set(current):
        raise _Die(UNKNOWN, f"Old counter file has unmatched keys: {set(before) - set(current)}")
    if set(current) - set(before):
        raise _Die(UNKNOWN, f"New counter file has unmatched keys: {set(current) - set(before)}")
    deltas = {}
    for name, value in current.items():
        delta = value - before[name]
        if delta < 0:
            raise _Die(UNKNOWN, f"Key [{name}] decreased by {-delta} in new counters file")
        deltas[name] = delta
    return deltas


def _lookup(counters: dict[str, int], name: str) -> int:
    if name not in counters:
        raise _Die(UNKNOWN, f"Counter {name} not found")
    return counters[name]


def _metadata_updates(report: dict[str, Any], old: dict[str, Any], lines: list[str]) -> int:
    before = _lookup(_by_name(old["counters"]), "GetMetadataSuccess")
    now = _lookup(_by_name(report["counters"]), "GetMetadataSuccess")
    if now > before:
        return OK
    lines.append(f"Warning: GetMetadataSuccess not increasing: old value {before} new value {now}")
    return CRITICAL
