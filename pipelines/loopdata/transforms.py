"""Per-task image transforms (torchvision.transforms.v2, timm's RandAugment) and batch-level Mixup/CutMix.

Sample transforms take the ``torch.uint8`` (3, H, W) tensor from :func:`loopdata.decode.decode_image`
and return ``uint8`` (3, resolution, resolution): geometry augmentation runs on uint8 tensors, where
torchvision's kernels are fastest; timm's RandAugment, which works on PIL images, gets the cropped image as a
PIL image and hands back a uint8 tensor (:class:`TimmRandAugment`). The batch is then converted to float and
normalised once (:class:`BatchNormalize`), followed in training by per-image RandomErasing and batch-level
Mixup/CutMix. Images smaller than the crop are upscaled by the resize step, never dropped.

Tasks and protocols:

* ``reconstruction`` (output in [-1, 1]):
  eval = resize shorter side to ``resolution`` (bicubic, antialiased) + centre crop;
  train = resize shorter side to ``resolution * s``, ``s ~ U(scale)`` (default ``(1, 1)``, no jitter),
  random crop, horizontal flip.
* ``classification`` with ``protocol="imagenet"`` (DeiT recipe; output normalised by ``mean``/``std``):
  train = RandomResizedCrop(scale=(0.08, 1), bicubic), flip, timm's RandAugment ``rand-m9-mstd0.5-inc1``
  (DeiT's: 2 ops of the increasing-severity set at magnitude 9 on timm's 0..10 scale, magnitude noise of std
  0.5, bicubic, fill = the mean colour, translations up to 0.45 x resolution, as timm's ``create_transform``
  sets them), RandomErasing(0.25, per-pixel normal values), and per batch Mixup(0.8) or CutMix(1.0) (50/50)
  with label smoothing 0.1; eval = resize shorter side to ``floor(resolution / crop_pct)`` (crop_pct 0.875)
  + centre crop.
* ``classification`` with ``protocol="cifar"``: train = random crop with 4-pixel zero padding + flip,
  eval = identity at 32x32 (other sizes are resized + centre-cropped first); CIFAR-10 mean/std; no
  RandAugment, erasing, mixing or smoothing unless asked for.

``repeated_aug`` (classification training, default 1) is applied by the loader, not here: see
:mod:`loopdata.repeated`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image
from timm.data.auto_augment import RandAugment, rand_augment_transform
from timm.data.auto_augment import posterize as timm_posterize
from timm.data.transforms import str_to_pil_interp
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
BICUBIC = v2.InterpolationMode.BICUBIC
TASKS = ("reconstruction", "classification")


@dataclass(frozen=True)
class ReconstructionOptions:
    """Options of the reconstruction task (pass as ``make_loader(..., **options)``).

    Attributes:
        scale: training scale-jitter range; the shorter side is resized to ``resolution * s`` with
            ``s ~ U(scale)`` before the random crop. Both values must be >= 1.
        hflip: horizontal-flip probability in training.
        draft: decode JPEGs at reduced DCT scale when that keeps the shorter side >= the resize target
            (faster; pixel values differ from a full decode by up to ~28 uint8 levels). Off by default: every
            measurement and encoding decodes fully; training may opt in for throughput.
        preprocess: how an evaluation image becomes its ``resolution``² reference: ``resize-crop`` (shorter side
            resized with antialiased bicubic, centre crop) or ``adm`` (ADM's ``center_crop_arr``, the protocol of
            DiT / SiT / REPA / MAR / LightningDiT: halve with a box filter while the shorter side is >= 2x the
            target, then PIL bicubic to the target, then a centre crop). Evaluation only.
    """

    scale: tuple[float, float] = (1.0, 1.0)
    hflip: float = 0.5
    draft: bool = False
    preprocess: str = "resize-crop"


@dataclass(frozen=True)
class ClassificationOptions:
    """Options of the classification task; defaults depend on ``protocol`` (see module docstring).

    RandAugment is timm's, configured by a timm string (:func:`randaugment_config_string`): ``randaugment_config``
    when set (e.g. ``"rand-m9-mstd0.5-inc1"``, used verbatim), else built from ``randaugment_magnitude`` (timm's
    0..10 scale; ``None`` = no RandAugment), ``randaugment_ops`` (ops per image), ``randaugment_mstd`` (std of the
    per-op magnitude noise) and ``randaugment_increasing`` (timm's increasing-severity op set); the ImageNet
    defaults give DeiT's ``rand-m9-mstd0.5-inc1``.

    ``repeated_aug = r > 1`` (training only): every sample is used ``r`` times per epoch with independent
    augmentations, DeiT's repeated augmentation in streaming form (:mod:`loopdata.repeated`).

    Mixing is enabled when ``mixup_alpha > 0`` or ``cutmix_alpha > 0``; the batch ``"label"`` is then a
    float (N, num_classes) soft target with ``label_smoothing`` applied. Without mixing ``"label"`` is an
    int64 (N,) tensor and label smoothing belongs in the loss (``CrossEntropyLoss(label_smoothing=...)``).
    """

    protocol: str = "imagenet"
    num_classes: int = 1000
    crop_pct: float = 0.875
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    randaugment_magnitude: int | None = 9
    randaugment_ops: int = 2
    randaugment_mstd: float = 0.5
    randaugment_increasing: bool = True
    randaugment_config: str | None = None
    repeated_aug: int = 1
    random_erasing: float = 0.25
    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    mix_prob: float = 1.0
    switch_prob: float = 0.5
    label_smoothing: float = 0.1
    padding: int = 4
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    draft: bool = True

    @property
    def mixing(self) -> bool:
        """True when batches get Mixup/CutMix soft labels."""
        return self.mix_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)


_CIFAR_DEFAULTS = dict(
    randaugment_magnitude=None,
    random_erasing=0.0,
    mixup_alpha=0.0,
    cutmix_alpha=0.0,
    label_smoothing=0.0,
    mean=CIFAR10_MEAN,
    std=CIFAR10_STD,
    num_classes=10,
    crop_pct=1.0,
)


def randaugment_config_string(opt: ClassificationOptions) -> str | None:
    """The timm RandAugment config string of ``opt`` (``None``: no RandAugment).

    ``randaugment_config`` wins when set; otherwise ``rand-m{magnitude}[-n{ops}]-mstd{mstd}-inc{0|1}`` (``n`` only
    when not timm's default of 2), so the ImageNet defaults give exactly DeiT's ``rand-m9-mstd0.5-inc1``.
    """
    if opt.randaugment_config is not None:
        return opt.randaugment_config
    m = opt.randaugment_magnitude
    if m is None:
        return None
    if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= 10:
        raise ValueError(
            f"randaugment_magnitude must be an integer in [0, 10] (timm's RandAugment scale; DeiT uses 9), got {m!r}; "
            "for magnitudes above 10 pass a timm string with mmax, e.g. randaugment_config='rand-m15-mmax20'"
        )
    if isinstance(opt.randaugment_ops, bool) or not isinstance(opt.randaugment_ops, int) or opt.randaugment_ops < 1:
        raise ValueError(f"randaugment_ops must be an integer >= 1 (ops per image), got {opt.randaugment_ops!r}")
    if not opt.randaugment_mstd >= 0:
        raise ValueError(f"randaugment_mstd must be >= 0 (0 = fixed magnitude), got {opt.randaugment_mstd!r}")
    ops = "" if opt.randaugment_ops == 2 else f"-n{opt.randaugment_ops}"
    return f"rand-m{m}{ops}-mstd{opt.randaugment_mstd:g}-inc{int(bool(opt.randaugment_increasing))}"


def posterize_keep_bits(img: Image.Image, bits_to_keep: int, **_: object) -> Image.Image:
    """Keep the ``bits_to_keep`` most significant bits of every channel (0 bits: a black image).

    timm's ``PosterizeIncreasing`` asks for 0 bits at the top of its magnitude range (m = 10, which ``mstd``
    noise reaches from m9), as TensorFlow's RandAugment does; Pillow >= 11 refuses 0 (``bits must be between
    or equal to 1 and 8``), which stopped DeiT-recipe training at a random step. The lookup table is the
    one ``ImageOps.posterize`` applies for 1..8 bits, extended to 0.
    """
    if bits_to_keep >= 8:
        return img
    mask = ~(2 ** (8 - max(0, bits_to_keep)) - 1)
    return img.point([i & mask for i in range(256)] * len(img.getbands()))


class TimmRandAugment:
    """timm's RandAugment (:func:`timm.data.auto_augment.rand_augment_transform`) on uint8 ``(3, H, W)`` tensors.

    The tensor becomes a PIL image, goes through timm's transform and comes back as a uint8 ``(3, H, W)`` tensor.
    The hyper-parameters are those timm's ``create_transform`` passes: ``translate_const = int(0.45 * resolution)``,
    ``img_mean`` (fill colour) = ``mean`` in 0..255, and the PIL ``interpolation`` (DeiT: bicubic).

    Seeding: timm draws from Python's ``random`` and NumPy's global RNG. Each call seeds both from one draw of
    torch's CPU RNG (which the loader seeds per sample) and restores their previous states afterwards, so the
    augmentation of a sample is reproducible (resume, any worker layout) and nothing else's random stream moves.

    Attributes:
        config: the timm config string, e.g. ``"rand-m9-mstd0.5-inc1"``.
        transform: timm's :class:`timm.data.auto_augment.RandAugment`.
    """

    def __init__(
        self, config: str, resolution: int, mean: tuple[float, ...], interpolation: str = "bicubic"
    ) -> None:
        if not isinstance(config, str) or config.split("-")[0] != "rand":
            raise ValueError(
                f"randaugment_config must be a timm RandAugment string starting with 'rand' "
                f"(e.g. 'rand-m9-mstd0.5-inc1'), got {config!r}"
            )
        hparams = {
            "translate_const": int(resolution * 0.45),
            "img_mean": tuple(min(255, round(255 * m)) for m in mean),
            "interpolation": str_to_pil_interp(interpolation),
        }
        try:
            transform = rand_augment_transform(config, hparams)
        except (AssertionError, ValueError, KeyError) as err:  # timm asserts on unknown sections
            raise ValueError(
                f"randaugment_config={config!r} is not a valid timm RandAugment string ({err or 'unknown section'}); "
                "sections: m<int> magnitude, n<int> ops, mstd<float>, mmax<int>, p<float>, inc<0|1>, t<name>"
            ) from None
        for op in transform.ops:
            if op.aug_fn is timm_posterize:
                op.aug_fn = posterize_keep_bits
        self.config = config
        self.transform: RandAugment = transform

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 ``(3, H, W)`` -> uint8 ``(3, H, W)``."""
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        py_state, np_state = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            out = self.transform(TF.to_pil_image(image))
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
        return TF.pil_to_tensor(out)

    def __repr__(self) -> str:
        return f"TimmRandAugment({self.config!r})"


