"""Types of pydory._cproducer (the C source: _cproducer.c)."""

from typing import Any

def bind(path: str) -> str: ...

class Producer:
    def __init__(self, properties: dict[str, str]) -> None: ...
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
    def poll(
        self, timeout_s: float, each_ack: bool
    ) -> (
        tuple[
            list[tuple[int, str, int, int]],
            list[tuple[str, int, bytes | None, bytes | None, int, int]] | None,
            list[tuple[Any, ...]],
            list[tuple[Any, ...]],
        ]
        | None
    ): ...
    def purge(self) -> int: ...
    def close(self) -> None: ...
    def __len__(self) -> int: ...
