"""The protocol between the harness and its child processes, both sides.

A child (generator, raw sink, direct producer) is ``python -m pydory_tools.bench.<module> JOB``
with a JSON job. It prepares, prints one JSON line ``{"ready": {...}}``, waits for the
line ``go`` on stdin, does its work, prints ``{"result": {...}}`` and exits 0; on failure
it prints ``{"error": "..."}`` and exits 1. Every job carries ``deadline_s``: a child
stops itself when it runs out of time, and the harness kills (by PID) a child that does
not answer in time. Children write stderr to a file the harness names in its errors.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from pydory.errors import PydoryError
from pydory_tools.testing.lifecycle import terminate_then_kill

#: How long a child may take to stop after SIGTERM before it is killed.
STOP_GRACE_S = 5.0


class BenchError(PydoryError):
    """A benchmark run failed: a child process or the daemon misbehaved or timed out.

    The message says which process and includes the end of its stderr; the run's figures
    are unusable, so the harness stops (rerun, or lower --messages if it timed out).
    """


# --- the child's side -------------------------------------------------------------------


#: What a child calls once prepared: announce readiness (with any details the harness
#: needs, e.g. a bound port) and block until the harness says go.
WaitForGo = Callable[[Mapping[str, Any]], None]


def child_main(work: Callable[[Mapping[str, Any], WaitForGo], Mapping[str, Any]]) -> int:
    """Run ``work(job, wait_for_go)`` for the job in argv[1] and print its result line.

    ``work`` prepares, then calls ``wait_for_go(details)`` (which announces readiness and
    blocks until the harness says go), then does the timed work and returns its figures.
    """
    job = json.loads(sys.argv[1])
    try:
        result = work(job, _announce_and_wait)
    except (OSError, PydoryError, TimeoutError) as error:
        _say({"error": f"{type(error).__name__}: {error}"})
        return 1
    _say({"result": dict(result)})
    return 0


def _announce_and_wait(details: Mapping[str, Any]) -> None:
    _say({"ready": {"pid": os.getpid(), **details}})
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise BenchError(f"expected 'go' from the harness, got {line!r}")


def _say(message: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def time_left(deadline: float) -> float:
    """Seconds until the monotonic ``deadline``; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the child ran out of time (deadline_s)")
    return left


# --- the harness's side -----------------------------------------------------------------


class ChildProcess:
    """A child started by the harness: its PID, its JSON lines, a bounded stop."""

    def __init__(self, module: str, job: Mapping[str, Any], workdir: Path, name: str) -> None:
        self.name = name
        self._stderr_path = workdir / f"{name}.stderr"
        with open(self._stderr_path, "wb") as stderr:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", module, json.dumps(dict(job))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self._pending = b""

    @property
    def pid(self) -> int:
        return self._proc.pid

    def wait_ready(self, timeout_s: float) -> Mapping[str, Any]:
        return self._expect("ready", timeout_s)

    def go(self) -> None:
        stdin = self._stdin()
        stdin.write(b"go\n")
        stdin.flush()

    def wait_result(self, timeout_s: float) -> Mapping[str, Any]:
        return self._expect("result", timeout_s)

    def _expect(self, key: str, timeout_s: float) -> Mapping[str, Any]:
        message = json.loads(self._read_line(timeout_s))
        if key not in message:
            raise BenchError(f"{self.name}: {message.get('error', message)}{self.stderr_tail()}")
        answer: Mapping[str, Any] = message[key]
        return answer

    def _read_line(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        fd = self._stdout().fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([fd], [], [], max(0.0, left))
            if not readable:
                raise BenchError(f"{self.name} did not answer within {timeout_s:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                self._proc.wait(STOP_GRACE_S)
                raise BenchError(
                    f"{self.name} exited with status {self._proc.returncode}{self.stderr_tail()}"
                )
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def stderr_tail(self) -> str:
        return stderr_tail(self.name, self._stderr_path)

    def stop(self) -> None:
        """End the child if it is still running: SIGTERM, then SIGKILL after a grace period."""
        stop_process(self._proc)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()

    def _stdin(self) -> IO[bytes]:
        assert self._proc.stdin is not None
        return self._proc.stdin

    def _stdout(self) -> IO[bytes]:
        assert self._proc.stdout is not None
        return self._proc.stdout


def stderr_tail(name: str, path: Path, limit: int = 2000) -> str:
    """The end of what the process ``name`` wrote to its stderr file ``path``, headed by its
    name, to append to an error; "" when it wrote nothing (or the file is gone)."""
    try:
        text = path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""
    return f"\n--- {name} stderr ---\n{text}" if text.strip() else ""


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Terminate ``proc`` and reap it; kill it if it outlasts :data:`STOP_GRACE_S`."""
    terminate_then_kill(proc, STOP_GRACE_S)
