"""A tiny study spec for the engine's tests: tied against untied weights of a three-pass linear recurrence.

The same question as the sharing study in miniature, at a budget of milliseconds: ``x -> W3 W2 W1 x`` fitted to a
fixed random target map by gradient descent, with one matrix used three times (``tied``) or three matrices
(``untied``), seeds 0-2, paired by seed (a seed fixes the initial weights' draw and the data). Options:
``sleep`` (seconds per run, for the kill test), ``fail`` (an arm whose runs raise), ``vanish`` (an arm whose
runs' worker dies without a result file), ``scale`` (a smoke run: steps scaled; refused in the study's own
results).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from looprun.study import Arm, Budget, Comparison, Metric, PlannedRun, Rules, RunContext, Study
from looprun.study import page as std

DIM, PASSES, SAMPLES = 6, 3, 24


def run(planned: PlannedRun, context: RunContext) -> dict[str, Any]:
    if context.options.get("fail") == planned.arm:
        raise RuntimeError(f"arm {planned.arm} fails on purpose (option fail)")
    if context.options.get("vanish") == planned.arm:  # the worker dies before it writes a result file
        os._exit(9)
    time.sleep(float(context.options.get("sleep", 0)))
    data = np.random.default_rng(1000)  # the task: the same for every run
    target = np.linalg.qr(data.normal(size=(DIM, DIM)))[0] * 0.9
    x_train, x_test = data.normal(size=(SAMPLES, DIM)), data.normal(size=(SAMPLES, DIM))
    rng = np.random.default_rng(planned.seed)
    weights = [np.eye(DIM) + 0.1 * rng.normal(size=(DIM, DIM)) for _ in range(1 if planned.arm == "tied" else PASSES)]
    lr, curve = planned.settings["lr"], []
    for step in range(1, max(10, round(planned.settings["steps"] * float(context.options.get("scale", 1)))) + 1):
        mats = [weights[min(i, len(weights) - 1)] for i in range(PASSES)]
        states = [x_train]
        for m in mats:
            states.append(states[-1] @ m.T)
        grad_out = 2 * (states[-1] - x_train @ target.T) / len(x_train)
        grads = [np.zeros_like(w) for w in weights]
        for i in reversed(range(PASSES)):
            grads[min(i, len(weights) - 1)] += grad_out.T @ states[i]
            grad_out = grad_out @ mats[i]
        for w, g in zip(weights, grads, strict=True):
            w -= lr * g
        if step % 10 == 0:
            curve.append({"step": step, "score": _scores(weights, x_test, target).mean()})
    per_sample = _scores(weights, x_test, target)
    return {"code_file": _code_file(),
            "metrics": {"score": float(per_sample.mean()), "params": sum(w.size for w in weights)},
            "per_unit": {"score": {f"x{i:02d}": float(v) for i, v in enumerate(per_sample)}}, "curve": curve}


def _code_file() -> str | None:
    """Where the code root's own package came from (the executors put the code root's sources on PYTHONPATH)."""
    try:
        import tinycode
    except ImportError:  # the spec also loads outside its test repository
        return None
    return tinycode.__file__


def _scores(weights: list[np.ndarray], x: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per sample -10 log10(squared error): higher is better, in dB like a PSNR."""
    y = x
    for i in range(PASSES):
        y = y @ weights[min(i, len(weights) - 1)].T
    return -10 * np.log10(((y - x @ target.T) ** 2).mean(1) + 1e-12)


STUDY = Study(
    name="tiny",
    smoke_options=("scale",),
    title="Tied against untied weights of a three-pass linear map (the engine's test study)",
    docs="docs/study_tiny",
    page="docs/study_tiny.md",
    arms=[Arm("tied", "one matrix, three passes", {"lr": 0.05}), Arm("untied", "three matrices", {"lr": 0.05})],
    budgets=[Budget("40", seeds=(0, 1, 2), steps=40)],
    metric=Metric("score", "dB", label="test score"),
    primaries=[Comparison("T1", "tied@40", "untied@40", "tied − untied", margin=0.5)],
    secondaries=[Comparison("S1", "untied@40", "tied@40", "untied − tied (the same contrast reversed)")],
    rules=Rules(),
    run=run,
    sections=[*std.STANDARD],
)
