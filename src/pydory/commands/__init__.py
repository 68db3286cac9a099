"""Subcommands of the `pydory` CLI, in the order `pydory --help` lists them."""

from __future__ import annotations

from types import ModuleType

from pydory.commands import bench as bench_command
from pydory.commands import config as config_command
from pydory.commands import demo, send, serve
from pydory.commands import pipeline as pipeline_command
from pydory.commands import reload as reload_command
from pydory.commands import status as status_command
from pydory.commands import wait as wait_command

COMMAND_MODULES: list[ModuleType] = []
COMMAND_MODULES.append(serve)
COMMAND_MODULES.append(send)
COMMAND_MODULES.append(wait_command)
COMMAND_MODULES.append(status_command)
COMMAND_MODULES.append(reload_command)
COMMAND_MODULES.append(config_command)
COMMAND_MODULES.append(demo)
COMMAND_MODULES.append(pipeline_command)
COMMAND_MODULES.append(bench_command)
