"""``loopvae compare``: tokenizers compared with the seed as the unit, on the same images, under one protocol.

Each *arm* is a named list of checkpoints: the seeds of one configuration (LoopVAE releases or runs, diffusers
``AutoencoderKL`` / ``AutoencoderDC`` folders, anything :func:`loopvae.loading.load_tokenizer` reads). Every
checkpoint is evaluated by ``loopvae eval``'s protocol (posterior mode, or the latent of a deterministic
autoencoder; uint8 outputs; per-image PSNR and SSIM) on the same images, and:

* an arm's PSNR / SSIM is the mean over its seeds of each seed's per-image mean;
* a comparison ``a - b`` is made on the per-seed values: **paired** by seed when the two arms' i-th checkpoints
  record the same training seed, data, crop and batch (they saw the same crops in the same order), **Welch**
  otherwise; 95% t-interval, p-value, and Holm's correction over the family of comparisons of each metric
  (PSNR, SSIM); verdicts better / worse / inconclusive from the adjusted p-value. One seed per arm gives no
  interval and no verdict;
* per-image differences (seed-averaged) are reported as *descriptive* intervals without a verdict word: images
  within one run are not independent replications of a training run; the *null rows* (two seeds of one arm
  compared by image) show how often such an interval would call identical configurations different;
* a bicubic row keeps at least as many values per pixel as the largest latent among the arms.

Outputs: ``compare.json`` (the contract: ``arms``, ``bicubic``, ``comparisons``, ``protocol``, plus per-image
tables), ``compare.md`` and ``compare.png`` (PSNR against GMACs).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from loopcore.flops import count_macs, count_parameters
from looprun.checkpoint import write_atomic
from looprun.plotting import plot_or_warn, pyplot
from looprun.statistics import Difference, apply_holm, paired_difference, welch_difference

from .autoencoders import encode_mode, latent_values_per_pixel
from .evaluate import EvalOptions, evaluate
from .loading import load_tokenizer
from .registry import LATENT_CONFIG_KEYS

log = logging.getLogger("loopvae.compare")

METRICS = ("psnr", "ssim")
PAIRINGS = ("auto", "paired", "welch")
# release.json keys that fix a run's data order and augmentation draws
ORDER_KEYS = ("seed", "data", "resolution", "batch_size", "grad_accum_steps", "world_size", "scale_jitter", "hflip")
# keys that also fix the order (the loader splits an epoch's batches over max(num_workers, 1) workers) but that older
# release.json files lack: compared where both checkpoints record them
OPTIONAL_ORDER_KEYS = ("num_workers",)


@dataclass
class CompareOptions:
    resolution: int = 256
    limit: int | None = None
    batch_size: int = 8
    num_workers: int = 2
    lpips_net: str = "none"  # "alex" / "vgg" adds LPIPS per image when its weights are present
    lpips_weights: str | None = None
    fid_weights: str | None = None
    device: str = "auto"
    pairing: str = "auto"  # auto | paired | welch
    pairs: list[tuple[str, str]] | None = None  # the comparison family (default: every pair, in arm order)
    confidence: float = 0.95
    progress: bool = True
    weights: str = "ema"
    skip_corrupt: bool = False
    preprocess: str = "resize-crop"  # or "adm" (see loopvae eval --preprocess)
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in protocol (e.g. the study's budget)


ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_arm_name(name: str, spec: str | None = None) -> str:
    """``name`` if it can be a folder name under ``--out`` (``OUT/evals/<name>/``): letters, digits, ``.``, ``_``
    and ``-``, starting with a letter or digit (no ``/``, ``..``, absolute paths or ``:``); ``ValueError`` naming
    it otherwise."""
    if not ARM_NAME.fullmatch(name):
        where = f"--arm {spec!r}" if spec is not None else f"arm {name!r}"
        raise ValueError(f"{where}: the arm name {name!r} becomes a folder under --out (OUT/evals/<name>/); use "
                         "letters, digits, '.', '_' and '-', starting with a letter or digit")
    return name


def parse_arm(spec: str) -> tuple[str, list[str]]:
    """``NAME=PATH[,PATH...]`` -> ``(NAME, [PATH, ...])``; ``ValueError`` naming the spec otherwise (a malformed
    spec, or a NAME that is not a plain folder name: :func:`check_arm_name`)."""
    name, sep, paths = spec.partition("=")
    items = [p.strip() for p in paths.split(",") if p.strip()]
    if not sep or not name.strip() or not items:
        raise ValueError(f"--arm {spec!r}: expected NAME=PATH[,PATH...] (the seeds of one arm, comma-separated)")
    return check_arm_name(name.strip(), spec), items


def parse_pair(spec: str) -> tuple[str, str]:
    """``A:B`` -> ``("A", "B")`` (the comparison ``A - B``)."""
    a, sep, b = spec.partition(":")
    if not sep or not a or not b:
        raise ValueError(f"--compare {spec!r}: expected A:B, two arm names (the comparison A - B)")
    return a, b


def _eval_dir(out: Path, arm: str, index: int, checkpoint: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(checkpoint).name or "checkpoint")
    return out / "evals" / check_arm_name(arm) / f"{index}-{safe}"


def _eval_options(options: CompareOptions) -> EvalOptions:
    """The ``loopvae eval`` options every checkpoint of a comparison is evaluated with."""
    return EvalOptions(
        resolution=options.resolution, limit=options.limit, batch_size=options.batch_size,
        num_workers=options.num_workers, fid_weights=options.fid_weights, lpips_net=options.lpips_net,
        lpips_weights=options.lpips_weights, device=options.device, progress=options.progress,
        weights=options.weights, skip_corrupt=options.skip_corrupt, grid_images=4, preprocess=options.preprocess)


def metric_weights(options: EvalOptions) -> dict[str, str]:
    """The sha256 of the LPIPS backbone and FID Inception files an evaluation with ``options`` would use, under
    the names ``metrics.json`` records them (``lpips/<file>``, ``inception/<file>``); absent files are left out,
    as the evaluation leaves them out (it reports ``lpips`` / ``rfid`` as null)."""
    from looprun.checkpoint import sha256_file

    from .metrics import default_inception_path
    from .perceptual import default_backbone_path

    found = {}
    if options.lpips_net != "none" and not options.lpips_random_backbone:
        path = Path(options.lpips_weights) if options.lpips_weights else default_backbone_path(options.lpips_net)
        if path.is_file():
            found[f"lpips/{path.name}"] = sha256_file(path)
    path = Path(options.fid_weights) if options.fid_weights else default_inception_path()
    if path.is_file():
        found[f"inception/{path.name}"] = sha256_file(path)
    return found


@dataclass
class ReuseKey:
    """What an earlier evaluation in a comparison's ``evals/`` must have recorded to be reused: the data
    specification and identity (:mod:`loopdata.identity`: shard sizes and times, folder file lists), every
    setting (:func:`loopvae.evaluate.eval_settings`), the preprocessing and the sha256 of every weights file
    (the checkpoint's, LPIPS's and Inception's)."""

    data: str
    identity: list[dict[str, Any]]
    options: EvalOptions
    preprocessing: dict[str, Any]
    metric_weights: dict[str, str]
    device: str


def _reuse_problem(old: dict[str, Any], key: ReuseKey, kind: str, weights: dict[str, str]) -> str | None:
    """Why the evaluation recorded in ``old`` (its ``metrics.json``) cannot be reused for a checkpoint of ``kind``
    with weight files ``weights``, or ``None`` when it can."""
    from loopdata.identity import first_set_difference

    from .evaluate import eval_settings

    data = old.get("data") or {}
    if data.get("urls") != key.data:
        return f"it evaluated --data {data.get('urls')!r}"
    if not isinstance(data.get("identity"), list):
        return "it records no identity of its data (an older loopvae eval)"
    changed = first_set_difference(data["identity"], key.identity)
    if changed is not None:
        return f"the data changed since ({changed})"
    settings = eval_settings(key.options, kind, key.device)
    recorded = old.get("settings") or {}
    differs = sorted(k for k in settings if recorded.get(k, "<not recorded>") != settings[k])
    if differs:
        return "other settings (" + ", ".join(f"{k}: {recorded.get(k, '<not recorded>')!r} then, "
                                               f"{settings[k]!r} now" for k in differs) + ")"
    if old.get("preprocessing") != key.preprocessing:
        return "other preprocessing"
    expected = {**{f"model/{k}": v for k, v in weights.items()}, **key.metric_weights}
    if old.get("weights_sha256") != expected:
        return "other weights files (checkpoint, LPIPS or Inception)"
    return None


def _evaluate_once(checkpoint: str, data: str, target: Path, key: ReuseKey, kind: str,
                   weights: dict[str, str]) -> dict[str, Any]:
    """``loopvae eval`` of one checkpoint into ``target``; an earlier result there is reused (a long comparison
    resumes) when it was made with the same weights (the files' sha256 and the ``--weights`` choice), on the same
    data (specification and identity) with the same settings (:func:`_reuse_problem`)."""
    metrics_file = target / "metrics.json"
    if metrics_file.is_file() and (target / "per_image.json").is_file():
        try:
            old = json.loads(metrics_file.read_text())
        except (OSError, ValueError):
            old = None
        problem = "its metrics.json is unreadable" if not isinstance(old, dict) else _reuse_problem(
            old, key, kind, weights)
        if problem is None:
            log.info("reusing the evaluation in %s", target)
            return old
        log.info("evaluating %s again in %s: %s", checkpoint, target, problem)
    return evaluate(checkpoint, data, target, key.options)


def _architecture(checkpoint: str, resolution: int, weights: str, loaded: Any = None) -> dict[str, Any]:
    """Class, parameters, GMACs at ``resolution``^2 (batch 1, meta device), values per latent pixel, and what
    the checkpoint's ``release.json`` says about its training order (seed, data, crop, batch)."""
    loaded = loaded if loaded is not None else load_tokenizer(checkpoint, weights)
    model = loaded.model
    with torch.device("meta"):
        twin = type(model).from_config(model.config)
        x = torch.empty(1, 3, resolution, resolution)
    macs = count_macs(lambda: twin.decode(encode_mode(twin, x)))
    info = {}
    release = Path(loaded.source) / "release.json" if Path(loaded.source).is_dir() else None
    if release is not None and release.is_file():
        info = json.loads(release.read_text())
    elif loaded.kind == "run-checkpoint":
        from .train_config import load_train_config

        run = Path(checkpoint)
        cfg = load_train_config(str(run / "config.yaml"))
        info = {"seed": cfg.seed, "resolution": cfg.resolution, "batch_size": cfg.batch_size,
                "grad_accum_steps": cfg.grad_accum_steps, "scale_jitter": list(cfg.scale_jitter), "hflip": cfg.hflip,
                "num_workers": cfg.num_workers}
    order = {k: info[k] for k in ORDER_KEYS + OPTIONAL_ORDER_KEYS if k in info}
    # the architecture (latent normalisation may differ between seeds; tuples and lists are the same here)
    config = json.loads(json.dumps({k: v for k, v in dict(model.config).items()
                                    if not k.startswith("_") and k not in LATENT_CONFIG_KEYS}, default=list))
    return {"class": type(model).__name__, "params": count_parameters(model), "gmacs": macs / 1e9,
            "values_per_pixel": latent_values_per_pixel(model), "order": order, "config": config,
            "step": loaded.step}


def _same_order(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether every i-th checkpoint of two arms trained on the same crops in the same order (all of
    :data:`ORDER_KEYS` recorded and equal, and :data:`OPTIONAL_ORDER_KEYS` equal where both record them;
    ``num_workers`` 0 and 1 load alike)."""
    def optional(order: dict[str, Any], k: str) -> Any:
        return max(int(order[k]), 1) if k == "num_workers" else order[k]

    return len(a) == len(b) and all(
        set(ORDER_KEYS) <= set(x["order"]) and set(ORDER_KEYS) <= set(y["order"])
        and all(x["order"][k] == y["order"][k] for k in ORDER_KEYS)
        and all(optional(x["order"], k) == optional(y["order"], k) for k in OPTIONAL_ORDER_KEYS
                if k in x["order"] and k in y["order"])
        for x, y in zip(a, b, strict=True))


def _seed_difference(a: list[float], b: list[float], paired: bool, confidence: float) -> Difference:
    return paired_difference(a, b, confidence) if paired else welch_difference(a, b, confidence)


@dataclass
class SeedEvaluation:
    """One checkpoint of an arm, evaluated: its per-image rows (``key``, ``shard``, ``psnr``, ``ssim``,
    ``bicubic_psnr``, ``bicubic_ssim``; sorted by shard and key) and its architecture facts
    (:func:`_architecture`: ``class``, ``params``, ``gmacs``, ``values_per_pixel``, ``order``, ``step``)."""

    checkpoint: str
    rows: list[dict[str, Any]]
    arch: dict[str, Any]
    lpips: float | None = None
    low_resolution: list[int] | None = None


def check_arms(arms: dict[str, list[str]]) -> None:
    """Refuse arm names that are not plain folder names and a checkpoint path listed twice in one arm (it would
    count as two seeds)."""
    if len(arms) < 1:
        raise ValueError("loopvae compare needs at least one --arm")
    for name, checkpoints in arms.items():
        check_arm_name(name)
        if not checkpoints:
            raise ValueError(f"--arm {name}: no checkpoints")
        seen: dict[str, str] = {}
        for ckpt in checkpoints:
            real = os.path.realpath(ckpt)
            if real in seen:
                also = "" if seen[real] == ckpt else f" (also as {seen[real]})"
                raise ValueError(f"--arm {name}: {ckpt} is listed twice{also}; an arm's checkpoints are its seeds: "
                                 "list each checkpoint once")
            seen[real] = ckpt


def _check_distinct_weights(name: str, checkpoints: list[str], digests: list[dict[str, str]]) -> None:
    """Refuse two checkpoints of one arm with the same weights (a copy of a checkpoint is not another seed)."""
    seen: dict[tuple[str, ...], str] = {}
    for ckpt, digest in zip(checkpoints, digests, strict=True):
        key = tuple(sorted(digest.values()))
        if key and key in seen:
            raise ValueError(f"--arm {name}: {ckpt} holds the same weights (sha256) as {seen[key]}; an arm's "
                             "checkpoints are its seeds: a copy of a checkpoint is not another seed, list it once")
        seen[key] = ckpt


def compare(arms: dict[str, list[str]], data: str, out_dir: str | Path, options: CompareOptions) -> dict[str, Any]:
    """Evaluate every checkpoint of every arm on ``data`` and write ``compare.json`` / ``compare.md`` /
    ``compare.png`` and ``side_by_side.png`` (a row per image, a column per arm plus the reference) to ``out_dir``.
    Returns the ``compare.json`` content.

    The arms, the data and every checkpoint are checked before ``out_dir`` is created: arm names must be plain
    folder names, and no checkpoint (by path or by the sha256 of its weights) may appear twice in one arm."""
    from loopdata.identity import data_identity
    from loopdata.shards import canonical_urls
    from loopdata.transforms import describe_preprocessing, make_options
    from looprun.distributed import resolve_device
    from looprun.output_dir import prepare_output_dir

    check_arms(arms)
    check_pairs(list(arms), options)
    identity = data_identity(canonical_urls(data))  # before anything is read: a change later is detected
    eval_options = _eval_options(options)
    preprocessing = describe_preprocessing(make_options("reconstruction", preprocess=options.preprocess),
                                           options.resolution)
    key = ReuseKey(data, identity, eval_options, preprocessing, metric_weights(eval_options),
                   resolve_device(options.device).type)
    # every checkpoint loaded once first: its checksums, kind and architecture (a bad one stops the comparison
    # before any evaluation, and a duplicated one is refused)
    facts: dict[str, list[tuple[dict[str, str], str, dict[str, Any]]]] = {}
    for name, checkpoints in arms.items():
        facts[name] = []
        for ckpt in checkpoints:
            loaded = load_tokenizer(ckpt, options.weights)
            facts[name].append((dict(loaded.weights_sha256), loaded.kind,
                                _architecture(ckpt, options.resolution, options.weights, loaded)))
            del loaded
        _check_distinct_weights(name, checkpoints, [f[0] for f in facts[name]])
    out = prepare_output_dir(out_dir, "--out")
    from looprun.run_lock import RunLock

    lock = RunLock(out, "loopvae compare")  # a second comparison (or eval) into this --out fails at once
    try:
        return _compare_locked(arms, data, out, options, key, facts, identity, preprocessing)
    finally:
        lock.release()


def _compare_locked(arms: dict[str, list[str]], data: str, out: Path, options: CompareOptions, key: ReuseKey,
                    facts: dict[str, list[tuple[dict[str, str], str, dict[str, Any]]]], identity: Any,
                    preprocessing: dict[str, Any]) -> dict[str, Any]:
    from looprun.run_logger import console_messages_once

    evaluated: dict[str, list[SeedEvaluation]] = {}
    with console_messages_once():  # one "rFID unavailable" line on the console, not one per checkpoint
        _evaluate_arms(arms, data, out, key, facts, identity, evaluated)
    protocol = {"data": data, "resolution": options.resolution, "limit": options.limit, "weights": options.weights,
                "preprocessing": preprocessing}
    result = summarise(evaluated, options, protocol)
    write_outputs(result, out)
    from .side_by_side import side_by_side

    # every arm's first checkpoint on the first images, one picture: the tables' numbers made visible
    side_by_side({name: checkpoints[0] for name, checkpoints in arms.items()}, data, out / "side_by_side.png",
                 resolution=options.resolution, weights=options.weights, preprocess=options.preprocess)
    return result


def _evaluate_arms(arms: dict[str, list[str]], data: str, out: Path, key: ReuseKey,
                   facts: dict[str, list[tuple[dict[str, str], str, dict[str, Any]]]], identity: Any,
                   evaluated: dict[str, list[SeedEvaluation]]) -> None:
    """Evaluate (or reuse) every checkpoint of every arm into ``evaluated``; stop if ``data`` changes meanwhile."""
    from loopdata.identity import first_set_difference

    for name, checkpoints in arms.items():
        evaluated[name] = []
        for i, ckpt in enumerate(checkpoints):
            log.info("arm %s, checkpoint %d/%d: %s", name, i + 1, len(checkpoints), ckpt)
            target = _eval_dir(out, name, i, ckpt)
            weights, kind, arch = facts[name][i]
            metrics = _evaluate_once(ckpt, data, target, key, kind, weights)
            changed = first_set_difference(metrics["data"]["identity"], identity)
            if changed is not None:  # the data was rewritten while the comparison ran
                raise ValueError(f"--data {data} changed while loopvae compare ran ({changed}); rerun it so that "
                                 "every checkpoint is evaluated on the same images")
            rows = sorted(json.loads((target / "per_image.json").read_text()), key=lambda r: (r["shard"], r["key"]))
            evaluated[name].append(SeedEvaluation(ckpt, rows, arch, metrics["lpips"],
                                                  metrics["baseline"]["low_resolution"]))


def check_pairs(names: list[str], options: CompareOptions) -> None:
    """Refuse an unknown pairing mode or a comparison naming an arm that is not there."""
    if options.pairing not in PAIRINGS:
        raise ValueError(f"--pairing {options.pairing!r}: choose one of {', '.join(PAIRINGS)}")
    for a, b in options.pairs or []:
        for name in (a, b):
            if name not in names:
                raise ValueError(f"--compare {a}:{b}: no arm named {name!r} (arms: {', '.join(names)})")


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """``compare.json``, ``compare.md`` and (with matplotlib) ``compare.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "compare.json", json.dumps(result, indent=1, allow_nan=False))
    write_atomic(out / "compare.md", render_markdown(result))
    plot_or_warn(plot_psnr_vs_gmacs, result, out / "compare.png", log=log)


def summarise(evaluated: dict[str, list[SeedEvaluation]], options: CompareOptions,
              protocol: dict[str, Any]) -> dict[str, Any]:
    """The ``compare.json`` content from evaluated checkpoints (no model is run here: a study can rebuild its
    comparison from committed per-image numbers). ``protocol`` gives ``data``, ``resolution``, ``limit`` and
    anything else to record."""
    check_pairs(list(evaluated), options)
    arms = {name: [e.checkpoint for e in seeds] for name, seeds in evaluated.items()}
    archs = {name: [e.arch for e in seeds] for name, seeds in evaluated.items()}
    per_image = {name: [e.rows for e in seeds] for name, seeds in evaluated.items()}
    pairs = options.pairs if options.pairs is not None else list(itertools.combinations(arms, 2))
    for name, seeds in evaluated.items():
        first = {k: v for k, v in seeds[0].arch.items() if k in ("class", "config")}
        for e in seeds[1:]:
            if {k: e.arch.get(k) for k in first} != first:
                raise ValueError(f"arm {name}: {e.checkpoint} is another architecture than {seeds[0].checkpoint} "
                                 f"({e.arch['class']} vs {first['class']}); an arm's checkpoints are seeds of one "
                                 "configuration")
    reference_keys = [(r["shard"], r["key"]) for r in next(iter(per_image.values()))[0]]
    for name, seeds in evaluated.items():
        for e in seeds:
            if [(r["shard"], r["key"]) for r in e.rows] != reference_keys:
                raise RuntimeError(f"arm {name}: {e.checkpoint} was evaluated on other images than the first arm's; "
                                   "every checkpoint must see the same images")

    result_arms = []
    for name, seeds in evaluated.items():
        per_seed = [{"checkpoint": e.checkpoint, "psnr": statistics.fmean(r["psnr"] for r in e.rows),
                     "ssim": statistics.fmean(r["ssim"] for r in e.rows), "lpips": e.lpips, "step": e.arch.get("step"),
                     "seed": e.arch["order"].get("seed")} for e in seeds]
        arch = seeds[0].arch
        result_arms.append({
            "name": name, "checkpoints": arms[name], "class": arch["class"], "params": arch["params"],
            "gmacs": arch["gmacs"], "values_per_pixel": arch["values_per_pixel"],
            "psnr": statistics.fmean(s["psnr"] for s in per_seed),
            "ssim": statistics.fmean(s["ssim"] for s in per_seed),
            "psnr_sd": statistics.stdev([s["psnr"] for s in per_seed]) if len(per_seed) > 1 else None,
            "ssim_sd": statistics.stdev([s["ssim"] for s in per_seed]) if len(per_seed) > 1 else None,
            "per_seed": per_seed,
        })
    # bicubic at >= the largest latent's values per pixel
    widest = max(arms, key=lambda n: archs[n][0]["values_per_pixel"])
    rows0 = per_image[widest][0]
    bicubic = {"psnr": statistics.fmean(r["bicubic_psnr"] for r in rows0),
               "ssim": statistics.fmean(r["bicubic_ssim"] for r in rows0),
               "values_per_pixel": archs[widest][0]["values_per_pixel"],
               "low_resolution": evaluated[widest][0].low_resolution}
    by_name = {a["name"]: a for a in result_arms}
    comparisons, descriptive = [], []
    for metric in METRICS:
        family = []
        for a, b in pairs:
            paired = {"paired": True, "welch": False}.get(options.pairing, _same_order(archs[a], archs[b]))
            if paired and len(arms[a]) != len(arms[b]):
                raise ValueError(f"--pairing paired: arms {a} ({len(arms[a])} checkpoints) and {b} "
                                 f"({len(arms[b])}) cannot be paired by seed")
            values_a = [s[metric] for s in by_name[a]["per_seed"]]
            values_b = [s[metric] for s in by_name[b]["per_seed"]]
            family.append(((a, b), _seed_difference(values_a, values_b, paired, options.confidence)))
            d = paired_difference(_image_means(per_image[a], metric), _image_means(per_image[b], metric),
                                  options.confidence)
            descriptive.append({"a": a, "b": b, "metric": metric, "diff": d.mean, "ci": [d.low, d.high], "n": d.n,
                                "wins": d.wins, "note": "by image, seed-averaged: descriptive, no verdict"})
        apply_holm([d for _, d in family])
        for (a, b), d in family:
            comparisons.append({"a": a, "b": b, "metric": metric, "diff": d.mean, "ci": [d.low, d.high], "n": d.n,
                                "n_a": len(arms[a]), "n_b": len(arms[b]), "test": d.test, "p": d.p,
                                "p_holm": d.p_adjusted, "family_size": len(family), "verdict": d.verdict})
    null_rows = []
    for name, runs in per_image.items():
        for (i, x), (j, y) in itertools.combinations(list(enumerate(runs)), 2):
            d = paired_difference([r["psnr"] for r in x], [r["psnr"] for r in y], options.confidence)
            null_rows.append({"arm": name, "a": arms[name][i], "b": arms[name][j], "metric": "psnr", "diff": d.mean,
                              "ci": [d.low, d.high], "n": d.n, "wins": d.wins,
                              "excludes_zero": bool(d.low is not None and (d.low > 0 or d.high < 0))})
    keys = [k for _, k in reference_keys]
    return {
        "arms": result_arms, "bicubic": bicubic, "comparisons": comparisons,
        "per_image_differences": descriptive, "null_rows": null_rows,
        "per_image": {"keys": keys, "shards": [s for s, _ in reference_keys],
                      "psnr": {n: _image_means(per_image[n], "psnr") for n in arms},
                      "ssim": {n: _image_means(per_image[n], "ssim") for n in arms},
                      "bicubic_psnr": [r["bicubic_psnr"] for r in rows0]},
        "num_images": len(keys),
        "protocol": {
            **protocol,
            "latent": "posterior mode (AutoencoderKL, LoopVAE); the deterministic latent (AutoencoderDC)",
            "outputs": "clamped to [-1, 1] and quantised to uint8 before every metric",
            "psnr": "mean over images of per-image PSNR (dB)", "ssim": "Gaussian window 11x11, sigma 1.5",
            "arm_value": "mean over the arm's seeds of each seed's per-image mean",
            "unit_of_verdict": "the seed (checkpoint); per-image intervals are descriptive only",
            "pairing": (f"{options.pairing}: paired t by seed when both arms' i-th checkpoints record the same "
                        f"{', '.join(ORDER_KEYS)} (same crops in the same order); Welch t otherwise"),
            "confidence": options.confidence,
            "multiplicity": "Holm over the listed comparisons, separately for PSNR and SSIM; verdict from the "
                            "adjusted p-value at 1 - confidence",
            "bicubic": f"bicubic down/up-sampling keeping >= {bicubic['values_per_pixel']:g} values per pixel "
                       "(the largest latent among the arms)",
            "macs": f"encode (mode) + decode of one {protocol['resolution']}² image, batch 1, torch.utils.flop_counter",
            **options.extra,
        },
    }


def _image_means(runs: list[list[dict[str, Any]]], metric: str) -> list[float]:
    """Per image, the mean over seeds of ``metric``."""
    return [statistics.fmean(run[i][metric] for run in runs) for i in range(len(runs[0]))]


def _ci(ci: list[float | None], digits: int = 2) -> str:
    return "–" if ci[0] is None else f"[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"


def render_markdown(result: dict[str, Any]) -> str:
    """``compare.md``: arms, bicubic, seed-level verdicts, descriptive per-image differences and null rows."""
    p = result["protocol"]
    lines = ["# Tokenizer comparison", "",
             f"{result['num_images']} images from `{p['data']}` at {p['resolution']}²; {p['latent']}; "
             f"{p['outputs']}. Unit of every verdict: {p['unit_of_verdict']}.", "",
             "| arm | class | seeds | params | GMACs | PSNR (dB) | seed s.d. | SSIM | seed s.d. |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for a in result["arms"]:
        sd_p = "–" if a["psnr_sd"] is None else f"{a['psnr_sd']:.3f}"
        sd_s = "–" if a["ssim_sd"] is None else f"{a['ssim_sd']:.4f}"
        lines.append(f"| {a['name']} | {a['class']} | {len(a['checkpoints'])} | {a['params']:,} | {a['gmacs']:.2f} | "
                     f"{a['psnr']:.2f} | {sd_p} | {a['ssim']:.4f} | {sd_s} |")
    b = result["bicubic"]
    lines += [f"| bicubic ({b['values_per_pixel']:g} values/px) | – | – | 0 | – | {b['psnr']:.2f} | – | "
              f"{b['ssim']:.4f} | – |", "", "## Seed-level comparisons", "",
              f"{p['pairing']}. {p['multiplicity']}.", "",
              "| a − b | metric | diff | 95% CI | test | n | p | p (Holm) | verdict |",
              "|---|---|---:|---|---|---:|---:|---:|---|"]
    for c in result["comparisons"]:
        digits = 2 if c["metric"] == "psnr" else 4
        pv = "–" if c["p"] is None else f"{c['p']:.3g}"
        ph = "–" if c["p_holm"] is None else f"{c['p_holm']:.3g}"
        test = c["test"] if c["ci"][0] is not None else "–"  # no interval (one checkpoint per arm): no test ran
        lines.append(f"| {c['a']} − {c['b']} | {c['metric']} | {c['diff']:+.{digits}f} | {_ci(c['ci'], digits)} | "
                     f"{test} | {c['n_a']} vs {c['n_b']} | {pv} | {ph} | **{c['verdict']}** |")
    lines += ["", "## Per image (descriptive, no verdicts)", "",
              "Seed-averaged per-image differences with a t-interval over images: images are not replications of a "
              "training run, so these intervals describe where the difference lies, not whether it would survive "
              "another seed.", "", "| a − b | metric | mean | interval over images | images a > b |",
              "|---|---|---:|---|---:|"]
    for d in result["per_image_differences"]:
        digits = 2 if d["metric"] == "psnr" else 4
        lines.append(f"| {d['a']} − {d['b']} | {d['metric']} | {d['diff']:+.{digits}f} | {_ci(d['ci'], digits)} | "
                     f"{d['wins']}/{d['n']} |")
    if result["null_rows"]:
        lines += ["", "## Null rows: two seeds of one arm, compared by image", "",
                  "Identical configurations; an interval over images that excludes 0 here is what a by-image "
                  "verdict between two single runs would wrongly call a difference.", "",
                  "| arm | seed a − seed b | PSNR diff | interval over images | excludes 0 |", "|---|---|---:|---|---|"]
        for r in result["null_rows"]:
            lines.append(f"| {r['arm']} | `{r['a']}` − `{r['b']}` | {r['diff']:+.3f} | {_ci(r['ci'], 3)} | "
                         f"{'yes' if r['excludes_zero'] else 'no'} |")
    lines += ["", "![PSNR against GMACs](compare.png)", "",
              "Each arm's first checkpoint on the first images (centre crops; reference first):", "",
              "![side by side](side_by_side.png)", ""]
    return "\n".join(lines)


def plot_psnr_vs_gmacs(result: dict[str, Any], path: Path) -> None:
    """Each arm's seeds (small points) and mean (large point) at its GMACs; bicubic as a line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, arm in enumerate(result["arms"]):
        xs = [arm["gmacs"]] * len(arm["per_seed"])
        ax.scatter(xs, [s["psnr"] for s in arm["per_seed"]], s=14, color=f"C{i}", alpha=0.6)
        ax.scatter([arm["gmacs"]], [arm["psnr"]], s=70, color=f"C{i}",
                   label=f"{arm['name']} ({arm['params'] / 1e6:.2f}M params)")
    ax.axhline(result["bicubic"]["psnr"], color="grey", ls="--", label="bicubic")
    ax.set(xlabel=f"GMACs per {result['protocol']['resolution']}² reconstruction", ylabel="PSNR (dB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
