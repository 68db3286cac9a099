"""The value parsers: numbers with k/m suffixes, signed levels, booleans, file modes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydory.config.values import (
    COUNT_SUFFIXES,
    MAX_UNSIGNED,
    NO_SUFFIX,
    SIZE_SUFFIXES,
    parse_bool,
    parse_mode,
    parse_signed,
    parse_unsigned,
)
from pydory.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "suffixes", "expected"),
    [
        ("0", NO_SUFFIX, 0),
        ("  42 ", NO_SUFFIX, 42),
        ("007", NO_SUFFIX, 7),
        ("10k", COUNT_SUFFIXES, 10 * 1024),
        ("10K", COUNT_SUFFIXES, 10 * 1024),
        ("256k", SIZE_SUFFIXES, 262144),
        ("128m", SIZE_SUFFIXES, 128 * 1024 * 1024),
        ("2048M", SIZE_SUFFIXES, 2048 * 1024 * 1024),
        ("10 k", SIZE_SUFFIXES, 10 * 1024),
    ],
)
def test_parse_unsigned(text: str, suffixes: str, expected: int) -> None:
    assert parse_unsigned(text, suffixes=suffixes) == expected


@pytest.mark.parametrize(
    ("text", "suffixes", "message"),
    [
        ("", SIZE_SUFFIXES, "Value is empty"),
        ("k", SIZE_SUFFIXES, "Invalid number"),
        ("1.5", SIZE_SUFFIXES, "Invalid number"),
        ("-3", SIZE_SUFFIXES, "Invalid number"),
        ("1kk", SIZE_SUFFIXES, "Invalid number"),
        ("\u0661\u0662", NO_SUFFIX, "Invalid number"),  # Arabic-Indic digits: int() takes them
        ("1_000", NO_SUFFIX, "Invalid number"),
        ("10k", NO_SUFFIX, "Suffix [k] not allowed"),
        ("10m", COUNT_SUFFIXES, "Suffix [m] not allowed"),
        ("10g", SIZE_SUFFIXES, "Suffix [g] not allowed"),
        ("9" * 5000, NO_SUFFIX, "out of range"),  # beyond int()'s 4300-digit limit
        (str(MAX_UNSIGNED + 1), NO_SUFFIX, "out of range"),
    ],
)
def test_parse_unsigned_refuses(text: str, suffixes: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_unsigned(text, suffixes=suffixes)
    assert message in info.value.reason


def test_parse_unsigned_range_applies_after_the_suffix() -> None:
    assert parse_unsigned("64k", suffixes=SIZE_SUFFIXES, maximum=65536) == 65536
    with pytest.raises(ConfigError, match="at most 65535"):
        parse_unsigned("64k", suffixes=SIZE_SUFFIXES, maximum=65535)
    with pytest.raises(ConfigError, match="at least 1"):
        parse_unsigned("0", minimum=1)


@given(
    text=st.one_of(
        st.text(),
        st.from_regex(r"\s*[0-9]{0,25}\s*[a-zA-Z]?\s*", fullmatch=True),
    ),
    suffixes=st.sampled_from([NO_SUFFIX, COUNT_SUFFIXES, SIZE_SUFFIXES]),
    maximum=st.integers(min_value=0, max_value=MAX_UNSIGNED),
)
def test_number_parser_returns_an_int_in_range_or_raises_config_error(
    text: str, suffixes: str, maximum: int
) -> None:
    try:
        value = parse_unsigned(text, suffixes=suffixes, maximum=maximum)
    except ConfigError as exc:
        reason = exc.reason  # a reason for the user; any other exception fails the test
        assert reason
        return
    assert type(value) is int
    assert 0 <= value <= maximum


@given(st.integers(min_value=0, max_value=2**40), st.sampled_from(["", "k", "K", "m", "M"]))
def test_number_parser_round_trips(number: int, suffix: str) -> None:
    multiplier = {"": 1, "k": 1024, "m": 1024 * 1024}[suffix.lower()]
    assert parse_unsigned(f"{number}{suffix}", suffixes=SIZE_SUFFIXES) == number * multiplier


def test_parse_signed() -> None:
    assert parse_signed("-1", minimum=-1, maximum=9) == -1
    assert parse_signed(" 9 ", minimum=-1, maximum=9) == 9
    for bad in ("10", "-2", "3k", "", "1.0"):
        with pytest.raises(ConfigError):
            parse_signed(bad, minimum=-1, maximum=9)


@pytest.mark.parametrize(("text", "expected"), [("true", True), (" FALSE ", False), ("True", True)])
def test_parse_bool(text: str, expected: bool) -> None:
    assert parse_bool(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0644", 0o644),
        ("0222", 0o222),
        ("00", 0),
        ("0777", 0o777),
        ("0b110010010", 0o622),
        ("0B1", 1),
        ("unspecified", None),
        (" Unspecified ", None),
    ],
)
def test_parse_mode(text: str, expected: int | None) -> None:
    assert parse_mode(text) == expected


@pytest.mark.parametrize(
    "text", ["644", "0o644", "0999", "0b2", "01000", "0" + "7" * 50, "", "rwx"]
)
def test_parse_mode_refuses(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_mode(text)
