"""`pydory demo` end to end, as CI and a new user run it: clients to daemon to lake to audit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from helpers import wait_until
from pydory.cli import main
from pydory.wording import counted
from pydory_tools.demo import RATE_LIMIT_MAX_COUNT
from pydory_tools.demo_kills import what_became_of_them
from pydory_tools.testing.kill_loop import Endpoint, SurvivingClient

COUNT = 300  # messages per well-behaved client: enough for every stage to have work
#: With --sigkill: enough that the clients still send after each restart. Stream clients
#: write faster than a busy daemon reads, and a kill loses what its socket buffers held:
#: with 300 the clients were done before the first restart (CI: 20 of 240 more accepted).
SIGKILL_COUNT = 2000  # the demo's default


@pytest.fixture(scope="module")
def demo_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One demo run (it takes a while), shared by the tests that read its output."""
    workdir = tmp_path_factory.mktemp("demo") / "work"
    done = subprocess.run(
        [sys.executable, "-m", "pydory", "demo", "--count", str(COUNT), "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=1800,  # a safety net only: 90 s alone, 280 s seen at load 50
        check=False,
    )
    return done, workdir


def assert_a_clean_terminal(done: subprocess.CompletedProcess[str]) -> None:
    """What a newcomer's terminal shows: no escape codes, and Spark's and the JVM's log
    lines (WARN, INFO) in the log files the demo names, not here."""
    assert "\x1b" not in done.stdout + done.stderr
    for line in (done.stdout + done.stderr).splitlines():
        assert not re.search(r"\b(WARN|INFO|ERROR)\b", line), line


@pytest.mark.slow
def test_the_demo_balances_and_says_so(
    demo_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, workdir = demo_run

    assert done.returncode == 0, done.stdout + done.stderr
    stages = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("[")]
    assert stages == ["kafka", "daemon", "clients", "settle", "books", "land", "audit"]
    assert_a_clean_terminal(done)
    kafka_line = next(line for line in done.stdout.splitlines() if line.startswith("[1/7]"))
    assert "Apache Kafka 4." in kafka_line, kafka_line  # the real broker is the default
    assert "topic         accepted  delivered  landed  dup  missing  discarded" in done.stdout
    assert "AUDIT BALANCED:" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("demo: OK")
    assert f"lake:    {workdir / 'lake'}" in done.stdout


@pytest.mark.slow
def test_the_demo_report_shows_every_kind_of_traffic(
    demo_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, workdir = demo_run

    report = json.loads((workdir / "audit.json").read_text())
    topics = {topic["topic"]: topic for topic in report["topics"]}

    assert report["balanced"] is True
    assert set(topics) == {"demo.events", "demo.keyed", "demo.limited"}
    # Three transports, AnyPartition; three oversized messages refused before Kafka.
    assert topics["demo.events"]["landed"] == 3 * COUNT
    assert topics["demo.events"]["discarded"] == {"too_long": 3}
    assert topics["demo.keyed"]["landed"] == 2 * COUNT
    # A flood on the rate-limited topic: exactly max_count pass within the window.
    assert topics["demo.limited"]["landed"] == RATE_LIMIT_MAX_COUNT
    assert topics["demo.limited"]["discarded"] == {"rate_limit": COUNT - RATE_LIMIT_MAX_COUNT}
    # An unknown topic (10) and three kinds of bytes that are not Dory messages (10 each).
    assert report["discarded_without_topic"] == 40


@pytest.mark.slow
def test_partition_keys_choose_the_partition(
    demo_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, workdir = demo_run

    keyed = ds.dataset(workdir / "lake" / "topic=demo.keyed", format="parquet", partitioning="hive")
    partitions = set(keyed.to_table(columns=["partition"]).column("partition").to_pylist())

    assert partitions == {7 % 4, 2 % 4}  # PartitionKey 7 and 2 over 4 partitions


def test_the_demo_refuses_a_work_directory_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "earlier-run.txt").write_text("something")

    status = main(["demo", "--workdir", str(tmp_path)])

    assert status == 1
    assert f"--workdir {tmp_path} is not empty" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.kafka
def test_the_demo_with_sigkills_lands_every_accepted_message_once_and_says_so(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"

    done = subprocess.run(
        [
            sys.executable, "-m", "pydory", "demo", "--sigkill", "2", "--seed", "24",
            "--count", str(SIGKILL_COUNT), "--workdir", str(workdir),
        ],
        capture_output=True,
        text=True,
        timeout=1800,  # a safety net only: 90 s alone, 280 s seen at load 50
        check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert_a_clean_terminal(done)
    lines = done.stdout.rstrip().splitlines()
    stages = [line.split()[1] for line in lines if line.startswith("[")]
    assert stages == ["kafka", "daemon", "clients", "settle", "land", "audit"]
    assert "the daemon SIGKILLed 2 times" in next(line for line in lines if "[3/6]" in line)
    assert re.fullmatch(
        r"demo: 2 SIGKILLs while the clients sent, [\d,]+ messages? replayed from the spool, "
        r"[\d,]+ second cop(y|ies) dropped by the landing job, 0 left in the lake",
        lines[-2],
    ), lines[-2]
    counts = re.fullmatch(
        r"demo: the clients sent ([\d,]+) messages?; the daemon accepted ([\d,]+); "
        r"([\d,]+) are in the lake, once each(\. The [\d,]+ never accepted were in a killed "
        r"daemon's socket buffers .*)?",
        lines[-3],
    )
    assert counts is not None, lines[-3]
    sent, accepted, landed = (int(n.replace(",", "")) for n in counts.groups()[:3])
    assert sent >= accepted >= landed > 0
    assert (counts[4] is not None) == (sent > accepted)
    assert lines[-1].startswith("demo: OK, the fleet audit balanced"), lines[-1]
    report = json.loads((workdir / "audit.json").read_text())
    assert report["balanced"] is True
    assert report["second_copies_in_lake"] == 0
    assert [host["host"] for host in report["hosts"]] == ["demo-host"]
    assert len(report["hosts"][0]["runs"]) == 3  # two killed, the last stopped cleanly


def test_the_demo_refuses_sigkill_on_the_mock_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["demo", "--sigkill", "1", "--kafka", "mock"])

    assert status == 1
    assert "--sigkill needs Apache Kafka" in capsys.readouterr().err


def test_the_sigkill_demo_says_what_became_of_the_messages_sent() -> None:
    topic = {
        "accepted": 8_958,
        "landed": 8_950,
        "discarded": {"shutdown_delay": 3},
        "possibly_delivered": 6,
        "possibly_delivered_found": 1,
        "outstanding": 0,
        "in_flight": 0,
    }
    report = {"hosts": [{"topics": [topic]}]}

    line = what_became_of_them(10_000, report)

    assert line == (
        "demo: the clients sent 10,000 messages; the daemon accepted 8,958; 8,950 are in the "
        "lake, once each. The 1,042 never accepted were in a killed daemon's socket buffers "
        "(written by the clients, not yet read: a SIGKILL drops them, so no daemon ever took "
        "them on). Of the accepted, 8 are not in the lake: discarded (shutdown_delay) 3, "
        "possibly delivered, not found 5"
    )
    every_one = {**topic, "landed": 8_958, "discarded": {}, "possibly_delivered": 0}
    assert what_became_of_them(8_958, {"hosts": [{"topics": [every_one]}]}) == (
        "demo: the clients sent 8,958 messages; the daemon accepted 8,958; 8,958 are in the "
        "lake, once each"
    )


def test_counts_say_one_thing_or_many_things() -> None:
    assert counted(1, "batch") == "1 batch"
    assert counted(2, "batch") == "2 batches"
    assert counted(0, "record") == "0 records"
    assert counted(1, "process") == "1 process"
    assert counted(10_000, "message") == "10,000 messages"
    assert counted(1, "second copy", "second copies") == "1 second copy"
    assert counted(41, "second copy", "second copies") == "41 second copies"


#: With --fleet: the clients send for count / 200 s (their rate), long enough for the
#: landing job to plan the batches in which a Spark worker and then the job are killed.
FLEET_COUNT = 2000


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.hdfs
@pytest.mark.spark_cluster
def test_the_fleet_demo_lands_every_accepted_message_once_on_hdfs_and_names_the_lost_host(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"

    done = subprocess.run(
        [
            sys.executable, "-m", "pydory", "demo", "--fleet", "--sigkill", "1",
            "--seed", "31", "--count", str(FLEET_COUNT), "--workdir", str(workdir),
        ],
        capture_output=True,
        text=True,
        timeout=1800,  # a safety net only
        check=False,
    )  # fmt: skip

    assert_a_clean_terminal(done)
    lines = done.stdout.rstrip().splitlines()
    stages = [line.split()[1] for line in lines if line.startswith("[")]
    assert stages == [
        "kafka", "hdfs", "spark", "daemons", "landing", "clients", "settle", "land", "audit",
    ], done.stdout + done.stderr  # fmt: skip
    assert "3 brokers" in lines[1], lines[1]
    clients = next(line for line in lines if line.startswith("[6/9]"))
    assert "9 client threads" in clients, clients
    assert "over unix datagram, unix stream and tcp to 3 daemons" in clients, clients
    assert "fleet-c's last kill for good" in clients, clients
    assert re.search(r"the landing job SIGKILLed in batch \d+", clients), clients
    land = next(line for line in lines if line.startswith("[8/9]"))
    assert re.search(r"restarted on its checkpoint, Spark worker 1 SIGKILLed in batch \d+", land)
    assert "landing finished: " in land, land
    gone = next(line for line in lines if line.startswith("demo: host fleet-c"))
    assert "did not come back (SIGKILLed, never restarted)" in gone, gone
    assert "books not final" in gone, gone
    # The last lines: what ran where, then that everything was stopped.
    where = lines[lines.index("", len(lines) - 10) + 1 :]
    assert where[0].startswith("kafka:   Apache Kafka 4."), where
    assert where[1].startswith("hdfs:    hdfs://127.0.0.1:"), where
    assert re.match(r"spark:   spark://127\.0\.0\.1:\d+ \(a master and 2 workers", where[2])
    assert [line.split()[1] for line in where[3:6]] == ["fleet-a:", "fleet-b:", "fleet-c:"]
    assert "never restarted" in where[5], where
    assert where[-1] == "every process the demo started is stopped"
    # Every process it named (brokers, HDFS, workers, daemons, landing job) is gone.
    named = re.findall(r"\bpids? ([\d, ]*\d)", done.stdout)
    pids = {int(pid) for group in named for pid in re.findall(r"\d+", group)}
    assert len(pids) >= 3 + 1 + 2 + 3 + 1, pids
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], pids

    report = json.loads((workdir / "audit.json").read_text())
    assert report["sources"]["lake"].startswith("hdfs://127.0.0.1:")
    hosts = {host["host"]: host for host in report["hosts"]}
    assert set(hosts) == {"fleet-a", "fleet-b", "fleet-c"}
    assert [run["ended"] for run in hosts["fleet-a"]["runs"]][-1] == "clean"
    assert all(run["ended"] != "clean" for run in hosts["fleet-c"]["runs"])
    assert report["second_copies_in_lake"] == 0
    assert hosts["fleet-a"]["balanced"], hosts["fleet-a"]
    assert hosts["fleet-b"]["balanced"], hosts["fleet-b"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(
        line.startswith("demo: OK, the fleet audit balanced: every accepted message is in the "
                        "lake exactly once") for line in lines
    ), done.stdout  # fmt: skip
    assert report["balanced"] is True


def test_the_fleet_demo_starts_its_own_parts(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["demo", "--fleet", "--kafka", "mock"])

    assert status == 1
    assert "--fleet starts its own 3-node Apache Kafka, HDFS and Spark cluster" in (
        capsys.readouterr().err
    )


def test_a_client_of_a_host_that_never_comes_back_stops_when_told(tmp_path: Path) -> None:
    """The fleet demo's gone host: its clients wait for a daemon (for a minute, then
    fail) until they are stopped, and then end without an error, the chunk counted."""
    nobody = Endpoint("datagram", str(tmp_path / "no-daemon-here.sock"))
    client = SurvivingClient("gone/datagram", nobody, "events", limit=100, rate=1000, chunk=20)

    client.start()
    # Its socket made, it is sending its first chunk: into a path no daemon holds.
    wait_until(lambda: client._connection is not None, 60, "the client's first send")
    client.stop()
    client.finish(60)

    assert client.error is None
    assert client.sent == 20  # the chunk it was sending when stopped: values used
