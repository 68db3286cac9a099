"""The driver's small files on a local file system, and which implementation a path gets
(no Spark: HadoopFiles on HDFS is in tests/test_distributed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydory.pipeline.lake_files import LocalFiles, NeedsSpark, is_local, join, lake_files


def test_a_local_file_is_replaced_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    files = LocalFiles()
    directory = f"file://{tmp_path}/state"
    path = join(directory, "state.json")

    assert files.read_text(path) is None
    assert files.names(directory) == []
    assert not files.is_dir(directory)
    files.write_text(path, "one")
    files.write_text(path, "two \u00e9")

    assert (tmp_path / "state" / "state.json").read_text(encoding="utf-8") == "two \u00e9"
    assert files.read_text(str(tmp_path / "state" / "state.json")) == "two \u00e9"
    assert files.names(directory) == ["state.json"]
    assert files.is_dir(directory)
    assert files.qualify(f"file://{tmp_path}/state/../state") == str(tmp_path / "state")


def test_local_paths_get_local_files_and_a_remote_one_needs_a_spark_session() -> None:
    assert isinstance(lake_files(None, "/data/lake", "file:///data/cp", "relative"), LocalFiles)
    assert all(is_local(p) for p in ("/a", "a/b", "file:/a", "file:///a", "C:/lake"))
    assert not any(is_local(p) for p in ("hdfs://nn:8020/a", "s3a://bucket/a", "gs://b/a"))
    with pytest.raises(NeedsSpark, match="hdfs://nn:8020/lake"):
        lake_files(None, "/data/cp", "hdfs://nn:8020/lake")
    assert join("hdfs://nn:8020/lake/", "_spark_metadata", "0") == (
        "hdfs://nn:8020/lake/_spark_metadata/0"
    )
