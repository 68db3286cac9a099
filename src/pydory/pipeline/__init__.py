"""The data pipeline on Apache Spark: a Kafka source for PySpark, the landing job, the audit.

- ``kafka_source``: the ``pydory-kafka`` streaming and batch source (PySpark's Python
  Data Source API), reading with a librdkafka consumer by ``assign()`` over offset ranges.
- ``offsets``: the source's offset planning, pure functions (no Kafka, no Spark).
- ``source_options``, ``broker_offsets``, ``range_reader``: the source's options, its
  driver-side watermark queries, its executor-side range reads.
- ``land``: the landing job, Kafka to a Parquet lake, exactly once.
- ``audit``, ``reconcile``: the audit job, the lake against the daemon's books.
- ``spark``: the one place a SparkSession is built.

The jobs' modules import PySpark, so the CLI imports them only when a pipeline command
runs (``pydory.commands.pipeline``, ``audit_command`` and ``fleet_audit_command`` build the
parsers without it, from the options in ``command_options``).
"""
