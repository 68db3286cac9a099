"""Books: what the daemon owes and what it has done.

Per-topic accounting and counters, the memory pool (what an accepted message costs),
the commit point, the discard log and message tracing files. Rule: a number the status
pages report is kept here, and only here.
"""
