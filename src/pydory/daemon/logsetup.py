"""Logging as Dory's <logging> section describes it: level, stdout/stderr, syslog, file.

Dory's levels map onto Python's, with NOTICE (between INFO and WARNING) added. SIGUSR1
reopens the log file (``LogFiles.reopen``), for logrotate. librdkafka's own lines (logger
``pydory.librdkafka``) repeat for as long as a broker is down, several a second: each
distinct line is let through once a minute, with how many like it were held back
(``RepeatedLines``).

Rule: the daemon's log handlers are built (``configure_logging``) and swapped
(:meth:`LogFiles.apply`) here alone.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
import threading
import time
from collections.abc import Callable

from pydory.config.model import LoggingConfig, LogLevel
from pydory.daemon.log_limits import RepeatGate

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


#: The logger librdkafka's lines come through (delivery/librdkafka_settings.py sets it).
LIBRDKAFKA_LOGGER = "pydory.librdkafka"
#: A librdkafka line identical to one let through less than this long ago is held back.
REPEAT_INTERVAL_S = 60.0
# What differs between two reports of the same failure: "(after 0ms in state CONNECT)".
_VARYING = re.compile(r"\(after \d+ms in state \w+[^)]*\)")
# Distinct lines remembered at most; past it the memory starts afresh (lines come back once).
_MAX_REMEMBERED = 1000


class RepeatedLines(logging.Filter):
    """Lets each distinct line through once per ``interval_s``; the next one let through
    says how many like it were held back meanwhile (``log_limits.RepeatGate``, keyed by
    the line's text). Thread-safe: librdkafka's lines are logged from the loop and from
    the metadata thread."""

    def __init__(
        self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._clock = clock
        self._lock = threading.Lock()
        self._gate = RepeatGate(interval_s, max_keys=_MAX_REMEMBERED)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        key = _VARYING.sub("", message)
        with self._lock:
            passed = self._gate.admit(key, self._clock())
        if passed is None:
            return False
        if passed.held:
            record.msg = (
                f"{message} ({passed.held} more like it in the last {passed.since_s:.0f} s)"
            )
            record.args = ()
        return True


def limit_librdkafka_repeats() -> None:
    """Install :class:`RepeatedLines` on librdkafka's logger (once per process)."""
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    if not any(isinstance(f, RepeatedLines) for f in logger.filters):
        logger.addFilter(RepeatedLines())


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


def destinations(config: LoggingConfig, *, force_stderr: bool = False) -> str:
    """Where the daemon's log lines go, in words (for `pydory serve`'s first line)."""
    places = []
    if config.file_path:
        places.append(f"the file {config.file_path}")
    if config.syslog:
        places.append("syslog" if os.path.exists("/dev/log") else "syslog (absent: /dev/log)")
    if config.stdout_stderr or force_stderr:
        places.append("stdout/stderr")
    if not places:
        return "nowhere (<logging> enables no output: add <file>, or run with --log-stderr)"
    return ", ".join(places) + f", at level {config.level.name} and above"


def configure_logging(config: LoggingConfig, *, force_stderr: bool = False) -> LogFiles:
    """Install root handlers per ``config``; ``force_stderr`` adds stdout/stderr output."""
    installed = LogFiles(force_stderr)
    installed.apply(config)
    limit_librdkafka_repeats()
    return installed
