"""Dory's XML config file -> a validated, immutable ``Config``.

The whole file is checked in one pass: every problem found is collected (element path,
line, column, reason) and raised together as ConfigErrors, so a user fixes them all at
once. Problems that stop the reading itself (unreadable file, XML that is not
well-formed, unsafe XML, a wrong root element) raise a single ConfigError at once.
Nothing is guessed: a value is either valid or an error, and an omitted optional
element takes Dory's documented default. What Dory itself accepts and ignores (an unknown
attribute on one of its elements, a gzip level outside zlib's range) loads with a warning
(``Config.warnings``) rather than an error: every file Dory accepts loads here too.
docs/config.md lists every difference that remains.

Sections made only of simple leaf elements (<msgDelivery>, <httpInterface>, ...) are read
from a table per section (``MSG_DELIVERY``, ...) that lists each element as the element
tables of docs/config.md do: its name, the model field it sets, and its kind of value.
The document's own sections are listed the same way, in ``DOCUMENT``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from pydory.config.librdkafka import librdkafka_property_problem
from pydory.config.model import (
    DEFAULT_SOCKET_MODE,
    NO_BATCHING,
    UNLIMITED_RATE,
    BatchingAction,
    BatchingConfig,
    BatchingThresholds,
    Broker,
    ClientRate,
    CompressionCodec,
    CompressionConfig,
    CompressionType,
    Config,
    DiscardLoggingConfig,
    HttpInterfaceConfig,
    InputConfig,
    InputSourcesConfig,
    KafkaConfig,
    ListenerQuotas,
    LoggingConfig,
    LogLevel,
    MessageIdentityConfig,
    MsgDebugConfig,
    MsgDeliveryConfig,
    OverloadPolicy,
    QuotasConfig,
    RateLimit,
    RateLimitingConfig,
    SpoolConfig,
    TcpInput,
    TopicBatching,
    UnixSocketInput,
)
from pydory.config.values import (
    COUNT_SUFFIXES,
    MAX_UNSIGNED,
    NO_SUFFIX,
    SIZE_SUFFIXES,
    describe_unsigned,
    parse_bool,
    parse_mode,
    parse_signed,
    parse_unsigned,
)
from pydory.config.xmltree import MAX_CONFIG_BYTES, Element, check_config_size, parse_xml
from pydory.errors import MAX_REPORTED_ERRORS, ConfigError, ConfigErrors
from pydory.wire import topic_name_problem

T = TypeVar("T")
S = TypeVar("S")  # a section's model (a dataclass from model.py)
E = TypeVar("E", bound=enum.Enum)  # a setting that is one of a few words

ROOT_ELEMENTS = ("doryConfig", "bruceConfig")  # Dory still accepts its predecessor's name
#: pydory's own sections: Dory never reads them, so nothing in them is Dory's to ignore
#: and an unknown attribute there is an error.
EXTENSION_SECTIONS = frozenset({"librdkafka", "spool", "quotas", "messageIdentity"})
#: zlib's levels: Dory's gzip codec uses its default level for any other value.
GZIP_LEVELS = (0, 9)
INT32_MAX = 2**31 - 1  # Kafka's protocol fields (sizes, timeouts) are signed 32-bit
PORT_MAX = 65535
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}", re.ASCII)

# Codec levels librdkafka accepts (compression.level is -1..12; -1 = codec default).
COMPRESSION_LEVELS: Mapping[CompressionType, tuple[int, int]] = MappingProxyType(
    {
        CompressionType.GZIP: (-1, 9),
        CompressionType.LZ4: (-1, 12),
        CompressionType.ZSTD: (-1, 12),
    }
)


# --- public API -------------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate the config file at ``path``.

    Raises ConfigError (or ConfigErrors, listing every problem) if the file cannot be
    read or is invalid in any way; the daemon must not start then.
    """
    try:
        # One byte more than the limit is enough to know the file is too large: a huge
        # file (or /dev/zero) is refused without being read.
        with Path(path).open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"Cannot read config file [{os.fsdecode(path)}]: {exc.strerror}"
        ) from None
    check_config_size(len(data), os.fsdecode(path))
    return parse_config(data, source=os.fsdecode(path))


def parse_config(text: bytes | str, source: str = "<string>") -> Config:
    """Validate a config document given as bytes (encoding per its XML declaration) or str.

    ``source`` names the document in errors about the document as a whole.
    Raises ConfigError / ConfigErrors like ``load_config``.
    """
    check_config_size(len(text), source)
    if not text.strip():
        raise ConfigError(f"Config file [{source}] is empty: expected a <doryConfig> document")
    root = parse_xml(text)
    if root.tag not in ROOT_ELEMENTS:
        raise root.error(f"Unknown root element [{root.tag}]: expected [doryConfig]")
    reader = _Reader()
    config = _read_config(reader, root)
    if reader.errors:
        raise ConfigErrors(
            sorted(reader.errors, key=lambda e: (e.line or 0, e.column or 0)),
            unlisted=reader.unlisted_errors,
        )
    warnings = sorted(reader.warnings, key=lambda e: (e.line or 0, e.column or 0))
    shown = [
        str(w).replace("Error in config file", "Warning in config file", 1)
        for w in warnings[:MAX_REPORTED_ERRORS]
    ]
    unshown = len(warnings) + reader.unlisted_warnings - len(shown)
    if unshown:  # each warning is logged at start-up: keep the log short
        shown.append(f"... and {unshown} more warnings")
    return dataclasses.replace(config, warnings=tuple(shown))


# --- the reader: structural checks and value conversion, collecting errors --------------------


