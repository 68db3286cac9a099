"""Delivery: an accepted message goes to Kafka and comes back with an outcome.

librdkafka does the network work; this stage picks the partition (router), owns the
producers and their settings, reads metadata and statistics, and turns each delivery
report into one outcome: delivered, rerouted, or discarded with its reason. Rule: every
accepted message leaves this stage exactly once, through the ledger (``outcomes``).

The rooms, after aiokafka's producer/ split: ``dispatcher`` is the facade (send, reroute,
settle), ``producer`` one librdkafka producer and its reports, ``outcomes`` every error ->
outcome decision and the ledger that settles an outcome, ``librdkafka_settings`` the one
way from config to librdkafka properties; ``router``, ``metadata`` and ``kafka_stats``
read the cluster.
"""
