"""The small files the pipeline's driver reads and writes itself — the lake's record of its
checkpoint, the checkpoint's id and logs, the sink's commit log, the fleet audit's state —
on whatever file system their path names: a local path or ``file:`` URI, ``hdfs://``,
``s3a://`` or any other scheme Hadoop knows.

Two implementations of one interface (:class:`LakeFiles`): :class:`LocalFiles` (the
operating system's calls, no Spark needed, so a wrong local path is told before a JVM
starts) and :class:`HadoopFiles` (Hadoop's ``FileSystem`` API through the Spark session's
JVM, with the session's Hadoop configuration: the same client, settings and credentials
the Spark jobs use on that lake). :func:`lake_files` picks one for a set of paths. Paths
are strings throughout; :func:`join` appends a name to a path of either kind.

A file is written whole or not at all: a hidden temporary file in the same directory,
then a rename over the old one (``os.replace``; Hadoop's ``FileContext.rename`` with
``OVERWRITE``, atomic on HDFS; on an S3 store a rename is a copy, and a reader sees the
old or the new object).

Rule: the driver's own file reads and writes of the lake, checkpoint and audit state go
through a `LakeFiles` made here, whatever the path's scheme.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from pydory.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "HadoopFiles",
    "LakeFiles",
    "LocalFiles",
    "NeedsSpark",
    "is_local",
    "join",
    "lake_files",
]


class NeedsSpark(PipelineError):
    """A path on a distributed file system was given where no Spark session runs: its
    files are reached through Spark's Hadoop client (start the job's session first)."""


class LakeFiles(Protocol):
    """What the driver does with the lake's and the checkpoint's small files."""

    def qualify(self, path: str) -> str:
        """``path`` made absolute (local) or fully qualified (``hdfs://host:port/...``)."""
        ...

    def is_dir(self, path: str) -> bool: ...

    def names(self, path: str) -> list[str]:
        """The names in directory ``path``; none when it does not exist."""
        ...

    def read_text(self, path: str) -> str | None:
        """The file's text, or None when it does not exist (OSError when it cannot be read)."""
        ...

    def write_text(self, path: str, text: str) -> None:
        """Replace ``path`` with ``text`` whole (its directory made if missing)."""
        ...

    def write_bytes(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` whole (its directory made if missing)."""
        ...


def is_local(path: str) -> bool:
    """Whether ``path`` is a local path or a ``file:`` URI."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a drive letter is no scheme


def join(path: str, *names: str) -> str:
    """``path`` with ``names`` appended, ``/`` between (a URI keeps its scheme and host)."""
    return "/".join([path.rstrip("/"), *names]) if names else path


def lake_files(spark: SparkSession | None, *paths: str) -> LakeFiles:
    """:class:`LocalFiles` when every path is local, else :class:`HadoopFiles` on
    ``spark`` (raises :class:`NeedsSpark` without one)."""
    if all(is_local(path) for path in paths):
        return LocalFiles()
    if spark is None:
        remote = next(path for path in paths if not is_local(path))
        raise NeedsSpark(f"{remote} is read through Spark's Hadoop client: no session given")
    return HadoopFiles(spark)


def _temporary_name(name: str) -> str:
    # Spark's listener thread records batches while the main thread may record the pair.
    return f".{name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:8]}.tmp"


class LocalFiles:
    """The local file system (a ``file:`` URI is taken as its path)."""

    def qualify(self, path: str) -> str:
        return str(self._path(path).resolve())

    def is_dir(self, path: str) -> bool:
        return self._path(path).is_dir()

    def names(self, path: str) -> list[str]:
        try:
            return [entry.name for entry in self._path(path).iterdir()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_text(self, path: str) -> str | None:
        try:
            return self._path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def write_bytes(self, path: str, data: bytes) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(_temporary_name(target.name))
        temporary.write_bytes(data)
        os.replace(temporary, target)

    @staticmethod
    def _path(path: str) -> Path:
        return Path(urlparse(path).path if path.startswith("file:") else path)


class HadoopFiles:
    """Any file system Hadoop reaches, through ``spark``'s JVM and Hadoop configuration.

    An ``IOException`` from Hadoop (a namenode that does not answer, a denied write) is
    raised as ``OSError`` naming the path, so callers handle it as they do a local one.
    """

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark._jvm
        self._gateway: Any = spark.sparkContext._gateway
        self._conf = spark._jsc.hadoopConfiguration()

    def qualify(self, path: str) -> str:
        return str(self._call(path, lambda fs, p: fs.makeQualified(p).toString()))

    def is_dir(self, path: str) -> bool:
        return bool(self._call(path, lambda fs, p: fs.getFileStatus(p).isDirectory(), False))

    def names(self, path: str) -> list[str]:
        statuses = self._call(path, lambda fs, p: fs.listStatus(p), [])
        return [status.getPath().getName() for status in statuses]

    def read_text(self, path: str) -> str | None:
        def read(fs: Any, p: Any) -> str:
            stream = fs.open(p)
            try:
                data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            finally:
                stream.close()
            return bytes(data).decode("utf-8")

        text: str | None = self._call(path, read, None)
        return text

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def write_bytes(self, path: str, data: bytes) -> None:
        def write(fs: Any, target: Any) -> None:
            temporary = self._jvm.org.apache.hadoop.fs.Path(
                target.getParent(), _temporary_name(target.getName())
            )
            fs.mkdirs(target.getParent())
            stream = fs.create(temporary, True)
            try:
                stream.write(bytearray(data))
            finally:
                stream.close()
            # FileSystem.rename never replaces a file; FileContext's does, in one step.
            overwrite = self._gateway.new_array(self._jvm.org.apache.hadoop.fs.Options.Rename, 1)
            overwrite[0] = self._jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE
            context = self._jvm.org.apache.hadoop.fs.FileContext.getFileContext(
                target.toUri(), self._conf
            )
            context.rename(temporary, target, overwrite)

        self._call(path, write)

    def _call(self, path: str, action: Any, missing: Any = ...) -> Any:
        """``action(fs, hadoop_path)``; ``missing`` when the path does not exist (if given)."""
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

        hadoop_path = self._jvm.org.apache.hadoop.fs.Path(path)
        try:
            return action(hadoop_path.getFileSystem(self._conf), hadoop_path)
        except Py4JJavaError as error:
            java_class = error.java_exception.getClass().getName()
            if missing is not ... and java_class == "java.io.FileNotFoundException":
                return missing
            raise OSError(f"{path}: {error.java_exception.toString()}") from None
