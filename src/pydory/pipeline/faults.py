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

Rule: how an environmental fault is named to the operator lives here alone.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator
from contextlib import contextmanager

from pydory.pipeline.errors import PipelineError

__all__ = [
    "EXIT_COULD_NOT_RUN",
    "CouldNotRun",
    "KafkaUnreachable",
    "could_not_run",
    "fault_line",
    "first_line",
    "require_kafka",
]

#: Every pipeline command's exit status for "could not run" (docs/pipeline.md).
EXIT_COULD_NOT_RUN = 2

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


def fault_line(error: BaseException) -> str | None:
    """One line naming the environmental fault in ``error``, or None if it is not one."""
    if isinstance(error, CouldNotRun):
        return str(error)
    if isinstance(error, OSError) and error.errno in _ERRNO:
        where = f" ({error.filename})" if error.filename else ""
        return f"{_ERRNO[error.errno]}{where}"
    text = str(error)
    for needle, said in _JVM_FAULTS:
        if needle in text:
            found = _FILE_IN_TEXT.search(text)
            return said + (f" ({found.group(1)})" if found else "")
    return None


def first_line(error: BaseException) -> str:
    """The first line of an error that is not a known fault (still one line)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def require_kafka(bootstrap_servers: str, timeout_s: float = 30.0) -> None:
    """Raise :class:`KafkaUnreachable` unless a broker at ``bootstrap_servers`` answers a
    metadata request within ``timeout_s`` (librdkafka, on the driver; nothing created)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "allow.auto.create.topics": False})
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as error:
        raise KafkaUnreachable(
            f"Kafka at {bootstrap_servers} did not answer within {timeout_s:g} s "
            f"({error.args[0].str()}): check that the brokers run and the address is theirs"
        ) from None


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
