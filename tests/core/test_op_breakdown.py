"""loopcore.op_breakdown: ops land in the right class with the right MACs and bytes, and the totals add up."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from loopcore.flops import count_macs
from loopcore.op_breakdown import (
    OP_CLASSES,
    MachinePeaks,
    OpClassRecorder,
    attribute_ops_to,
    breakdown,
    measure_machine_peaks,
    summarise,
)

PEAKS = MachinePeaks(flops_per_s=1e11, bytes_per_s=1e10, threads=1, how="fixed for the test")


class KnownMix(nn.Module):
    """One op of each class, sizes chosen so every MAC count is easy to write down."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 5, padding=2, groups=8)
        self.pointwise = nn.Conv2d(8, 16, 1)
        self.norm = nn.GroupNorm(4, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pointwise(self.depthwise(self.dense(x)))
        h = F.silu(self.norm(h))
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        tokens = h.flatten(2).transpose(1, 2)  # (B, 4HW, 16)
        q = self.proj(tokens).unsqueeze(1)
        return F.scaled_dot_product_attention(q, q, q)


def _by_class(calls):
    out = {}
    for c in calls:
        entry = out.setdefault(c.op_class, {"flops": 0, "ops": set()})
        entry["flops"] += c.flops
        entry["ops"].add(c.op)
    return out


def test_a_known_op_mix_is_attributed_with_exact_macs():
    torch.manual_seed(0)
    model, x = KnownMix(), torch.randn(2, 3, 6, 6)
    with OpClassRecorder() as rec:
        model(x).sum().backward()
    classes = _by_class(rec.calls)
    b, hw = 2, 36
    dense = b * hw * 8 * 3 * 9  # forward MACs of each convolution
    depthwise = b * hw * 8 * 25
    pointwise = b * hw * 16 * 8
    # backward: the input's gradient is not needed for the first convolution (x has no grad): weight grad only
    assert classes["dense convolution"]["flops"] == 2 * (dense + dense)
    assert classes["depthwise convolution"]["flops"] == 2 * (depthwise + 2 * depthwise)
    tokens = 4 * hw
    linear = b * tokens * 16 * 16
    assert classes["1×1 / linear"]["flops"] == 2 * (pointwise + 2 * pointwise + linear + 2 * linear)
    attention_forward = 2 * b * tokens * tokens * 16 * 2  # QK^T and PV, in FLOPs
    # backward: five matmuls (the recomputed QK^T, dV, dP, dQ, dK) against the forward's two
    assert classes["attention"]["flops"] == attention_forward * 7 // 2
    assert {"native_group_norm", "native_group_norm_backward"} <= classes["normalisation"]["ops"]
    assert "silu" in classes["activation and elementwise"]["ops"]
    assert any("upsample" in op for op in classes["resampling"]["ops"])
    assert {"convolution", "convolution_backward"} <= classes["depthwise convolution"]["ops"]
    for name in ("normalisation", "activation and elementwise", "resampling"):
        assert classes[name]["flops"] == 0  # only matmul-like work is counted, as in count_macs


def test_forward_macs_equal_count_macs():
    torch.manual_seed(0)
    model, x = KnownMix(), torch.randn(2, 3, 6, 6)
    with torch.no_grad(), OpClassRecorder() as rec:
        model(x)
    assert sum(c.flops for c in rec.calls) // 2 == count_macs(model, x)


def test_bytes_moved():
    a, b = torch.ones(1000), torch.ones(1000)
    col, row = torch.ones(30, 1), torch.ones(1, 40)
    with OpClassRecorder() as rec:
        a + b
        a.view(10, 100)
        col + row  # broadcast: each input once, the 30 x 40 output once
        a.add_(b)  # in place: a and b read, a written
    add, view, bcast, inplace = rec.calls
    assert (add.op, add.bytes, add.op_class) == ("add", 3 * 4000, "activation and elementwise")
    assert (view.op, view.bytes) == ("view", 0)
    assert bcast.bytes == 4 * (30 + 40 + 30 * 40)
    assert inplace.bytes == 3 * 4000


def test_attribute_ops_to_files_a_block_under_one_class():
    p = nn.Parameter(torch.ones(10))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(10)
    with OpClassRecorder() as rec:
        with attribute_ops_to("optimizer"):
            opt.step()
        p * 2
    assert rec.calls[-1].op_class == "activation and elementwise"
    assert {c.op_class for c in rec.calls[:-1]} == {"optimizer"}
    with pytest.raises(ValueError, match="unknown op class 'optimiser'"):
        with attribute_ops_to("optimiser"):
            pass


def test_breakdown_totals_add_up_and_the_roofline_is_the_max_of_two_ceilings():
    torch.manual_seed(0)
    model, x = KnownMix(), torch.randn(2, 3, 6, 6)
    result = breakdown(lambda: model(x).sum().backward(), PEAKS, warmup=1, repeats=2)
    rows = result.rows()
    assert math.isclose(sum(r["share"] for r in rows), 1.0, rel_tol=1e-9)
    assert math.isclose(sum(r["ms"] for r in rows) / 1000, result.op_seconds, rel_tol=1e-9)
    assert math.isclose(result.op_seconds + result.outside_ops_seconds, result.instrumented_seconds, rel_tol=1e-12)
    assert result.plain_seconds > 0 and result.op_seconds > 0
    assert [r["class"] for r in rows] == [c for c in OP_CLASSES if c in {r["class"] for r in rows}]
    for r in rows:
        flops, nbytes = 2e9 * r["gmacs"], 1e6 * r["mb"]
        # per class, the roofline is summed per op, so it is at least the class's aggregate max
        assert r["roofline_ms"] >= 1000 * PEAKS.roofline_seconds(flops, nbytes) * (1 - 1e-9)
    assert PEAKS.roofline_seconds(1e11, 1.0) == 1.0  # compute-bound
    assert PEAKS.roofline_seconds(1.0, 1e10) == 1.0  # memory-bound
    json_rows = result.to_json()
    assert json_rows["gmacs"] == result.macs / 1e9 and len(json_rows["rows"]) == len(rows)
    assert json_rows["framework_ms"] == pytest.approx(max(0.0, 1000 * (result.plain_seconds - result.op_seconds)))


def test_summarise_averages_per_step():
    from loopcore.op_breakdown import OpCall

    calls = [OpCall("add", "activation and elementwise", 0.5, 0, 100)] * 4 + [OpCall("mm", "1×1 / linear", 1.0, 8, 4)]
    classes, top = summarise(calls, 2, PEAKS)
    assert classes["activation and elementwise"].calls == 2 and classes["activation and elementwise"].seconds == 1.0
    assert classes["1×1 / linear"].flops == 4 and top["1×1 / linear"] == [("mm", 0, 0.5)]


def test_machine_peaks_are_measured():
    peaks = measure_machine_peaks(matmul_size=128, copy_mib=8, repeats=2, conv_channels=16, conv_size=16)
    assert peaks.flops_per_s > 1e8 and peaks.bytes_per_s > 1e8
    assert peaks.threads == torch.get_num_threads() and "128² matmul" in peaks.how and "3×3 convolution" in peaks.how
    # the ceiling is the faster of the two probes, both stated
    stated = [float(v) for v in re.findall(r"\(([0-9.]+) GFLOP/s\)", peaks.how)]
    assert len(stated) == 2 and peaks.flops_per_s / 1e9 == pytest.approx(max(stated), abs=0.06)
