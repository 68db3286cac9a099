"""What every broker launcher shares: ``with`` stops what the constructor started."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class StopsOnExit(ABC):
    """A service started by its constructor; leaving a ``with`` block stops it, even on error."""

    @abstractmethod
    def stop(self) -> None:
        """End everything the service started. Stopping twice is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
