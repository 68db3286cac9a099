"""Spool: a message is kept on disk until it settles.

- ``segments``: the segment files (the directory's lock, appends, settling, deletion);
- ``records``: their byte format;
- ``syncing``: when they are fsynced; ``disk_worker``: the thread the interval's syncs
  and the deletions run on;
- ``acks``: the acknowledgement marks (which frames are settled); ``tallies``: what
  became of them;
- ``recovery``: reading an earlier run's segments (a torn tail cut, damage passed);
  ``corrupt``: the damaged bytes kept for the operator;
- ``identity``: each message's durable name; ``lock_pid``: the pid in the ``LOCK`` file;
- ``errors``: the errors a spool operation raises;
- ``write_ahead``: each read burst appended before admission sees it, and the replay of
  what was left at the next start;
- ``lifecycle``: the spool on the event loop (opened, replayed, synced on a timer, closed).

Rule: nothing outside this package reads or writes a segment file or its mark: the daemon
reaches them through ``segments`` and ``write_ahead``. (The run's books file and the host
id file also live in the spool directory; ``books/durable.py`` and ``identity`` own them.)
"""
