"""One run of the recurrence study (``studies/recursion.py``): ``srvit train`` in a subprocess, then what the study
measures on the EMA weights and on the logged history. A run's settings: ``preset``, ``model`` (``model_overrides``
on top of :data:`STUDY_MODEL`), ``extra`` config overrides, ``section``, ``group``, ``lr`` and ``steps``."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from looprun.study import PlannedRun, RunContext

# The DeiT-Ti block at half width (96 channels, 3 heads), 8x8 patches of the 32x32 images (16 tokens + class token):
# the study fits ~3.4 hours of 2 CPU cores at a budget where the training losses flatten.
STUDY_MODEL: dict[str, Any] = {"patch_size": 8, "embed_dim": 96, "num_heads": 3}
HORIZON_MULTIPLES = (1.0, 1.5, 2.0, 3.0, 4.0)  # bViT evaluation depths as multiples of its training T
PROBE_IMAGES = 256  # class-balanced test images for state norms and router weights
QUICK = {"steps": 200, "eval_images": 2000}  # --option quick=true (and the main phase at one seed)
Settings = Mapping[str, Any]


def is_bvit(s: Settings) -> bool:
    return s["preset"].startswith("cifar10-bvit")


def horizon(s: Settings) -> int:
    """Training steps per block: R for SR-ViT, T for bViT."""
    return int(s["model"].get("recursion", 12 if is_bvit(s) else 1))


def block_evaluations(s: Settings) -> int:
    """Block evaluations of one forward at the training horizon (the study's unit of arithmetic)."""
    return (1 if is_bvit(s) else 12) * horizon(s) * {"heun": 2, "rk4": 4}.get(s["model"].get("solver", "euler"), 1)


def horizon_steps(s: Settings) -> tuple[int, ...]:
    return tuple(sorted({max(1, round(m * horizon(s))) for m in HORIZON_MULTIPLES})) if is_bvit(s) else ()


def eval_steps(s: Settings) -> tuple[int, ...]:
    """bViT: every step ``1..T`` and the :func:`horizon_steps` beyond (one trajectory gives them all)."""
    return tuple(sorted(set(horizon_steps(s)) | set(range(1, horizon(s) + 1)))) if is_bvit(s) else ()


def swapped_solvers(s: Settings) -> list[tuple[str, float, int]]:
    """``(solver, h, steps)``: a trained Euler / Heun bViT with the other solver at its integration time ``T x h``, at
    matched steps and matched block evaluations (not the depth arms nor deep supervision: no solver arms)."""
    if not is_bvit(s) or s["section"] == "depth" or s["extra"]:
        return []
    method, steps, h = s["model"].get("solver", "euler"), horizon(s), float(s["model"].get("step_size", 1.0))
    return {"euler": [("heun", h, steps), ("heun", 2 * h, steps // 2)],
            "heun": [("euler", h, steps), ("euler", h / 2, 2 * steps)]}.get(method, [])


def data_dir(options: Mapping[str, Any]) -> dict[str, str]:
    """``{"data": folder}`` of the CIFAR-10 shards: ``--option data=DIR``, else the shared data's ``cifar10/``."""
    import loopdata

    folder = Path(options.get("data") or (loopdata.find_shared_data() or Path("missing")) / "cifar10")
    if not all((folder / f"cifar10-{split}-000000.tar").is_file() for split in ("train", "test")):
        raise FileNotFoundError(f"no cifar10-train/test-000000.tar in {folder}: pass --option data=DIR")
    return {"data": str(folder)}


def run(planned: PlannedRun, context: RunContext) -> dict[str, Any]:
    """Train (a rerun after a kill resumes from the checkpoint in the run's workdir) and measure one run. Options:
    ``quick`` (:data:`QUICK`), ``steps``, ``eval_images``, ``data``, ``threads`` per run (default 1: --jobs = cores).
    A diverged lr is a result of the sweep (``diverged``), not a failed run."""
    s, o, out = planned.settings, context.options, context.workdir
    steps = int(o.get("steps", QUICK["steps"] if o.get("quick") else s["steps"]))
    images = o.get("eval_images", QUICK["eval_images"] if o.get("quick") else None)
    threads, data = int(o.get("threads", 1)), Path(data_dir(o)["data"])
    sets = [f"model_overrides={json.dumps({**STUDY_MODEL, **s['model']})}", f"max_steps={steps}", f"lr={s['lr']}",
            f"seed={planned.seed}", "progress_bar=false", "checkpoint_every=200", "keep_checkpoints=1",
            "log_every=1", *s["extra"]]  # log_every=1: every step's loss in TensorBoard (logged_history)
    base = {"name": planned.id, "group": s["group"], "lr": s["lr"], "overrides": sets, "settings": {
        "steps": steps, "eval_images": images, "probe_images": PROBE_IMAGES, "model": STUDY_MODEL}}
    start, train = time.perf_counter(), str(data / "cifar10-train-000000.tar")
    done = subprocess.run([sys.executable, "-m", "srvit", "train", "--config", s["preset"], "--data", train, "--out",
                           str(out), "--set", *sets], env={**os.environ, "OMP_NUM_THREADS": str(threads)},
                          capture_output=True, text=True, check=False)
    base |= {"train_seconds": round(time.perf_counter() - start, 1), **({"quick": True} if o.get("quick") else {})}
    print(done.stdout, done.stderr, sep="\n", flush=True)  # into the run's log in the study's workdir
    if done.returncode == 3:  # srvit train: a non-finite loss
        return {**base, "diverged": True, "error": done.stderr.split("srvit train: ", 1)[-1].splitlines()[0]}
    if done.returncode != 0:
        raise RuntimeError(f"srvit train exited with code {done.returncode}: {done.stderr.strip()[-800:]}")
    if (history := logged_history(out))[-1]["step"] < steps:
        raise RuntimeError(f"srvit train stopped at step {history[-1]['step']} of {steps}: run the study again")
    import loopdata
    from srvit.train_config import load_train_config

    config = load_train_config(s["preset"], sets)
    loader = loopdata.make_loader(train, task="classification", train=True, batch_size=config.batch_size,
                                  num_workers=0, resolution=config.resolution, **config.data_options())
    return {**base, "diverged": False, "steps": history[-1]["step"],
            "epochs": history[-1]["step"] / max(loader.num_batches, 1),
            **summarise_history(history), **measure(out / "release", s, data, config.resolution, images, threads)}


def measure(release: Path, s: Settings, data: Path, resolution: int, count: int | None, threads: int) -> dict:
    """Top-1 / top-5 of the EMA weights on ``count`` class-balanced test images (``None``: all), top-1 at every
    :func:`eval_steps` depth and with the other solver (:func:`swapped_solvers`), and the :func:`probe`."""
    import torch

    import loopdata
    from srvit.evaluate import Counts, batch_counts
    from srvit.loading import load_classifier

    torch.set_num_threads(threads)
    model, start = load_classifier(release).model.eval(), time.perf_counter()
    batches = list(loopdata.make_loader(str(data / "cifar10-test-000000.tar"), task="classification", train=False,
                                        batch_size=250, num_workers=0, resolution=resolution, protocol="cifar",
                                        num_classes=10))  # all test images, normalised, in shard order
    images, labels = (torch.cat([b[k] for b in batches]) for k in ("image", "label"))
    chosen, trained = spread(len(labels), count), (model.solver.method, model.solver.step_size)

    def counts(steps: tuple[int, ...]) -> Counts:
        parts = [chosen[i:i + 250] for i in range(0, len(chosen), 250)]
        return functools.reduce(Counts.merge, (batch_counts(model, images[p], labels[p], steps) for p in parts))

    main, swapped = counts(eval_steps(s)), []
    for method, h, steps in swapped_solvers(s):
        model.use_solver(method, h)
        swapped.append({"solver": method, "step_size": h, "steps": steps, "time": steps * h, "block_evaluations":
                        steps * {"heun": 2, "rk4": 4}.get(method, 1), "top1": counts((steps,)).by_steps[steps]})
    model.use_solver(*trained)
    n = main.num_images
    for sw in swapped:
        sw["top1"] /= n
    return {"parameters": sum(p.numel() for p in model.parameters()), "block_evaluations": block_evaluations(s),
            "top1": main.top1 / n, "top5": main.top5 / n, "num_images": n, **({"swapped": swapped} if swapped else {}),
            "by_steps": {str(k): v / n for k, v in sorted(main.by_steps.items())},
            **probe(model, images[spread(len(labels), PROBE_IMAGES)], s),
            "eval_seconds": round(time.perf_counter() - start, 1)}


def logged_history(run_dir: Path) -> list[dict[str, float]]:
    """Every logged step ``{"step", key: value}`` of a run from its TensorBoard events, across resumptions (a resumed
    run recomputes the steps after its checkpoint: the values written last win)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}).Reload()
    by_step: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        if tag == "train/loss_final" or tag.startswith("train/fusion_entropy"):
            for event in events.Scalars(tag):  # in write order: a recomputed step overwrites its first value
                by_step.setdefault(event.step, {"step": event.step})[tag.removeprefix("train/")] = event.value
    return [by_step[step] for step in sorted(by_step)]


def summarise_history(history: list[dict[str, float]], window: int = 10, every: int = 20) -> dict[str, Any]:
    """``loss_curve``: ``window``-step means of the final-state loss; ``final_train_loss``: its mean over the last
    10% of the steps (at least ``2 * window``); ``entropy_curve``: router entropy per block every ``every`` steps."""
    last, buckets = history[-1]["step"], {}
    for h in history:
        buckets.setdefault(-(-h["step"] // window) * window, []).append(h["loss_final"])
    tail = [h["loss_final"] for h in history if h["step"] > last - max(2 * window, last // 10)]
    return {"loss_curve": [[step, sum(v) / len(v)] for step, v in sorted(buckets.items())],
            "final_train_loss": sum(tail) / len(tail),
            "entropy_curve": [[h["step"], [h[k] for k in sorted(h) if k.startswith("fusion_entropy/block")]]
                              for h in history if "fusion_entropy" in h and h["step"] % every == 0]}


def spread(total: int, count: int | None) -> Any:
    """``count`` indices spread evenly over ``range(total)`` (all: ``None``): the test shard is sorted by class, so
    they are a class-balanced subset where the first ``count`` would hold one or two classes."""
    import torch

    return torch.arange(total) if count is None or count >= total else \
        torch.linspace(0, total - 1, count).round().long()


def probe(model: Any, images: Any, s: Settings) -> dict[str, Any]:
    """Inside the trained weights. Routers: ``router_weights[j][r]`` (mean SoftMoR weight of step ``r`` in block ``j``
    over images and tokens), ``router_entropy[j]`` (nats; ``ln R``: uniform). bViT, run to 4x its horizon:
    ``state_norms[t]`` (mean L2 norm of a token after step ``t``; 0: the embedding), ``direction_change[t]`` (mean
    ``|u_{t+1} - u_t|`` of the unit token states: the final LayerNorm sees only the direction)."""
    import torch

    from loopcore.softmor import fusion_entropy

    out: dict[str, Any] = {}
    with torch.no_grad():
        if model.fusions is not None:
            weights = model.forward_trace(images).fusion_weights
            out["router_weights"] = [w.float().mean(dim=(0, 2)).tolist() for w in weights]
            out["router_entropy"] = [float(fusion_entropy(w)) for w in weights]
        if is_bvit(s):
            states = [model.embed(images), *model.forward_trace(images, steps=4 * horizon(s),
                                                                return_step_states=True).step_states[0]]
            units = [torch.nn.functional.normalize(x.float(), dim=-1) for x in states]
            out["state_norms"] = [float(x.float().norm(dim=-1).mean()) for x in states]
            out["direction_change"] = [float((b - a).norm(dim=-1).mean()) for a, b in zip(units, units[1:])]
    return out
