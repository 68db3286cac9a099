"""Spool: a message is kept on disk until it settles.

The segment files (``segments``: the lock, appends, settling; ``syncing``: when they
are fsynced), their byte format
(``records``), the recovery that truncates a torn tail (``recovery``), the errors a spool
operation raises (``errors``), and the write-ahead that appends each read burst before
admission sees it and replays what was left at the next start (``write_ahead``). Rule:
nothing else in the daemon touches the spool's files.
"""
