"""Release artifacts: the diffusers folder layout plus provenance and a model card.

A release is ``config.json`` + ``diffusion_pytorch_model.safetensors`` (what diffusers'
``from_pretrained`` and pipelines look for, so a release folder can be a pipeline's ``vae/``),
``release.json`` (provenance: step, run, which weights, the weights file's sha256) and ``README.md``
(a model card). Written for any diffusers ``ConfigMixin`` model at the end of training;
``LoopVAE.from_pretrained(path)`` and ``RecursiveViT.from_pretrained(path)`` load them. Releases
written before the layout change hold ``model.safetensors`` and still load.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from loopdata.assets import portable_text
from loopdata.errors import one_line
from looprun.checkpoint import (
    CheckpointManager,
    CheckpointSaveError,
    check_weight_choice,
    fsync_dir,
    load_run_checkpoint,
    model_weights,
    sha256_file,
    write_durable,
    write_failure,
)
from looprun.config import RenamedKey, upgrade_renamed_keys

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"  # diffusers' SAFETENSORS_WEIGHTS_NAME
LEGACY_WEIGHTS_NAME = "model.safetensors"  # releases written before the diffusers layout
CARD_NAME = "README.md"


def release_weights_file(path: str | Path) -> Path | None:
    """The safetensors weights of the release or diffusers folder ``path`` (current name first), or ``None``."""
    for name in (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME):
        if (Path(path) / name).is_file():
            return Path(path) / name
    return None


def count_stored_parameters(model: torch.nn.Module) -> int:
    """Stored parameters (shared tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def card_front_matter(name: str, library_name: str, tags: list[str], results: list[dict[str, Any]] | None = None,
                      pipeline_tag: str | None = None, license: str = "apache-2.0") -> str:
    """The Hugging Face Hub model card's YAML front matter (``---`` block), so ``push_to_hub`` publishes ours.

    Written by ``huggingface_hub.ModelCardData`` (which checks the ``model-index`` it builds). ``results``:
    measured metrics, each ``{"task": type, "dataset": name, "type": metric id, "name": label, "value": number}``
    and optionally ``"dataset_type"``, the dataset's machine id (default: a slug of its name, e.g. ``kodak``);
    they become ``model-index`` (omitted when nothing was measured).
    """
    from huggingface_hub import EvalResult, ModelCardData

    evals = [EvalResult(task_type=r["task"], dataset_type=r.get("dataset_type") or dataset_id(r["dataset"]),
                        dataset_name=r["dataset"], metric_type=r["type"], metric_name=r["name"],
                        metric_value=round(float(r["value"]), 4)) for r in results or []]
    data = ModelCardData(library_name=library_name, license=license, tags=list(tags), pipeline_tag=pipeline_tag,
                         model_name=name if evals else None, eval_results=evals or None)
    return "---\n" + data.to_yaml() + "\n---\n"


def dataset_id(name: str) -> str:
    """A Hub-style dataset id from a human-readable set name: ``kodim21-24 (Kodak), 256²`` -> ``kodak``,
    ``40 held-out ImageNet-sample images, 256²`` -> ``imagenet-sample``; otherwise a lower-case slug."""
    lowered = name.lower()
    for known, dataset in (("kodak", "kodak"), ("imagenet-sample", "imagenet-sample"), ("imagenet", "imagenet"),
                           ("cifar-100", "cifar-100"), ("cifar100", "cifar-100"), ("cifar-10", "cifar-10"),
                           ("cifar10", "cifar-10")):
        if known in lowered:
            return dataset
    return "-".join("".join(c if c.isalnum() else " " for c in lowered).split())


def hub_identity(model: torch.nn.Module) -> tuple[str, list[str], str | None]:
    """``(library_name, tags, pipeline_tag)`` of a release: diffusers for the tokenizers, timm for the classifiers."""
    package = type(model).__module__.split(".")[0]
    if package == "srvit":  # a diffusers-layout folder loaded by srvit (and timm.create_model via its names)
        return "loopvision", ["loopvision", "srvit", "timm", "recursive-vit", "image-classification"], \
            "image-classification"
    name = type(model).__name__  # LoopVAE -> loopvae, AutoencoderKL -> autoencoderkl, AutoencoderDC -> autoencoderdc
    return "diffusers", ["loopvision", name.lower(), "vae", "image-tokenizer"], None


def render_model_card(model: torch.nn.Module, info: dict[str, Any], facts: dict[str, Any] | None = None) -> str:
    """A short model card (markdown) for a release: architecture, size, training, metrics, checksum.

    ``info`` is the release's ``release.json`` content; ``facts`` adds model-specific lines, e.g.
    ``{"MACs per image": "7.23 G at 256²", "metrics": {...}}``. Metrics the run did not measure are
    said to be missing, with the command that measures them, never left blank.
    """
    config = {k: v for k, v in dict(model.config).items() if not k.startswith("_")}
    facts = dict(facts or {})
    metrics = facts.pop("metrics", None)
    measure = facts.pop("measure_command", None)
    results = facts.pop("results", None)
    name = info.get("model_name") or type(model).__name__
    library, tags, pipeline = hub_identity(model)
    lines = [card_front_matter(name, library, tags, results, pipeline), f"# {name} release", "",
             f"* class: `{type(model).__module__.split('.')[0]}.{type(model).__name__}`; "
             f"parameters: {count_stored_parameters(model):,}"]
    lines += [f"* {key}: {value}" for key, value in facts.items()]
    training = []
    for key in ("preset", "stage", "step", "data", "run_dir", "weights"):
        if info.get(key) is not None:
            training.append(f"{key} `{info[key]}`")
    lines += [f"* training: {', '.join(training) if training else 'not recorded'}"]
    if metrics:
        lines += ["* metrics:"] + [f"  * {k}: {v}" for k, v in metrics.items()]
    else:
        lines += ["* metrics: none measured when the release was written"
                  + (f"; measure with `{measure}`" if measure else "")]
    lines += [f"* `{info.get('weights_file', WEIGHTS_NAME)}` sha256: `{info.get('sha256')}`", "",
              "## Configuration", "", "```json", json.dumps(config, indent=2, sort_keys=True, default=str), "```", "",
              f"Load: `{type(model).__name__}.from_pretrained(\"<this folder>\")` "
              f"(or as the `subfolder` of a saved diffusers pipeline).", ""]
    return "\n".join(lines)


def save_release(
    model: torch.nn.Module, directory: str | Path, provenance: dict[str, Any] | None = None,
    card_facts: dict[str, Any] | None = None,
) -> Path:
    """Atomically and durably write ``model`` (a ``ConfigMixin`` model) as a release artifact in ``directory``:
    ``config.json``, ``diffusion_pytorch_model.safetensors``, ``release.json`` (``provenance`` plus the
    weights file and its sha256) and ``README.md`` (:func:`render_model_card` with ``card_facts``).

    Written to a temporary folder (every file fsynced), then swapped in: the old release, if any, is moved
    aside and deleted only after the new one is in place. A failed write raises
    :class:`looprun.checkpoint.CheckpointSaveError` and leaves the old release as it was.
    """
    directory = Path(directory)
    tmp = directory.with_name(f".tmp-{directory.name}-{os.getpid()}")
    old = directory.with_name(f".old-{directory.name}-{os.getpid()}")
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        model.save_config(tmp)
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
        # recorded paths relative to the repository / shared data / home (loopdata.assets.portable_text)
        info = {"weights": "model", **{k: portable_text(v) if isinstance(v, str) else v
                                       for k, v in (provenance or {}).items()},
                "weights_file": WEIGHTS_NAME, "sha256": sha256_file(tmp / WEIGHTS_NAME)}
        write_durable(tmp / "release.json", json.dumps(info, indent=2, sort_keys=True))
        write_durable(tmp / CARD_NAME, render_model_card(model, info, card_facts))
        for name in ("config.json", WEIGHTS_NAME):
            with open(tmp / name, "rb+") as f:
                os.fsync(f.fileno())
        fsync_dir(tmp)
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        fsync_dir(directory.parent)
    except (OSError, RuntimeError) as err:  # safetensors / torch report a full disk as other errors too
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not directory.exists():
            os.replace(old, directory)
        raise CheckpointSaveError(
            f"release: {write_failure(directory, err)}; free disk space and rerun the same command (the finished "
            "run resumes at its last step and writes the release)"
        ) from err
    shutil.rmtree(old, ignore_errors=True)
    return directory


def artifact_class_name(path: str | Path) -> str | None:
    """The ``_class_name`` in ``path/config.json`` (a release or diffusers folder), ``None`` without one."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} holds a {type(config).__name__}, not a mapping; fix or regenerate the file")
    name = config.get("_class_name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{config_file}: key '_class_name' must be a string such as \"LoopVAE\", got {name!r}; fix "
                         "or regenerate the file")
    return name


def resolve_artifact(path: str | Path) -> Path:
    """A release folder, or a training run directory (-> its ``release/``); clear error otherwise."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    if (path / "release" / "config.json").is_file():
        return path / "release"
    raise FileNotFoundError(
        f"{path} is neither a release artifact (config.json + model.safetensors) nor a run directory with a "
        "release/ folder; train first (it is written when a run completes) or point --checkpoint / init_from at one"
    )


def check_config_types(cls: type, config: dict[str, Any], source: str | Path) -> None:
    """Raise ``ValueError`` naming ``source`` and the key when a value of ``config`` (a parsed
    ``config.json``) does not have the type of ``cls.__init__``'s default for that key (a list whose default has
    entries, such as ``block_out_channels``, must have entries too); keys annotated with several types are
    left to the constructor."""
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name not in config or param.default is inspect.Parameter.empty or param.default is None:
            continue
        annotation = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
        if "|" in annotation or "Union" in annotation or "Optional" in annotation:
            continue  # several types allowed (AutoencoderDC's block_types: a name or one per stage)
        value, default = config[name], param.default
        if isinstance(default, bool):
            ok, want = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif isinstance(default, float):
            ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        elif isinstance(default, str):
            ok, want = isinstance(value, str), "a string"
        elif isinstance(default, (tuple, list)) and default:  # e.g. block_out_channels: one entry per stage
            ok, want = isinstance(value, (list, tuple)) and len(value) > 0, "a non-empty list"
        elif isinstance(default, (tuple, list)):
            ok, want = value is None or isinstance(value, (list, tuple)), "a list"
        else:
            continue
        if not ok:
            raise ValueError(f"{source}: key {name!r} must be {want}, got {value!r}; fix or regenerate the file")


def check_weight_shapes(cls: type, config: Any, weights_file: Path) -> None:
    """Raise ``ValueError`` when ``weights_file`` (a safetensors file; only its header is read) does not hold
    the tensors, with their shapes, of the ``cls`` model ``config`` describes. The model is built on the meta
    device, so a hand-edited size (``width: 4096`` next to a tiny model's weights) is refused before gigabytes
    are allocated and initialised."""
    config_file = weights_file.parent / "config.json"
    try:
        with torch.device("meta"):
            skeleton = cls.from_config(config)
    except Exception as err:  # noqa: BLE001 - whatever the constructor raises on these values, name the file
        raise ValueError(f"{config_file} describes a {cls.__name__} that cannot be built ({one_line(err)}); fix "
                         "or regenerate the file") from None
    try:
        with safe_open(weights_file, "pt") as f:
            stored = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118
    except Exception as err:  # noqa: BLE001 - safetensors raises its own SafetensorError, or OSError
        raise ValueError(
            f"{weights_file} is not a readable safetensors file ({err}); the download or copy is damaged"
        ) from None
    expected = {key: tuple(t.shape) for key, t in skeleton.state_dict().items()}
    missing = [k for k in expected if k not in stored]
    unexpected = [k for k in stored if k not in expected]
    wrong = [f"{k} {list(stored[k])} in the file, {list(shape)} per config.json" for k, shape in expected.items()
             if k in stored and stored[k] != shape]
    if missing or unexpected or wrong:
        details = [f"missing {missing[:5]}" if missing else "", f"unexpected {unexpected[:5]}" if unexpected else "",
                   f"shapes differ: {'; '.join(wrong[:3])}" if wrong else ""]
        raise ValueError(f"{weights_file} does not match its config.json ({config_file}): "
                         f"{', '.join(d for d in details if d)}; fix or regenerate config.json")


def load_release(cls: type, path: str | Path, torch_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Build ``cls`` (a diffusers ``ConfigMixin`` model) from ``path/config.json`` and load its safetensors
    weights (``diffusion_pytorch_model.safetensors``, or a legacy ``model.safetensors``) strictly; eval mode.

    ``load_state_dict`` copies into the model's own tensors, so nothing stays mapped from the file.
    """
    path = Path(path)
    weights_file = release_weights_file(path)
    if weights_file is None:
        raise FileNotFoundError(f"{path} has no {WEIGHTS_NAME} (or legacy {LEGACY_WEIGHTS_NAME})")
    config = cls.load_config(path)
    check_weight_shapes(cls, config, weights_file)  # on the meta device: a wrong size costs no memory
    model = cls.from_config(config)
    try:
        weights = load_file(weights_file)
    except Exception as err:  # noqa: BLE001 - safetensors raises its own SafetensorError, or OSError
        raise ValueError(
            f"{weights_file} is not a readable safetensors file ({err}); the download or copy is damaged"
        ) from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{weights_file} does not match its config.json: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if torch_dtype is not None:
        model = model.to(torch_dtype)
    return model.eval()


class ReleaseLoadingMixin:
    """``from_pretrained`` for diffusers ``ModelMixin`` models that also reads release artifacts.

    Put it before ``ModelMixin`` in the bases. Loads a release artifact or any diffusers folder
    (``save_pretrained``, also a pipeline's ``subfolder``) with our strict loader, and a legacy release
    (``model.safetensors``); then copies every tensor into fresh memory:
    safetensors hands out views into the file at arbitrary byte offsets, CPU kernels take other SIMD paths
    on unaligned weights and round differently (~1e-7). Copying makes a loaded model compute
    bit-identically to the one that was saved, and releases the file mapping.
    """

    # {old key: RenamedKey}: constructor arguments that were renamed; configs with the old name still load
    RENAMED_KEYS: dict[str, RenamedKey] = {}

    @classmethod
    def upgrade_config(cls, config: Mapping[str, Any], source: str | Path = "config") -> dict[str, Any]:
        """``config`` (a ``config.json`` or keyword overrides) with renamed keys read under their new names.

        Every old key warns (``FutureWarning``) and names ``source``; models with a rename that is more
        than a new name override this and call ``super()``.
        """
        return upgrade_renamed_keys(config, cls.RENAMED_KEYS, str(source))

    @classmethod
    def load_config(cls, *args, **kwargs):
        """diffusers' ``load_config``, with renamed keys upgraded (:meth:`upgrade_config`) and a type check of
        every key against the constructor's defaults, so a hand-edited ``config.json`` fails with the file
        and key instead of deep inside ``__init__``."""
        loaded = super().load_config(*args, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        source = Path(args[0]) / "config.json" if args and Path(args[0]).is_dir() else (args[0] if args else "config")
        upgraded = cls.upgrade_config(config, source)
        config.clear()
        config.update(upgraded)
        check_config_types(cls, config, source)
        return loaded

    @classmethod
    def from_config(cls, config=None, **kwargs):
        """diffusers' ``from_config``, with renamed keys of a plain ``config`` dict upgraded first."""
        if isinstance(config, Mapping):
            config = cls.upgrade_config(config, "from_config")
        return super().from_config(config, **kwargs)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        source = Path(args[0]) if args else None
        if kwargs.get("subfolder") and source is not None:
            source = source / kwargs["subfolder"]
        plain = set(kwargs) <= {"torch_dtype", "subfolder", "local_files_only", "low_cpu_mem_usage"}
        if source is not None and plain and (source / "config.json").is_file() and release_weights_file(source):
            model = cls._from_release(source, kwargs.get("torch_dtype"))
        else:
            if importlib.util.find_spec("accelerate") is None:
                kwargs.setdefault("low_cpu_mem_usage", False)  # diffusers would warn and fall back anyway
            model = super().from_pretrained(*args, **kwargs)
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                tensor.data = tensor.data.clone()
        return model

    @classmethod
    def _from_release(cls, path: Path, torch_dtype: torch.dtype | None):
        return load_release(cls, path, torch_dtype)


@dataclass
class LoadedArtifact:
    """A model loaded by :func:`load_artifact` (eval mode) and where it came from.

    ``kind``: ``release`` (a folder with ``release.json``), ``diffusers`` (a ``save_pretrained`` folder) or
    ``run-checkpoint``; ``weights``: ``ema`` / ``model`` for run checkpoints, what ``release.json`` says for
    releases (``release`` when it says nothing); ``weights_sha256``: ``{file name: sha256}`` of what was read;
    ``info``: the parsed ``release.json`` (empty otherwise); ``run_dir``: the training run the weights come
    from, when known (a run checkpoint's run, or the parent of a run's ``release/``).
    """

    model: torch.nn.Module
    source: str
    kind: str
    weights: str
    weights_sha256: dict[str, str] = field(default_factory=dict)
    step: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None


def _weight_files(folder: Path) -> list[Path]:
    names = (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME, "diffusion_pytorch_model.bin")
    return [folder / n for n in names if (folder / n).is_file()]


def _load_folder(cls: type, path: Path, torch_dtype: torch.dtype | None) -> torch.nn.Module:
    """``cls`` from a release or diffusers folder: its own ``from_pretrained`` when it reads releases
    (:class:`ReleaseLoadingMixin`), else our strict release loader or diffusers' for plain folders."""
    if issubclass(cls, ReleaseLoadingMixin):
        return cls.from_pretrained(path, torch_dtype=torch_dtype)
    if release_weights_file(path) is not None:
        return load_release(cls, path, torch_dtype)
    return cls.from_pretrained(path, local_files_only=True, low_cpu_mem_usage=False, torch_dtype=torch_dtype)


def load_artifact(
    path: str | Path, cls: type | Sequence[type], build_from_run: Callable[[Path], torch.nn.Module] | None = None,
    weights: str = "ema", torch_dtype: torch.dtype | None = None, what: str = "model",
) -> LoadedArtifact:
    """Load the model ``path`` names: a release folder, a diffusers folder, or a training run directory.

    Args:
        path: a folder with ``config.json`` + weights (``diffusion_pytorch_model.safetensors``, a legacy
            ``model.safetensors`` or diffusers' ``.bin``), or a run directory (``config.yaml`` +
            ``checkpoints/``; its newest valid checkpoint).
        cls: the model class(es) accepted, chosen by the folder's ``_class_name``.
        build_from_run: ``run_dir -> untrained model`` as the run's ``config.yaml`` describes it (needed for
            run directories; the package knows its config schema).
        weights: for run directories: ``ema`` (default) or ``model`` (the raw training weights).
        torch_dtype: dtype to load folders in (default: as stored).
        what: the package's word for the model in error messages (``tokenizer``, ``classifier``).

    Raises ``ValueError`` (unreadable or mismatched files, another ``_class_name``) and
    ``FileNotFoundError`` (nothing loadable at ``path``), each naming the file and what to do.
    """
    path = Path(path)
    check_weight_choice(weights)
    classes = {c.__name__: c for c in ([cls] if isinstance(cls, type) else cls)}
    if (path / "config.json").is_file():
        try:
            class_name = artifact_class_name(path)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path / 'config.json'} is not valid JSON ({err})") from None
        if class_name not in classes:
            raise ValueError(f"{path / 'config.json'}: _class_name is {class_name!r}, not a {what} "
                             f"({' or '.join(classes)}); point at a {what} artifact")
        files = _weight_files(path)
        if not files:
            raise FileNotFoundError(f"{path} has a config.json but no {WEIGHTS_NAME} (or {LEGACY_WEIGHTS_NAME})")
        # every class, not only those whose load_config checks (diffusers' own fail deep inside __init__)
        check_config_types(classes[class_name], json.loads((path / "config.json").read_text()), path / "config.json")
        try:
            model = _load_folder(classes[class_name], path, torch_dtype)
        except (OSError, RuntimeError, TypeError) as err:  # diffusers' errors for unreadable weights / configs
            raise ValueError(f"cannot load the {class_name} in {path}: {one_line(err)}") from err
        info = json.loads((path / "release.json").read_text()) if (path / "release.json").is_file() else {}
        parent = path.parent if (path.parent / "config.yaml").is_file() else None
        return LoadedArtifact(model.eval(), str(path), "release" if info else "diffusers",
                              info.get("weights", "release"), {f.name: sha256_file(f) for f in files},
                              info.get("step"), info, parent)
    if (path / "config.yaml").is_file() and CheckpointManager(path / "checkpoints").list_checkpoints():
        if build_from_run is None:
            raise ValueError(f"{path} is a training run directory; pass its release/ folder instead")
        loaded, digests = load_run_checkpoint(path)
        model = build_from_run(path)
        model.load_state_dict(model_weights(loaded, weights))
        return LoadedArtifact(model.eval(), str(loaded.path), "run-checkpoint", weights, digests, loaded.step,
                              {}, path)
    if not path.exists():
        raise FileNotFoundError(missing_artifact_message(path, what))
    raise FileNotFoundError(
        f"{path} is neither a {what} release artifact (config.json + {WEIGHTS_NAME}) nor a training run directory "
        f"with config.yaml and checkpoints/; pass the --out directory of a training run or its release/ folder"
    )


def missing_artifact_message(path: str | Path, what: str = "model") -> str:
    """The error for a ``--checkpoint`` that does not exist; a Hugging Face Hub id (``org/name``) gets how to
    download it, since nothing is downloaded at run time."""
    text = str(path)
    accepted = (f"a {what} release folder or diffusers model folder (config.json + {WEIGHTS_NAME}), or a training "
                "run directory")
    parts = text.split("/")
    if len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and " " not in text:
        return (f"{text} does not exist here and looks like a Hugging Face Hub id: nothing is downloaded at run time. "
                f"Download it first (`hf download {text} --local-dir {parts[1]}`, or huggingface_hub's "
                f"snapshot_download; a pipeline's VAE is its vae/ subfolder) and pass the local folder; accepted: "
                f"{accepted}")
    return f"{text} does not exist; pass {accepted}"
