"""`pydory demo` end to end, as CI and a new user run it: clients to daemon to lake to audit.

``demo --sigkill`` is in ``test_demo_sigkill.py``, ``demo --fleet`` in ``test_demo_fleet.py``:
each a long run of its own, in a module of its own so that the suite's workers can run
them at once (``tests/module_costs.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from demo_output import assert_a_clean_terminal
from pydory.cli import main
from pydory.wording import counted
from pydory_tools.demo import RATE_LIMIT_MAX_COUNT

COUNT = 300  # messages per well-behaved client: enough for every stage to have work


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


def test_counts_say_one_thing_or_many_things() -> None:
    assert counted(1, "batch") == "1 batch"
    assert counted(2, "batch") == "2 batches"
    assert counted(0, "record") == "0 records"
    assert counted(1, "process") == "1 process"
    assert counted(10_000, "message") == "10,000 messages"
    assert counted(1, "second copy", "second copies") == "1 second copy"
    assert counted(41, "second copy", "second copies") == "41 second copies"
