"""Logging as Dory's <logging> section describes it: level, stdout/stderr, syslog, file.

Dory's levels map onto Python's, with NOTICE (between INFO and WARNING) added. SIGUSR1
reopens the log file (``LogFiles.reopen``), for logrotate.

Rule: the daemon's log handlers are built and swapped here alone.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys

from pydory.config.model import LoggingConfig, LogLevel

NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")

_LEVELS = {
    # Python has one level above ERROR: syslog's three most severe share it.
    LogLevel.EMERG: logging.CRITICAL,
    LogLevel.ALERT: logging.CRITICAL,
    LogLevel.CRIT: logging.CRITICAL,
    LogLevel.ERR: logging.ERROR,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.NOTICE: NOTICE,
    LogLevel.INFO: logging.INFO,
    LogLevel.DEBUG: logging.DEBUG,
}
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


class LogFiles:
    """The handlers pydory installed, so they can be reopened, replaced and removed."""

    def __init__(self, force_stderr: bool = False) -> None:
        """``force_stderr`` (``serve --log-stderr``) adds stdout/stderr whatever the config says."""
        self.handlers: list[logging.Handler] = []
        self._force_stderr = force_stderr
        self._file: logging.FileHandler | None = None
        self._file_mode: int | None = None

    def apply(self, config: LoggingConfig) -> None:
        """Install the handlers ``config`` asks for, then remove the ones installed before
        (a config reload): no record falls between the two sets. Raises OSError, with
        the old handlers still in place, if the new log file cannot be opened."""
        old = self.handlers, self._file, self._file_mode
        self.handlers, self._file, self._file_mode = [], None, None
        try:
            self._install(config)
        except OSError:
            self.remove()
            self.handlers, self._file, self._file_mode = old
            raise
        root = logging.getLogger()
        for handler in old[0]:
            root.removeHandler(handler)
            handler.close()
        if config.syslog and not os.path.exists("/dev/log"):
            logging.getLogger(__name__).warning("syslog logging is enabled but /dev/log is absent")

    def _install(self, config: LoggingConfig) -> None:
        formatter = logging.Formatter(_FORMAT)
        if config.stdout_stderr or self._force_stderr:
            out = logging.StreamHandler(sys.stdout)
            out.addFilter(_BelowWarning())
            err = logging.StreamHandler(sys.stderr)
            err.setLevel(logging.WARNING)
            self.handlers += [out, err]
        if config.syslog and os.path.exists("/dev/log"):
            syslog = logging.handlers.SysLogHandler(address="/dev/log")
            syslog.setFormatter(logging.Formatter("pydory[%(process)d]: %(levelname)s %(message)s"))
            self.handlers.append(syslog)
        if config.file_path:
            file_handler = logging.FileHandler(config.file_path)
            if config.file_mode is not None:
                os.chmod(config.file_path, config.file_mode)
            self.handlers.append(file_handler)
            self._file = file_handler
            self._file_mode = config.file_mode
        root = logging.getLogger()
        root.setLevel(_LEVELS[config.level])
        for handler in self.handlers:
            if handler.formatter is None:
                handler.setFormatter(formatter)
            root.addHandler(handler)

    def reopen(self) -> None:
        """SIGUSR1: close and reopen the log file (it may have been rotated away).

        A file created anew gets the configured mode, like the first one.
        """
        if self._file is not None:
            self._file.acquire()
            try:
                self._file.close()
                self._file.stream = self._file._open()
                if self._file_mode is not None:
                    os.chmod(self._file.baseFilename, self._file_mode)
            finally:
                self._file.release()

    def remove(self) -> None:
        """Detach and close every handler installed (at exit, and in tests)."""
        root = logging.getLogger()
        for handler in self.handlers:
            root.removeHandler(handler)
            handler.close()
        self.handlers = []


def configure_logging(config: LoggingConfig, *, force_stderr: bool = False) -> LogFiles:
    """Install root handlers per ``config``; ``force_stderr`` adds stdout/stderr output."""
    installed = LogFiles(force_stderr)
    installed.apply(config)
    return installed