def make_options(task: str, **overrides: object) -> ReconstructionOptions | ClassificationOptions:
    """Build the options dataclass of ``task`` from keyword overrides, rejecting unknown names."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
    if task == "reconstruction" and overrides.get("preprocess", "resize-crop") not in PREPROCESSING:
        raise ValueError(f"preprocess {overrides['preprocess']!r}: choose one of {', '.join(PREPROCESSING)}")
    cls = ReconstructionOptions if task == "reconstruction" else ClassificationOptions
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"unknown {task} option(s) {unknown}; valid options: {sorted(names)}")
    for key in ("scale", "ratio", "mean", "std"):
        if key in overrides and overrides[key] is not None:
            overrides[key] = tuple(float(v) for v in overrides[key])  # type: ignore[union-attr]
    if cls is ClassificationOptions:
        protocol = overrides.get("protocol", "imagenet")
        if protocol not in ("imagenet", "cifar"):
            raise ValueError(f"unknown classification protocol {protocol!r}; choose 'imagenet' or 'cifar'")
        if protocol == "cifar":
            overrides = {**_CIFAR_DEFAULTS, **overrides}
    return cls(**overrides)  # type: ignore[arg-type]


class BatchNormalize:
    """uint8 (N, 3, H, W) in [0, 255] -> float32 ``(x / 255 - mean) / std``, in one fused in-place pass.

    Folded into one multiply and one subtract per channel (``x * a - b``), which is several times faster
    than per-sample ``ToDtype`` + ``Normalize``. Reconstruction uses mean = std = 0.5, i.e. [-1, 1].
    """

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean, self.std = tuple(mean), tuple(std)
        self.scale = torch.tensor([1.0 / (255.0 * s) for s in std]).view(1, -1, 1, 1)
        self.shift = torch.tensor([m / s for m, s in zip(mean, std)]).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (N, 3, H, W) -> float32 (N, 3, H, W)."""
        return images.to(torch.float32).mul_(self.scale).sub_(self.shift)


