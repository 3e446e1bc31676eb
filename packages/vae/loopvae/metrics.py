"""Reconstruction metrics with a pinned protocol (the one LDM, TiTok and diffusers' VAE evaluations use).

* Reconstructions are clamped to [-1, 1] and quantised to uint8 exactly like the references (the
  centre-cropped images the model saw), then compared.
* PSNR: mean over images of per-image PSNR on uint8 (data range 255), each capped at 120 dB in every command
  (identical images would give infinity; metrics files are strict JSON).
* SSIM: Gaussian window 11x11, sigma 1.5, data range 255, mean over valid window positions per
  image, then mean over images (torchmetrics' SSIM map; equals piq / scikit-image).
* LPIPS: the named net (``vgg`` or ``alex``) on the quantised images mapped back to [-1, 1].
* rFID: torchmetrics ``FrechetInceptionDistance`` (torch-fidelity's InceptionV3, 2048-d pool
  features, ``antialias=False`` as torch-fidelity resizes), float64 running sums; weights from a
  local file, read with ``torch.load(weights_only=True)`` (a crafted pickle is refused, never run), never
  downloaded.
* Interventions (the paper's protocol) score the float decoder output ``u`` on the [0, 1] scale, not
  uint8: clipped PSNR / SSIM on ``clip(u)``, raw PSNR / SSIM on ``u`` itself, the fraction of pixels
  with any channel outside [0, 1] and the clipping displacement ``mean |u - clip(u)|``. PSNR is capped
  at 120 dB (an exact reconstruction would be infinite, which JSON cannot hold).
"""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``(B, 3, H, W)`` in [-1, 1] (any range; clamped) -> uint8 ``[0, 255]``."""
    return ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


PSNR_CAP_DB = 120.0


def psnr_per_image(pred: torch.Tensor, target: torch.Tensor, data_range: float = 255.0) -> torch.Tensor:
    """``(B,)`` PSNR in dB between ``(B, C, H, W)`` images (uint8 or float on the ``data_range`` scale), at most
    :data:`PSNR_CAP_DB`: identical images (an exact reconstruction, or a constant image and its bicubic baseline)
    give the cap, not infinity, in every command, so means stay finite and the JSON strict."""
    psnr = peak_signal_noise_ratio(
        pred.double(), target.double(), data_range=data_range, reduction="none", dim=(1, 2, 3)
    )
    return psnr.clamp(max=PSNR_CAP_DB)  # +inf -> the cap; a NaN (NaN inputs) stays NaN and is refused by JSON


def ssim_per_image(
    pred: torch.Tensor, target: torch.Tensor, data_range: float = 255.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``(B,)`` SSIM with an 11x11 Gaussian window (sigma 1.5), averaged over the valid window positions.

    Computed in ``dtype``: float64 for the evaluation protocol; float32 is ~15x faster on CPU (float64
    convolutions have no fast kernels) and differs by ~1e-6, which the interventions accept.

    torchmetrics computes the SSIM map on a reflect-padded image; we average the map over the
    positions whose window lies inside the image (5 px border excluded), the convention of Wang et
    al.'s reference code, scikit-image and piq (they agree to ~1e-15).
    """
    _, ssim_map = structural_similarity_index_measure(
        pred.to(dtype), target.to(dtype), gaussian_kernel=True, sigma=1.5, kernel_size=11, data_range=data_range,
        reduction="none", return_full_image=True,
    )
    pad = 5
    if ssim_map.shape[-1] <= 2 * pad or ssim_map.shape[-2] <= 2 * pad:
        raise ValueError(f"SSIM needs images larger than the 11x11 window, got {tuple(pred.shape[-2:])}")
    return ssim_map[..., pad:-pad, pad:-pad].mean(dim=(1, 2, 3))


