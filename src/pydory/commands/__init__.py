"""Subcommands of the `pydory` CLI, in the order `pydory --help` lists them."""

from __future__ import annotations

from types import ModuleType

from pydory.commands import config as config_command
from pydory.commands import demo, send, serve

COMMAND_MODULES: list[ModuleType] = []
COMMAND_MODULES.append(serve)
COMMAND_MODULES.append(send)
COMMAND_MODULES.append(config_command)
COMMAND_MODULES.append(demo)
