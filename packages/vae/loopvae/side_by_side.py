"""One picture of several tokenizers on the same images: a row per image, a column per model plus the reference.

``loopvae compare`` writes it as ``side_by_side.png`` (each arm's first checkpoint), and the demo report shows
the bundled LoopVAE beside the bundled references with it. Each cell is the same centre crop of the
reconstruction at the evaluation resolution (clamped, uint8, as every metric sees it), so differences in detail
are visible at a glance; numbers stay in the tables.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

LABEL_HEIGHT = 18


def _uint8(images: torch.Tensor) -> np.ndarray:
    """``(B, 3, H, W)`` in [-1, 1] -> ``(B, H, W, 3)`` uint8, clamped and rounded as the metrics quantise."""
    return images.clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def side_by_side(checkpoints: dict[str, str], data: str, out: str | Path, resolution: int = 256,
                 max_images: int = 4, crop: int = 128, weights: str = "ema", preprocess: str = "resize-crop"
                 ) -> Path:
    """Write ``out`` (a PNG): for the first ``max_images`` images of ``data`` (in the evaluation order), the
    reference and each model's reconstruction (posterior mode / deterministic latent), centre-cropped to
    ``crop`` pixels (at most the resolution) of the ``resolution``² input; labelled columns in the order of
    ``checkpoints`` (``{label: --checkpoint path}``). Runs on the CPU. Returns ``out``."""
    import loopdata

    from .autoencoders import reconstruct_mode
    from .loading import load_tokenizer

    crop = min(crop, resolution)  # a small evaluation resolution shows whole images
    loader = loopdata.make_loader(data, task="reconstruction", train=False, batch_size=max_images, num_workers=0,
                                  resolution=resolution, rank=0, world_size=1, preprocess=preprocess)
    batch = next(iter(loader))
    images, keys = batch["image"][:max_images], list(batch["key"])[:max_images]
    columns = {"reference": _uint8(images)}
    with torch.no_grad():
        for label, path in checkpoints.items():
            model = load_tokenizer(path, weights).model.float().eval()
            columns[label] = _uint8(reconstruct_mode(model, images).float())
            del model
    top = (resolution - crop) // 2
    sheet = Image.new("RGB", (crop * len(columns), LABEL_HEIGHT + crop * len(keys)), "white")
    draw = ImageDraw.Draw(sheet)
    for c, (label, pixels) in enumerate(columns.items()):
        draw.text((c * crop + 3, 3), label[: max(4, crop // 7)], fill="black")
        for r in range(len(keys)):
            cell = Image.fromarray(pixels[r, top:top + crop, top:top + crop])
            sheet.paste(cell, (c * crop, LABEL_HEIGHT + r * crop))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    sheet.save(tmp)
    tmp.replace(out)
    return out
