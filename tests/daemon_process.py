"""``pydory serve`` as a process of its own: it lives in :mod:`pydory_tools.testing.daemon_process`
(the kill loop and the demo use it too); the tests import it from here as before."""

from pydory_tools.testing.daemon_process import START_TIMEOUT_S, DaemonProcess

__all__ = ["START_TIMEOUT_S", "DaemonProcess"]
