"""What the demo tests check of every demo's output (``test_demo*.py``)."""

from __future__ import annotations

import re
import subprocess


def assert_a_clean_terminal(done: subprocess.CompletedProcess[str]) -> None:
    """What a newcomer's terminal shows: no escape codes, and Spark's and the JVM's log
    lines (WARN, INFO) in the log files the demo names, not here."""
    assert "\x1b" not in done.stdout + done.stderr
    for line in (done.stdout + done.stderr).splitlines():
        assert not re.search(r"\b(WARN|INFO|ERROR)\b", line), line