@dataclass
class TaskTransforms:
    """The transforms of one (task, train/eval) configuration, in the order they run.

    Attributes:
        sample: uint8 (3, H, W) -> uint8 (3, resolution, resolution), per sample (seeded per sample).
        normalize: the stacked uint8 batch -> float32 (N, 3, R, R).
        erase: optional per-image RandomErasing on the normalised float images (training).
        batch: optional ``(images (N, 3, R, R), labels int64 (N,)) -> (images, soft labels (N, K))``.
        draft_size: the shorter side JPEG draft decoding must keep (``None``: decode at full size).
        resize_side: the largest shorter side the sample transform resizes a whole image to (``None``: it never
            resizes a whole image, e.g. RandomResizedCrop); decoding refuses images whose resized size would
            exceed the pixel limit (a 1,000,000 x 1 PNG).
        needs_label: every sample must carry a label (classification).
        num_classes: labels must lie in ``[0, num_classes)`` when set.
    """

    sample: Callable[[torch.Tensor], torch.Tensor]
    normalize: BatchNormalize
    erase: Callable[[torch.Tensor], torch.Tensor] | None = None
    batch: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    draft_size: int | None = None
    needs_label: bool = False
    num_classes: int | None = None
    options: object = field(default=None)
    resize_side: int | None = None


