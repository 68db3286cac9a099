"""The argparse types of numbers that several commands take (`send`, `pipeline land`).

Each turns an option's text into its value, or into a usage error that says what is wrong
with the text (argparse prints it with the option's name). Stdlib only: `pydory send`
imports this module and must start fast.
"""

from __future__ import annotations

import argparse


def integer(text: str) -> int:
    """A whole number, written in decimal."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    """A whole number of at least 1 (a count, a cap)."""
    number = integer(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def positive_float(text: str) -> float:
    """A number above 0 (an interval, a window in seconds)."""
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return number
