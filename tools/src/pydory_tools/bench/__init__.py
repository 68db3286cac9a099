"""``pydory bench``: pydory's end-to-end benchmark against its two baselines (issue 6).

One invocation starts, for every round, a librdkafka mock cluster (3 brokers, one topic
of 8 partitions), then in turn:

- raw: the load generator into a receiver that only reads (the socket path's ceiling);
- pydory: the generator into ``pydory serve`` (its own process, measured through /proc
  and its status interface), with latency probes read back by a consumer;
- direct: one Python process producing the same messages with confluent-kafka.

Modules, in the order a reader meets them: settings (the one validated config),
workload (what is sent), child (the harness <-> child process protocol), generator,
sink and direct (the child processes), procfs, daemon, latency, runs (one run of each
kind), contention (``--contend``: CPU-bound processes beside the runs), harness (the
interleaved rounds), report (min / median / max, text and JSON).
"""

from __future__ import annotations

from pydory_tools.bench.child import BenchError
from pydory_tools.bench.harness import run_bench
from pydory_tools.bench.report import BenchReport
from pydory_tools.bench.settings import BenchSettings

__all__ = ["BenchError", "BenchReport", "BenchSettings", "run_bench"]
