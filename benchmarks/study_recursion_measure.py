"""What the recurrence study measures on one trained run: its logged training history, the class-balanced test
subset, and probes of what the trained weights do inside (SoftMoR router weights, bViT state norms)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from study_recursion import Arm


def logged_history(run_dir: Path) -> list[dict[str, float]]:
    """Every logged step of a run from its TensorBoard events, across resumptions: ``[{"step", key: value}]``.

    A resumed run recomputes the steps after its checkpoint; their values written last win. (The in-process
    ``TrainResult.history`` only holds the steps of the last invocation.)
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}).Reload()
    by_step: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        if tag == "train/loss_final" or tag.startswith("train/fusion_entropy"):
            for event in events.Scalars(tag):  # in write order: a recomputed step overwrites its first value
                by_step.setdefault(event.step, {"step": event.step})[tag.removeprefix("train/")] = event.value
    return [by_step[step] for step in sorted(by_step)]


def summarise_history(history: list[dict[str, float]], window: int = 10, entropy_every: int = 20) -> dict[str, Any]:
    """Loss curve (means over ``window``-step buckets of the final-state loss), final loss, router entropy.

    ``final_train_loss`` is the mean logged loss over the last 10% of the steps (at least ``2 * window``);
    the entropy curve keeps every ``entropy_every``-th step, so runs logged at different rates line up.
    """
    last = history[-1]["step"]
    buckets: dict[int, list[float]] = {}
    for h in history:
        buckets.setdefault(-(-h["step"] // window) * window, []).append(h["loss_final"])
    curve = [[step, sum(v) / len(v)] for step, v in sorted(buckets.items())]
    tail = [h["loss_final"] for h in history if h["step"] > last - max(2 * window, last // 10)]
    entropy = [[h["step"], [h[k] for k in sorted(h) if k.startswith("fusion_entropy/block")]]
               for h in history if "fusion_entropy" in h and h["step"] % entropy_every == 0]
    return {"loss_curve": curve, "final_train_loss": sum(tail) / len(tail), "entropy_curve": entropy}


def test_images(test_urls: str, resolution: int):
    """All test images ``(N, 3, H, W)`` (normalised, in shard order) and labels ``(N,)``."""
    import torch

    import loopdata

    loader = loopdata.make_loader(test_urls, task="classification", train=False, batch_size=250, num_workers=0,
                                  resolution=resolution, protocol="cifar", num_classes=10)
    batches = list(loader)
    return torch.cat([b["image"] for b in batches]), torch.cat([b["label"] for b in batches])


def spread(total: int, count: int | None):
    """Indices of ``count`` items spread evenly over ``range(total)`` (all when None).

    The shared test shard is sorted by class, so evenly spread indices give a class-balanced subset where the
    first ``count`` would hold one or two classes.
    """
    import torch

    if count is None or count >= total:
        return torch.arange(total)
    return torch.linspace(0, total - 1, count).round().long()


def probe(model, images, arm: Arm) -> dict[str, Any]:
    """What the trained weights do inside: router weights (SR-ViT) or state norms per step (bViT).

    * ``router_weights[j][r]``: mean SoftMoR weight of step ``r`` in block ``j`` over images and tokens;
      ``router_entropy[j]``: mean entropy of block ``j``'s weights (nats; ``ln R`` = uniform).
    * ``state_norms[t]``: mean L2 norm of a token's state after step ``t`` (``t = 0``: the embedding), run to
      4x the horizon; ``direction_change[t]``: mean ``|u_{t+1} - u_t|`` of the unit-normalised token states,
      how much a step still turns the state (the final LayerNorm sees only the direction).
    """
    import torch

    from loopcore.softmor import fusion_entropy

    out: dict[str, Any] = {}
    with torch.no_grad():
        if model.fusions is not None:
            trace = model.forward_trace(images)
            out["router_weights"] = [w.float().mean(dim=(0, 2)).tolist() for w in trace.fusion_weights]
            out["router_entropy"] = [float(fusion_entropy(w)) for w in trace.fusion_weights]
        if arm.preset.startswith("cifar10-bvit"):
            steps = 4 * arm.horizon
            trace = model.forward_trace(images, steps=steps, return_step_states=True)
            states = [model.embed(images), *trace.step_states[0]]
            norms = [float(s.float().norm(dim=-1).mean()) for s in states]
            units = [torch.nn.functional.normalize(s.float(), dim=-1) for s in states]
            turns = [float((b - a).norm(dim=-1).mean()) for a, b in zip(units, units[1:])]
            out.update({"state_norms": norms, "direction_change": turns})
    return out
