"""The pipeline off one machine's file system and Spark: the lake and checkpoint on HDFS
(Hadoop's MiniDFSCluster in a JVM of its own), the jobs on a Spark standalone cluster (a
master and two workers, each a process of its own), audited from there.

One Spark session on the cluster for the module (a process has one SparkContext), the
session's HDFS and Kafka shared with other modules; each test uses paths of its own.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from pydory.daemon.books.durable import CLEAN
from pydory.pipeline.audits.audit import summarize_lake
from pydory.pipeline.audits.fleet_audit import fleet_audit
from pydory.pipeline.lake_files import HadoopFiles, join
from pydory.pipeline.landing.lake_binding import BINDING_FILE
from pydory.pipeline.landing.land import LandSettings, run_landing
from pydory.pipeline.spark import spark_session
from pydory_tools.testing.hdfs_cluster import HdfsCluster
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.lifecycle import SHORT_LIVED_EXECUTOR_CONF
from pydory_tools.testing.spark_cluster import SparkCluster
from test_pipeline_fleet_audit import name, produce, publish, run_books

pytestmark = [
    pytest.mark.hdfs,
    pytest.mark.spark_cluster,
    pytest.mark.kafka,
    pytest.mark.slow,
]

H = 0xE


@pytest.fixture(scope="module")
def spark(spark_cluster: SparkCluster) -> Iterator[SparkSession]:
    # A local session an earlier module of this worker left running for the next one to
    # reuse would be reused here too (one per process), and these tests would run on it:
    # stop it first.
    earlier = SparkContext._active_spark_context
    if earlier is not None and earlier.master != spark_cluster.master_url:
        earlier.stop()
    # An executor per worker (1 core each), small enough for a worker's 1 GiB.
    session = spark_session(
        master=spark_cluster.master_url,
        app_name="pydory-test-distributed",
        conf={
            "spark.executor.memory": "512m",
            "spark.sql.shuffle.partitions": "2",
            **SHORT_LIVED_EXECUTOR_CONF,
        },
    )
    yield session
    session.stop()


def test_a_file_round_trips_through_hdfs(spark: SparkSession, hdfs_cluster: HdfsCluster) -> None:
    files = HadoopFiles(spark)
    directory = f"{hdfs_cluster.uri}/round-trip"
    path = join(directory, "state.json")

    assert files.read_text(path) is None
    assert files.names(directory) == []
    files.write_text(path, '{"one": 1}')
    files.write_text(path, '{"two": 2} \u00e9')  # replaced whole

    assert files.read_text(path) == '{"two": 2} \u00e9'
    assert files.names(directory) == ["state.json"]  # no temporary file left behind
    # The launcher's own look (WebHDFS, no JVM), as the fleet demo watches a checkpoint.
    assert hdfs_cluster.list_names(directory) == ["state.json"]
    assert hdfs_cluster.list_names(f"{directory}/nothing-here") == []
    assert files.is_dir(directory)
    assert not files.is_dir(path)
    assert files.qualify(f"{directory}/./x") == f"{hdfs_cluster.uri}/round-trip/x"
    # The blocks are on the datanode's disk, not in the client: the JVM's own reader agrees.
    jvm = spark._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    status = hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration()).getFileStatus(hadoop_path)
    assert status.getLen() == len('{"two": 2} \u00e9'.encode())


def test_a_lake_on_hdfs_lands_on_the_spark_cluster_and_the_audits_read_it_there(
    spark: SparkSession,
    spark_cluster: SparkCluster,
    hdfs_cluster: HdfsCluster,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    events, books_topic = unique_topic("hdfs-events"), unique_topic("hdfs-books")
    kafka_broker.create_topic(events, 3)
    kafka_broker.create_topic(books_topic, 1, config={"cleanup.policy": "compact"})
    root = f"{hdfs_cluster.uri}/{events}"
    lake, checkpoint, state = f"{root}/lake", f"{root}/checkpoint", f"{root}/audit-state"

    # A run of 12 messages, 3 of them sent twice (a crash's replay): 12 rows in the lake.
    produce(bootstrap, events, [name("h", H, n) for n in range(12)])
    produce(bootstrap, events, [name("h", H, n) for n in (9, 10, 11)])
    publish(
        bootstrap,
        books_topic,
        [run_books("h", H, CLEAN, {events: {"accepted": 12, "delivered": 12}})],
    )
    settings = LandSettings(
        bootstrap_servers=bootstrap,
        topics=(events,),
        lake=lake,
        checkpoint=checkpoint,
        master=spark_cluster.master_url,
        available_now=True,
    )
    out = io.StringIO()
    assert run_landing(settings, out) == 0, out.getvalue()
    # The executors ran on the two workers: the driver's block managers and theirs.
    assert spark.sparkContext.master == spark_cluster.master_url
    assert spark._jsc.sc().getExecutorMemoryStatus().size() == 3

    files = HadoopFiles(spark)
    binding = files.read_text(join(lake, BINDING_FILE))
    assert binding is not None
    assert f'"checkpoint": "{checkpoint}"' in binding

    # The plain audit's view of the lake: 15 offsets planned, 12 landed (3 dropped copies).
    summary = summarize_lake(spark, lake)
    assert sum(p.rows for p in summary.partitions) == 12

    report = fleet_audit(
        spark, lake, bootstrap_servers=bootstrap, books_topic=books_topic, state_dir=state
    )
    assert report.balanced, report.render()
    assert report.sources["lake"] == lake
    assert report.sources["lake_files_read"] > 0
    assert files.read_text(join(state, "fleet-audit-state.json")) is not None

    # The pairing guard on HDFS: a new checkpoint on this lake is refused before it runs.
    refused = io.StringIO()
    other = LandSettings(
        bootstrap_servers=bootstrap,
        topics=(events,),
        lake=lake,
        checkpoint=f"{root}/another-checkpoint",
        master=spark_cluster.master_url,
        available_now=True,
    )
    assert run_landing(other, refused) == 1
    assert f"the lake {lake} already holds batch" in refused.getvalue()
    assert "the checkpoint" in refused.getvalue()

    # Nothing new: the next audit reads no lake file again, and still balances.
    again = fleet_audit(
        spark, lake, bootstrap_servers=bootstrap, books_topic=books_topic, state_dir=state
    )
    assert again.balanced, again.render()
    assert again.sources["lake_files_read"] == 0
    assert again.sources["lake_files_audited"] == report.sources["lake_files_audited"]
