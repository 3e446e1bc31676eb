"""Speed switches shared by the command lines: torch memory format, ``torch.compile``, CPU allocator.

None of them changes a parameter, a MAC or (beyond float rounding) an output; ``docs/benchmarks.md``
measures what each buys. They exist as switches rather than fixed choices because each has a cost:

* ``memory_format="channels_last"`` stores 4-D activations as ``(B, H, W, C)``, so convolutions pick
  the channels-last kernels (oneDNN on CPUs, cuDNN's NHWC kernels on GPUs). Inputs must be converted
  too: :func:`to_memory_format`.
* ``compile=True`` wraps the model's heavy submodules with :func:`torch.compile` in place (state-dict
  keys unchanged, so checkpoints and releases do not see it). The first call compiles (seconds to
  minutes, and a C++ compiler on CPUs).
* :func:`retain_freed_cpu_memory` stops glibc from returning freed blocks to the kernel. A LoopVAE
  writes many short-lived 25-100 MB activation maps; with glibc's defaults each such block is a fresh
  ``mmap`` whose pages the kernel zero-fills on first touch, which measured as a large share of CPU
  inference time (docs/benchmarks.md). Retaining freed memory is what the CUDA caching allocator does on
  GPUs; the price is that the process's resident size stays at its high-water mark.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import logging
import os

import torch
from torch import nn

from .cli_args import (
    ALLOCATOR_ENV,
    CPU_ALLOCATORS,
    MEMORY_FORMAT_NAMES,
    add_speed_arguments,  # noqa: F401 (re-exported: the older import path)
)

log = logging.getLogger("looprun.speed")

MEMORY_FORMATS: dict[str, torch.memory_format] = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
}
assert tuple(MEMORY_FORMATS) == MEMORY_FORMAT_NAMES  # one list of names for the command lines and the code

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_retained = False


def memory_format(name: str) -> torch.memory_format:
    """``"contiguous"`` / ``"channels_last"`` -> the torch memory format; ``ValueError`` otherwise."""
    if name not in MEMORY_FORMATS:
        raise ValueError(f"unknown memory format {name!r}; choose one of {', '.join(MEMORY_FORMATS)}")
    return MEMORY_FORMATS[name]


def to_memory_format(x: torch.Tensor, fmt: str | torch.memory_format) -> torch.Tensor:
    """``x`` in memory format ``fmt`` when it is a 4-D image batch ``(B, C, H, W)``; other tensors unchanged."""
    fmt = memory_format(fmt) if isinstance(fmt, str) else fmt
    return x.contiguous(memory_format=fmt) if x.ndim == 4 else x


def retain_freed_cpu_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse (no ``mmap`` per large block, no trimming).

    Process-wide and irreversible for the process; call it once, early, in a command-line entry point.
    Returns ``False`` (and changes nothing) where the C library is not glibc.
    """
    global _retained
    if _retained:
        return True
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("retain_freed_cpu_memory: no glibc mallopt here; keeping the system allocator's behaviour")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_MAX, 0),  # large blocks come from the heap, so they can be reused after free
        (_M_TRIM_THRESHOLD, 2**31 - 1),  # never give the heap's free top back to the kernel
        (_M_TOP_PAD, 256 * 2**20),  # grow the heap in 256 MiB steps (fewer brk calls)
    ))
    _retained = ok
    return ok


def apply_cpu_allocator(choice: str) -> bool:
    """``"retain"``: :func:`retain_freed_cpu_memory`; ``"system"``: leave malloc as it is. Returns whether retained."""
    if choice not in CPU_ALLOCATORS:
        raise ValueError(f"unknown CPU allocator setting {choice!r}; choose one of {', '.join(CPU_ALLOCATORS)}")
    return retain_freed_cpu_memory() if choice == "retain" else False


def compile_in_place(model: nn.Module) -> nn.Module:
    """``torch.compile`` the parts of ``model`` that do the work, in place; returns ``model``.

    Autoencoders (anything with ``encoder`` and ``decoder`` submodules, ours and diffusers') get the two
    compiled separately, so ``encode`` / ``decode`` calls, which never go through ``forward``, are
    compiled too; any other module compiles its ``forward``. Parameter names do not change.
    """
    parts = [getattr(model, name, None) for name in ("encoder", "decoder")]
    if all(isinstance(part, nn.Module) for part in parts):
        for part in parts:
            part.compile()
    else:
        model.compile()
    return model


def prepare_for_speed(model: nn.Module, memory_format_name: str = "contiguous", compile: bool = False) -> nn.Module:
    """Convert ``model``'s 4-D parameters to ``memory_format_name`` and optionally compile it (in place)."""
    model = model.to(memory_format=memory_format(memory_format_name))
    return compile_in_place(model) if compile else model



def default_cpu_allocator() -> str:
    """``$LOOPVISION_CPU_ALLOCATOR`` when set (``retain`` / ``system``), else ``retain``."""
    choice = os.environ.get(ALLOCATOR_ENV, "retain")
    if choice not in CPU_ALLOCATORS:
        raise ValueError(f"${ALLOCATOR_ENV}={choice!r} is not one of {', '.join(CPU_ALLOCATORS)}")
    return choice


def apply_speed_arguments(args: argparse.Namespace) -> None:
    """Process-wide part of :func:`add_speed_arguments`: the CPU allocator choice."""
    if hasattr(args, "cpu_allocator"):
        apply_cpu_allocator(args.cpu_allocator or default_cpu_allocator())
