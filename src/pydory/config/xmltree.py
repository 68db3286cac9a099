"""Safe XML parsing into a small element tree that remembers where each element is.

The config file is parsed with defusedxml's expat SAX reader: entity declarations
("billion laughs", external entities) and external references (a DTD on disk or on
the network) are refused before anything is expanded or read. Each element records
its line and column (1-based, the position of its ``<``) and an XPath-like path such
as ``/doryConfig/batching/namedConfigs/config[@name=low_latency]/time`` for errors.

A config file is small and shallow, so anything far beyond that is refused while it is
being read, with one message naming the limit, before it can cost time or memory: more
than :data:`MAX_CONFIG_BYTES` bytes, elements nested deeper than :data:`MAX_DEPTH`, or
more than :data:`MAX_ELEMENTS` elements (docs/config.md, "Limits").
"""

from __future__ import annotations

import io
import xml.sax
import xml.sax.handler
import xml.sax.xmlreader
from collections import Counter
from dataclasses import dataclass, field

from defusedxml import DefusedXmlException, EntitiesForbidden, ExternalReferenceForbidden
from defusedxml.expatreader import DefusedExpatParser

from pydory.errors import ConfigError

#: The largest config file read, in bytes. Dory's sample config is 10 KB; a file with a
#: thousand topic overrides is a few hundred KB.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: The deepest element nesting accepted; Dory's deepest element is 5 levels down.
MAX_DEPTH = 32
#: The most elements accepted in one file: room for thousands of per-topic settings.
MAX_ELEMENTS = 20_000


class _LimitExceeded(Exception):
    """Raised from inside the SAX handler to stop the parse at once; carries the error."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(slots=True)
class Element:
    """One XML element: its tag, attributes, children and where it is in the file."""

    tag: str
    attributes: dict[str, str]
    line: int
    column: int
    children: list[Element] = field(default_factory=list)
    text: str = ""
    path: str = ""

    def error(self, reason: str) -> ConfigError:
        """A ConfigError located at this element."""
        return ConfigError(reason, self.path, self.line, self.column)


class _TreeBuilder(xml.sax.handler.ContentHandler):
    """Collects SAX events into Elements, stamping each with the locator's position."""

    def __init__(self) -> None:
        super().__init__()
        self.locator: xml.sax.xmlreader.Locator | None = None
        self.root: Element | None = None
        self._open: list[Element] = []
        self.element_count = 0

    def setDocumentLocator(self, locator: xml.sax.xmlreader.Locator) -> None:
        self.locator = locator

    def position(self) -> tuple[int | None, int | None]:
        """The parser's current (line, 1-based column), when known."""
        if self.locator is None:
            return None, None
        column = self.locator.getColumnNumber()
        return self.locator.getLineNumber(), None if column is None else column + 1

    def startElement(self, name: str, attrs: xml.sax.xmlreader.AttributesImpl) -> None:
        line, column = self.position()
        self.element_count += 1
        # Checked before the element is built: the parse stops at the first one too many.
        if self.element_count > MAX_ELEMENTS:
            raise _LimitExceeded(
                ConfigError(
                    f"Config file has more than {MAX_ELEMENTS} elements: refused "
                    f"(the limit is {MAX_ELEMENTS})",
                    line=line,
                    column=column,
                )
            )
        if len(self._open) >= MAX_DEPTH:
            raise _LimitExceeded(
                ConfigError(
                    f"Element [{name}] is nested more than {MAX_DEPTH} deep: refused "
                    f"(the limit is {MAX_DEPTH} levels)",
                    line=line,
                    column=column,
                )
            )
        element = Element(name, dict(attrs.items()), line or 0, column or 0)
        if self._open:
            self._open[-1].children.append(element)
        else:
            self.root = element
        self._open.append(element)

    def endElement(self, name: str) -> None:
        self._open.pop()

    def characters(self, content: str) -> None:
        if self._open:
            self._open[-1].text += content


def parse_xml(text: bytes | str) -> Element:
    """Parse a whole document into its root Element, or raise ConfigError.

    Raises ConfigError for XML that is not well-formed (an empty document included), any
    entity declaration or external reference (refused, never expanded or fetched), and a
    document beyond :data:`MAX_CONFIG_BYTES`, :data:`MAX_DEPTH` or :data:`MAX_ELEMENTS`.
    """
    check_config_size(len(text))
    builder = _TreeBuilder()
    parser = DefusedExpatParser(forbid_dtd=False, forbid_entities=True, forbid_external=True)
    parser.setContentHandler(builder)
    source = xml.sax.xmlreader.InputSource()
    if isinstance(text, str):
        source.setCharacterStream(io.StringIO(text))
    else:
        source.setByteStream(io.BytesIO(text))
    try:
        parser.parse(source)
    except _LimitExceeded as exc:
        raise exc.error from None
    except xml.sax.SAXParseException as exc:
        column = exc.getColumnNumber()
        raise ConfigError(
            f"Config file is not well-formed XML: {exc.getMessage()}",
            line=exc.getLineNumber(),
            column=None if column is None else column + 1,
        ) from None
    except DefusedXmlException as exc:
        line, column = builder.position()
        raise ConfigError(_unsafe_xml_refusal(exc), line=line, column=column) from None
    if builder.root is None:  # expat reports "no element found" first; kept as a guard
        raise ConfigError("Config file has no root element")
    _assign_paths(builder.root, f"/{builder.root.tag}")
    return builder.root


def _unsafe_xml_refusal(exc: DefusedXmlException) -> str:
    """Why defusedxml refused the document, for the person who wrote it."""
    if isinstance(exc, EntitiesForbidden):
        return f"Entity declarations are not allowed in a config file (entity [{exc.name}])"
    if isinstance(exc, ExternalReferenceForbidden):
        return f"External references are not allowed in a config file ([{exc.sysid}])"
    return f"Refused unsafe XML: {exc}"


def check_config_size(size: int, source: str = "") -> None:
    """Raise ConfigError if a config document of ``size`` bytes is over the limit."""
    if size > MAX_CONFIG_BYTES:
        named = f" [{source}]" if source else ""
        raise ConfigError(
            f"Config file{named} is larger than {MAX_CONFIG_BYTES} bytes: refused "
            f"(the limit is {MAX_CONFIG_BYTES // (1024 * 1024)} MiB)"
        )


def _assign_paths(element: Element, path: str) -> None:
    """Give every element a path; name repeated siblings by @name, else by position."""
    element.path = path
    counts = Counter(child.tag for child in element.children)
    seen: Counter[str] = Counter()
    for child in element.children:
        seen[child.tag] += 1
        segment = child.tag
        if "name" in child.attributes:
            segment += f"[@name={child.attributes['name'].strip()}]"
        elif counts[child.tag] > 1:
            segment += f"[{seen[child.tag]}]"
        _assign_paths(child, f"{path}/{segment}")
