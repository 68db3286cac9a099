"""Spool: a message is kept on disk until it settles.

The segment files (framed, checksummed records; recovery that truncates a torn tail) and the
write-ahead that appends each read burst before admission sees it and replays what was left
at the next start. Rule: nothing else in the daemon touches the spool's files.
"""
