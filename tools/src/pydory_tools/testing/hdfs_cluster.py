"""HDFS on loopback for the tests and the fleet demo: Hadoop's ``MiniDFSCluster`` (a namenode
and datanodes) in one JVM process of its own.

The jars come from Maven Central at set-up (``./dev`` copies what ``jvm/hadoop/pom.xml``
pins into ``.jars/hadoop/``, the Hadoop release PySpark's own client is built against);
nothing downloads here. The process is Hadoop's own ``MiniDFSClusterManager`` main
(shipped in ``hadoop-client-minicluster``): its namenode listens on a free loopback port,
its datanodes on loopback too, its data lives in a directory of ours, and it writes a
small JSON file once the cluster is active (``waitActive``: the namenode answers and every
datanode has registered), which is the condition :class:`HdfsCluster` waits for.
:meth:`HdfsCluster.stop` ends the process by its PID; :meth:`HdfsCluster.kill` SIGKILLs it
(HDFS gone at once, as a namenode host that dies) and :meth:`HdfsCluster.start_again`
starts a new one on the same data and ports, not formatted (the namenode an operator
brings back: the same ``hdfs://`` URI, the files written before the kill).
:meth:`HdfsCluster.list_names` reads a directory through the namenode's WebHDFS (its HTTP
port), without a JVM of the caller's: the fleet demo watches the landing job's checkpoint
on HDFS so.

Run it as a process for demos and manual testing::

    python -m pydory_tools.testing.hdfs_cluster

The first line of output is the file system's URI (``hdfs://127.0.0.1:PORT``); the process
serves until SIGTERM or SIGINT, then stops HDFS and exits 0.

Rule: `HdfsCluster` is the only code that starts, waits for and stops an HDFS process.
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
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from pydory.errors import PydoryError
from pydory_tools.testing.lifecycle import (
    SHORT_LIVED_JVM_FLAGS,
    StopsOnExit,
    die_with_parent,
    find_java,
    log_tail,
    serve_until_signalled,
    terminate_then_kill,
)
from pydory_tools.testing.ports import LOOPBACK, accepts_connections, free_loopback_ports

__all__ = ["HdfsCluster", "HdfsError", "find_hadoop_jars", "main"]

_JARS_ENV = "PYDORY_HADOOP_JARS"
_MAIN_CLASS = "org.apache.hadoop.test.MiniDFSClusterManager"
_POLL_INTERVAL_S = 0.1
# A namenode and a datanode for tests fit a small heap.
_JVM_OPTIONS = (
    "-Xms64m",
    "-Xmx384m",
    *SHORT_LIVED_JVM_FLAGS,
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
)


class HdfsError(PydoryError):
    """HDFS could not be set up, started or stopped. Carries the log tail."""


def find_hadoop_jars() -> Path:
    """The directory of the minicluster's jars: ``$PYDORY_HADOOP_JARS`` or ``.jars/hadoop``."""
    configured = os.environ.get(_JARS_ENV)
    directory = Path(configured) if configured else _project_root() / ".jars" / "hadoop"
    if not any(directory.glob("hadoop-client-minicluster-*.jar")):
        raise HdfsError(
            f"no hadoop-client-minicluster jar in {directory}: run ./dev jars (it fetches "
            f"them from Maven Central), or set {_JARS_ENV} to a directory holding it and "
            "its dependencies"
        )
    return directory


def _project_root() -> Path:
    # tools/src/pydory_tools/testing/hdfs_cluster.py -> the checkout (installed editable).
    return Path(__file__).resolve().parents[4]


