"""The audits: what the lake holds against what the daemons' books say.

Rule: the audits only read (the lake, the books, Kafka's gaps); their verdicts live here
(`reconcile`, `fleet_reconcile`).
"""
