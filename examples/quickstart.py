# %% [markdown]
# # loopvision quick start
#
# A plain script in jupytext's percent format (`jupytext --to notebook examples/quickstart.py` makes a notebook
# of it). It runs on the bundled model and a bundled Kodak image, or on your own image:
#
# ```bash
# .venv/bin/python examples/quickstart.py                       # kodim23 from assets/kodak
# .venv/bin/python examples/quickstart.py --image photo.jpg --out runs/quickstart
# ```
#
# 1. encode and decode an image with the bundled LoopVAE (a diffusers model);
# 2. any-time decoding: fewer decoder passes, less time, lower quality;
# 3. an intervention: truncate the finest decoder stage and plot PSNR per retained pass;
# 4. load the same folder through diffusers' generic loader.

# %%
from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms.v2.functional import center_crop, pil_to_tensor, resize, to_pil_image

import loopcore
import loopdata
import loopvae

# the repository root: this file's parent folder, or the working directory inside a notebook kernel
ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = ROOT / "assets" / "models" / "loopvae-cnn-tiny"


def load_image(path: str | None, size: int = 256) -> torch.Tensor:
    """An RGB image as ``(1, 3, size, size)`` in [-1, 1]: shorter side resized, centre-cropped (eval's protocol).
    Without ``path``: kodim23 from the bundled Kodak validation shard."""
    if path is None:
        shard = loopdata.bundled_kodak_urls("val")[0]
        sample = next(s for s in loopdata.shards.iter_samples(shard) if s["__key__"] == "kodim23")
        pil = Image.open(io.BytesIO(next(v for k, v in sample.items() if k in ("jpg", "png")))).convert("RGB")
    else:
        pil = Image.open(path).convert("RGB")
    img = center_crop(resize(pil_to_tensor(pil), size), size)
    return img.float().div(127.5).sub(1).unsqueeze(0)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB of two images in [-1, 1], after clamping and uint8 quantisation (the evaluation protocol)."""
    q = lambda t: t.clamp(-1, 1).add(1).mul(127.5).round()  # noqa: E731
    return float(10 * torch.log10(255.0**2 / (q(a) - q(b)).pow(2).mean()))


# %% [markdown]
# ## Settings

# %%
parser = argparse.ArgumentParser(description="loopvision quick start")
parser.add_argument("--image", default=None, help="your image (default: kodim23 from assets/kodak)")
parser.add_argument("--out", default="runs/quickstart")
args, _ = parser.parse_known_args()  # known args only: also runs inside a notebook kernel
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)

# %% [markdown]
# ## 1. Encode and decode

# %%
vae = loopvae.LoopVAE.from_pretrained(str(MODEL)).eval()
x = load_image(args.image)
with torch.no_grad():
    z = vae.encode(x).latent_dist.mode()  # (1, 16, 32, 32): the posterior mean
    recon = vae.decode(z).sample
to_pil_image(recon[0].clamp(-1, 1).add(1).mul(127.5).round().byte()).save(out / "recon.png")
print(f"latent {tuple(z.shape)}, reconstruction PSNR {psnr(recon, x):.2f} dB -> {out / 'recon.png'}")

# %% [markdown]
# ## 2. Any-time decoding
# Run only the first k passes of each decoder stage. The bundled model was not trained for early exits
# (no deep supervision), so fewer passes cost a lot of quality here.

# %%
trained = list(vae.config.decoder_passes)
for passes in ([1, 1, 1], [1, 2, 2], trained):
    start = time.perf_counter()
    with torch.no_grad():
        y = vae.decode(z, decoder_passes=passes).sample
    print(f"decoder_passes={passes}: {psnr(y, x):.2f} dB in {1000 * (time.perf_counter() - start):.0f} ms")

# %% [markdown]
# ## 3. An intervention
# Keep the first k passes of the finest decoder stage only (`loopcore.LoopHooks(prefix=...)`).

# %%
finest = len(trained) - 1
curve = []
for k in range(1, trained[finest] + 1):
    hooks = loopcore.LoopHooks(prefix={finest: k})
    with torch.no_grad(), vae.decoder.core.use_hooks(hooks):
        curve.append(psnr(vae.decode(z).sample, x))
print("finest-stage prefix PSNR:", " -> ".join(f"{p:.2f}" for p in curve))
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot(range(1, len(curve) + 1), curve, marker="o")
    ax.set(xlabel="passes kept (finest decoder stage)", ylabel="PSNR (dB)")
    fig.tight_layout()
    fig.savefig(out / "prefix.png", dpi=90)
    print(f"plot -> {out / 'prefix.png'}")
except ImportError:
    print("matplotlib not installed (pip install 'loopvision[plots]'): no plot")

# %% [markdown]
# ## 4. diffusers' generic loader
# `diffusers.AutoModel` finds `LoopVAE` once `loopvae` is imported.

# %%
from diffusers import AutoModel  # noqa: E402

same = AutoModel.from_pretrained(str(MODEL))
with torch.no_grad():
    again = same.decode(z).sample
print(f"AutoModel.from_pretrained -> {type(same).__name__}; identical output: {torch.equal(again, recon)}")
