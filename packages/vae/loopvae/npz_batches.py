"""Image batches as ``.npz`` files in the layout of ADM's evaluator (guided-diffusion ``evaluations/evaluator.py``):
one array ``arr_0`` of uint8 images ``(N, H, W, 3)``, what it reads for a sample batch and a reference batch.

``loopvae eval --save-npz`` writes ``reconstructions.npz`` and ``references.npz`` (same order, listed in
``keys.json``). Under torchrun every rank first writes its own part as ``.npy``; rank 0 then streams the parts into
the ``.npz`` (an uncompressed zip member), so no process holds more than its own images.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np


def save_part(images: list[np.ndarray], path: Path) -> Path:
    """``images``: uint8 batches ``(B, H, W, 3)`` -> one ``.npy`` part (an empty ``(0, 0, 0, 3)`` without images)."""
    array = np.concatenate(images) if images else np.zeros((0, 0, 0, 3), dtype=np.uint8)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"expected uint8 images (N, H, W, 3), got {array.dtype} {array.shape}")
    np.save(path, array)
    return path


def merge_parts(parts: list[Path], target: Path) -> tuple[int, ...]:
    """Concatenate ``.npy`` parts (uint8 ``(n_i, H, W, 3)``) into ``target`` (``.npz`` with ``arr_0``), streaming
    one part at a time. Returns the final shape; the parts are removed."""
    arrays = [np.load(p, mmap_mode="r") for p in parts]
    shapes = {a.shape[1:] for a in arrays if a.shape[0] > 0}
    if len(shapes) > 1:
        raise ValueError(f"parts of different image shapes {sorted(shapes)}: {parts}")
    tail = shapes.pop() if shapes else (0, 0, 3)
    shape = (sum(a.shape[0] for a in arrays), *tail)
    tmp = target.with_name(f".{target.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        with zf.open("arr_0.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_2_0(
                member, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False,
                         "shape": shape})
            for array in arrays:
                if array.shape[0]:
                    member.write(np.ascontiguousarray(array).tobytes())
    tmp.replace(target)
    for p in parts:
        p.unlink()
    return shape


def write_keys(path: Path, keys: list[tuple[str, str]]) -> None:
    """The ``(shard, key)`` of every image, in the arrays' order."""
    path.write_text(json.dumps([{"shard": s, "key": k} for s, k in keys], indent=1))
