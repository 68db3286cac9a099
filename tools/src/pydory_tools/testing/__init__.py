"""Kafka brokers and helpers for pydory's tests and demos.

- :mod:`pydory_tools.testing.mock_cluster`: librdkafka's in-process mock cluster (fault injection).
- :mod:`pydory_tools.testing.tansu`: the Tansu broker as a separate process.
- :mod:`pydory_tools.testing.kafka_util`: topic names, topic creation, reading a topic back.
- :mod:`pydory_tools.testing.pytest_plugin`: pytest fixtures over the above.

Submodules are imported on demand, so ``import pydory_tools.testing`` stays cheap.
"""
