"""`pydory demo --sigkill` end to end: the daemon SIGKILLed while the clients send, every
accepted message landed once, and the output says what became of the messages sent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from demo_output import assert_a_clean_terminal
from pydory.cli import main
from pydory_tools.demo_kills import what_became_of_them

#: With --sigkill: enough that the clients still send after each restart. Stream clients
#: write faster than a busy daemon reads, and a kill loses what its socket buffers held:
#: with 300 the clients were done before the first restart (CI: 20 of 240 more accepted).
SIGKILL_COUNT = 2000  # the demo's default


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


def test_messages_landed_past_a_lost_hosts_last_books_count_as_accepted_not_as_never_read() -> None:
    # The fleet demo's host that never came back: its last run's books stop at its last
    # periodic record (820), while 3,940 of its messages are in the lake.
    lost = {**_EVERY_ONE_LANDED, "accepted": 820, "landed": 3_940}
    kept = {**_EVERY_ONE_LANDED, "accepted": 11_760, "landed": 11_760}
    report = {"hosts": [{"topics": [kept]}, {"topics": [lost]}]}

    line = what_became_of_them(16_020, report, "the daemons")

    assert line == (
        "demo: the clients sent 16,020 messages; the daemons accepted 15,700 (3,120 of them "
        "after the last books of a run that never ended, known from the lake); 15,700 are in "
        "the lake, once each. The 320 never accepted were in a killed daemon's socket buffers "
        "(written by the clients, not yet read: a SIGKILL drops them, so no daemon ever took "
        "them on)"
    )


_EVERY_ONE_LANDED = {
    "discarded": {},
    "possibly_delivered": 0,
    "possibly_delivered_found": 0,
    "outstanding": 0,
    "in_flight": 0,
}
