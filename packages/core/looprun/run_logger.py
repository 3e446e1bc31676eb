"""Run logging: scalars/images to the run's tracker (TensorBoard, W&B or none) and a rank-0 progress bar with
images/s and ETA."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm


class RunLogger:
    """Logs on the main rank only; every method is a no-op elsewhere.

    Args:
        run_dir: TensorBoard events go to ``run_dir / "tb"``.
        total_steps: for the progress bar's ETA.
        start_step: first step of this (possibly resumed) run.
        enabled: whether this process logs (the main rank).
        progress: show the progress bar (off in tests and non-interactive runs if desired).
        tracker: ``tensorboard`` (events in ``run_dir/tb``), ``wandb`` or ``none`` (:mod:`looprun.trackers`).
        config: the run's settings (W&B records them).
    """

    def __init__(
        self, run_dir: str | Path, total_steps: int, start_step: int = 0, enabled: bool = True, progress: bool = True,
        tracker: str = "tensorboard", config: dict | None = None,
    ) -> None:
        self.enabled = enabled
        self.writer = None
        self.bar = None
        self._last_time = time.perf_counter()
        self._images = 0
        if not enabled:
            return
        from .trackers import make_tracker

        self.writer = make_tracker(tracker, run_dir, config, resumed=start_step > 0)
        if progress:
            self.bar = tqdm(total=total_steps, initial=start_step, dynamic_ncols=True, desc="train", unit="step")

    def step(self, images: int) -> None:
        """Advance the bar by one step that processed ``images`` images (all ranks together)."""
        if not self.enabled:
            return
        self._images += images
        if self.bar is not None:
            self.bar.update(1)

    def scalars(self, step: int, values: dict[str, float], prefix: str = "train", throughput: bool = True) -> None:
        """Log ``values`` under ``prefix/``; with ``throughput`` also the images/s since the last call."""
        if not self.enabled:
            return
        for key, value in values.items():
            self.writer.scalar(f"{prefix}/{key}", value, step)
        if not throughput:
            return
        now = time.perf_counter()
        rate = self._images / max(now - self._last_time, 1e-9)
        self._last_time, self._images = now, 0
        self.writer.scalar(f"{prefix}/images_per_s", rate, step)
        if self.bar is not None:
            shown = {k: f"{v:.4g}" for k, v in list(values.items())[:4]}
            self.bar.set_postfix(**shown, img_s=f"{rate:.1f}")

    def images(self, step: int, tag: str, grid: torch.Tensor) -> None:
        """Log a ``(3, H, W)`` image grid with values in [0, 1]."""
        if self.enabled:
            self.writer.image(tag, grid.clamp(0, 1), step)

    def text(self, step: int, tag: str, text: str) -> None:
        if self.enabled:
            self.writer.text(tag, text, step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


RUN_LOGGERS = ("loopcore", "loopdata")  # package loggers every run log also carries


def teardown_run_logging(name: str) -> None:
    """Remove (and close) the handlers :func:`setup_run_logging` installed for ``name``."""
    for logger in (logging.getLogger(name), *(logging.getLogger(n) for n in RUN_LOGGERS)):
        for handler in list(logger.handlers):
            if getattr(handler, "_loopvision", False):
                logger.removeHandler(handler)
                handler.close()


_console_seen: set[tuple[int, str]] | None = None  # set while console_messages_once() is active


class _ConsoleOnce(logging.Filter):
    """Lets a console message through once while :func:`console_messages_once` is active (every run's log file
    still gets all of them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _console_seen is None or record.levelno < logging.WARNING:
            return True
        key = (record.levelno, record.getMessage())
        if key in _console_seen:
            return False
        _console_seen.add(key)
        return True


@contextlib.contextmanager
def console_messages_once() -> Iterator[None]:
    """Within the block, a warning printed to the console by one run is not printed again by the next run in
    the same process (``loopvae compare`` evaluates many checkpoints: one "rFID unavailable" line, not one per
    arm). Each run's own log file keeps its warnings."""
    global _console_seen
    previous, _console_seen = _console_seen, set()
    try:
        yield
    finally:
        _console_seen = previous


def setup_run_logging(name: str, run_dir: Path, is_main: bool, rank: int, log_file: str = "train.log") -> None:
    """Send the ``name`` logger and ``loopcore``'s and ``loopdata``'s (skipped corrupt samples, checkpoint
    recovery) to stderr, and on the main rank to ``run_dir/<log_file>`` (``train.log``, ``eval.log``, ...).

    Idempotent: handlers installed by an earlier call (an earlier run in the same process) are replaced.
    """
    teardown_run_logging(name)
    root = logging.getLogger(name)
    root.setLevel(logging.INFO)
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    handlers[0].addFilter(_ConsoleOnce())
    if is_main:
        handlers.append(logging.FileHandler(Path(run_dir) / log_file))
    for handler in handlers:
        handler.setFormatter(fmt)
        handler._loopvision = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    for package in RUN_LOGGERS:
        logger = logging.getLogger(package)
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
        for handler in handlers:
            logger.addHandler(handler)
