"""Release artifacts: ``config.json`` + ``model.safetensors`` (+ ``release.json`` provenance).

``LoopVAE.from_pretrained(path)`` loads them (as well as diffusers' own ``save_pretrained`` folders).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

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


def resolve_artifact(path: str | Path) -> Path:
    """A release folder, or a training run directory (-> its ``release/``); clear error otherwise."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    if (path / "release" / "config.json").is_file():
        return path / "release"
    raise FileNotFoundError(
        f"{path} is neither a release artifact (config.json + model.safetensors) nor a run directory with a "
        "release/ folder; train stage 1 first or point init_from / --checkpoint at its output"
    )
