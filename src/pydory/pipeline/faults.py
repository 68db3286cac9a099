"""Faults a pipeline job cannot get past, each said in one line with exit status 2.

A job stops on a fault of its surroundings: the lake or checkpoint cannot be written (a
read-only file system, no permission, a path under a regular file), the disk is full, a
committed lake file is not readable Parquet, Kafka does not answer, Spark cannot start.
Neither "does not balance" (1) nor a traceback: the operator reads what is wrong and
where, fixes it, and runs the job again (exit status 2, "could not run", in every
pipeline command; docs/pipeline.md).

The fault reaches the driver either as Python's ``OSError`` (pydory's own files: the
lake's binding record, the checkpoint's metadata, an audit's state) or inside a JVM
error (Spark's own reads and writes), whose text names the cause somewhere among its
lines: both are read here.

Rule: how an environmental fault is named to the operator lives here alone (`fault_line`).
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydory.pipeline.errors import PipelineError

__all__ = [
    "EXIT_COULD_NOT_RUN",
    "KAFKA_ANSWER_TIMEOUT_S",
    "CouldNotRun",
    "ExecutorsGone",
    "KafkaUnreachable",
    "SparkMasterUnreachable",
    "could_not_run",
    "fault_line",
    "first_line",
    "require_kafka",
    "require_spark_master",
]

#: Every pipeline command's exit status for "could not run" (docs/pipeline.md).
EXIT_COULD_NOT_RUN = 2

#: How long the driver waits for a Kafka broker to answer a metadata request before it
#: says Kafka does not answer. Read at each call, so that a test of that fault sets it
#: short instead of waiting out 30 s per request.
KAFKA_ANSWER_TIMEOUT_S = 30.0

#: OSError numbers -> what to say (the path is added).
_ERRNO = {
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOSPC: "no space left on the device (the disk is full)",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EIO: "input/output error (the disk failed)",
}

#: Text of a JVM error (Java's or Spark's own words) -> what to say.
_JVM_FAULTS = (
    ("No space left on device", "no space left on the device (the disk is full)"),
    ("Disk quota exceeded", "disk quota exceeded"),
    ("Read-only file system", "read-only file system"),
    ("AccessDeniedException", "permission denied"),
    ("Permission denied", "permission denied"),
    ("Not a directory", "a part of the path is a file, not a directory"),
    ("Parent path is not a directory", "a part of the path is a file, not a directory"),
    ("is not a Parquet file", "a lake file is not readable Parquet (corrupt or truncated)"),
    ("CANNOT_READ_FILE_FOOTER", "a lake file is not readable Parquet (corrupt or truncated)"),
    ("ParquetDecodingException", "a lake file is not readable Parquet (corrupt)"),
    ("FAILED_READ_FILE", "a lake file could not be read"),
    ("Timed out waiting for a node assignment", "Kafka did not answer (no broker reachable)"),
    ("Connection refused", "connection refused"),
)
#: A file named in a JVM error: Spark writes ``file:/...`` or ``hdfs://...``.
_FILE_IN_TEXT = re.compile(r"((?:file|hdfs|s3a?):/+[^\s,;'\"\]]+)")


class CouldNotRun(PipelineError):
    """A job could not run for a fault of its surroundings; the message says which."""


class KafkaUnreachable(CouldNotRun):
    """Kafka did not answer at the bootstrap servers given. Check that the brokers run
    and that the address is theirs; nothing was read or written."""


class ExecutorsGone(CouldNotRun):
    """A job on a cluster has had no executor for longer than it waits: the cluster's
    workers are gone (or have no cores or memory for it). The batch in flight is redone
    by the next run, from the checkpoint."""


class SparkMasterUnreachable(CouldNotRun):
    """No Spark standalone master answered at the ``spark://`` URL given. Check that the
    master runs and that the URL is its; no session was started."""


def fault_line(error: BaseException) -> str | None:
    """One line naming the environmental fault in ``error``, or None if it is not one."""
    if isinstance(error, CouldNotRun):
        return str(error)
    if isinstance(error, OSError) and error.errno in _ERRNO:
        where = f" ({error.filename})" if error.filename else ""
        return f"{_ERRNO[error.errno]}{where}"
    text = "\n".join(_texts(error))
    found = _FILE_IN_TEXT.search(text)
    # A path ends before the colon or full stop that may follow it in the message.
    path = found.group(1).rstrip(":.") if found else None
    where = f" ({path})" if path else ""
    if _CANNOT_CREATE in text or _MKDIR_FAILED.search(text):
        # Hadoop's local file system says only that it failed: look at the path.
        return _why_not_writable(path) + where
    for needle, said in _JVM_FAULTS:
        if needle in text:
            return said + where
    return None


def _texts(error: BaseException) -> Iterator[str]:
    """The error's own words and those of its causes: Python's chain, PySpark's captured
    JVM stack trace (``Caused by:`` lines), a py4j error's Java cause chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield str(current)
        stack = getattr(current, "_stackTrace", None)  # PySpark's CapturedException
        if isinstance(stack, str):
            yield stack
        java = getattr(current, "java_exception", None)  # py4j's Py4JJavaError
        for _ in range(_JAVA_CAUSES):
            java = java.getCause() if java is not None else None
            if java is None:
                break
            yield str(java.toString())
        current = current.__cause__ or getattr(current, "_cause", None)


