"""pydory: a per-host producer daemon for Apache Kafka, compatible with Dory."""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # ``__version__`` is read from the installed metadata on first use only:
    # importlib.metadata costs tens of milliseconds, more than all of `pydory send`.
    if name != "__version__":
        raise AttributeError(f"module 'pydory' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("pydory")
    except PackageNotFoundError:  # running from a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
