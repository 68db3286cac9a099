"""pydory's tools, apart from the daemon: what tests, benchmarks and demos run beside it.

- :mod:`pydory_tools.testing`: Kafka for tests and demos (Apache Kafka's launcher,
  librdkafka's mock cluster, Tansu's launcher), ``pydory serve`` as a process and in a
  thread, the kill loop, the pytest fixtures;
- :mod:`pydory_tools.bench`: ``pydory bench`` (and ``_cloadgen``, its load generator in C);
- :mod:`pydory_tools.demo`, :mod:`pydory_tools.demo_kills`: ``pydory demo``;
- :mod:`pydory_tools.commands`: the two `pydory` subcommands that live here.

The arrow runs one way: this package imports ``pydory``; ``pydory`` never imports it (its
CLI names the two commands here by module name and imports one only to run it).
"""
