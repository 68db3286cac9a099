"""`pydory demo --fleet` end to end: a 3-node Apache Kafka, HDFS, a Spark standalone cluster
and three daemons, SIGKILLed while their clients send, one host never restarted, a Spark
worker and the landing job killed mid-batch; the fleet audit names the lost host."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from demo_output import assert_a_clean_terminal
from helpers import wait_until
from pydory.cli import main
from pydory_tools.testing.kill_loop import Endpoint, SurvivingClient

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
    print(done.stdout)  # with -s: the stages and their times

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
    # Every process it named (brokers, HDFS, workers, daemons, landing job) is gone. A PID
    # alone does not say so: the kernel hands out 32,768 of them (threads included) and a
    # busy suite goes round them in minutes, so one the demo named early (a daemon killed
    # in its first seconds) may be another test's process by now. Ours name the demo's
    # work directory or its HDFS on their command lines.
    named = re.findall(r"\bpids? ([\d, ]*\d)", done.stdout)
    pids = {int(pid) for group in named for pid in re.findall(r"\d+", group)}
    assert len(pids) >= 3 + 1 + 2 + 3 + 1, pids
    hdfs_uri = where[1].split()[1]
    left = [pid for pid in pids if running_one_of_ours(pid, (str(workdir), hdfs_uri))]
    assert not left, left

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
    counts = re.search(
        r"^demo: the clients sent ([\d,]+) messages?; the daemons accepted ([\d,]+)[ ;].*?"
        r"([\d,]+) are in the lake, once each",
        done.stdout,
        re.MULTILINE,
    )
    assert counts is not None, done.stdout
    sent, accepted, landed = (int(n.replace(",", "")) for n in counts.groups())
    # What a lost host took on after its last books is in the lake: accepted, never more
    # than was sent, and never fewer than landed.
    assert sent >= accepted >= landed > 0, counts[0]


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


def running_one_of_ours(pid: int, markers: tuple[str, ...]) -> bool:
    """Whether process ``pid`` runs and its command line names one of ``markers``."""
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return any(marker in command_line for marker in markers)