def build_transforms(
    task: str, train: bool, resolution: int, options: ReconstructionOptions | ClassificationOptions
) -> TaskTransforms:
    """Build the sample (and batch) transforms of a task; see the module docstring for the recipes."""
    if not isinstance(resolution, int) or resolution < 1:
        raise ValueError(f"resolution must be a positive integer, got {resolution!r}")
    if isinstance(options, ReconstructionOptions):
        return _reconstruction(train, resolution, options)
    return _classification(train, resolution, options)


def _reconstruction(train: bool, res: int, opt: ReconstructionOptions) -> TaskTransforms:
    lo, hi = opt.scale
    if not 1.0 <= lo <= hi:
        raise ValueError(
            f"reconstruction scale must satisfy 1 <= min <= max (the shorter side becomes resolution * s "
            f"before the crop), got {opt.scale}"
        )
    half = BatchNormalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # [0, 255] -> [-1, 1]
    if train:
        lo_px, hi_px = round(res * lo), round(res * hi)
        steps = [
            v2.RandomResize(lo_px, hi_px + 1, interpolation=BICUBIC, antialias=True),
            v2.RandomCrop(res),
            v2.RandomHorizontalFlip(opt.hflip),
        ]
        draft = hi_px
    elif opt.preprocess == "adm":
        steps = [AdmCenterCrop(res)]
        draft = None  # ADM decodes fully and downsamples with its own box filter
    else:
        steps = [v2.Resize(res, interpolation=BICUBIC, antialias=True), v2.CenterCrop(res)]
        draft = res
    return TaskTransforms(v2.Compose(steps), half, draft_size=draft if opt.draft else None, options=opt,
                          resize_side=round(res * hi) if train else res)


PREPROCESSING = ("resize-crop", "adm")


def describe_preprocessing(options: ReconstructionOptions, resolution: int) -> dict[str, object]:
    """What an evaluation records about its references (metrics.json's ``preprocessing``)."""
    if options.preprocess == "adm":
        resample = "box filter halving while the shorter side >= 2x the target, then PIL bicubic (ADM center_crop_arr)"
    else:
        resample = "shorter side resized with antialiased bicubic (torchvision)"
    return {"method": options.preprocess, "resolution": resolution, "resample": resample, "crop": "centre",
            "jpeg_draft": bool(options.draft) and options.preprocess != "adm"}


