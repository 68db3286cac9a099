"""The `pydory` subcommands of the tools' distribution: `demo` and `bench`.

``pydory.commands.COMMANDS`` names them (with their help lines) by these modules' names;
``pydory.cli`` imports one only when it is run, and says what to install when this package
is not here. Each module's ``register(subparsers)`` is as in ``pydory.commands``.
"""
