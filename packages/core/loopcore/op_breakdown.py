"""Where the time goes, by op class: every aten op a step runs, timed, with its MACs and bytes moved.

A MAC count cannot predict time when part of the work is memory-bound (a 7×7 depthwise convolution does
about 49 MACs per output element and streams every activation through memory twice). This module explains
a measured time instead of predicting it:

* :class:`OpClassRecorder` is a ``TorchDispatchMode``: it sees every aten op that reaches the kernels,
  forward, backward (the autograd engine runs CPU backward on the calling thread, with the mode active) and
  the optimizer's, and records the op's own time (the kernel call, nothing nested), its FLOPs (torch's
  ``flop_counter`` formulas, plus ours for the CPU flash-attention kernels) and the bytes it must move at
  least (each distinct input read once, each output written once; views move nothing).
* Ops fall into :data:`OP_CLASSES` by what they are (convolutions by their kernel size and groups).
* :func:`measure_machine_peaks` measures this machine's attainable FLOP/s (the faster of a large fp32 matmul and
  a large dense convolution) and memory
  bandwidth (a large copy) with the current thread setting, and :func:`breakdown` turns the records into a
  roofline estimate per class: ``max(FLOPs / peak FLOP/s, bytes / bandwidth)`` summed over the class's ops;
  ``achieved = roofline time / measured time`` says how far each class is from what the machine could do.

The instrumentation costs a few microseconds per op, so the instrumented step is slower than the plain
one; the report gives both and the time spent outside any op (Python, autograd, dispatch, the recorder).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .flops import flop_formulas

OP_CLASSES = (
    "dense convolution",  # spatial kernels with groups == 1 (or grouped, groups < channels)
    "depthwise convolution",  # groups == input channels
    "1×1 / linear",  # 1×1 convolutions, mm / addmm / bmm outside attention
    "normalisation",  # group / layer / batch / RMS norm, forward and backward
    "activation and elementwise",  # ops torch tags pointwise (SiLU, add, mul, modulation, ...) and their backward
    "attention",  # scaled-dot-product attention kernels, forward and backward
    "resampling",  # up-sampling, pooling, pixel (un)shuffle
    "copy and layout",  # copies between layouts, clone, cat, pad, fill
    "optimizer",  # every op inside an attribute_ops_to("optimizer") block
    "other",  # reductions (the loss), random numbers, views, anything else
)

_aten = torch.ops.aten
_FLOPS = flop_formulas()
_NORM = ("group_norm", "layer_norm", "batch_norm", "rms_norm", "instance_norm")
_RESAMPLE = ("upsample", "pool", "pixel_shuffle", "pixel_unshuffle", "grid_sampler", "_interp")
_ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")
_MATMUL = ("mm", "addmm", "bmm", "baddbmm", "matmul", "addmm_activation", "linear")
_COPY = ("copy", "to_copy", "clone", "cat", "stack", "constant_pad_nd", "reflection_pad", "replication_pad",
         "fill", "zero", "zeros_like", "empty_like", "new_zeros", "index_select", "gather", "contiguous", "roll",
         "flip", "repeat", "unsafe_index")
# metadata queries: no kernel, no bytes; left out of the records entirely
_METADATA = {"size", "sym_size", "stride", "sym_stride", "storage_offset", "sym_storage_offset", "numel", "sym_numel",
             "dim", "is_contiguous", "sym_is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense",
             "layout", "device"}

# ops that return a tensor over the same memory without the schema saying so: no data moves
_NO_DATA = {"_unsafe_view", "alias", "lift_fresh", "_reshape_alias"}

_override: list[str] = []


@contextlib.contextmanager
def attribute_ops_to(op_class: str) -> Iterator[None]:
    """Within the block, an active :class:`OpClassRecorder` files every op under ``op_class`` (e.g. the
    optimizer step, whose elementwise ops are the optimizer's cost, not the model's). No effect otherwise."""
    if op_class not in OP_CLASSES:
        raise ValueError(f"unknown op class {op_class!r}; choose one of {', '.join(OP_CLASSES)}")
    _override.append(op_class)
    try:
        yield
    finally:
        _override.pop()


def _conv_class(weight: torch.Tensor, groups: int, in_channels: int) -> str:
    if groups > 1 and groups == in_channels:
        return "depthwise convolution"
    if groups == 1 and all(k == 1 for k in weight.shape[2:]):
        return "1×1 / linear"
    return "dense convolution"


def classify_op(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
    """The :data:`OP_CLASSES` entry of one aten op call (by name, torch's op tags and, for convolutions, the
    weight's kernel size and ``groups``)."""
    name = func._overloadpacket.__name__
    base = name.strip("_")  # in-place (add_) and private (_to_copy) variants share their op's class
    if base in ("convolution", "convolution_backward"):
        forward = base == "convolution"
        inp, weight = (args[0], args[1]) if forward else (args[1], args[2])
        groups = args[8] if forward else args[9]
        return _conv_class(weight, int(groups), int(inp.shape[1]))
    if any(key in name for key in _ATTENTION):
        return "attention"
    if any(key in name for key in _NORM):
        return "normalisation"
    if base in _MATMUL:
        return "1×1 / linear"
    if any(key in name for key in _RESAMPLE):
        return "resampling"
    if base in _COPY:
        return "copy and layout"
    if torch.Tag.pointwise in func.tags or base.endswith("_backward") and any(
            act in base for act in ("silu", "gelu", "sigmoid", "tanh", "threshold", "softplus", "mish")):
        return "activation and elementwise"
    return "other"


def _touched_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses (broadcast dimensions, stride 0, count once)."""
    elements = math.prod(s for s, st in zip(t.shape, t.stride(), strict=True) if st != 0) if t.ndim else 1
    return elements * t.element_size()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _bytes_moved(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> int:
    """Compulsory traffic of one op: each distinct input tensor read once, each output written once."""
    if func.is_view or func._overloadpacket.__name__ in _NO_DATA:
        return 0
    seen: set[tuple] = set()
    total = 0
    for t in _tensors((args, kwargs)):
        key = (t.data_ptr(), tuple(t.shape), t.stride())
        if key not in seen and t.device.type != "meta":
            seen.add(key)
            total += _touched_bytes(t)
    for t in _tensors(out):
        if t.device.type != "meta":
            total += _touched_bytes(t)
    return total


@dataclass
class OpCall:
    """One recorded op call: aten name, class, seconds inside the kernel call, FLOPs, bytes moved."""

    op: str
    op_class: str
    seconds: float
    flops: int
    bytes: int


class OpClassRecorder(TorchDispatchMode):
    """Record every aten op run while the mode is active (see the module docstring).

    ``recorder.calls`` lists :class:`OpCall` in call order. Works for CPU tensors; CUDA ops are timed with a
    device synchronisation around each op (slow, but each op's own time).
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[OpCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet.__name__ in _METADATA:
            return func(*args, **kwargs)
        cuda = any(t.is_cuda for t in _tensors((args, kwargs)))
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = func(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        formula = _FLOPS.get(packet)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
        op_class = _override[-1] if _override else classify_op(func, args, kwargs)
        self.calls.append(OpCall(str(packet.__name__), op_class, seconds, flops, _bytes_moved(func, args, kwargs, out)))
        return out


@dataclass
class MachinePeaks:
    """Attainable fp32 FLOP/s (the faster of a square matmul and a dense 3×3 convolution) and memory bandwidth
    (a copy larger than the caches), measured here with ``threads`` torch threads; the roofline's two ceilings."""

    flops_per_s: float
    bytes_per_s: float
    threads: int
    how: str

    def roofline_seconds(self, flops: float, nbytes: float) -> float:
        """The least time an op with this arithmetic and traffic can take on this machine."""
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s)


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: first touch of the pages, thread pool start, the kernel library's plan
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_machine_peaks(matmul_size: int = 1024, copy_mib: int = 256, repeats: int = 5,
                          conv_channels: int = 256, conv_size: int = 128) -> MachinePeaks:
    """This machine's two roofline ceilings, with torch's current thread count, best of ``repeats``:

    * FLOP/s: the faster of an fp32 ``n × n`` matmul (``2 n^3`` FLOPs) and a channels-last fp32 3×3
      convolution, ``conv_channels`` -> ``conv_channels`` at ``conv_size``² (``2 · C² · 9 · H · W`` FLOPs). On
      x86 CPUs torch's convolution kernels (oneDNN) can outrun its matmul (on the 2-core development machine:
      219 vs 161 GFLOP/s, docs/benchmarks.md), and a ceiling below what a model's own convolutions reach would
      report them above 100% of the roofline;
    * bytes/s: read + write of a ``copy_mib`` MiB buffer, well beyond a CPU's last-level cache.
    """
    a, b = torch.randn(matmul_size, matmul_size), torch.randn(matmul_size, matmul_size)
    x = torch.randn(1, conv_channels, conv_size, conv_size).contiguous(memory_format=torch.channels_last)
    w = torch.randn(conv_channels, conv_channels, 3, 3).contiguous(memory_format=torch.channels_last)
    src = torch.ones(copy_mib * 2**20 // 4)
    dst = torch.empty_like(src)
    with torch.no_grad():
        mm_flops = 2 * matmul_size**3 / _best_seconds(lambda: a @ b, repeats)
        conv_flops = (2 * conv_channels**2 * 9 * conv_size**2
                      / _best_seconds(lambda: torch.nn.functional.conv2d(x, w, padding=1), repeats))
        copy_bytes = 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), repeats)
    threads = torch.get_num_threads()
    return MachinePeaks(
        flops_per_s=max(mm_flops, conv_flops), bytes_per_s=copy_bytes, threads=threads,
        how=f"FLOP/s: the faster of an fp32 {matmul_size}² matmul ({mm_flops / 1e9:.1f} GFLOP/s) and a "
            f"channels-last fp32 3×3 convolution, {conv_channels} channels at {conv_size}² "
            f"({conv_flops / 1e9:.1f} GFLOP/s); bandwidth: a {copy_mib} MiB copy (read + write); best of {repeats}, "
            f"{threads} threads")


@dataclass
class ClassTotals:
    """One op class over one step: calls, measured seconds, FLOPs, bytes and roofline seconds."""

    calls: int = 0
    seconds: float = 0.0
    flops: int = 0
    bytes: int = 0
    roofline_seconds: float = 0.0


@dataclass
class OpBreakdown:
    """One step's time by op class (per step: averages over the instrumented repeats).

    ``plain_seconds``: median wall time of the step without instrumentation; ``instrumented_seconds``: with it;
    ``outside_ops_seconds``: instrumented time not inside any recorded op (Python, autograd engine, dispatch
    and the recorder itself); ``sum(c.seconds) + outside_ops_seconds == instrumented_seconds``.
    """

    classes: dict[str, ClassTotals]
    plain_seconds: float
    instrumented_seconds: float
    peaks: MachinePeaks
    top_ops: dict[str, list[tuple[str, int, float]]] = field(default_factory=dict)

    @property
    def op_seconds(self) -> float:
        return sum(c.seconds for c in self.classes.values())

    @property
    def outside_ops_seconds(self) -> float:
        return self.instrumented_seconds - self.op_seconds

    @property
    def macs(self) -> int:
        return sum(c.flops for c in self.classes.values()) // 2

    def rows(self) -> list[dict[str, Any]]:
        """One dict per class with ops in it: ``class, calls, ms, share`` (of the op time), ``gmacs, mb``
        (bytes moved, MB), ``intensity`` (FLOP / byte), ``roofline_ms`` and ``achieved`` (roofline / measured)."""
        total = self.op_seconds
        out = []
        for name in OP_CLASSES:
            c = self.classes[name]
            if c.calls == 0:
                continue
            out.append({
                "class": name, "calls": c.calls, "ms": 1000 * c.seconds, "share": c.seconds / total if total else 0.0,
                "gmacs": c.flops / 2e9, "mb": c.bytes / 1e6, "intensity": c.flops / c.bytes if c.bytes else None,
                "roofline_ms": 1000 * c.roofline_seconds,
                "achieved": c.roofline_seconds / c.seconds if c.seconds else None})
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows(), "plain_ms": 1000 * self.plain_seconds,
            "instrumented_ms": 1000 * self.instrumented_seconds, "op_ms": 1000 * self.op_seconds,
            "outside_ops_ms": 1000 * self.outside_ops_seconds,
            # the plain step's time outside ops, estimated: plain time minus the (instrumented) op time, >= 0
            "framework_ms": 1000 * max(0.0, self.plain_seconds - self.op_seconds), "gmacs": self.macs / 1e9,
            "roofline_ms": 1000 * sum(c.roofline_seconds for c in self.classes.values()),
            "peaks": {"gflops_per_s": self.peaks.flops_per_s / 1e9, "gb_per_s": self.peaks.bytes_per_s / 1e9,
                      "threads": self.peaks.threads, "how": self.peaks.how},
            "top_ops": {k: [{"op": op, "calls": n, "ms": 1000 * s} for op, n, s in v] for k, v in self.top_ops.items()},
        }


def summarise(calls: list[OpCall], steps: int, peaks: MachinePeaks) -> tuple[dict[str, ClassTotals], dict]:
    """Per-class totals per step of ``calls`` recorded over ``steps`` steps, and each class's top 3 ops by time."""
    classes = {name: ClassTotals() for name in OP_CLASSES}
    per_op: dict[tuple[str, str], list[float]] = {}
    for call in calls:
        c = classes[call.op_class]
        c.calls += 1
        c.seconds += call.seconds
        c.flops += call.flops
        c.bytes += call.bytes
        c.roofline_seconds += peaks.roofline_seconds(call.flops, call.bytes)
        entry = per_op.setdefault((call.op_class, call.op), [0, 0.0])
        entry[0] += 1
        entry[1] += call.seconds
    for c in classes.values():
        c.calls //= steps
        c.seconds /= steps
        c.flops //= steps
        c.bytes //= steps
        c.roofline_seconds /= steps
    top: dict[str, list[tuple[str, int, float]]] = {}
    for (op_class, op), (n, s) in sorted(per_op.items(), key=lambda kv: -kv[1][1]):
        if len(top.setdefault(op_class, [])) < 3:
            top[op_class].append((op, n // steps, s / steps))
    return classes, top


def breakdown(step: Callable[[], Any], peaks: MachinePeaks, warmup: int = 1, repeats: int = 3) -> OpBreakdown:
    """Time ``step`` plain (median of ``repeats`` calls after ``warmup``), then ``repeats`` more calls under an
    :class:`OpClassRecorder`, and return the per-step breakdown. ``step`` may use :func:`attribute_ops_to`."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        step()
    plain = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        plain.append(time.perf_counter() - start)
    recorder = OpClassRecorder()
    start = time.perf_counter()
    with recorder:
        for _ in range(repeats):
            step()
    instrumented = (time.perf_counter() - start) / repeats
    classes, top = summarise(recorder.calls, repeats, peaks)
    return OpBreakdown(classes, statistics.median(plain), instrumented, peaks, top)
