"""``pydory demo --sigkill N``: the demo with the daemon SIGKILLed N times while its clients
send, then landed once and audited from the books topic, as a fleet would be.

What it runs, in order, each stage timed on one line (:mod:`pydory_tools.demo` has the rest):

1. Apache Kafka (or your cluster), the demo topics and the books topic (compacted);
2. the daemon (``pydory serve``) with its spool on and a host id, publishing each run's
   books to the books topic;
3. client threads on all three transports, each value unique (``<client>/<n>``), that
   survive the daemon's restarts (:class:`pydory_tools.testing.kill_loop.SurvivingClient`);
   meanwhile the daemon is SIGKILLed N times, each after a random number of messages
   accepted since its start, and started again on the same config and spool: each start
   rebuilds the killed run's books from the spool and replays what was not acknowledged;
4. the last run settles every message and stops cleanly (its final books published);
5. the landing job (Trigger.AvailableNow), dropping second copies by their ``pydory-id``;
6. the fleet audit: the books topic against the lake, no daemon's HTTP port.

Its last lines say whether the audit balanced, with the kills, the messages replayed and
the second copies the landing job dropped; it returns 0 only if the audit balances.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydory.wording import counted
from pydory_tools.demo import (
    CLIENT_TIMEOUT_S,
    DAEMON_START_TIMEOUT_S,
    SETTLE_TIMEOUT_S,
    DemoFailed,
    DemoPaths,
    DemoTopics,
    Progress,
    demo_daemon_config,
    embedded_kafka,
    landed_query,
    landing_connector,
    prepare_workdir,
    require_clean_exit,
    stderr_to,
    verdict,
)
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.daemon_process import DaemonDidNotStart
from pydory_tools.testing.kafka_util import admin_create_topic
from pydory_tools.testing.kill_loop import (
    KilledDaemon,
    KillLoopError,
    SurvivingClient,
    Transport,
    endpoints,
    kill_thresholds,
)

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

    from pydory.pipeline.audits.fleet_reconcile import FleetReport

STAGES = 6
#: The daemon's host id: the first part of every identity it gives out.
HOST_ID = "demo-host"
#: Messages a second each client sends while the daemon is up.
CLIENT_RATE = 1_000


@dataclass(frozen=True)
class KillRun:
    """What the kill loop did: the kills, the messages sent and replayed."""

    kills: int
    thresholds: tuple[int, ...]
    sent: int
    replayed: int


def sigkill_clients(config: DaemonConfig, topics: DemoTopics, count: int) -> list[SurvivingClient]:
    """The client threads: AnyPartition on each transport, PartitionKey on two."""
    to = endpoints(config)

    def client(
        label: str, transport: Transport, topic: str, key: int | None = None
    ) -> SurvivingClient:
        return SurvivingClient(
            label, to[transport], topic, limit=count, rate=CLIENT_RATE, partition_key=key
        )

    return [
        client("datagram-events", "datagram", topics.events),
        client("stream-events", "stream", topics.events),
        client("tcp-events", "tcp", topics.events),
        client("tcp-keyed-7", "tcp", topics.keyed, 7),
        client("stream-keyed-2", "stream", topics.keyed, 2),
    ]


def send_while_killing(
    daemon: KilledDaemon, clients: Sequence[SurvivingClient], kills: int, seed: int | None
) -> KillRun:
    """Start the clients; SIGKILL the daemon ``kills`` times while they send, each after
    a random number of messages accepted since its start; wait for the clients."""
    total = sum(client.limit for client in clients)
    # The kills fall within the first half of the traffic, whatever the draw: the last
    # run takes messages too, and what the kills lose in socket buffers is covered.
    low, high = total // (3 * (kills + 1)), total // (2 * (kills + 1))
    thresholds = kill_thresholds(random.Random(seed), kills, max(1, low), max(1, high))
    try:
        for client in clients:
            client.start()
        # Under load a kill can lose more in socket buffers than the draw allows for:
        # once the clients are done, the kills left come at once.
        daemon.kill_at(
            thresholds, senders_done=lambda: not any(client.is_alive() for client in clients)
        )
        for client in clients:
            client.finish(CLIENT_TIMEOUT_S)
    finally:  # after a failure, no client outlives the demo
        for client in clients:
            client.stop()
    sent = sum(client.sent for client in clients)
    return KillRun(daemon.kills, tuple(thresholds), sent, daemon.replayed)


def second_copies_dropped(query: StreamingQuery, topics: Sequence[str]) -> int:
    """The rows the landing query read and did not land (its observed metrics)."""
    from pydory.pipeline.landing.dedup import dropped_per_topic

    return sum(
        sum(dropped_per_topic(progress.observedMetrics or {}, topics).values())
        for progress in query.recentProgress
    )


def fleet_audit(
    bootstrap: str,
    topics: DemoTopics,
    paths: DemoPaths,
    master: str,
    kafka: str,
    *,
    lake: str | None = None,
    state_dir: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> FleetReport:
    """The fleet audit over the books topic and the lake (``paths.lake``, or ``lake``: a
    URI such as ``hdfs://…``), its state kept in ``state_dir`` if given, on a session with
    ``conf``; the report written in text and JSON under the work directory."""
    from pydory.pipeline.audits.fleet_audit import fleet_audit as audit_fleet
    from pydory.pipeline.errors import PipelineError
    from pydory.pipeline.spark import spark_session

    spark = spark_session(master=master, app_name="pydory-demo", conf=conf)
    try:
        report = audit_fleet(
            spark,
            lake or str(paths.lake),
            bootstrap_servers=bootstrap,
            books_topic=topics.books,
            state_dir=state_dir,
            connector=landing_connector(kafka),
        )
    except PipelineError as error:
        raise DemoFailed(f"the fleet audit could not run: {error}") from None
    paths.report_text.write_text(report.render(), encoding="utf-8")
    paths.report_json.write_text(json.dumps(report.as_dict(), indent=2) + "\n", encoding="utf-8")
    return report


def what_became_of_them(sent: int, report: dict[str, Any], who: str = "the daemon") -> str:
    """Sent, accepted (by ``who``), in the lake, and why the three differ: the line a
    reader needs beside "exactly once" (which speaks of the accepted ones only).

    A run that ended without final books (a host that never came back) counts in its books
    only what it had accepted at its last periodic record; what it accepted after that is
    known from the lake alone (``landed`` over ``accepted``), and counts as accepted here:
    those messages were taken on, not lost in a socket buffer."""
    topics = [topic for host in report["hosts"] for topic in host["topics"]]
    booked = sum(topic["accepted"] for topic in topics)
    past_the_books = sum(max(0, topic["landed"] - topic["accepted"]) for topic in topics)
    accepted = booked + past_the_books
    landed = sum(topic["landed"] for topic in topics)
    line = f"demo: the clients sent {counted(sent, 'message')}; {who} accepted {accepted:,}"
    if past_the_books:
        line += (
            f" ({past_the_books:,} of them after the last books of a run that never ended, "
            "known from the lake)"
        )
    line += f"; {landed:,} are in the lake, once each"
    if sent > accepted:
        line += (
            f". The {sent - accepted:,} never accepted were in a killed daemon's socket "
            "buffers (written by the clients, not yet read: a SIGKILL drops them, so no "
            "daemon ever took them on)"
        )
    if accepted > landed:
        line += f". Of the accepted, {accepted - landed:,} are not in the lake: "
        line += _not_landed(topics)
    return line


def _not_landed(topics: Sequence[dict[str, Any]]) -> str:
    """Why accepted messages are not in the lake, as the books say (reason: count)."""
    reasons: dict[str, int] = {}
    for topic in topics:
        for reason, count in topic["discarded"].items():
            reasons[f"discarded ({reason})"] = reasons.get(f"discarded ({reason})", 0) + count
        unfound = topic["possibly_delivered"] - topic["possibly_delivered_found"]
        for name, count in (
            ("possibly delivered, not found", unfound),
            ("outstanding", topic["outstanding"]),
            ("in flight", topic["in_flight"]),
        ):
            reasons[name] = reasons.get(name, 0) + count
    return ", ".join(f"{name} {count:,}" for name, count in reasons.items() if count) or "none"


def run_sigkill_demo(
    kills: int,
    kafka: str = "kafka",
    brokers: int | None = None,
    count: int = 2000,
    workdir: str | None = None,
    master: str = "local[2]",
    seed: int | None = None,
) -> int:
    """Run the demo with ``kills`` SIGKILLs; returns 0 when the fleet audit balances."""
    progress = Progress(STAGES)
    try:
        paths = prepare_workdir(workdir)
        print(f"pydory demo --sigkill {kills}: work directory {paths.workdir} (kept)", flush=True)
        report, run, dropped = _run_stages(
            progress, paths, kafka, brokers, count, master, kills, seed
        )
    except DemoFailed as error:
        print(f"demo: FAILED: {error}", flush=True)
        return 1
    print()
    print(report.render().rstrip("\n"))
    print()
    print(f"lake:    {paths.lake}  (Parquet, partitioned by topic and date)")
    print(f"reports: {paths.report_text}, {paths.report_json}")
    print(f"daemon:  {paths.daemon_log}, {paths.config}, spool {paths.spool}")
    print(f"spark:   {paths.spark_log}")
    copies = report.as_dict()["second_copies_in_lake"]
    print(what_became_of_them(run.sent, report.as_dict()))
    print(
        f"demo: {counted(run.kills, 'SIGKILL')} while the clients sent, "
        f"{counted(run.replayed, 'message')} replayed from the spool, "
        f"{counted(dropped, 'second copy', 'second copies')} dropped by the landing job, "
        f"{copies:,} left in the lake"
    )
    return verdict(
        progress,
        report.balanced,
        "the fleet audit balanced: every accepted message is in the lake exactly once",
        "the fleet audit does not balance",
    )


def _run_stages(
    progress: Progress,
    paths: DemoPaths,
    kafka: str,
    brokers: int | None,
    count: int,
    master: str,
    kills: int,
    seed: int | None,
) -> tuple[FleetReport, KillRun, int]:
    with contextlib.ExitStack() as running:
        with progress.stage("kafka") as result:
            bootstrap, described, topics = running.enter_context(
                embedded_kafka(kafka, brokers, paths.workdir)
            )
            # Compacted: the latest record of each run is kept (docs/accounting.md).
            admin_create_topic(bootstrap, topics.books, 1, config={"cleanup.policy": "compact"})
            listed = topics.listed()
            result.append(f"{described} at {bootstrap}; topics {listed}; books {topics.books}")
        with progress.stage("daemon") as result:
            config = demo_daemon_config(bootstrap, paths, host_id=HOST_ID, books_topic=topics.books)
            daemon = _start_daemon(config, paths)
            running.callback(daemon.stop)
            url = f"http://127.0.0.1:{config.http_port}"
            pid = daemon.process.process.pid
            result.append(f"pydory serve (pid {pid}), status {url}, spool on, host id {HOST_ID}")
        with progress.stage("clients") as result:
            clients = sigkill_clients(config, topics, count)
            try:
                run = send_while_killing(daemon, clients, kills, seed)
            except (KillLoopError, DaemonDidNotStart) as error:
                raise DemoFailed(f"{error}; see {paths.daemon_log}") from None
            moments = ", ".join(f"{k:,}" for k in run.thresholds)
            result.append(
                f"{counted(len(clients), 'client thread')} sent {counted(run.sent, 'message')} "
                f"over unix datagram, unix stream and tcp; the daemon SIGKILLed "
                f"{counted(run.kills, 'time')} (after {moments} more accepted) and restarted "
                "on its spool"
            )
        with progress.stage("settle") as result:
            try:
                daemon.settle(SETTLE_TIMEOUT_S)
            except KillLoopError as error:
                raise DemoFailed(str(error)) from None
            require_clean_exit(daemon.stop(), paths)
            result.append(
                f"the last run settled every message and stopped cleanly (exit 0); "
                f"{counted(run.replayed, 'message')} replayed from the spool in all"
            )
        with stderr_to(paths.spark_log):
            with progress.stage("land") as result:
                query = landed_query(bootstrap, topics, paths, master, kafka)
                records = sum(p.numInputRows for p in query.recentProgress)
                dropped = second_copies_dropped(query, tuple(topics.partitions))
                result.append(
                    f"Spark AvailableNow query: {counted(records, 'record')} read, "
                    f"{counted(dropped, 'second copy', 'second copies')} dropped by pydory-id"
                )
            with progress.stage("audit") as result:
                report = fleet_audit(bootstrap, topics, paths, master, kafka)
                verdict = "balanced" if report.balanced else "DOES NOT BALANCE"
                result.append(f"books topic {topics.books} against the lake: {verdict}")
    return report, run, dropped


def _start_daemon(config: DaemonConfig, paths: DemoPaths) -> KilledDaemon:
    try:
        return KilledDaemon(config, paths.workdir, start_timeout_s=DAEMON_START_TIMEOUT_S)
    except DaemonDidNotStart:
        raise DemoFailed(f"the daemon did not start; see {paths.daemon_log}") from None
