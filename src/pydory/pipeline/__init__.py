"""The data pipeline on Apache Spark, grouped by job as ``daemon/`` is by stage:

- ``source/``: reading Kafka: the ``pydory-kafka`` streaming and batch source (PySpark's
  Python Data Source API, ``kafka_source``), its offset planning (``offsets``, pure), its
  options (``source_options``), driver-side watermarks (``broker_offsets``) and
  executor-side range reads (``range_reader``).
- ``landing/``: the landing job, Kafka to a Parquet lake exactly once (``land``), second
  copies dropped by identity (``dedup``), the lake's checkpoint (``lake_binding``), what
  a run with data loss accepted skipped (``skip_report``), and the check that ends a
  one-shot run before Spark starts when Kafka holds nothing new (``nothing_new``).
- ``audits/``: the lake against the books: one daemon run's (``audit`` + ``reconcile``),
  every host's from the books topic (``fleet_audit`` + ``fleet_reconcile``).
- beside them, shared by the jobs: ``spark`` (the one place a SparkSession is built),
  ``errors``, ``faults`` (a fault of the surroundings said in one line, exit 2),
  ``lake_files`` (the small files the driver reads and writes itself, the checkpoint's
  logs and the fleet audit's state among them, on any filesystem a URI names),
  ``worker_python`` (``pydory-spark-python``, the interpreter of every session's Python
  workers).

The wing imports nothing of ``daemon/``, ``server`` or ``commands/`` (tests/test_layout.py):
the message identity it shares with the daemon is :mod:`pydory.message_identity`. The
command lines are ``pydory.commands.pipeline`` (``land``), ``pipeline_audit`` and
``pipeline_fleet_audit``, built without PySpark from ``pipeline_options``; they import a
job's modules only when it runs.
"""
