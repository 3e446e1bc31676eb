"""Graceful stop on SIGTERM / SIGINT: the handler only sets a flag; the loop checkpoints and exits."""

from __future__ import annotations

import signal
from types import FrameType


class StopSignal:
    """Install handlers for SIGTERM and SIGINT that record the request instead of killing the run.

    Use as a context manager; the previous handlers are restored on exit. A second SIGINT while a
    stop is pending raises ``KeyboardInterrupt`` (the usual way out of a hung run).
    """

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave default handling
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
