"""Argument types and shared options of the command lines, importable without torch.

The command lines build their whole argument tree from this module and :mod:`looprun.config` (which needs only
PyYAML), so ``loopvae --help`` and ``srvit --help`` answer before torch, diffusers or the data pipelines are
imported; the sub-command that runs imports what it needs. :mod:`looprun.speed` applies the options added here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# torch memory formats by their option name (looprun.speed maps them to torch.memory_format objects)
MEMORY_FORMAT_NAMES = ("contiguous", "channels_last")
CPU_ALLOCATORS = ("retain", "system")
ALLOCATOR_ENV = "LOOPVISION_CPU_ALLOCATOR"  # the command lines' default for --cpu-allocator


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default (``(default: ...)``) unless it is ``None`` / ``False`` or already stated."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or action.required:
            return text
        return super()._get_help_string(action)


def _bounded_int(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--limit -3`` is an error that names the value)."""
    return _bounded_int(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _bounded_int(text, 0, "an integer >= 0")


def preset_names(configs: Path) -> list[str]:
    """The presets a command ships: the YAML files in its ``configs`` folder, sorted."""
    return sorted(p.stem for p in configs.glob("*.yaml"))


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device``, with the same default for every sub-command."""
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when available, else the CPU), cpu or cuda")


def add_speed_arguments(
    parser: argparse.ArgumentParser, memory_format: bool = True, compile: bool = True, allocator: bool = True
) -> None:
    """Add ``--memory-format``, ``--compile`` and ``--cpu-allocator`` (those asked for) to a sub-command."""
    if memory_format:
        parser.add_argument("--memory-format", choices=MEMORY_FORMAT_NAMES, default="channels_last",
                            help="torch memory format of the model's 4-D tensors (default channels_last: the "
                                 "faster NHWC convolution kernels; outputs equal up to float rounding)")
    if compile:
        parser.add_argument("--compile", action="store_true",
                            help="torch.compile the model (first call compiles; CPUs need a C++ compiler)")
    if allocator:
        parser.add_argument("--cpu-allocator", choices=CPU_ALLOCATORS, default=None,
                            help="retain: glibc keeps freed memory for reuse (faster on CPU, resident size stays at "
                                 f"its peak); system: malloc's defaults (default: ${ALLOCATOR_ENV} or retain)")