class HdfsCluster(StopsOnExit):
    """HDFS on 127.0.0.1, started by the constructor, ended by :meth:`stop`.

    ``datanodes`` datanodes (each file's blocks are written to ``min(3, datanodes)`` of
    them, the cluster's replication). Data lives under ``base_dir`` if given (kept
    afterwards), else in a temporary directory removed by :meth:`stop`.
    """

    def __init__(
        self,
        datanodes: int = 1,
        *,
        base_dir: Path | None = None,
        startup_timeout_s: float = 180.0,
    ) -> None:
        if datanodes < 1:
            raise ValueError("HDFS needs at least one datanode")
        self._jars = find_hadoop_jars()
        self._java = find_java(HdfsError, "HDFS")
        self._owns_base_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="pydory-hdfs-")) if base_dir is None else base_dir
        )
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.http_port = free_loopback_ports(2)
        self.datanodes = datanodes
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        try:
            started = time.monotonic()
            self._spawn(format_storage=True)
            self._wait_until_active(startup_timeout_s)
            self.startup_s = time.monotonic() - started
        except BaseException:
            self.stop()
            raise

    def start_again(self, startup_timeout_s: float = 180.0) -> None:
        """After :meth:`kill`: a new process on the same data and the same ports, its
        storage kept (no ``-format``), waited for as the first; the files written before
        the kill are there again, at the same URI."""
        with self._lock:
            if self._process is not None:
                raise HdfsError(f"HDFS at {self.uri} still runs (pid {self._process.pid})")
        started = time.monotonic()
        self._spawn(format_storage=False)
        try:
            self._wait_until_active(startup_timeout_s)
        except BaseException:
            self.kill()
            raise
        self.startup_s = time.monotonic() - started

    @property
    def uri(self) -> str:
        """The file system's URI, ``hdfs://127.0.0.1:PORT`` (a path is appended to it)."""
        return f"hdfs://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The JVM's process id, or None once stopped or killed."""
        return None if self._process is None else self._process.pid

    @property
    def log_path(self) -> Path:
        return self.base_dir / "hdfs.log"

    def describe(self) -> str:
        """One line for people: ``HDFS (MiniDFSCluster, 1 datanode) at hdfs://...``."""
        noun = "datanode" if self.datanodes == 1 else "datanodes"
        return f"HDFS (Hadoop MiniDFSCluster, {self.datanodes} {noun}) at {self.uri}"

    def list_names(self, path: str) -> list[str]:
        """The names in the directory ``path`` (``hdfs://…`` of this cluster, or absolute);
        ``[]`` when it does not exist. Asked of the namenode's WebHDFS (``LISTSTATUS``)."""
        absolute = path.removeprefix(self.uri) or "/"
        url = (
            f"http://{LOOPBACK}:{self.http_port}/webhdfs/v1{urllib.parse.quote(absolute)}"
            "?op=LISTSTATUS"
        )
        # Loopback: never through a proxy the environment may name.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=60) as response:
                listing = json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return []
            raise HdfsError(f"WebHDFS LISTSTATUS {absolute}: {error}") from None
        return [status["pathSuffix"] for status in listing["FileStatuses"]["FileStatus"]]

    def kill(self) -> None:
        """SIGKILL the process (namenode and datanodes at once): HDFS gone, its data kept."""
        with self._lock:
            process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()

    def stop(self, grace_s: float = 20.0) -> None:
        """End the process (SIGTERM, SIGKILL after ``grace_s``); remove a temporary base_dir."""
        with self._lock:
            process, self._process = self._process, None
        if process is not None:
            if self._owns_base_dir:
                process.kill()  # its data is about to go: a clean shutdown only costs time
                process.wait()
            else:
                terminate_then_kill(process, grace_s)
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self) -> str:
        """The last few kilobytes the process wrote, for error messages."""
        return log_tail(self.log_path)

    # --- start-up ------------------------------------------------------------------------------

    @property
    def _details_path(self) -> Path:
        return self.base_dir / "details.json"

    def _command(self, format_storage: bool) -> list[str]:
        data = self.base_dir / "data"
        return [
            self._java,
            *_JVM_OPTIONS,
            # MiniDFSCluster's fallback data directory (its own default is under the cwd).
            f"-Dtest.build.data={data}",
            "-cp",
            f"{self._jars}/*",
            _MAIN_CLASS,
            # Without it the namenode starts on what its directories hold (REGULAR).
            *(["-format"] if format_storage else []),
            "-datanodes",
            str(self.datanodes),
            "-nnport",
            str(self.port),
            "-httpport",
            str(self.http_port),
            "-writeDetails",
            str(self._details_path),
            "-D",
            f"hdfs.minidfs.basedir={data}",
            "-D",
            f"dfs.replication={min(3, self.datanodes)}",
            # Loopback only: the namenode's RPC and HTTP servers, and where it sends clients.
            "-D",
            f"dfs.namenode.rpc-bind-host={LOOPBACK}",
            "-D",
            f"dfs.namenode.http-bind-host={LOOPBACK}",
        ]

    def _spawn(self, format_storage: bool) -> None:
        self._details_path.unlink(missing_ok=True)
        with self.log_path.open("ab") as output:
            # Its own session (a Ctrl-C aimed at the test run does not race our stop()),
            # killed with the thread that started it (a killed test run leaves no HDFS).
            self._process = subprocess.Popen(
                self._command(format_storage),
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def _wait_until_active(self, timeout_s: float) -> None:
        """Wait for the details file (written after ``waitActive``) and the namenode's port."""
        deadline = time.monotonic() + timeout_s
        while not (self._details_written() and accepts_connections(LOOPBACK, self.port)):
            process = self._process
            if process is None or process.poll() is not None:
                status = None if process is None else process.returncode
                raise HdfsError(self._failure(f"exited with status {status}"))
            if time.monotonic() >= deadline:
                raise HdfsError(self._failure(f"was not active after {timeout_s:.0f} s"))
            time.sleep(_POLL_INTERVAL_S)

    def _details_written(self) -> bool:
        try:
            details = json.loads(self._details_path.read_text())
        except (FileNotFoundError, ValueError):  # not yet, or being written
            return False
        return isinstance(details, dict) and details.get("namenode_port") == self.port

    def _failure(self, what: str) -> str:
        return f"HDFS at {self.uri} {what}; log {self.log_path}:\n{self.log_tail()}"


# --- python -m pydory_tools.testing.hdfs_cluster -------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pydory_tools.testing.hdfs_cluster",
        description="Run HDFS (Hadoop's MiniDFSCluster) on loopback; print its URI first.",
    )
    parser.add_argument("--datanodes", type=int, default=1, help="number of datanodes")
    parser.add_argument("--dir", type=Path, help="keep HDFS's data here")
    args = parser.parse_args(argv)
    return serve_until_signalled(
        "hdfs_cluster",
        lambda: HdfsCluster(args.datanodes, base_dir=args.dir),
        HdfsError,
        lambda cluster: cluster.uri,
    )


if __name__ == "__main__":
    sys.exit(main())
