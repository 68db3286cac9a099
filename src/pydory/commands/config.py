"""`pydory config check PATH`: validate a config file and show the effective settings.

Exit status 0 and the settings (every section, defaults filled in, under the XML's own
element names in the file's order: ``pydory.commands.config_listing``) on stdout; or
exit status 1 and every error on stderr, in Dory's format ``Error in config file: (line
L, column C) /element/path: reason``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydory.commands import Subparsers, add_command_group, add_subcommand
from pydory.config import Config, load_config
from pydory.errors import ConfigError, ConfigErrors


def register(subparsers: Subparsers) -> None:
    """Add `pydory config` and its `check` subcommand."""
    commands = add_command_group(
        subparsers, "config", "Work with pydory's (Dory's) XML config file."
    )
    check = add_subcommand(
        commands,
        "check",
        help="validate a config file and print the effective settings",
        description="Validate PATH. Print the effective settings and exit 0, "
        "or print every error to stderr and exit 1.",
        handler=run_check,
    )
    check.add_argument("path", metavar="PATH", help="the XML config file")
    check.add_argument("--json", action="store_true", help="print the settings as JSON")


def run_check(args: argparse.Namespace) -> int:
    """Handler of `pydory config check`."""
    try:
        config = load_config(args.path)
    except ConfigError as exc:
        errors = exc.errors if isinstance(exc, ConfigErrors) else [exc]
        print(exc, file=sys.stderr)
        count = f"{len(errors)} error{'s' if len(errors) != 1 else ''}"
        print(f"pydory config check: {args.path} is invalid ({count})", file=sys.stderr)
        if args.json:
            print(
                json.dumps({"valid": False, "errors": [_error_dict(e) for e in errors]}, indent=2)
            )
        return 1
    for warning in config.warnings:  # valid, but something is ignored: say what
        print(warning, file=sys.stderr)
    if args.json:
        print(json.dumps({"valid": True, "config": config_as_dict(config)}, indent=2))
    else:
        from pydory.commands.config_listing import file_sections, listing

        print(f"# {args.path}: valid. Effective settings (defaults filled in), by element:")
        print(listing(config, file_sections(Path(args.path).read_bytes())))
    return 0


def _error_dict(error: ConfigError) -> dict[str, Any]:
    return {"reason": error.reason, "path": error.path, "line": error.line, "column": error.column}


def config_as_dict(config: Config) -> dict[str, Any]:
    """The settings as JSON-ready data: sections as objects, modes as octal strings."""
    result: dict[str, Any] = _to_data(config)
    result["bootstrap_servers"] = config.bootstrap_servers
    return result


def _to_data(value: Any, field_name: str = "") -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _to_data(getattr(value, field.name), field.name)
            for field in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        return {str(key): _to_data(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_to_data(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.value
    if field_name.endswith("mode") and isinstance(value, int):
        return f"0{value:03o}"
    return value
