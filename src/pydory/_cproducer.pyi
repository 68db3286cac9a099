"""Types of pydory._cproducer (the C source: _cproducer.c)."""

from collections.abc import Sequence
from typing import NamedTuple

HEADER_VERSION: int
REPORT_RING_EVENTS: int

def library_version(module_path: str) -> tuple[int, str]: ...
def bind(module_path: str) -> tuple[str, str]: ...
def burst_topics(parsed: Sequence[object], max_data: int) -> dict[str, tuple[int, int]] | None: ...
def _inject_faults(fail_report: int, garble_texts: int) -> None: ...

# The records a poll hands back: C struct sequences (tuples with named fields).

class AckSum(NamedTuple):
    token: int
    topic: str
    messages: int
    data_bytes: int

class Ack(NamedTuple):
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    token: int

class Failure(NamedTuple):
    code: int
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: list[tuple[str, bytes | None]] | None
    token: int
    partition_key: int | None
    attempt: int
    maybe_in_kafka: bool
    status: int

class Statistics(NamedTuple):
    json: str

class Error(NamedTuple):
    code: int
    text: str
    fatal: bool

class Log(NamedTuple):
    level: int
    facility: str
    name: str
    text: str

class Polled(NamedTuple):
    ack_sums: list[AckSum]
    acks: list[Ack] | None
    failures: list[Failure]
    events: list[Statistics | Error | Log]
    stopped_by: type[BaseException] | None

class Producer:
    polling: int
    @property
    def wake_fd(self) -> int: ...
    def __init__(self, properties: dict[str, str], thread: bool = False) -> None: ...
    def produce(
        self,
        topic: str,
        partition: int,
        value: bytes,
        key: bytes | None,
        timestamp_ms: int,
        partition_key: int | None,
        attempt: int,
        token: int,
        maybe_in_kafka: bool,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> int: ...
    def produce_burst(
        self,
        parsed: Sequence[object],
        headers: object,
        topic: str,
        max_data: int,
        runs: object,
        token: int,
    ) -> list[tuple[int, int]]: ...
    def poll(self, timeout_s: float, each_ack: bool) -> Polled | None: ...
    def purge(self) -> int: ...
    def close(self) -> None: ...
    def report_each_ack(self) -> None: ...
    def thread_counts(self) -> dict[str, int] | None: ...
    def __len__(self) -> int: ...
