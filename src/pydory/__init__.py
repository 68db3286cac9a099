"""pydory: a per-host producer daemon for Apache Kafka, compatible with Dory."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pydory")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
