"""What every launcher of a process shares: ``with`` stops what the constructor started,
a process is stopped with SIGTERM, then SIGKILL if it outlasts its grace period, a child
dies with the thread that started it, Java is found one way and run with one set of flags
for short lives (:data:`SHORT_LIVED_JVM_FLAGS`), a log is quoted by its tail, and a launcher
run as ``python -m`` serves until SIGTERM or SIGINT (:func:`serve_until_signalled`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, MutableMapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
#: How much of a log's end an error quotes.
LOG_TAIL_BYTES = 4000

#: The JVM flags of every JVM the tests and demos start (brokers, HDFS, Spark's daemons,
#: drivers and executors): each lives seconds to minutes and moves little data, where the
#: JIT's optimising compiler (C2) costs more CPU than it wins back. Measured on a Spark
#: driver of the suite: C2's thread took 41 of its 107 CPU-s; with C1 alone a local session's
#: start-up took 15 CPU-s against 26, and two pipeline test modules 88 and 68 machine CPU-s
#: against 138 and 98. Serial GC: no GC threads beside the others on a 2-core machine.
#: Production JVMs (a user's Kafka, a landing job run by hand) are not started here.
SHORT_LIVED_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
#: :data:`SHORT_LIVED_JVM_FLAGS` as Spark's executors of a test or demo job take them.
SHORT_LIVED_EXECUTOR_CONF = {"spark.executor.defaultJavaOptions": " ".join(SHORT_LIVED_JVM_FLAGS)}
#: Spark's launcher adds this variable to the driver JVM's command line (``spark-submit``,
#: which PySpark runs to start a session); a local master's executors run in that JVM.
SPARK_DRIVER_OPTIONS_ENV = "SPARK_SUBMIT_OPTS"


def terminate_then_kill(process: subprocess.Popen[Any], grace_s: float) -> bool:
    """SIGTERM ``process`` (ours: it is signalled by its Popen, never by name) and reap
    it, SIGKILLing it if it has not exited after ``grace_s``. True when it exited in time."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False
    return True


class StopsOnExit(ABC):
    """A service started by its constructor; leaving a ``with`` block stops it, even on error."""

    @abstractmethod
    def stop(self) -> None:
        """End everything the service started. Stopping twice is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def die_with_parent() -> None:
    """In the child before exec (``preexec_fn``): SIGKILL it when the thread that started
    it exits.

    Linux's PR_SET_PDEATHSIG follows the creating *thread*, so services are started and
    restarted from the thread that owns them (the main thread in tests and the demo).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def short_lived_spark_drivers(environ: MutableMapping[str, str] = os.environ) -> None:
    """Start every Spark driver started from here on (in this process or its children)
    with :data:`SHORT_LIVED_JVM_FLAGS`, unless the caller set ``SPARK_SUBMIT_OPTS``."""
    environ.setdefault(SPARK_DRIVER_OPTIONS_ENV, " ".join(SHORT_LIVED_JVM_FLAGS))


def find_java(error: type[Exception], service: str) -> str:
    """``$JAVA_HOME/bin/java``, else the ``java`` on PATH; none: ``error`` saying that
    ``service`` needs it."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is not None and candidate.is_file():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise error(f"no java on PATH: {service} needs Java 17 (./dev installs it)")
    return found


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of the log at ``path``, as text (for an error message)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "(no log written)"
    return data[-limit:].decode(errors="replace")


class Launched(Protocol):
    """A service as :func:`serve_until_signalled` runs it."""

    startup_s: float

    def describe(self) -> str: ...

    def stop(self) -> None: ...


ServiceT = TypeVar("ServiceT", bound=Launched)


def serve_until_signalled(
    prog: str,
    start: Callable[[], ServiceT],
    error: type[Exception],
    address: Callable[[ServiceT], str],
    ready: Callable[[ServiceT], None] | None = None,
) -> int:
    """The ``python -m`` main of a launcher once its arguments are read: ``start`` the
    service (``error``: one line on stderr, exit 1), ``ready`` it, print its ``address``
    first on stdout (what a caller reads) and what it is on stderr, then serve until
    SIGTERM or SIGINT, stop it and return 0."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        service = start()
    except error as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    try:
        if ready is not None:
            ready(service)
        print(address(service), flush=True)
        print(f"{service.describe()}; started in {service.startup_s:.1f} s", file=sys.stderr)
        stop.wait()
    finally:
        service.stop()
    return 0
