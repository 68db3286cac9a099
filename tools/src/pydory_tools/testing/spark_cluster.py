"""A Spark standalone cluster on loopback for the tests and the fleet demo: a master and
workers, each a process of its own, from PySpark's own distribution.

``SPARK_HOME`` is the installed ``pyspark`` package (its ``bin/spark-class`` and ``jars/``,
the same release as the driver); each daemon is ``spark-class
org.apache.spark.deploy.master.Master`` or ``... worker.Worker spark://...``, as Spark's
``sbin/start-master.sh`` and ``start-worker.sh`` start them, bound to 127.0.0.1 on free
ports, with its log and the workers' work directories under our directory. The workers
start once the master's own status (``/json/`` on its web UI) says it is ALIVE (a worker
registering earlier waits 5 to 15 s for its next try), and the cluster is ready when that
status lists every worker ALIVE;
:meth:`SparkCluster.stop` ends every process by its PID. A job reaches it with
``spark_session(master=cluster.master_url)``.

Run it as a process for demos and manual testing::

    python -m pydory_tools.testing.spark_cluster --workers 2

The first line of output is the master URL; the process serves until SIGTERM or SIGINT.

Rule: `SparkCluster` is the only code that starts, waits for and stops Spark's standalone
daemons.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

from pydory.errors import PydoryError
from pydory_tools.testing.lifecycle import (
    SHORT_LIVED_JVM_FLAGS,
    StopsOnExit,
    die_with_parent,
    log_tail,
    serve_until_signalled,
    terminate_then_kill,
)
from pydory_tools.testing.ports import LOOPBACK, free_loopback_ports

__all__ = ["SparkCluster", "SparkClusterError", "main"]

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_POLL_INTERVAL_S = 0.2
# The daemons only schedule; the executors they start get the job's own memory setting.
_DAEMON_MEMORY = "256m"
_DAEMON_JAVA_OPTS = " ".join((*SHORT_LIVED_JVM_FLAGS, "-Djava.awt.headless=true"))


class SparkClusterError(PydoryError):
    """The standalone cluster could not be started or stopped. Carries the log tail."""


@dataclass
class _Daemon:
    """One master or worker process and its log."""

    name: str
    command: list[str]
    log_path: Path
    web_port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class SparkCluster(StopsOnExit):
    """A master and ``workers`` workers on 127.0.0.1, started by the constructor.

    Each worker offers ``cores_per_worker`` cores and ``memory_per_worker`` of memory to
    executors (a job's ``spark.executor.memory`` must fit in it). Logs and work
    directories live under ``base_dir`` if given (kept), else in a temporary directory
    removed by :meth:`stop`.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        base_dir: Path | None = None,
        startup_timeout_s: float = 180.0,
    ) -> None:
        if workers < 1:
            raise ValueError("a cluster needs at least one worker")
        self.spark_home = Path(pyspark.__file__).resolve().parent
        self._owns_base_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="pydory-spark-")) if base_dir is None else base_dir
        )
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.web_port, *worker_web_ports = free_loopback_ports(2 + workers)
        self._lock = threading.Lock()
        self._master = _Daemon("master", self._master_command(), self.base_dir / "master.log")
        self._workers = [
            _Daemon(
                f"worker-{n}",
                self._worker_command(n, web_port, cores_per_worker, memory_per_worker),
                self.base_dir / f"worker-{n}.log",
                web_port,
            )
            for n, web_port in enumerate(worker_web_ports, start=1)
        ]
        try:
            started = time.monotonic()
            deadline = started + startup_timeout_s
            self._spawn(self._master)
            # The workers only once the master leads: a worker that registers earlier is
            # told the master is in standby, ignores it, and tries again 5 to 15 s later
            # (Spark's fixed, randomised first retry), long after the master is ready.
            self._wait_until_master_alive(deadline)
            for worker in self._workers:
                self._spawn(worker)
            self.wait_until_ready(deadline - time.monotonic())
            self.startup_s = time.monotonic() - started
        except BaseException:
            self.stop()
            raise

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``, the ``--master`` of a job on this cluster."""
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def worker_count(self) -> int:
        return len(self._workers)

    def describe(self) -> str:
        return (
            f"Spark {pyspark.__version__} standalone, a master and {len(self._workers)} "
            f"workers at {self.master_url}"
        )

    def worker_pid(self, number: int) -> int | None:
        """The process id of worker ``number`` (from 1), or None once it is down."""
        process = self._workers[number - 1].process
        return None if process is None else process.pid

    def worker_executors(self, number: int) -> int:
        """How many executors worker ``number`` (from 1) runs now, as its own status
        (``/json/`` on its web UI) says; 0 when it does not answer."""
        try:
            status = self._status(self._workers[number - 1].web_port)
        except (OSError, ValueError):
            return 0
        return len(status.get("executors", []))

    def kill_worker(self, number: int) -> None:
        """SIGKILL worker ``number`` (from 1) and reap it: a worker machine gone."""
        self._end(self._workers[number - 1], kill=True)

    def alive_workers(self) -> int:
        """How many workers the master lists ALIVE now (0 when it does not answer)."""
        try:
            status = self._master_status()
        except (OSError, ValueError):
            return 0
        return sum(1 for worker in status.get("workers", []) if worker.get("state") == "ALIVE")

    def wait_until_ready(self, timeout_s: float) -> None:
        """Wait until the master lists every running worker ALIVE."""
        deadline = time.monotonic() + timeout_s
        wanted = sum(1 for worker in self._workers if worker.process is not None)
        while self.alive_workers() < wanted:
            for daemon in (self._master, *self._workers):
                process = daemon.process
                if process is not None and process.poll() is not None:
                    raise SparkClusterError(
                        self._failure(daemon, f"exited with status {process.returncode}")
                    )
            if time.monotonic() >= deadline:
                raise SparkClusterError(
                    self._failure(self._master, f"listed fewer than {wanted} workers ALIVE")
                )
            time.sleep(_POLL_INTERVAL_S)

    def _wait_until_master_alive(self, deadline: float) -> None:
        """Wait until the master's own status says it leads (``ALIVE``): it then takes
        registrations."""
        while True:
            try:
                if self._master_status().get("status") == "ALIVE":
                    return
            except (OSError, ValueError):
                pass  # its web UI is not up yet
            process = self._master.process
            if process is not None and process.poll() is not None:
                raise SparkClusterError(
                    self._failure(self._master, f"exited with status {process.returncode}")
                )
            if time.monotonic() >= deadline:
                raise SparkClusterError(self._failure(self._master, "never became ALIVE"))
            time.sleep(_POLL_INTERVAL_S)

    def stop(self, grace_s: float = 20.0) -> None:
        """End the workers, then the master; remove a temporary base_dir."""
        for daemon in (*self._workers, self._master):
            self._end(daemon, kill=False, grace_s=grace_s)
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, name: str = "master") -> str:
        """The last few kilobytes ``master`` or ``worker-N`` logged."""
        return log_tail(self.base_dir / f"{name}.log")

    # --- the processes ---------------------------------------------------------------------

    def _spark_class(self) -> list[str]:
        return [str(self.spark_home / "bin" / "spark-class")]

    def _master_command(self) -> list[str]:
        return [
            *self._spark_class(),
            _MASTER_CLASS,
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.web_port),
        ]

    def _worker_command(self, number: int, web_port: int, cores: int, memory: str) -> list[str]:
        work_dir = self.base_dir / f"worker-{number}-work"
        work_dir.mkdir(parents=True, exist_ok=True)
        return [
            *self._spark_class(),
            _WORKER_CLASS,
            "--host",
            LOOPBACK,
            "--webui-port",
            str(web_port),
            "--cores",
            str(cores),
            "--memory",
            memory,
            "--work-dir",
            str(work_dir),
            self.master_url,
        ]

    def _environment(self) -> dict[str, str]:
        environment = dict(os.environ)
        environment.update(
            SPARK_HOME=str(self.spark_home),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_DAEMON_MEMORY=_DAEMON_MEMORY,
            SPARK_DAEMON_JAVA_OPTS=_DAEMON_JAVA_OPTS,
            # Nothing of a Spark installation elsewhere on the machine.
            SPARK_CONF_DIR=str(self.base_dir / "conf"),
            # Executors run Python workers on the interpreter of the job's driver, which
            # passes it; this one is the fallback.
            PYSPARK_PYTHON=environment.get("PYSPARK_PYTHON", sys.executable),
        )
        return environment

    def _spawn(self, daemon: _Daemon) -> None:
        with daemon.log_path.open("ab") as output:
            # spark-class execs the daemon's JVM: the PID is the daemon's. Its own session,
            # and killed with the thread that started it (a killed test run leaves none).
            daemon.process = subprocess.Popen(
                daemon.command,
                cwd=self.base_dir,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def _end(self, daemon: _Daemon, *, kill: bool, grace_s: float = 20.0) -> None:
        with self._lock:
            process, daemon.process = daemon.process, None
        if process is None:
            return
        if kill:
            process.kill()
            process.wait()
        else:
            terminate_then_kill(process, grace_s)

    def _master_status(self) -> dict[str, Any]:
        return self._status(self.web_port)

    def _status(self, web_port: int) -> dict[str, Any]:
        # Loopback: never through a proxy the environment may name.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{LOOPBACK}:{web_port}/json/", timeout=60) as response:
            status = json.load(response)
        return status if isinstance(status, dict) else {}

    def _failure(self, daemon: _Daemon, what: str) -> str:
        where = f"Spark {daemon.name} ({self.master_url}) {what}; log {daemon.log_path}"
        return f"{where}:\n{log_tail(daemon.log_path)}"


# --- python -m pydory_tools.testing.spark_cluster ------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pydory_tools.testing.spark_cluster",
        description="Run a Spark standalone master and workers on loopback; print the URL.",
    )
    parser.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    parser.add_argument("--dir", type=Path, help="keep the logs and work directories here")
    args = parser.parse_args(argv)
    return serve_until_signalled(
        "spark_cluster",
        lambda: SparkCluster(args.workers, base_dir=args.dir),
        SparkClusterError,
        lambda cluster: cluster.master_url,
    )


if __name__ == "__main__":
    sys.exit(main())
