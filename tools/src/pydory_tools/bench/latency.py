"""Latency samples: a consumer reads the probe topic while the load runs.

The daemon does not report per-message latency, and a record's Kafka timestamp is the
client's own timestamp (milliseconds, set before sending), so the harness measures it
from outside: each generator sends a probe every ``probe_every`` messages, stamped with
its wall clock in nanoseconds (pydory_tools.bench.workload); this consumer, running in the
harness during the load, notes the wall clock when it receives each probe.

What it measures, honestly: client send -> daemon -> librdkafka batching (linger) ->
broker ack *and* -> the consumer's next fetch. That is an upper bound on "client timestamp
to delivery report": it adds the consumer's fetch wait (``FETCH_WAIT_MAX_MS``) and its
share of a loaded machine's scheduling. Probes go through the same sockets, the same
producer and the same batches as the load, so they see its queues.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from pydory_tools.bench.workload import probe_send_time_ns

#: The consumer's longest wait for data in one fetch (an upper bound on what it adds).
FETCH_WAIT_MAX_MS = 5
_POLL_TIMEOUT_S = 0.1
CONNECT_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles of the probes' send-to-consumption times, in milliseconds."""

    samples: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of ascending ``sorted_values`` (``fraction`` in (0, 1])."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, -(-len(sorted_values) * fraction // 1))  # ceil(n * fraction), at least 1
    return sorted_values[int(rank) - 1]


def summarize(latencies_ms: list[float]) -> LatencySummary:
    if not latencies_ms:
        return LatencySummary(0, None, None, None)
    ordered = sorted(latencies_ms)
    return LatencySummary(
        len(ordered), percentile(ordered, 0.50), percentile(ordered, 0.99), ordered[-1]
    )


class ProbeConsumer:
    """Reads the one-partition probe topic from the start on a thread, until stopped."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": "pydory-bench-probes",  # required even with assign(); never committed
                "enable.auto.commit": False,
                "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
                "fetch.min.bytes": 1,
            }
        )
        # Asking for the watermarks connects to the partition's leader now, so the first
        # probes do not wait for the consumer to start; the low mark spares an offset lookup.
        low, _ = self._consumer.get_watermark_offsets(
            TopicPartition(topic, 0), timeout=CONNECT_TIMEOUT_S
        )
        self._consumer.assign([TopicPartition(topic, 0, low)])
        self._latencies_ms: list[float] = []
        self._enough = threading.Event()
        self._expected: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="bench-probes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # poll() returns as soon as one record is there; consume(n, timeout) would
                # wait for n records or the whole timeout, adding its wait to the samples.
                record = self._consumer.poll(_POLL_TIMEOUT_S)
                received_ns = time.time_ns()
                if record is None or record.error() is not None:
                    continue  # nothing yet, or a client event (e.g. a reconnect)
                sent_ns = probe_send_time_ns(record.value() or b"")
                with self._lock:
                    self._latencies_ms.append((received_ns - sent_ns) / 1e6)
                    self._check_enough()
        finally:
            self._consumer.close()

    def _check_enough(self) -> None:
        if self._expected is not None and len(self._latencies_ms) >= self._expected:
            self._enough.set()

    def finish(self, expected: int, timeout_s: float) -> LatencySummary:
        """Wait (at most ``timeout_s``) until ``expected`` probes have arrived, stop, summarize.

        Probes that have not arrived by then are left out: the summary's ``samples`` says
        how many were measured.
        """
        with self._lock:
            self._expected = expected
            self._check_enough()
        self._enough.wait(timeout_s)
        self._stop.set()
        self._thread.join(timeout_s + 5)
        with self._lock:
            return summarize(list(self._latencies_ms))

    def stop(self) -> None:
        """Stop reading (on the error path; ``finish`` stops it otherwise)."""
        self._stop.set()
        self._thread.join(5)