class _Reader:
    """Checks elements and converts values, recording every problem in ``errors``.

    Each method returns a usable fallback after recording a problem, so that reading
    goes on and finds the next one; the result is thrown away if any were recorded.
    """

    #: Errors (and warnings) kept for the message; beyond it they are only counted. More
    #: than are shown, so the ones shown are the first in the file after sorting by line.
    KEPT = 10 * MAX_REPORTED_ERRORS

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []
        self.warnings: list[ConfigError] = []
        self.unlisted_errors = 0
        self.unlisted_warnings = 0

    @property
    def error_count(self) -> int:
        """Every error found so far, kept or only counted."""
        return len(self.errors) + self.unlisted_errors

    def report(self, element: Element, reason: str) -> None:
        if len(self.errors) < self.KEPT:
            self.errors.append(element.error(reason))
        else:
            self.unlisted_errors += 1

    def warn(self, element: Element, reason: str) -> None:
        """Something Dory accepts and pydory ignores: the file loads, the user is told."""
        if len(self.warnings) < self.KEPT:
            self.warnings.append(element.error(reason))
        else:
            self.unlisted_warnings += 1

    def attributes(
        self, element: Element, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ) -> dict[str, str]:
        """The element's attributes, after checking none is missing; an unknown one is
        ignored with a warning, as Dory ignores it (an error in pydory's own sections)."""
        allowed = (*required, *optional)
        for name in element.attributes:
            if name in allowed:
                continue
            reason = f"Unknown attribute [{name}]: {_expected(allowed)}"
            if _section_of(element) in EXTENSION_SECTIONS:
                self.report(element, reason)
            else:
                self.warn(element, f"{reason}; ignored, as Dory ignores it")
        for name in required:
            if name not in element.attributes:
                self.report(element, f"Missing required attribute [{name}]")
        return element.attributes

    def children(
        self, element: Element, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ) -> dict[str, Element]:
        """The element's children by tag; each may appear once."""
        allowed = (*required, *optional)
        found: dict[str, Element] = {}
        for child in element.children:
            if child.tag not in allowed:
                self.report(child, f"Unknown element [{child.tag}]: {_expected(allowed)}")
            elif child.tag in found:
                self.report(child, f"Duplicate element [{child.tag}]")
            else:
                found[child.tag] = child
        for tag in required:
            if tag not in found:
                self.report(element, f"Missing required element [{tag}]")
        return found

    def items(self, container: Element, tag: str) -> list[Element]:
        """The children of a list element such as <namedConfigs>, all named ``tag``."""
        self.attributes(container)
        items = []
        for child in container.children:
            if child.tag == tag:
                items.append(child)
            else:
                self.report(child, f"Unknown element [{child.tag}]: expected [{tag}]")
        return items

    def leaf(self, element: Element) -> None:
        for child in element.children:
            self.report(child, f"Unknown element [{child.tag}]: [{element.tag}] has no children")

    def value(self, element: Element) -> str:
        """The ``value`` attribute of a leaf such as <port value="9090" />."""
        self.leaf(element)
        return self.attributes(element, required=("value",)).get("value", "")

    def text(self, element: Element | None, default: str) -> str:
        """The free-text value of a leaf, as written, or ``default`` if it is omitted."""
        return default if element is None else self.value(element)

    def name(self, element: Element, attribute: str = "name") -> str:
        """A required, non-empty name attribute (surrounding whitespace ignored)."""
        if attribute not in element.attributes:
            return ""  # reported by attributes()
        name = element.attributes[attribute].strip()
        if not name:
            self.report(element, f"Attribute [{attribute}] must not be empty")
        return name

    def convert(
        self, element: Element, attribute: str, text: str, parse: Callable[[str], T]
    ) -> T | None:
        """``parse(text)``, or None after reporting why it failed."""
        try:
            return parse(text)
        except ConfigError as exc:
            self.report(element, f"Bad value for attribute [{attribute}]: {exc.reason}")
            return None

    def one_of(
        self,
        element: Element,
        attribute: str,
        text: str,
        choices: type[E],
        what: str,
        case: Callable[[str], str] = str.lower,
    ) -> E | None:
        """``text`` as one of the words ``choices`` (compared after ``case``: Dory ignores
        the case of such words), or None after reporting that it is none of them."""
        try:
            return choices(case(text))
        except ValueError:
            self.report(
                element,
                f"Bad value for attribute [{attribute}]: invalid {what} [{text}]: "
                f"{_expected(tuple(member.value for member in choices))}",
            )
            return None

    def keyword(
        self,
        element: Element | None,
        default: E,
        *,
        choices: type[E],
        what: str,
        case: Callable[[str], str] = str.lower,
    ) -> E:
        """One of the words ``choices`` in <x value="..."/>, or ``default`` if the element
        is omitted or the word is none of them (reported)."""
        if element is None:
            return default
        choice = self.one_of(element, "value", self.value(element).strip(), choices, what, case)
        return default if choice is None else choice

    def unsigned(
        self,
        element: Element | None,
        default: int,
        *,
        suffixes: str = NO_SUFFIX,
        minimum: int = 0,
        maximum: int = MAX_UNSIGNED,
    ) -> int:
        """The number in <x value="..."/>, or ``default`` if the element is omitted."""
        if element is None:
            return default
        text = self.value(element)
        if text.strip().lower() in ("disable", "unlimited", "unspecified"):
            self.report(
                element,
                f"Bad value for attribute [value]: [{text.strip()}] is not allowed for "
                f"[{element.tag}]: expected {describe_unsigned(suffixes)}",
            )
            return default
        parse = partial(parse_unsigned, suffixes=suffixes, minimum=minimum, maximum=maximum)
        result = self.convert(element, "value", text, parse)
        return default if result is None else result

    def unsigned_or(
        self,
        element: Element,
        attribute: str,
        keyword: str,
        *,
        suffixes: str = NO_SUFFIX,
        minimum: int = 0,
        maximum: int = MAX_UNSIGNED,
    ) -> int | None:
        """A number, or None for ``keyword`` ("disable", "unlimited")."""
        text = element.attributes.get(attribute)
        if text is None or text.strip().lower() == keyword:
            return None  # a missing attribute is reported by attributes()

        def parse(text: str) -> int:
            try:
                return parse_unsigned(text, suffixes=suffixes, minimum=minimum, maximum=maximum)
            except ConfigError as exc:
                raise ConfigError(f"{exc.reason}, or {keyword}") from None

        return self.convert(element, attribute, text, parse)

    def limit(
        self, element: Element | None, default: int | None, keyword: str, *, suffixes: str
    ) -> int | None:
        """The number in <x value="..."/>, None (no limit) for ``keyword``, or ``default``
        if the element is omitted."""
        if element is None:
            return default
        self.leaf(element)
        self.attributes(element, required=("value",))
        return self.unsigned_or(element, "value", keyword, suffixes=suffixes)

    def boolean(self, element: Element | None, default: bool, attribute: str = "value") -> bool:
        """A true/false attribute of a leaf, or ``default`` if the element is omitted."""
        if element is None:
            return default
        self.leaf(element)
        self.attributes(element, required=(attribute,))
        return self.flag(element, attribute, default)

    def flag(self, element: Element, attribute: str, default: bool = False) -> bool:
        """A true/false attribute (its presence is checked by attributes())."""
        text = element.attributes.get(attribute)
        result = None if text is None else self.convert(element, attribute, text, parse_bool)
        return default if result is None else result

    def mode(self, element: Element | None, default: int | None) -> int | None:
        if element is None:
            return default
        return self.convert(element, "value", self.value(element), parse_mode)

    def absolute_path(self, element: Element | None, enabled: bool, what: str) -> str | None:
        """A <path value="..."/>: None when disabled or empty, else an absolute path."""
        if element is None:
            return None
        path = self.value(element).strip()
        if not enabled or not path:
            return None
        if not path.startswith("/"):
            self.report(element, f"{what} path must be absolute: [{path}]")
            return None
        return path

    def reference(self, element: Element, named: Mapping[str, T], section: str) -> T | None:
        """The named config that the element's ``config`` attribute names."""
        name = self.name(element, "config")
        if name and name not in named:
            defined = ", ".join(named) or "none"
            self.report(
                element, f"{section} config [{name}] is not defined (defined configs: {defined})"
            )
        return named.get(name)

    def no_text(self, element: Element) -> None:
        """Values belong in attributes: text inside any element is a mistake."""
        if element.text.strip():
            self.report(
                element, f"Unexpected text [{element.text.strip()}]: values go in attributes"
            )
        for child in element.children:
            self.no_text(child)