class AdmCenterCrop:
    """ADM's centre crop (Dhariwal & Nichol 2021, ``center_crop_arr``) on a uint8 ``(3, H, W)`` tensor.

    While the shorter side is at least twice ``size``, the image is halved (integer division of both sides) with
    PIL's box filter; then it is resized with PIL's bicubic filter so that the shorter side is ``size`` (both
    sides scaled and rounded), and the centre ``size``² is cut out (offsets rounded down). The references of the
    tokenizer papers that generate with DiT-family models are made this way; numbers are comparable only under
    the same crop.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        from PIL import Image

        pil = Image.fromarray(image.permute(1, 2, 0).contiguous().numpy())
        while min(pil.size) >= 2 * self.size:
            pil = pil.resize((pil.width // 2, pil.height // 2), resample=Image.BOX)
        scale = self.size / min(pil.size)
        pil = pil.resize((round(pil.width * scale), round(pil.height * scale)), resample=Image.BICUBIC)
        top, left = (pil.height - self.size) // 2, (pil.width - self.size) // 2
        pil = pil.crop((left, top, left + self.size, top + self.size))
        return torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1).contiguous()


def _classification(train: bool, res: int, opt: ClassificationOptions) -> TaskTransforms:
    if not 0 < opt.crop_pct <= 1:
        raise ValueError(f"crop_pct must be in (0, 1], got {opt.crop_pct}")
    if opt.num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {opt.num_classes}")
    if isinstance(opt.repeated_aug, bool) or not isinstance(opt.repeated_aug, int) or opt.repeated_aug < 1:
        raise ValueError(f"repeated_aug must be an integer >= 1 (1 = off, 3 = DeiT), got {opt.repeated_aug!r}")
    norm = BatchNormalize(opt.mean, opt.std)
    resize_to = math.floor(res / opt.crop_pct)
    eval_steps: list[v2.Transform] = [
        v2.Resize(resize_to, interpolation=BICUBIC, antialias=True),
        v2.CenterCrop(res),
    ]
    if not train:
        return TaskTransforms(
            v2.Compose(eval_steps),
            norm,
            draft_size=resize_to if opt.draft else None,
            needs_label=True,
            num_classes=opt.num_classes,
            options=opt,
            resize_side=resize_to,
        )
    if opt.protocol == "cifar":
        # CIFAR images are already res x res; resizing first makes other sizes follow the same recipe.
        steps: list[v2.Transform] = [
            v2.Resize(res, interpolation=BICUBIC, antialias=True),
            v2.CenterCrop(res),
            v2.RandomCrop(res, padding=opt.padding, fill=0),
            v2.RandomHorizontalFlip(opt.hflip),
        ]
        draft = res if opt.draft else None
    else:
        steps = [
            v2.RandomResizedCrop(
                res, scale=opt.scale, ratio=opt.ratio, interpolation=BICUBIC, antialias=True
            ),
            v2.RandomHorizontalFlip(opt.hflip),
        ]
        # A small RandomResizedCrop area is upsampled, so full-resolution pixels matter: no draft.
        draft = None
    randaugment = randaugment_config_string(opt)
    if randaugment is not None:
        steps.append(TimmRandAugment(randaugment, res, opt.mean))  # on the cropped image, as in DeiT
    # value="random": per-pixel N(0, 1) noise in normalised space, DeiT's "pixel" erasing mode.
    erase = v2.RandomErasing(p=opt.random_erasing, value="random") if opt.random_erasing > 0 else None
    batch = MixBatch(opt) if opt.mixing else None
    return TaskTransforms(v2.Compose(steps), norm, erase, batch, draft, True, opt.num_classes, options=opt,
                          resize_side=res if opt.protocol == "cifar" else None)


class MixBatch:
    """Batch-level Mixup / CutMix with label smoothing (timm ``Mixup`` semantics, torchvision ops).

    With probability ``mix_prob`` the batch is mixed, choosing CutMix with probability ``switch_prob``
    when both alphas are positive; the (possibly unmixed) one-hot targets are then smoothed:
    ``y * (1 - eps) + eps / K``, which equals mixing smoothed one-hot targets because both are linear.
    """

    def __init__(self, opt: ClassificationOptions) -> None:
        self.num_classes = opt.num_classes
        self.mix_prob = opt.mix_prob
        self.smoothing = opt.label_smoothing
        choices, probs = [], []
        if opt.cutmix_alpha > 0:
            choices.append(v2.CutMix(alpha=opt.cutmix_alpha, num_classes=opt.num_classes))
            probs.append(opt.switch_prob if opt.mixup_alpha > 0 else 1.0)
        if opt.mixup_alpha > 0:
            choices.append(v2.MixUp(alpha=opt.mixup_alpha, num_classes=opt.num_classes))
            probs.append(1.0 - opt.switch_prob if opt.cutmix_alpha > 0 else 1.0)
        self.mix = v2.RandomChoice(choices, p=probs)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images float (N, 3, H, W), labels int64 (N,) -> (mixed images, soft targets float (N, K))."""
        if self.mix_prob >= 1 or torch.rand(()) < self.mix_prob:
            images, target = self.mix(images, labels)
        else:
            target = torch.nn.functional.one_hot(labels, self.num_classes).float()
        if self.smoothing > 0:
            target = target * (1.0 - self.smoothing) + self.smoothing / self.num_classes
        return images, target
