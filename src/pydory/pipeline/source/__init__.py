"""Reading Kafka for Spark: the ``pydory-kafka`` source and its offset planning.

Rule: how the pipeline reads Kafka's records and offsets lives in this package alone
(`kafka_source`, `range_reader`).
"""
