"""Release artifacts: ``config.json`` + ``model.safetensors`` (+ ``release.json`` provenance).

Written for any diffusers ``ConfigMixin`` model at the end of training; ``LoopVAE.from_pretrained(path)``
and ``RecursiveViT.from_pretrained(path)`` load them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from loopcore.checkpoint import sha256_file

WEIGHTS_NAME = "model.safetensors"


def save_release(model: torch.nn.Module, directory: str | Path, provenance: dict[str, Any] | None = None) -> Path:
    """Atomically write ``model`` (a ``ConfigMixin`` model) as a release artifact in ``directory``."""
    directory = Path(directory)
    tmp = directory.with_name(f".tmp-{directory.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_config(tmp)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
    info = {"weights": WEIGHTS_NAME, "sha256": sha256_file(tmp / WEIGHTS_NAME), **(provenance or {})}
    (tmp / "release.json").write_text(json.dumps(info, indent=2, sort_keys=True))
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def artifact_class_name(path: str | Path) -> str | None:
    """The ``_class_name`` in ``path/config.json`` (a release or diffusers folder), ``None`` without one."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return None
    return json.loads(config_file.read_text()).get("_class_name")


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


def load_release(cls: type, path: str | Path, torch_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Build ``cls`` (a diffusers ``ConfigMixin`` model) from ``path/config.json`` and load
    ``path/model.safetensors`` strictly; returns it in eval mode.

    ``load_state_dict`` copies into the model's own tensors, so nothing stays mapped from the file.
    """
    path = Path(path)
    model = cls.from_config(cls.load_config(path))
    missing, unexpected = model.load_state_dict(load_file(path / WEIGHTS_NAME), strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path / WEIGHTS_NAME} does not match its config.json: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if torch_dtype is not None:
        model = model.to(torch_dtype)
    return model.eval()


class ReleaseLoadingMixin:
    """``from_pretrained`` for diffusers ``ModelMixin`` models that also reads release artifacts.

    Put it before ``ModelMixin`` in the bases. Loads a diffusers folder (``save_pretrained``) or a release
    artifact (``config.json`` + ``model.safetensors``), then copies every tensor into fresh memory:
    safetensors hands out views into the file at arbitrary byte offsets, CPU kernels take other SIMD paths
    on unaligned weights and round differently (~1e-7). Copying makes a loaded model compute
    bit-identically to the one that was saved, and releases the file mapping.
    """

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        source = Path(args[0]) if args else None
        if source is not None and (source / WEIGHTS_NAME).is_file() and not any(
            (source / name).is_file() for name in ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")
        ):
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
