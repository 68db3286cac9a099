"""Admission: a message is judged.

Decode, size, memory pool, rate limit, known topic, in that order; a message that passes is
accepted and handed to delivery, one that fails is discarded with its reason. A burst
reaches admission already written ahead to the spool (``daemon/spool/write_ahead.py``).

- ``intake``: the checks, in order, and the moment of acceptance (the reference path);
- ``burst_path``: the compiled producer's path for a burst whose outcome is the
  reference's, message for message;
- ``waiting_room``: messages whose topic the metadata does not show yet (the first fetch,
  or a topic being auto-created);
- ``ratelimit``: Dory's per-topic rate limit;
- ``overload``: what admission and the inputs do when the memory pool runs short.

Rule: a message a client sent is accepted only in ``intake`` (or by the ``burst_path`` it
hands a burst to), and every discard before acceptance is booked here, with the reason of
the first check it fails; the one exception is a message the spool lost to damage before
its replay (``spool_corrupt``, booked by ``daemon/spool/write_ahead.py``).
"""