#: How deep a Java cause chain is read.
_JAVA_CAUSES = 16
#: Hadoop's words when it cannot make a directory, its cause untold.
_CANNOT_CREATE = "Mkdirs failed to create"
_MKDIR_FAILED = re.compile(r"mkdir of \S+ failed")


def _why_not_writable(uri: str | None) -> str:
    """Why a local directory could not be made: the nearest existing ancestor tells."""
    if uri is None or not uri.startswith("file:"):
        return "cannot create the directory"
    path = Path("/" + uri.removeprefix("file:").lstrip("/"))
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        return _ERRNO[errno.ENOTDIR]
    stats = os.statvfs(path)
    if stats.f_flag & os.ST_RDONLY:
        return _ERRNO[errno.EROFS]
    if not os.access(path, os.W_OK):
        return _ERRNO[errno.EACCES]
    if stats.f_bavail == 0:
        return _ERRNO[errno.ENOSPC]
    return "cannot create the directory"


def first_line(error: BaseException) -> str:
    """The first line of an error that is not a known fault (still one line)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def require_kafka(bootstrap_servers: str, timeout_s: float | None = None) -> None:
    """Raise :class:`KafkaUnreachable` unless a broker at ``bootstrap_servers`` answers a
    metadata request within ``timeout_s`` (default :data:`KAFKA_ANSWER_TIMEOUT_S`;
    librdkafka, on the driver; nothing created)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    if timeout_s is None:
        timeout_s = KAFKA_ANSWER_TIMEOUT_S
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "allow.auto.create.topics": False})
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as error:
        raise KafkaUnreachable(
            f"Kafka at {bootstrap_servers} did not answer within {timeout_s:g} s "
            f"({error.args[0].str()}): check that the brokers run and the address is theirs"
        ) from None


def require_spark_master(master: str, timeout_s: float = 10.0) -> None:
    """Raise :class:`SparkMasterUnreachable` unless a master of a ``spark://`` URL (one or
    more ``host:port``, comma-separated for standby masters) accepts a connection within
    ``timeout_s``; other masters are not checked.

    Without it a session on a master that is gone starts all the same, and Spark's
    standalone client gives up registering only after three fixed 20 s attempts, while a
    job's first batch waits for executors that never come.
    """
    if not master.startswith("spark://"):
        return
    causes = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return
        except (OSError, ValueError) as error:
            causes.append(f"{address}: {getattr(error, 'strerror', None) or error}")
    raise SparkMasterUnreachable(
        f"no Spark master answered at {master} within {timeout_s:g} s ({'; '.join(causes)}): "
        "check that the master runs and that the URL is its"
    )


@contextmanager
def could_not_run(command: str) -> Iterator[None]:
    """Inside, a fault of the surroundings (an ``OSError``, a Spark or JVM error) is raised
    again as :class:`CouldNotRun` saying ``pydory <command>: could not run: <fault>``, one
    line (an error it does not know is named by its first line)."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    try:
        yield
    except CouldNotRun as error:
        raise CouldNotRun(f"pydory {command}: could not run: {error}") from None
    except (OSError, PySparkException, Py4JError) as error:
        line = fault_line(error) or first_line(error)
        raise CouldNotRun(f"pydory {command}: could not run: {line}") from None
