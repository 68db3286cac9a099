"""Parsers for the attribute values of Dory's config file: numbers, booleans, modes.

Pure functions: text in, value out, or ConfigError carrying only a reason (the loader
adds the element path and position). Whitespace around a value is ignored, as in Dory.
"""

from __future__ import annotations

import re

from pydory.errors import ConfigError

SIZE_SUFFIXES = "km"
"""Sizes accept k (x1024) and m (x1024*1024)."""
COUNT_SUFFIXES = "k"
"""Counts accept k (x1024)."""
NO_SUFFIX = ""
"""Times and most other values are plain integers."""

MAX_UNSIGNED = 2**63 - 1
"""No value in the file may exceed this (the limit of a signed 64-bit integer)."""

_MULTIPLIERS = {"k": 1024, "m": 1024 * 1024}
# ASCII digits only: Python's int() would also take "١٢", "1_000" or "+5".
_UNSIGNED = re.compile(r"([0-9]+)\s*([A-Za-z]?)", re.ASCII)
_SIGNED = re.compile(r"-?[0-9]+", re.ASCII)
_OCTAL_MODE = re.compile(r"0[0-7]*", re.ASCII)
_BINARY_MODE = re.compile(r"0[bB][01]+", re.ASCII)
# More digits than this cannot be in range; checking first keeps int() cheap and
# away from its 4300-digit limit.
_MAX_DIGITS = 40
MAX_MODE = 0o777


def describe_unsigned(suffixes: str) -> str:
    """How an accepted value looks, for error messages."""
    if suffixes == SIZE_SUFFIXES:
        return "a nonnegative integer, optionally with suffix k (x1024) or m (x1048576)"
    if suffixes == COUNT_SUFFIXES:
        return "a nonnegative integer, optionally with suffix k (x1024)"
    return "a nonnegative integer (no suffix allowed)"


def parse_unsigned(
    text: str, *, suffixes: str = NO_SUFFIX, minimum: int = 0, maximum: int = MAX_UNSIGNED
) -> int:
    """Parse ``"10"``, ``"10k"``, ``"2m"`` into an int in ``[minimum, maximum]``.

    ``suffixes`` lists the (lower-case) suffixes allowed; they match either case.
    Raises ConfigError (reason only) on anything else.
    """
    value = text.strip()
    expected = describe_unsigned(suffixes)
    if not value:
        raise ConfigError(f"Value is empty: expected {expected}")
    match = _UNSIGNED.fullmatch(value)
    if match is None:
        raise ConfigError(f"Invalid number [{value}]: expected {expected}")
    digits, suffix = match.groups()
    suffix = suffix.lower()
    if suffix and suffix not in suffixes:
        raise ConfigError(
            f"Suffix [{match.group(2)}] not allowed in [{value}]: expected {expected}"
        )
    if len(digits.lstrip("0")) > _MAX_DIGITS:
        raise ConfigError(f"Value [{value}] is out of range: must be at most {maximum}")
    number = int(digits) * _MULTIPLIERS.get(suffix, 1)
    return _check_range(value, number, minimum, maximum)


def parse_signed(text: str, *, minimum: int, maximum: int) -> int:
    """Parse a plain, possibly negative integer in ``[minimum, maximum]``."""
    value = text.strip()
    if not _SIGNED.fullmatch(value) or len(value) > _MAX_DIGITS:
        raise ConfigError(
            f"Invalid integer [{value}]: expected an integer from {minimum} to {maximum}"
        )
    return _check_range(value, int(value), minimum, maximum)


def _check_range(value: str, number: int, minimum: int, maximum: int) -> int:
    if number < minimum:
        raise ConfigError(f"Value [{value}] is out of range: must be at least {minimum}")
    if number > maximum:
        raise ConfigError(f"Value [{value}] is out of range: must be at most {maximum}")
    return number


def parse_bool(text: str) -> bool:
    """Parse ``true`` or ``false`` (any case), as Dory does."""
    value = text.strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    raise ConfigError(f"Invalid boolean [{text.strip()}]: expected true or false")


def parse_mode(text: str) -> int | None:
    """Parse file mode bits: octal with a leading 0 (``0644``), binary (``0b110100100``),
    or ``unspecified`` (None: the process umask decides)."""
    value = text.strip()
    if value.lower() == "unspecified":
        return None
    if len(value) > _MAX_DIGITS:
        raise ConfigError(f"Mode [{value}] is out of range: must be at most 0777")
    if _OCTAL_MODE.fullmatch(value):
        mode = int(value, 8)
    elif _BINARY_MODE.fullmatch(value):
        mode = int(value[2:], 2)
    else:
        raise ConfigError(
            f"Invalid mode [{value}]: expected octal with a leading 0 (e.g. 0644), "
            "binary with a leading 0b (e.g. 0b110100100), or unspecified"
        )
    if mode > MAX_MODE:
        raise ConfigError(f"Mode [{value}] is out of range: must be at most 0777")
    return mode
