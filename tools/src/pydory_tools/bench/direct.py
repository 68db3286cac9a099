"""The direct baseline: one Python process producing the same messages with confluent-kafka.

``python -m pydory_tools.bench.direct JOB`` (protocol: pydory_tools.bench.child). The job:
bootstrap, topic, messages, value_bytes, linger_ms, compression, seed, probe_topic, probe_every,
deadline_s. It sends the same latency probes as the generators, so that the two
latency figures come from one method.

This is what a user would write instead of running a daemon: produce() in a loop
(waiting in poll() when librdkafka's queue is full), then flush(). It asks for the same
guarantees as pydory's producers (acks=all, idempotence) and, so as not to charge it a
Python callback per message, only error reports (``delivery.report.only.error``): flush()
returning 0 means every message has its report, so delivered = messages - errors.

Result: first_produce and last_ack (time.monotonic()), delivered, errors, probes, cpu_s
(the whole process, librdkafka's threads included), rss_mb_peak.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from pydory_tools.bench import workload
from pydory_tools.bench.child import BenchError, WaitForGo, child_main, time_left

#: How long produce() waits in poll() for room when librdkafka's queue is full.
QUEUE_FULL_WAIT_S = 0.01
#: Serve (error) reports every this many messages, as a well-behaved producer loop does.
POLL_EVERY = 10_000


class _ErrorCount:
    def __init__(self) -> None:
        self.errors = 0

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors += 1


def produce(job: Mapping[str, Any], wait_for_go: WaitForGo) -> Mapping[str, Any]:
    deadline = time.monotonic() + float(job["deadline_s"])
    errors = _ErrorCount()
    producer = Producer(
        {
            "bootstrap.servers": job["bootstrap"],
            "linger.ms": int(job["linger_ms"]),
            "compression.type": job["compression"],
            "enable.idempotence": True,
            "delivery.report.only.error": True,
            "on_delivery": errors,
        }
    )
    producer.list_topics(job["topic"], timeout=time_left(deadline))  # connect before timing
    values = workload.make_values(int(job["value_bytes"]), workload.POOL_SIZE, int(job["seed"]))
    topic, total = job["topic"], int(job["messages"])
    probe_topic, probe_every = job["probe_topic"], int(job["probe_every"])
    probe_padding = b"p" * (int(job["value_bytes"]) - workload.PROBE_STAMP.size)
    probes = 0
    wait_for_go({})
    cpu_start = time.process_time()
    first_produce = time.monotonic()
    for i in range(total):
        value = values[i % workload.POOL_SIZE]
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(QUEUE_FULL_WAIT_S)
                time_left(deadline)
        if i % POLL_EVERY == 0:
            producer.poll(0)
        if probe_every and (i + 1) % probe_every == 0:
            # The same latency probe as the generators send to pydory (workload.encode_probe).
            stamp = workload.PROBE_STAMP.pack(time.time_ns())
            producer.produce(probe_topic, stamp + probe_padding)
            probes += 1
    remaining = producer.flush(time_left(deadline))
    last_ack = time.monotonic()
    if remaining:
        raise BenchError(f"{remaining} messages still unacknowledged at the deadline")
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "first_produce": first_produce,
        "last_ack": last_ack,
        "delivered": total - errors.errors,
        "errors": errors.errors,
        "probes": probes,
        "cpu_s": time.process_time() - cpu_start,
        "rss_mb_peak": rss_kb / 1024,
    }


if __name__ == "__main__":
    sys.exit(child_main(produce))
