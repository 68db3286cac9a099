"""What a spool operation raises: the disk refused it, the spool is full, or it is in use.

Rule: the spool reports a refused operation to its callers as one of these (a
:class:`SpoolError`), defined here only (a disk error is wrapped, never passed on as a bare
``OSError``).
"""

from __future__ import annotations

from pydory.errors import ConfigError, PydoryError

SPOOL_PATH_ELEMENT = "/doryConfig/spool/path"
"""The config element naming the spool directory (errors about the directory name it)."""


class SpoolError(PydoryError):
    """The disk refused a spool operation (ENOSPC, EIO, EACCES...).

    The burst that raised it is not in the spool: the caller applies its overload policy
    to it, exactly as if memory had run out.
    """


class SpoolFull(SpoolError):
    """Appending this burst would take the spool above its size cap (``max_bytes``)."""


class SpoolInUse(ConfigError):
    """Another process holds the spool directory's lock: refuse to start.

    Two daemons sharing one spool would replay and delete each other's messages, so this
    is treated like a socket path a live daemon listens on: a configuration problem.
    """

    def __init__(self, directory: str, detail: str = "") -> None:
        reason = f"Spool directory [{directory}] is locked by a running process{detail}"
        super().__init__(reason, path=SPOOL_PATH_ELEMENT)
        self.directory = directory
