"""The landing job: Kafka's records into a Parquet lake, each message once.

Rule: what is written into the lake, and when, is decided in this package alone (`land`).
"""
