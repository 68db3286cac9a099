"""Exactly once from a client's socket to the lake, across daemon crashes, for a fleet
(issue 24's "done when"), on Apache Kafka.

Three daemons with their own host ids, spools and sockets stand for a fleet; clients on
every transport send unique, recognisable values (``<host>/<transport>/<n>``) to each;
every daemon is SIGKILLed several times at random moments (after k more accepted
messages, k drawn from a seeded RNG) and restarted on its spool; the landing job is
SIGKILLed in the middle of a batch (driver and Spark JVM) and restarted on its
checkpoint. At the end, with every daemon stopped cleanly and the landing job run to its
end:

(a) the test's own reading of the lake (the Parquet files its commit log lists) and of
    the books topic: no value and no identity landed twice, every landed value is one a
    client sent (to the daemon whose host id it carries), and per host the runs' books
    add up: the messages first accepted (accepted less replayed, over every run) are the
    distinct identities landed plus the discards after acceptance;
(b) the fleet audit (``pydory pipeline fleet-audit``) balances every host, with no
    second copy in the lake, and run again on its state (nothing new: no Spark started)
    it still balances.

``PYDORY_FLEET_SEED`` changes the random moments; ``-s`` prints what happened.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq
import pytest

from helpers import wait_until
from pydory.daemon.books.events import AFTER_ACCEPTANCE
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.kill_loop import (
    KilledDaemon,
    LandingJob,
    SurvivingClient,
    endpoints,
    kill_thresholds,
)
from test_books_durable_kafka import books_records
from test_spool_acks_kafka import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SEED = int(os.environ.get("PYDORY_FLEET_SEED", "24"))
HOSTS = ("fleet-a", "fleet-b", "fleet-c")
KILLS = 2  # per daemon
PER_CLIENT = 1_200  # messages each client sends at most: 3 clients per daemon
RATE = 250  # messages a second per client, while its daemon is up
#: A daemon is killed after accepting k more messages since its start, k in this range
#: (its three clients send ~750 a second): well within what they send, whatever the RNG.
KILL_AFTER = (100, 400)
#: Safety nets only (a Spark job: ~20 s quiet): the restarted landing job ran over 180 s at
#: a 1-minute load of 20-30; 1,800 s is also the demos' own subprocess net.
LANDING_TIMEOUT_S = 1800.0
AUDIT_TIMEOUT_S = 1800.0
_COMMITTED_LOG_ENTRY = re.compile(r"^\d+(\.compact)?$")


def committed_lake_files(lake: Path) -> list[Path]:
    """The Parquet files the lake's commit log (``_spark_metadata``) lists: a batch killed
    before its commit may have left files that are not part of the lake."""
    added: set[str] = set()
    deleted: set[str] = set()
    for entry in (lake / "_spark_metadata").iterdir():
        if not _COMMITTED_LOG_ENTRY.match(entry.name):
            continue  # Spark's temporary and checksum files
        for line in entry.read_text().splitlines()[1:]:  # after the version line
            record = json.loads(line)
            (added if record["action"] == "add" else deleted).add(record["path"])
    return [Path(unquote(urlparse(path).path)) for path in sorted(added - deleted)]


def lake_rows(lake: Path) -> list[tuple[bytes, str | None]]:
    """Every committed row of the lake: (value, pydory_id)."""
    rows: list[tuple[bytes, str | None]] = []
    for path in committed_lake_files(lake):
        table = pq.read_table(path, columns=["value", "pydory_id"])
        rows += zip(
            table.column("value").to_pylist(), table.column("pydory_id").to_pylist(), strict=True
        )
    return rows


def replayed(run: dict[str, Any]) -> int:
    """What a run replayed from earlier runs' spools: its ``replayed_from``, the chain that
    closes the books across a crash (each equals the earlier run's ``handed_over``)."""
    return sum(n for topics in run["replayed_from"].values() for n in topics.values())


def first_accepted(run: dict[str, Any]) -> int:
    """A run's messages accepted for the first time (not replayed from an earlier run),
    less those discarded after acceptance: what that run owes the lake."""
    owed = -replayed(run)
    for topic in run["topics"].values():
        discarded = sum(n for reason, n in topic["discarded"].items() if reason in AFTER_ACCEPTANCE)
        owed += topic["accepted"] - discarded
    return owed


def start_daemons(bootstrap: str, books_topic: str, tmp_path: Path) -> dict[str, KilledDaemon]:
    """A daemon per host, each with its own host id, directory and spool, started at
    once. A daemon that started is stopped if another did not."""

    def start(host: str) -> KilledDaemon:
        workdir = tmp_path / host
        workdir.mkdir()
        config = DaemonConfig(
            bootstrap,
            str(workdir),
            spool_path=str(workdir / "spool"),
            host_id=host,
            books_topic=books_topic,
        )
        return KilledDaemon(config, workdir)

    with ThreadPoolExecutor(len(HOSTS)) as pool:
        starting = {host: pool.submit(start, host) for host in HOSTS}
    errors = [error for future in starting.values() if (error := future.exception()) is not None]
    if errors:
        for future in starting.values():
            if future.exception() is None:
                future.result().stop()
        raise errors[0]
    return {host: future.result() for host, future in starting.items()}


@pytest.fixture
def landing_jobs() -> Iterator[list[LandingJob]]:
    """The landing jobs a test starts; any still running at its end is killed."""
    jobs: list[LandingJob] = []
    yield jobs
    for job in jobs:
        if job.process.poll() is None:
            job.kill()


def test_a_fleet_killed_again_and_again_lands_every_accepted_message_exactly_once(
    kafka_broker: KafkaCluster,
    unique_topic: Any,
    tmp_path: Path,
    landing_jobs: list[LandingJob],
) -> None:
    rng = random.Random(SEED)
    bootstrap = kafka_broker.bootstrap_servers
    topic, books_topic = unique_topic("fleet"), unique_topic("fleet-books")
    kafka_broker.create_topic(topic, 4)
    kafka_broker.create_topic(books_topic, 1, config={"cleanup.policy": "compact"})
    lake, checkpoint = tmp_path / "lake", tmp_path / "checkpoint"
    land = ["--bootstrap", bootstrap, "--topics", topic, "--lake", str(lake)]
    land += ["--checkpoint", str(checkpoint), "--master", "local[1]"]

    # The landing job runs while the daemons are killed, and is killed itself. The daemons
    # start (at once: none needs another) while its JVM does; the clients once it lands.
    landing_jobs.append(LandingJob([*land, "--trigger-interval", "1"], tmp_path / "land.err"))
    daemons = start_daemons(bootstrap, books_topic, tmp_path)
    clients = [
        SurvivingClient(f"{host}/{transport}", endpoint, topic, limit=PER_CLIENT, rate=RATE)
        for host, daemon in daemons.items()
        for transport, endpoint in endpoints(daemon.config).items()
    ]
    try:
        landing_jobs[0].wait_for_line("landing query started")
        for client in clients:
            client.start()
        with ThreadPoolExecutor(len(daemons)) as pool:
            kill_loops = [
                pool.submit(daemon.kill_at, kill_thresholds(rng, KILLS, *KILL_AFTER))
                for daemon in daemons.values()
            ]
            killed_batch = landing_jobs[0].kill_mid_batch(checkpoint, after_batch=0)
            for loop in kill_loops:
                loop.result()
        # The last run of each daemon takes messages too before the clients end.
        for daemon in daemons.values():
            wait_until(lambda d=daemon: d.accepted_since_start() > 0, 60, "the last runs")
        for client in clients:
            client.finish(120)
        for daemon in daemons.values():
            daemon.settle()
    finally:
        for client in clients:
            client.stop()
        statuses = {host: daemon.stop() for host, daemon in daemons.items()}
    assert statuses == dict.fromkeys(HOSTS, 0)
    assert all(daemon.kills == KILLS for daemon in daemons.values())
    landing_jobs.append(LandingJob([*land, "--available-now"], tmp_path / "land.err"))
    assert landing_jobs[1].wait(LANDING_TIMEOUT_S) == 0, landing_jobs[1].output

    # (a) The lake and the books, read by the test itself.
    rows = lake_rows(lake)
    kafka_rows = read_topic(bootstrap, topic)
    values = Counter(value for value, _ in rows)
    identities = Counter(identity for _, identity in rows)
    sent = {client.label: client.sent for client in clients}
    assert not [v for v, n in values.items() if n > 1], "a value landed twice"
    assert not [i for i, n in identities.items() if n > 1], "an identity landed twice"
    assert None not in identities, "a row without its pydory-id"
    for value, identity in rows:
        host, transport, number = value.decode().split("/")
        assert int(number) < sent[f"{host}/{transport}"], value  # one a client sent
        assert identity is not None
        assert identity.split("/")[0] == host, (value, identity)  # the daemon it was sent to
    second_copies = len(kafka_rows) - len({identity for _, identity in kafka_rows})
    print(
        f"\nseed {SEED}: {len(rows)} rows landed from {sum(sent.values())} sent; "
        f"{sum(d.kills for d in daemons.values())} daemon SIGKILLs, "
        f"{sum(d.replayed for d in daemons.values())} messages replayed, "
        f"{second_copies} second copies in Kafka; landing job killed in batch {killed_batch}\n"
        + landing_jobs[1].output
    )
    records = books_records(bootstrap, books_topic)
    runs = {host: [r for r in records.values() if r["host"] == host] for host in HOSTS}
    for host, host_runs in runs.items():
        ended = Counter(run["ended"] for run in host_runs)
        assert ended == {"rebuilt_after_crash": KILLS, "clean": 1}, (host, ended)
        assert all(run["final"] and run["unprotected"] == 0 for run in host_runs), host
        possibly = sum(t["possibly_delivered"] for r in host_runs for t in r["topics"].values())
        landed = sum(1 for identity in identities if identity.split("/")[0] == host)
        owed = sum(first_accepted(run) for run in host_runs)
        assert owed - possibly <= landed <= owed, (host, owed, possibly, landed)
        assert sum(replayed(run) for run in host_runs) == daemons[host].replayed, host
        by_incarnation = {run["incarnation"]: run for run in host_runs}
        for run in host_runs:
            for earlier, topics in run["replayed_from"].items():
                handed_over = by_incarnation[earlier]["topics"][topic]["handed_over"]
                assert topics[topic] == handed_over, (host, earlier)

    # (b) The fleet audit: the books topic and the lake, no daemon's HTTP port.
    audit = [sys.executable, "-m", "pydory", "pipeline", "fleet-audit", "--lake", str(lake)]
    audit += ["--bootstrap-servers", bootstrap, "--books-topic", books_topic]
    audit += ["--state", str(tmp_path / "audit-state"), "--master", "local[1]", "--json"]
    for which in ("first", "incremental"):
        done = subprocess.run(
            audit, capture_output=True, text=True, timeout=AUDIT_TIMEOUT_S, check=False
        )
        assert done.returncode == 0, f"{which} audit:\n{done.stdout}\n{done.stderr}"
        report = json.loads(done.stdout)
        print(f"{which} fleet audit:\n{done.stdout}")
        assert report["balanced"] is True
        assert report["second_copies_in_lake"] == 0
        assert {host["host"] for host in report["hosts"]} == set(HOSTS)
        for host in report["hosts"]:
            assert all(topic["balanced"] for topic in host["topics"]), host
    # The second run read only what came since the first: nothing, found without Spark.
    assert report["sources"]["incremental"] is True
    assert report["sources"]["lake_files_read"] == 0
    assert report["sources"]["books_records_read"] == 0
    assert report["sources"]["read_with_spark"] is False
    assert "Spark's default log4j profile" not in done.stderr, done.stderr[-2000:]

    # Each run's per-topic "replayed" is the sum of its replayed_from (docs/accounting.md).
    for run in records.values():
        in_topics = run["topics"].get(topic, {}).get("replayed", 0)
        assert in_topics == replayed(run), (run["host"], run["incarnation"], run["ended"])