def capped_psnr(pred: torch.Tensor, target: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """``(B,)`` PSNR in dB on the [0, 1] scale, at most :data:`PSNR_CAP_DB` (as :func:`psnr_per_image`)."""
    return psnr_per_image(pred, target, data_range)


def range_statistics(recon: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-image intervention metrics of a float reconstruction, all on the [0, 1] scale.

    ``recon`` is the unclipped decoder output in the [-1, 1] convention, ``target`` the reference in
    [-1, 1]; both are mapped to ``u = (x + 1) / 2`` in float64. Returns ``(B,)`` tensors: ``psnr`` /
    ``ssim`` of ``clip(u, 0, 1)``, ``raw_psnr`` / ``raw_ssim`` of ``u`` itself (no clipping, no
    quantisation), ``out_of_range`` (fraction of pixels with any channel outside [0, 1]) and
    ``clip_displacement`` (``mean |u - clip(u)|``). PSNRs are capped at :data:`PSNR_CAP_DB`; SSIMs are
    computed in float32 (within ~1e-6 of float64).
    """
    u = (recon.double() + 1) / 2
    ref = (target.double() + 1) / 2
    clipped = u.clamp(0, 1)
    outside = ((u < 0) | (u > 1)).any(dim=1).flatten(1).double().mean(dim=1)
    displacement = (u - clipped).abs().flatten(1).mean(dim=1)
    # SSIM in float32: 30+ scored reconstructions per intervention run, and float64 is 15x slower
    ssim = lambda a: ssim_per_image(a, ref, data_range=1.0, dtype=torch.float32).double()  # noqa: E731
    return {"psnr": capped_psnr(clipped, ref), "raw_psnr": capped_psnr(u, ref), "ssim": ssim(clipped),
            "raw_ssim": ssim(u), "out_of_range": outside, "clip_displacement": displacement}


def bicubic_baseline(images: torch.Tensor, values_per_pixel: float) -> tuple[torch.Tensor, tuple[int, int]]:
    """Bicubic down- and up-sampling that keeps at least ``values_per_pixel`` numbers per pixel.

    ``images``: ``(B, 3, H, W)`` in [-1, 1]. The low-resolution image has ``3 h w >= vpp H W`` values
    (e.g. 19x19 for 64x64 at the 0.25 values/pixel of an f8 16-channel latent). Returns the
    reconstruction (unclipped) and ``(h, w)``.
    """
    _, c, height, width = images.shape
    scale = math.sqrt(values_per_pixel / c)
    h, w = max(1, math.ceil(height * scale)), max(1, math.ceil(width * scale))
    while c * h * w < values_per_pixel * height * width:
        h, w = h + 1, w + 1
    low = F.interpolate(images.float(), size=(h, w), mode="bicubic", antialias=True, align_corners=False)
    return F.interpolate(low, size=(height, width), mode="bicubic", align_corners=False), (h, w)


def default_inception_path() -> Path:
    """Where torchmetrics / torch-fidelity users keep the FID Inception weights (torch hub cache)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_FILE


def _load_failure(err: BaseException) -> str:
    """The reason in torch.load's message (its weights-only boilerplate dropped), one line."""
    if isinstance(err, EOFError):
        return "the file is empty or truncated"
    lines = []
    for line in str(err).splitlines():
        line = line.strip()
        if "WeightsUnpickler error:" in line:
            line = line.split("WeightsUnpickler error:", 1)[1].strip()
        if line and not line.startswith(("Weights only load failed", "Check the documentation")):
            lines.append(line)
    text = " ".join(lines) or type(err).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def load_tensor_file(path: str | Path, what: str, expected: str) -> dict[str, torch.Tensor]:
    """The ``{name: tensor}`` state dict in ``path``, read with ``torch.load(weights_only=True)``: a pickle that would
    run code (or build objects other than tensors and containers) is refused, never executed.

    ``ValueError`` naming ``what``, the file, the reason and the ``expected`` file when it is not a readable torch
    file of a state dict (random bytes, a truncated file, a crafted pickle, a list)."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - UnpicklingError, RuntimeError (not a zip file), EOFError, ...
        raise ValueError(f"{what} {path}: not a torch file of plain tensors ({_load_failure(err)}); expected "
                         f"{expected} (read with weights_only=True: pickled code is never run)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ValueError(f"{what} {path}: holds a {type(state).__name__}, not a state dict of named tensors; "
                         f"expected {expected}")
    return state


def load_inception_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of an FID Inception weights file (:func:`load_tensor_file`)."""
    return load_tensor_file(path, "FID Inception weights", f"torch-fidelity's {INCEPTION_FILE}")


@functools.cache
def _inception_class() -> type:
    """torchmetrics' ``NoTrainInceptionV3`` whose ``load_state_dict`` names what is wrong with a weights file in one
    line (missing, unknown and misshapen tensors) instead of listing ~470 keys (built on first use: importing
    torchmetrics' FID imports torch-fidelity)."""
    from torchmetrics.image.fid import NoTrainInceptionV3

    class CheckedInceptionV3(NoTrainInceptionV3):
        def __init__(self, weights_file: str, **kwargs) -> None:
            object.__setattr__(self, "weights_file", weights_file)  # torch-fidelity loads inside __init__
            super().__init__(**kwargs)

        def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
            expected = super().state_dict()
            missing = [k for k in expected if k not in state_dict]
            unexpected = [k for k in state_dict if k not in expected]
            wrong = [k for k in expected if k in state_dict and state_dict[k].shape != expected[k].shape]
            problems = [f"{len(missing)} of its {len(expected)} tensors missing (e.g. {missing[0]})"] if missing else []
            problems += [f"{len(unexpected)} unknown (e.g. {unexpected[0]})"] if unexpected else []
            problems += [f"{len(wrong)} of another shape (e.g. {wrong[0]}: {tuple(state_dict[wrong[0]].shape)}, "
                         f"expected {tuple(expected[wrong[0]].shape)})"] if wrong else []
            if problems:
                raise ValueError(f"FID Inception weights {self.weights_file}: not torch-fidelity's InceptionV3 state "
                                 f"dict ({'; '.join(problems)}); expected {INCEPTION_FILE}")
            return super().load_state_dict(state_dict, strict=strict, assign=assign)

    return CheckedInceptionV3


def build_inception(path: str | Path) -> torch.nn.Module:
    """torchmetrics' ``NoTrainInceptionV3`` (torch-fidelity's InceptionV3, 2048-d pool features,
    ``antialias=False``) with the weights of ``path``, read by :func:`load_inception_state`.

    torch-fidelity itself reads a weights file with ``torch.load(weights_only=False)``, which runs whatever code a
    crafted pickle holds; here it unpickles only the tensors read safely from ``path``, re-serialised in memory."""
    state = load_inception_state(path)
    buffer = io.BytesIO()
    torch.save(state, buffer)  # tensors only: what torch-fidelity unpickles from it cannot run code
    del state
    buffer.seek(0)
    net = _inception_class()(str(path), name="inception-v3-compat", features_list=["2048"],
                             feature_extractor_weights_path=buffer, antialias=False)
    net.num_features = 2048  # torchmetrics reads it instead of running a dummy image through the network
    return net


def build_fid(weights_path: str | Path | None) -> tuple[object | None, str | None, Path | None]:
    """``(metric, unavailable_reason, weights_file)``; the metric is ``None`` when weights are missing.

    The weights are read with ``weights_only=True`` (:func:`build_inception`), also from the default
    ``$TORCH_HOME/hub/checkpoints/`` path; a file that is not torch-fidelity's InceptionV3 state dict raises a
    ``ValueError`` naming it."""
    path = Path(weights_path) if weights_path else default_inception_path()
    if not path.is_file():
        reason = (
            f"FID Inception weights not found at {path}: place torch-fidelity's {INCEPTION_FILE} there "
            "(or in $TORCH_HOME/hub/checkpoints/) or pass --fid-weights PATH"
        )
        return None, reason, None
    from torchmetrics.image.fid import FrechetInceptionDistance

    fid = FrechetInceptionDistance(feature=build_inception(path), normalize=False)
    return fid, None, path