def _section_of(element: Element) -> str:
    """The top-level section an element is in ("" for the root): its path's 2nd step."""
    steps = element.path.split("/")
    return steps[2].split("[", 1)[0] if len(steps) > 2 else ""


def _expected(allowed: tuple[str, ...], what: str = "expected one of") -> str:
    return f"{what}: {', '.join(allowed)}" if allowed else "none allowed here"


def _named_configs(
    reader: _Reader, container: Element | None, section: str, read_one: Callable[[Element, str], T]
) -> dict[str, T]:
    """The <config name="..."> items of a <namedConfigs> element, names unique."""
    configs: dict[str, T] = {}
    if container is None:
        return configs
    for element in reader.items(container, "config"):
        name = reader.name(element)
        value = read_one(element, name)
        if name in configs:
            reader.report(element, f"{section} config contains duplicate named config: [{name}]")
        elif name:
            configs[name] = value
    return configs


def _topic_overrides(
    reader: _Reader, container: Element | None, section: str, read_one: Callable[[Element], T]
) -> Mapping[str, T]:
    """The <topic name="..."> items of a <topicConfigs> element, topics valid and unique."""
    overrides: dict[str, T] = {}
    if container is None:
        return MappingProxyType(overrides)
    for element in reader.items(container, "topic"):
        topic = reader.name(element)
        value = read_one(element)
        if not topic:
            continue
        if not TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            reader.report(
                element,
                f"Invalid topic name [{topic}]: expected 1 to 249 of a-z A-Z 0-9 . _ - "
                "(and not . or ..)",
            )
        elif topic in overrides:
            reader.report(
                element, f"{section} config contains duplicate specification for topic [{topic}]"
            )
        else:
            overrides[topic] = value
    return MappingProxyType(overrides)


#: Reads a <defaultTopic> or a <topic>: (the element, the attributes it has besides those
#: of a <defaultTopic>: a <topic>'s "name") -> the topic's setting.
TopicReader = Callable[[Element, tuple[str, ...]], T]


def _per_topic(
    reader: _Reader,
    parts: Mapping[str, Element],
    section: str,
    read_topic: TopicReader[T],
    missing: T,
) -> tuple[T, Mapping[str, T]]:
    """A section's <defaultTopic> (``missing`` when absent: that is reported) and its
    <topicConfigs> overrides: each <topic> reads as the default does, plus its name."""
    default_element = parts.get("defaultTopic")
    default = missing if default_element is None else read_topic(default_element, ())
    overrides = _topic_overrides(
        reader,
        parts.get("topicConfigs"),
        section,
        lambda element: read_topic(element, ("name",)),
    )
    return default, overrides


def _config_reference(
    reader: _Reader, named: Mapping[str, T], section: str, missing: T
) -> TopicReader[T]:
    """Reads a <defaultTopic config="..."/> (or a <topic>) that only names one of the
    section's named configs: that config, or ``missing`` when it is not defined (reported)."""

    def read(element: Element, extra: tuple[str, ...]) -> T:
        reader.leaf(element)
        reader.attributes(element, required=(*extra, "config"))
        config = reader.reference(element, named, section)
        return missing if config is None else config

    return read


# --- sections of leaf elements, read from a table ---------------------------------------------

LeafReader = Callable[[_Reader, Element | None, Any], Any]
"""Reads one leaf: (reader, the element or None if omitted, the default) -> its value."""


@dataclass(frozen=True, slots=True)
class Leaf:
    """One row of a section's table of elements, as Dory's docs list them."""

    tag: str  # the child element, as Dory names it
    field: str  # the field of the section's model that it sets; the model gives its default
    read: LeafReader


def unsigned(
    *, suffixes: str = NO_SUFFIX, minimum: int = 0, maximum: int = MAX_UNSIGNED
) -> LeafReader:
    """A number in <x value="..."/> within [minimum, maximum], ``suffixes`` allowed."""
    return partial(_Reader.unsigned, suffixes=suffixes, minimum=minimum, maximum=maximum)


def limit(keyword: str, *, suffixes: str) -> LeafReader:
    """A number in <x value="..."/>, or ``keyword`` (such as "unlimited") for None: no limit."""
    return partial(_Reader.limit, keyword=keyword, suffixes=suffixes)


def keyword(
    choices: type[enum.Enum], what: str, case: Callable[[str], str] = str.lower
) -> LeafReader:
    """One of the words ``choices`` in <x value="..."/>; ``what`` names it in an error."""
    return partial(_Reader.keyword, choices=choices, what=what, case=case)


def boolean(attribute: str = "value") -> LeafReader:
    """A true/false in <x value="..."/>, or in ``attribute`` (Dory uses "enable" for some)."""
    return partial(_Reader.boolean, attribute=attribute)


