"""Books: what the daemon owes and what it has done.

- ``accounting``: per-topic books (accepted, delivered, discarded by reason, in flight)
  and their invariant;
- ``events``: the vocabulary every stage names (discard reasons, transports);
- ``counters``: every counter's name, and the counters;
- ``discard_report``: Dory's discard report periods;
- ``pool``: the memory pool, and what an accepted message costs;
- ``shares``: each client's fair share of the pool (its partial frames and its accepted
  messages charged to it); ``charges``: which client an accepted message's bytes are
  charged to, carried in its token until its outcome;
- ``commit_point``: the moment before which every message read is settled;
- ``durable``, ``keeper``, ``publisher``: the run's books that survive the process (the
  record and its file, when it is written, the books topic);
- ``files``: the daemon's own log files, written off the loop;
- ``discard_log``, ``msg_debug``: Dory's discard log and message tracing.

Other stages keep the numbers of their own machinery, which the status pages read too
(librdkafka's statistics and the metadata times in ``delivery/``, the spool's sensors in
``spool/``, the reload history in ``daemon/reload.py``).

Rule: a message's outcome is booked only through ``accounting`` (which refuses a step that
would break the books' invariant), and every counter is named in ``counters``.
"""
