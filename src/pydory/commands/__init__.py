"""Subcommands of the `pydory` CLI, in the order `pydory --help` lists them."""

from __future__ import annotations

from types import ModuleType

COMMAND_MODULES: list[ModuleType] = []
