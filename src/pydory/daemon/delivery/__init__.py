"""Delivery: an accepted message goes to Kafka and comes back with an outcome.

librdkafka does the network work; this stage picks the partition (router), owns the
producers and their settings, reads metadata and statistics, and turns each delivery
report into one outcome: delivered, rerouted, or discarded with its reason. Rule: every
accepted message leaves this stage exactly once, through the ledger (``outcomes``).

The rooms, after aiokafka's producer/ split: ``dispatcher`` is the facade (send, poll,
producers' lifecycle), ``settlement`` each report batch onto the ledger (reroute, the
possible-duplicate window), ``outcomes`` every error -> outcome decision and the ledger
that settles an outcome, ``librdkafka_settings`` the one way from config to librdkafka
properties; ``producer`` one librdkafka producer (``ProducerHandle``) through the producer
seam, ``producer_backend`` (the interface and its report records), its two backends
``compiled_producer`` and ``confluent_producer``, and ``backends``, which chooses one;
``router``, ``metadata``, ``kafka_stats`` and ``broker_trouble`` read the cluster.
"""