# Kinds of value that recur in the tables.
TEXT: LeafReader = _Reader.text  # free text, kept as written
SIZE = unsigned(suffixes=SIZE_SUFFIXES)
POSITIVE_SIZE = unsigned(suffixes=SIZE_SUFFIXES, minimum=1)
INT32 = unsigned(maximum=INT32_MAX)
POSITIVE_INT32 = unsigned(minimum=1, maximum=INT32_MAX)
MILLIS = INT32  # a time in milliseconds
# Times given in minutes or seconds must still fit 32 bits once converted to milliseconds.
MINUTES_AS_MILLIS = unsigned(minimum=1, maximum=INT32_MAX // 60_000)
SECONDS_AS_MILLIS = unsigned(minimum=1, maximum=INT32_MAX // 1000)


def _read_leaf_section(
    reader: _Reader, element: Element | None, model: Callable[..., S], table: tuple[Leaf, ...]
) -> S:
    """A section whose children are all optional leaves, read as ``table`` says.

    An omitted element takes the model's default, and so does every element of an
    omitted section.
    """
    default = model()
    if element is None:
        return default
    reader.attributes(element)
    parts = reader.children(element, optional=tuple(leaf.tag for leaf in table))
    return model(**_leaf_values(reader, parts, default, table))


def _leaf_values(
    reader: _Reader, parts: Mapping[str, Element], default: object, table: tuple[Leaf, ...]
) -> dict[str, Any]:
    """The model fields that ``table`` sets, each read from its element in ``parts``.

    The leaves are read in table order, which is the order of Dory's docs.
    """
    return {
        leaf.field: leaf.read(reader, parts.get(leaf.tag), getattr(default, leaf.field))
        for leaf in table
    }


def _read_path_section(
    reader: _Reader,
    element: Element | None,
    model: Callable[..., S],
    what: str,
    table: tuple[Leaf, ...],
    flags: Mapping[str, str] = MappingProxyType({}),
) -> S:
    """A section like <msgDebug enable="..."> that writes to a <path>, and optional leaves;
    ``flags``: optional true/false attributes of the section (attribute -> model field).

    It is off (the model's path is None) when omitted, disabled, or given an empty path.
    """
    default = model()
    if element is None:
        return default
    path, parts = _read_enabled_path(
        reader, element, what, tuple(leaf.tag for leaf in table), tuple(flags)
    )
    flag_values = {
        field: reader.flag(element, attribute, getattr(default, field))
        for attribute, field in flags.items()
    }
    return model(path=path, **_leaf_values(reader, parts, default, table), **flag_values)


def _read_enabled_path(
    reader: _Reader,
    element: Element,
    what: str,
    optional: tuple[str, ...],
    optional_attributes: tuple[str, ...] = (),
) -> tuple[str | None, dict[str, Element]]:
    """The required enable attribute and <path> child of ``element``, and its children.

    The path is None when disabled or empty, else absolute.
    """
    reader.attributes(element, required=("enable",), optional=optional_attributes)
    enabled = reader.flag(element, "enable")
    parts = reader.children(element, required=("path",), optional=optional)
    return reader.absolute_path(parts.get("path"), enabled, what), parts


# --- the document -----------------------------------------------------------------------------


def _read_config(reader: _Reader, root: Element) -> Config:
    """The whole Config; it holds placeholders only where an error was recorded."""
    reader.attributes(root)
    reader.no_text(root)
    sections = reader.children(
        root,
        required=tuple(section.tag for section in DOCUMENT if section.required),
        optional=tuple(section.tag for section in DOCUMENT if not section.required),
    )
    if "batching" not in sections:
        reader.warn(root, _WITHOUT_BATCHING)
    return Config(
        **{section.field: section.read(reader, sections.get(section.tag)) for section in DOCUMENT}
    )


@dataclass(frozen=True, slots=True)
class Section:
    """One row of ``DOCUMENT`` (at the end of this module, after the readers it names)."""

    tag: str  # the top-level element, as Dory names it
    field: str  # the field of Config that it sets
    read: Callable[[_Reader, Element | None], Any]  # None: the section is omitted
    required: bool = False


# A file without <batching> or <compression> is one Dory accepts (conf.cc reads both
# sections only when present), so it loads here with Dory's empty builders' values.
#: Dory's batching without <batching>: produceRequestDataLimit and messageMaxBytes 0, no
#: batching. Every message is then larger than messageMaxBytes: Dory discards them all.
DORY_WITHOUT_BATCHING = BatchingConfig(0, 0, False, None, None, NO_BATCHING)
#: Dory's compression without <compression>: none, for every topic.
DORY_WITHOUT_COMPRESSION = CompressionConfig(CompressionCodec("", CompressionType.NONE))
_WITHOUT_BATCHING = (
    "No <batching> section: Dory then has messageMaxBytes 0 and discards every message as too "
    "long; pydory does the same (too_long). Add <batching> to deliver messages"
)


# --- batching ---------------------------------------------------------------------------------


def _read_batching(reader: _Reader, element: Element | None) -> BatchingConfig:
    if element is None:
        return DORY_WITHOUT_BATCHING  # and a warning, from _read_config
    reader.attributes(element)
    parts = reader.children(
        element,
        required=("produceRequestDataLimit", "messageMaxBytes", "combinedTopics", "defaultTopic"),
        optional=("namedConfigs", "topicConfigs"),
    )
    named = _named_configs(
        reader, parts.get("namedConfigs"), "Batching", partial(_read_thresholds, reader)
    )
    combined_name, combined = _read_combined_topics(reader, parts.get("combinedTopics"), named)
    combined_batching = (
        NO_BATCHING
        if combined is None
        else TopicBatching(BatchingAction.COMBINED, combined, combined_name)
    )
    produce_request_data_limit = reader.unsigned(
        parts.get("produceRequestDataLimit"), 0, suffixes=SIZE_SUFFIXES, maximum=INT32_MAX
    )
    message_max_bytes = reader.unsigned(
        parts.get("messageMaxBytes"), 1, suffixes=SIZE_SUFFIXES, minimum=1, maximum=INT32_MAX
    )
    read_topic = partial(_read_topic_batching, reader, named, combined_batching)
    default_topic, topic_configs = _per_topic(reader, parts, "Batching", read_topic, NO_BATCHING)
    return BatchingConfig(
        produce_request_data_limit=produce_request_data_limit,
        message_max_bytes=message_max_bytes,
        combined_topics_enabled=combined is not None,
        combined_topics_config=combined_name,
        combined_topics=combined,
        default_topic=default_topic,
        named_configs=MappingProxyType(named),
        topic_configs=topic_configs,
    )


def _read_thresholds(reader: _Reader, element: Element, name: str) -> BatchingThresholds:
    reader.attributes(element, required=("name",))
    limits = reader.children(element, required=("time", "messages", "bytes"))

    def threshold(tag: str, suffixes: str) -> int | None:
        return reader.limit(limits.get(tag), None, "disable", suffixes=suffixes)

    thresholds = BatchingThresholds(
        time_ms=threshold("time", NO_SUFFIX),
        messages=threshold("messages", COUNT_SUFFIXES),
        bytes=threshold("bytes", SIZE_SUFFIXES),
    )
    all_disabled = all(
        tag in limits and limits[tag].attributes.get("value", "").strip().lower() == "disable"
        for tag in ("time", "messages", "bytes")
    )
    if all_disabled:
        reader.report(
            element,
            f"Named batching config [{name}] must specify at least one of "
            "{time, messages, bytes}",
        )
    return thresholds


def _read_combined_topics(
    reader: _Reader, element: Element | None, named: Mapping[str, BatchingThresholds]
) -> tuple[str | None, BatchingThresholds | None]:
    """(config name, thresholds) of combined-topics batching; (None, None) when disabled."""
    if element is None:
        return None, None
    reader.leaf(element)
    reader.attributes(element, required=("enable",), optional=("config",))
    enabled = reader.flag(element, "enable")
    configured = element.attributes.get("config", "").strip()
    if not enabled and not configured:
        return None, None
    if enabled and "config" not in element.attributes:
        reader.report(element, "Missing required attribute [config] (combinedTopics is enabled)")
        return None, None
    # A named config given while disabled must still exist: a typo is an error either way.
    thresholds = reader.reference(element, named, "Batching")
    return (configured, thresholds) if enabled else (None, None)


def _read_topic_batching(
    reader: _Reader,
    named: Mapping[str, BatchingThresholds],
    combined: TopicBatching,
    element: Element,
    extra: tuple[str, ...],
) -> TopicBatching:
    """A <defaultTopic> or <topic>: action perTopic | combinedTopics | disable."""
    reader.leaf(element)
    reader.attributes(element, required=(*extra, "action"), optional=("config",))
    action_text = element.attributes.get("action", "").strip()
    config_name = element.attributes.get("config", "").strip()
    try:
        action = BatchingAction(action_text)
    except ValueError:
        if "action" in element.attributes:
            reader.report(
                element,
                f"Bad value for attribute [action]: [{action_text}]: "
                "expected perTopic, combinedTopics or disable",
            )
        return NO_BATCHING
    if action is BatchingAction.PER_TOPIC:
        if not config_name:
            reader.report(element, "Attribute [config] must name a batching config (perTopic)")
            return NO_BATCHING
        thresholds = reader.reference(element, named, "Batching")
        return TopicBatching(action, thresholds, config_name)
    if action is BatchingAction.COMBINED:
        if config_name:
            reader.report(
                element,
                f"Attribute [config] must be missing or empty when action is combinedTopics "
                f"(got [{config_name}]): combined batching uses <combinedTopics>",
            )
        # With combined batching disabled, such topics are not batched at all.
        return combined
    return NO_BATCHING  # disable: "config" is optional and ignored, as in Dory


# --- compression ------------------------------------------------------------------------------


def _read_compression(reader: _Reader, element: Element | None) -> CompressionConfig:
    if element is None:
        return DORY_WITHOUT_COMPRESSION
    reader.attributes(element)
    parts = reader.children(
        element,
        required=("defaultTopic",),
        optional=("namedConfigs", "sizeThresholdPercent", "topicConfigs"),
    )
    named = _named_configs(
        reader, parts.get("namedConfigs"), "Compression", partial(_read_codec, reader)
    )
    no_codec = DORY_WITHOUT_COMPRESSION.default_topic
    read_topic = _config_reference(reader, named, "Compression", no_codec)
    default_topic, topic_configs = _per_topic(reader, parts, "Compression", read_topic, no_codec)
    return CompressionConfig(
        default_topic=default_topic,
        size_threshold_percent=reader.unsigned(parts.get("sizeThresholdPercent"), 100, maximum=100),
        named_configs=MappingProxyType(named),
        topic_configs=topic_configs,
    )


def _read_codec(reader: _Reader, element: Element, name: str) -> CompressionCodec:
    reader.leaf(element)
    attributes = reader.attributes(
        element, required=("name", "type"), optional=("minSize", "level")
    )
    codec_type = None
    if "type" in attributes:  # a missing one is reported by attributes()
        type_text = attributes["type"].strip()
        codec_type = reader.one_of(element, "type", type_text, CompressionType, "compression type")
    if codec_type is None:
        return CompressionCodec(name, CompressionType.NONE)
    if codec_type is CompressionType.NONE:
        # Dory: "minSize is ignored (and optional) if type is none".
        min_size = 0
    elif "minSize" not in attributes:
        reader.report(element, f"Missing required attribute [minSize] (type {codec_type})")
        min_size = 0
    else:
        parse = partial(parse_unsigned, suffixes=SIZE_SUFFIXES)
        min_size = reader.convert(element, "minSize", attributes["minSize"], parse) or 0
    return CompressionCodec(name, codec_type, min_size, _read_level(reader, element, codec_type))


def _read_level(reader: _Reader, element: Element, codec_type: CompressionType) -> int | None:
    """The codec level; None (the codec's default) when omitted or -1.

    Dory reads any integer, ignores it for none and snappy, and compresses gzip at zlib's
    default level when it is outside 0..9: so do we, with a warning. lz4 and zstd are
    pydory's, and their range is enforced.
    """
    text = element.attributes.get("level")
    if text is None:
        return None
    # Dory reads a C int: anything else is an error there too.
    level = reader.convert(
        element, "level", text, partial(parse_signed, minimum=-INT32_MAX - 1, maximum=INT32_MAX)
    )
    if level is None:
        return None  # not an integer: reported (Dory refuses it too)
    if codec_type not in COMPRESSION_LEVELS:
        reader.warn(element, f"Attribute [level] ignored for compression type {codec_type}")
        return None
    if (
        codec_type is CompressionType.GZIP
        and level != -1
        and not (GZIP_LEVELS[0] <= level <= GZIP_LEVELS[1])
    ):
        reader.warn(
            element,
            f"gzip level [{level}] is outside zlib's {GZIP_LEVELS[0]}..{GZIP_LEVELS[1]}: "
            "the default level is used, as Dory does",
        )
        return None
    low, high = COMPRESSION_LEVELS[codec_type]
    level = reader.convert(element, "level", text, partial(parse_signed, minimum=low, maximum=high))
    return None if level == -1 else level


# --- topic rate limiting ----------------------------------------------------------------------


def _read_rate_limiting(reader: _Reader, element: Element | None) -> RateLimitingConfig:
    if element is None:
        return RateLimitingConfig()  # Dory: no <topicRateLimiting>, no limit on any topic
    reader.attributes(element)
    parts = reader.children(
        element, required=("namedConfigs", "defaultTopic"), optional=("topicConfigs",)
    )
    named = _named_configs(
        reader, parts.get("namedConfigs"), "Topic rate limiting", partial(_read_rate_limit, reader)
    )
    read_topic = _config_reference(reader, named, "Topic rate limiting", UNLIMITED_RATE)
    default_topic, topic_configs = _per_topic(
        reader, parts, "Topic rate limiting", read_topic, UNLIMITED_RATE
    )
    return RateLimitingConfig(
        default_topic=default_topic,
        named_configs=MappingProxyType(named),
        topic_configs=topic_configs,
    )


def _read_rate_limit(reader: _Reader, element: Element, name: str) -> RateLimit:
    reader.leaf(element)
    attributes = reader.attributes(element, required=("name", "maxCount"), optional=("interval",))
    max_count = reader.unsigned_or(element, "maxCount", "unlimited", suffixes=COUNT_SUFFIXES)
    unlimited = attributes.get("maxCount", "").strip().lower() == "unlimited"
    interval_text = attributes.get("interval")
    if interval_text is None:
        if not unlimited and "maxCount" in attributes:
            reader.report(element, "Missing required attribute [interval] (maxCount is bounded)")
        return RateLimit(name, 1, max_count)
    parse = partial(parse_unsigned, minimum=1, maximum=INT32_MAX)
    interval = reader.convert(element, "interval", interval_text, parse)
    return RateLimit(name, interval or 1, max_count)


# --- inputs -----------------------------------------------------------------------------------


def _read_input_sources(reader: _Reader, element: Element | None) -> InputSourcesConfig:
    if element is None:
        return InputSourcesConfig()
    reader.attributes(element)
    errors_before = reader.error_count
    parts = reader.children(element, optional=("unixDatagram", "unixStream", "tcp"))
    inputs = InputSourcesConfig(
        unix_datagram=_read_unix_socket(reader, parts.get("unixDatagram"), "UNIX datagram socket"),
        unix_stream=_read_unix_socket(reader, parts.get("unixStream"), "UNIX stream socket"),
        tcp=_read_tcp(reader, parts.get("tcp")),
    )
    enabled = (inputs.unix_datagram.enabled, inputs.unix_stream.enabled, inputs.tcp.enabled)
    # Dory refuses a section that enables nothing (an input in error is reported already).
    if not any(enabled) and reader.error_count == errors_before:
        reader.report(
            element,
            "Input sources config must enable at least one of {unixDatagram, unixStream, tcp}",
        )
    return inputs


def _read_file_section(
    reader: _Reader, element: Element, what: str, default_mode: int | None
) -> tuple[str | None, int | None]:
    """An element like <unixDatagram enable="..."> with <path> and <mode> children."""
    path, parts = _read_enabled_path(reader, element, what, optional=("mode",))
    return path, reader.mode(parts.get("mode"), default_mode)


def _read_unix_socket(reader: _Reader, element: Element | None, what: str) -> UnixSocketInput:
    if element is None:
        return UnixSocketInput()
    path, mode = _read_file_section(reader, element, what, DEFAULT_SOCKET_MODE)
    return UnixSocketInput(path, mode)


def _read_tcp(reader: _Reader, element: Element | None) -> TcpInput:
    if element is None:
        return TcpInput()
    reader.attributes(element, required=("enable",))
    enabled = reader.flag(element, "enable")
    port_element = reader.children(element, required=("port",)).get("port")
    if port_element is None:
        return TcpInput()
    text = reader.value(port_element)
    if not text.strip():
        return TcpInput()  # an empty port turns TCP input off
    parse = partial(parse_unsigned, maximum=PORT_MAX)
    port = reader.convert(port_element, "value", text, parse)
    return TcpInput(port if enabled else None)


MSG_SIZE = unsigned(suffixes=SIZE_SUFFIXES, minimum=1, maximum=INT32_MAX)  # Kafka's size limit

INPUT_CONFIG = (
    Leaf("maxBuffer", "max_buffer", POSITIVE_SIZE),
    Leaf("maxDatagramMsgSize", "max_datagram_msg_size", MSG_SIZE),
    Leaf("allowLargeUnixDatagrams", "allow_large_unix_datagrams", boolean()),
    Leaf("maxStreamMsgSize", "max_stream_msg_size", MSG_SIZE),
)


def _read_input_config(reader: _Reader, element: Element | None) -> InputConfig:
    return _read_leaf_section(reader, element, InputConfig, INPUT_CONFIG)


# --- delivery, HTTP, discard log, Kafka, debugging, logging -----------------------------------


MSG_DELIVERY = (
    Leaf("topicAutocreate", "topic_autocreate", boolean("enable")),
    Leaf("maxFailedDeliveryAttempts", "max_failed_delivery_attempts", INT32),
    Leaf("shutdownMaxDelay", "shutdown_max_delay_ms", MILLIS),
    Leaf("dispatcherRestartMaxDelay", "dispatcher_restart_max_delay_ms", MILLIS),
    Leaf("metadataRefreshInterval", "metadata_refresh_interval_min", MINUTES_AS_MILLIS),
    Leaf("compareMetadataOnRefresh", "compare_metadata_on_refresh", boolean()),
    Leaf("kafkaSocketTimeout", "kafka_socket_timeout_s", SECONDS_AS_MILLIS),
    Leaf("pauseRateLimitInitial", "pause_rate_limit_initial_ms", MILLIS),
    Leaf("pauseRateLimitMaxDouble", "pause_rate_limit_max_double", unsigned(maximum=31)),
    Leaf("minPauseDelay", "min_pause_delay_ms", MILLIS),
)


def _read_msg_delivery(reader: _Reader, element: Element | None) -> MsgDeliveryConfig:
    return _read_leaf_section(reader, element, MsgDeliveryConfig, MSG_DELIVERY)


PREFIX_SIZE = unsigned(suffixes=COUNT_SUFFIXES, maximum=INT32_MAX)  # bytes, given like a count
#: The records of a million names would take hundreds of MB: the limit exists to bound them.
MAX_UNKNOWN_TOPICS = 1_000_000

HTTP_INTERFACE = (
    # Dory: "HTTP interface port must be > 0".
    Leaf("port", "port", unsigned(minimum=1, maximum=PORT_MAX)),
    Leaf("loopbackOnly", "loopback_only", boolean()),
    Leaf("discardReportInterval", "discard_report_interval_s", POSITIVE_INT32),
    Leaf("badMsgPrefixSize", "bad_msg_prefix_size", PREFIX_SIZE),
    Leaf("maxUnknownTopics", "max_unknown_topics", unsigned(maximum=MAX_UNKNOWN_TOPICS)),
)


def _read_http_interface(reader: _Reader, element: Element | None) -> HttpInterfaceConfig:
    return _read_leaf_section(reader, element, HttpInterfaceConfig, HTTP_INTERFACE)


DISCARD_LOGGING = (
    Leaf("maxFileSize", "max_file_size", POSITIVE_SIZE),
    Leaf("maxArchiveSize", "max_archive_size", SIZE),
    Leaf("maxMsgPrefixSize", "max_msg_prefix_size", limit("unlimited", suffixes=COUNT_SUFFIXES)),
)


def _read_discard_logging(reader: _Reader, element: Element | None) -> DiscardLoggingConfig:
    return _read_path_section(
        reader, element, DiscardLoggingConfig, "Discard logging", DISCARD_LOGGING
    )


KAFKA_CONFIG = (
    Leaf("clientId", "client_id", TEXT),
    Leaf("replicationTimeout", "replication_timeout_ms", POSITIVE_INT32),
)


def _read_kafka_config(reader: _Reader, element: Element | None) -> KafkaConfig:
    return _read_leaf_section(reader, element, KafkaConfig, KAFKA_CONFIG)


MSG_DEBUG = (
    Leaf("timeLimit", "time_limit_s", unsigned()),
    Leaf("byteLimit", "byte_limit", SIZE),
)


def _read_msg_debug(reader: _Reader, element: Element | None) -> MsgDebugConfig:
    return _read_path_section(
        reader,
        element,
        MsgDebugConfig,
        "Message debug",
        MSG_DEBUG,
        flags={"extraFields": "extra_fields"},  # pydory's: partition and now on each line
    )


LOGGING_LEAVES = (
    Leaf("level", "level", keyword(LogLevel, "log level", case=str.upper)),
    Leaf("stdoutStderr", "stdout_stderr", boolean("enable")),
    Leaf("syslog", "syslog", boolean("enable")),
    Leaf("logDiscards", "log_discards", boolean("enable")),
)


def _read_logging(reader: _Reader, element: Element | None) -> LoggingConfig:
    default = LoggingConfig()
    if element is None:
        return default
    reader.attributes(element)
    # <file> is not in LOGGING_LEAVES: it is a section of its own that sets two fields.
    parts = reader.children(
        element, optional=("level", "stdoutStderr", "syslog", "file", "logDiscards")
    )
    file_path, file_mode = default.file_path, default.file_mode
    if "file" in parts:
        file_path, file_mode = _read_file_section(reader, parts["file"], "Logfile", None)
    return LoggingConfig(
        file_path=file_path,
        file_mode=file_mode,
        **_leaf_values(reader, parts, default, LOGGING_LEAVES),
    )


# --- the durable spool (pydory extension) -----------------------------------------------------

SPOOL_SIZE_SYNTAX = (
    "a positive integer, optionally with suffix k (x1024), m (x1048576) or g (x1073741824)"
)
_SPOOL_SIZE = re.compile(r"([0-9]+)\s*([kmgKMG]?)", re.ASCII)
_SPOOL_MULTIPLIERS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def parse_spool_size(text: str) -> int:
    """A spool size: ``"512m"``, ``"1g"``, ``"4096"``. Dory's sizes stop at ``m``; a
    spool is sized in gigabytes, so this element also takes ``g`` (x1024³)."""
    value = text.strip()
    if not value:
        raise ConfigError(f"Value is empty: expected {SPOOL_SIZE_SYNTAX}")
    match = _SPOOL_SIZE.fullmatch(value)
    if match is None:
        raise ConfigError(f"Invalid size [{value}]: expected {SPOOL_SIZE_SYNTAX}")
    digits, suffix = match.groups()
    if len(digits.lstrip("0")) > 19:  # keeps int() cheap; far beyond the maximum anyway
        raise ConfigError(f"Value [{value}] is out of range: must be at most {MAX_UNSIGNED}")
    size = int(digits) * _SPOOL_MULTIPLIERS[suffix.lower()]
    if size < 1:
        raise ConfigError(f"Value [{value}] is out of range: must be at least 1")
    if size > MAX_UNSIGNED:
        raise ConfigError(f"Value [{value}] is out of range: must be at most {MAX_UNSIGNED}")
    return size


def parse_fsync(text: str) -> int | None:
    """The fsync policy: ``none`` (None: never), ``always`` (0: after every write), or an
    interval in milliseconds (``0`` is the same as ``always``)."""
    value = text.strip()
    keyword = value.lower()
    if keyword == "none":
        return None
    if keyword == "always":
        return 0
    if not _DIGITS.fullmatch(value):
        raise ConfigError(
            f"Invalid fsync policy [{value}]: expected none, always, or an interval in "
            "milliseconds (a nonnegative integer, e.g. 1000)"
        )
    return parse_unsigned(value, maximum=INT32_MAX)


def _read_spool_size(reader: _Reader, element: Element | None, default: int) -> int:
    if element is None:
        return default
    size = reader.convert(element, "value", reader.value(element), parse_spool_size)
    return default if size is None else size


def _read_fsync(reader: _Reader, element: Element | None, default: int | None) -> int | None:
    if element is None:
        return default
    text = reader.value(element)
    try:
        return parse_fsync(text)
    except ConfigError as exc:
        reader.report(element, f"Bad value for attribute [value]: {exc.reason}")
        return default


SPOOL = (
    Leaf("maxSize", "max_bytes", _read_spool_size),
    Leaf("segmentSize", "segment_bytes", _read_spool_size),
    Leaf("fsync", "fsync_interval_ms", _read_fsync),
    Leaf("overloadPolicy", "overload_policy", keyword(OverloadPolicy, "overload policy")),
)


def _read_spool(reader: _Reader, element: Element | None) -> SpoolConfig:
    """<spool enable="..."> with a <path> (a directory) and the leaves of ``SPOOL``.

    Like the other path sections it is off when omitted, disabled or given an empty path,
    and its values are validated even then.
    """
    default = SpoolConfig()
    if element is None:
        return default
    path, parts = _read_enabled_path(reader, element, "Spool", tuple(leaf.tag for leaf in SPOOL))
    errors_before = reader.error_count
    spool = SpoolConfig(path=path, **_leaf_values(reader, parts, default, SPOOL))
    # Compared only when the values were read (a bad size is reported already).
    if reader.error_count == errors_before and spool.segment_bytes > spool.max_bytes:
        where = parts.get("segmentSize") or parts.get("maxSize") or element
        reader.report(
            where,
            f"Spool segmentSize [{spool.segment_bytes}] must not exceed maxSize "
            f"[{spool.max_bytes}]: a segment must fit in the spool",
        )
    return spool


# --- quotas on the stream listeners (pydory extension) ----------------------------------------

#: The rate window's bounds (ms): at least ten samples of 10 ms, at most a minute.
QUOTA_WINDOW_MIN_MS = 100
QUOTA_WINDOW_MAX_MS = 60_000
_CLIENT_RATE_ATTRIBUTES = ("bytesPerSec", "msgsPerSec", "window")


HOST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}", re.ASCII)


def _read_host_id(reader: _Reader, element: Element | None, default: str | None) -> str | None:
    """<hostId value="..."/>: 1-64 of letters, digits, ``.``, ``_``, ``-``."""
    if element is None:
        return default
    value = reader.value(element).strip()
    if not HOST_ID.fullmatch(value):
        reader.report(
            element,
            f"Bad value for attribute [value]: invalid host id [{value}]: expected 1 to 64 "
            "letters, digits, '.', '_' or '-'",
        )
        return default
    return value


def _read_books_topic(reader: _Reader, element: Element | None, default: str | None) -> str | None:
    """<booksTopic value="..."/>: a legal Kafka topic name, or empty (books not published)."""
    if element is None:
        return default
    value = reader.value(element).strip()
    if not value:
        return None
    problem = topic_name_problem(value)
    if problem is not None:
        reader.report(element, f"Bad value for attribute [value]: books topic: {problem}")
        return default
    return value


MESSAGE_IDENTITY = (
    Leaf("hostId", "host_id", _read_host_id),
    Leaf("headers", "headers", boolean("enable")),
    Leaf("booksTopic", "books_topic", _read_books_topic),
)


def _read_message_identity(reader: _Reader, element: Element | None) -> MessageIdentityConfig:
    return _read_leaf_section(reader, element, MessageIdentityConfig, MESSAGE_IDENTITY)


def _read_quotas(reader: _Reader, element: Element | None) -> QuotasConfig:
    """<quotas> with a <unixStream>, a <tcp> and a <unixDatagram> element, each optional
    (= no quota)."""
    if element is None:
        return QuotasConfig()
    reader.attributes(element)
    parts = reader.children(element, optional=("unixStream", "tcp", "unixDatagram"))
    return QuotasConfig(
        unix_stream=_read_listener_quotas(reader, parts.get("unixStream")),
        tcp=_read_listener_quotas(reader, parts.get("tcp")),
        unix_datagram=_read_datagram_quota(reader, parts.get("unixDatagram")),
    )


def _read_datagram_quota(reader: _Reader, element: Element | None) -> ClientRate:
    """<unixDatagram> holds a <clientRate/> only: a datagram socket has no connections."""
    if element is None:
        return ClientRate()
    reader.attributes(element)
    parts = reader.children(element, optional=("clientRate",))
    rate_element = parts.get("clientRate")
    return ClientRate() if rate_element is None else _read_client_rate(reader, rate_element)


def _read_listener_quotas(reader: _Reader, element: Element | None) -> ListenerQuotas:
    """A listener's <maxConnections value="N|unlimited"/> and <clientRate .../>."""
    if element is None:
        return ListenerQuotas()
    reader.attributes(element)
    parts = reader.children(element, optional=("maxConnections", "clientRate"))
    max_connections = None
    limit_element = parts.get("maxConnections")
    if limit_element is not None:
        reader.leaf(limit_element)
        reader.attributes(limit_element, required=("value",))
        max_connections = reader.unsigned_or(
            limit_element,
            "value",
            "unlimited",
            suffixes=COUNT_SUFFIXES,
            minimum=1,
            maximum=INT32_MAX,
        )
    rate_element = parts.get("clientRate")
    rate = ClientRate() if rate_element is None else _read_client_rate(reader, rate_element)
    return ListenerQuotas(max_connections, rate)


def _read_client_rate(reader: _Reader, element: Element) -> ClientRate:
    """<clientRate bytesPerSec="size|unlimited" msgsPerSec="count|unlimited" window="ms"/>:
    at least one of the two rates must be given."""
    reader.leaf(element)
    attributes = reader.attributes(element, optional=_CLIENT_RATE_ATTRIBUTES)
    if "bytesPerSec" not in attributes and "msgsPerSec" not in attributes:
        reader.report(
            element, "Missing attribute: give bytesPerSec or msgsPerSec (or both) in clientRate"
        )
    bytes_per_sec = reader.unsigned_or(
        element, "bytesPerSec", "unlimited", suffixes=SIZE_SUFFIXES, minimum=1, maximum=INT32_MAX
    )
    msgs_per_sec = reader.unsigned_or(
        element, "msgsPerSec", "unlimited", suffixes=COUNT_SUFFIXES, minimum=1, maximum=INT32_MAX
    )
    window_ms = ClientRate().window_ms
    if "window" in attributes:
        parse = partial(parse_unsigned, minimum=QUOTA_WINDOW_MIN_MS, maximum=QUOTA_WINDOW_MAX_MS)
        window_ms = reader.convert(element, "window", attributes["window"], parse) or window_ms
    return ClientRate(bytes_per_sec, msgs_per_sec, window_ms)


# --- brokers and librdkafka -------------------------------------------------------------------


def _read_initial_brokers(reader: _Reader, element: Element | None) -> tuple[Broker, ...]:
    if element is None:
        return ()  # reported as a missing required element
    brokers = []
    for broker_element in reader.items(element, "broker"):
        reader.leaf(broker_element)
        attributes = reader.attributes(broker_element, required=("host",), optional=("port",))
        host = reader.name(broker_element, "host")
        port = 9092
        if "port" in attributes:
            parse = partial(parse_unsigned, minimum=1, maximum=PORT_MAX)
            port = reader.convert(broker_element, "port", attributes["port"], parse) or port
        brokers.append(Broker(host, port))
    if not brokers:
        reader.report(element, "Initial brokers missing: give at least one <broker host=...>")
    return tuple(brokers)


def _read_librdkafka(reader: _Reader, element: Element | None) -> Mapping[str, str]:
    """pydory's extension: extra librdkafka properties for every producer."""
    properties: dict[str, str] = {}
    if element is None:
        return MappingProxyType(properties)
    for item in reader.items(element, "property"):
        reader.leaf(item)
        attributes = reader.attributes(item, required=("name", "value"))
        name = reader.name(item)
        if not name or "value" not in attributes:
            continue
        problem = librdkafka_property_problem(name)
        if problem:
            reader.report(item, problem)
        elif name in properties:
            reader.report(item, f"Duplicate librdkafka property [{name}]")
        else:
            properties[name] = attributes["value"]
    return MappingProxyType(properties)


# --- the document's sections ------------------------------------------------------------------

#: Every top-level section: required ones first, then as Dory's docs list them (an unknown
#: element's error lists them in this order); they are read in this order too.
DOCUMENT = (
    Section("batching", "batching", _read_batching),
    Section("compression", "compression", _read_compression),
    Section("initialBrokers", "initial_brokers", _read_initial_brokers, required=True),
    Section("topicRateLimiting", "rate_limiting", _read_rate_limiting),
    Section("inputSources", "inputs", _read_input_sources),
    Section("inputConfig", "input_config", _read_input_config),
    Section("msgDelivery", "delivery", _read_msg_delivery),
    Section("httpInterface", "http", _read_http_interface),
    Section("discardLogging", "discard_logging", _read_discard_logging),
    Section("kafkaConfig", "kafka", _read_kafka_config),
    Section("msgDebug", "msg_debug", _read_msg_debug),
    Section("logging", "logging", _read_logging),
    Section("librdkafka", "librdkafka", _read_librdkafka),
    Section("spool", "spool", _read_spool),
    Section("quotas", "quotas", _read_quotas),
    Section("messageIdentity", "message_identity", _read_message_identity),
)
