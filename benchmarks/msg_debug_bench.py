"""Message debugging's cost in the intake: ``Intake.messages`` per message.

64-message bursts of 100-byte AnyPartition datagrams, a dispatcher that does nothing;
message debugging off (or a checkout without it), enabled with nothing selected, tracing
another topic, and tracing this topic (lines formatted and handed to writers that drop
them). Rounds interleaved; ns per message, min and median over the rounds.

    PYTHONPATH=/path/to/checkout/src .venv/bin/python benchmarks/msg_debug_bench.py
"""

from __future__ import annotations

import time
from typing import Any, cast

from pydory.config.model import MsgDebugConfig
from pydory.daemon.admission.intake import Intake
from pydory.daemon.admission.ratelimit import TopicRateLimiter
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import Transport
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.router import MetadataSnapshot, Router
from pydory.wire import encode_any_partition

BURST = 64
BURSTS_PER_ROUND = 300
ROUNDS = 15


class NullDispatcher:
    def send(self, *args: Any, **kwargs: Any) -> None:
        pass


class Unlimited:
    interval_ms = 1000
    max_count = None


class NullSink:
    def write_line(self, line: bytes) -> None:
        pass

    def truncate(self) -> None:
        pass

    def reopen(self) -> None:
        pass

    def close(self) -> None:
        pass


def make(msg_debug: Any) -> Intake:
    extra = {} if msg_debug is None else {"msg_debug": msg_debug}
    topics = {name: dict.fromkeys(range(8), 1) for name in ("fast", "other")}
    return Intake(
        books=Books(600, 64, wall_clock=lambda: 1_700_000_000.0),
        pool=MemoryPool(10**15, clock=lambda: 0.0),
        limiter=TopicRateLimiter(lambda topic: Unlimited(), clock=lambda: 0.0),
        router=Router(MetadataSnapshot.build({1: "b1"}, topics)),
        dispatcher=cast(Dispatcher, NullDispatcher()),
        commit_point=CommitPoint(schedule=lambda delay, callback: False),
        message_max_bytes=1_000_000,
        prefix_size=64,
        **extra,
    )


def variants() -> dict[str, Intake]:
    out = {"baseline (no msg_debug argument)": make(None)}
    try:
        from pydory.daemon.books.msg_debug import MsgDebug
    except ImportError:  # a checkout before message debugging
        return out

    def msg_debug(*topics: str) -> MsgDebug:
        tracer = MsgDebug(
            MsgDebugConfig("/nowhere", 3600, 1 << 60),
            Counters(),
            writers=[NullSink(), NullSink(), NullSink()],
            schedule=lambda delay, callback: None,
        )
        for topic in topics:
            tracer.add_topic(topic)
        return tracer

    out["enabled, nothing selected"] = make(msg_debug())
    out["another topic traced"] = make(msg_debug("other"))
    out["this topic traced"] = make(msg_debug("fast"))
    return out


def main() -> None:
    burst = [
        encode_any_partition("fast", b"v" * 100, b"", 1_700_000_000_000 + i) for i in range(BURST)
    ]
    intakes = variants()
    results: dict[str, list[float]] = {name: [] for name in intakes}
    for _ in range(ROUNDS):
        for name, intake in intakes.items():
            start = time.perf_counter()
            for _ in range(BURSTS_PER_ROUND):
                intake.messages(burst, Transport.UNIX_DGRAM)
            elapsed = time.perf_counter() - start
            results[name].append(elapsed / (BURSTS_PER_ROUND * BURST) * 1e9)
    for name, figures in results.items():
        figures.sort()
        median = figures[len(figures) // 2]
        print(f"{name:34s} ns/msg  min {figures[0]:6.0f}  median {median:6.0f}")


if __name__ == "__main__":
    main()
