"""The data pipeline on Apache Spark: a Kafka source for PySpark, the landing job, the audit.

- ``kafka_source``: the ``pydory-kafka`` streaming and batch source (PySpark's Python
  Data Source API), reading with a librdkafka consumer by ``assign()`` over offset ranges.
- ``offsets``: the source's offset planning, pure functions (no Kafka, no Spark).
- ``land``: the landing job, Kafka to a Parquet lake, exactly once.
- ``spark``: the one place a SparkSession is built.

Modules here import PySpark; the CLI loads them only when a pipeline command runs.
"""
