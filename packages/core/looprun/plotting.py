"""matplotlib as an optional extra (``pip install 'loopvision[plots]'``): plots are side products of the
commands (their JSON and markdown are the results), so a missing matplotlib skips them with a warning that
says how to get them, and a direct call to a plot function raises :class:`PlotsUnavailable` saying the same."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

INSTALL_HINT = "pip install 'loopvision[plots]' (make setup installs it)"


class PlotsUnavailable(ImportError):
    """matplotlib is not installed."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or :class:`PlotsUnavailable` naming the extra."""
    try:
        import matplotlib
    except ImportError as err:
        raise PlotsUnavailable(f"plots need matplotlib, which is not installed: {INSTALL_HINT}") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_or_warn(fn: Callable[..., Any], *args: Any, log: logging.Logger, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; without matplotlib, a warning instead (the command's other outputs stand)."""
    try:
        return fn(*args, **kwargs)
    except PlotsUnavailable as err:
        log.warning("plots skipped: %s", err)
        return None
