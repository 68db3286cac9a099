"""Dory's XML config file as typed, immutable, validated settings.

``load_config(path)`` reads and validates a file and returns a ``Config``, or raises
``ConfigError`` / ``ConfigErrors`` naming every problem (element path, line, column).
The settings' classes are those of ``pydory.config.model`` (its ``__all__``).

- ``model``: the frozen dataclasses of the settings;
- ``loader``: validation, element by element (``load_config``, ``parse_config``);
- ``xmltree``: the file read safely, with line and column, within its size limits;
- ``values``: the value parsers;
- ``librdkafka``: the librdkafka properties pydory owns and those it defaults.
"""

from __future__ import annotations

from pydory.config import model
from pydory.config.librdkafka import OWNED_LIBRDKAFKA_PROPERTIES
from pydory.config.loader import load_config, parse_config
from pydory.config.model import *  # noqa: F403 - the settings' classes, as model.__all__ names them
from pydory.errors import ConfigError, ConfigErrors

__all__ = [
    "OWNED_LIBRDKAFKA_PROPERTIES",
    "ConfigError",
    "ConfigErrors",
    "load_config",
    "parse_config",
]
__all__ += model.__all__
