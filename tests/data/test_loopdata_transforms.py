"""Task transforms: value ranges, exact agreement with PIL, DeiT/CIFAR recipes (timm's RandAugment), Mixup targets."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from loopdata_helpers import jpeg, noise_image
from PIL import Image
from torchvision.transforms import v2

from loopdata.decode import decode_image
from loopdata.transforms import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    BatchNormalize,
    ClassificationOptions,
    MixBatch,
    TimmRandAugment,
    build_transforms,
    make_options,
    randaugment_config_string,
)


def pil_resize_center_crop(data: bytes, size: int) -> np.ndarray:
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    nw, nh = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    img = img.resize((nw, nh), Image.Resampling.BICUBIC)
    left, top = round((nw - size) / 2), round((nh - size) / 2)
    return np.asarray(img.crop((left, top, left + size, top + size))).astype(np.int16)


def run(tf, data: bytes) -> torch.Tensor:
    return tf.normalize(tf.sample(decode_image(data, tf.draft_size))[None])[0]


def test_reconstruction_eval_matches_plain_pil_within_one_level():
    opt = make_options("reconstruction", draft=False)
    tf = build_transforms("reconstruction", False, 32, opt)
    data = jpeg(90, 60, seed=1)
    out = run(tf, data)
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    assert out.min() >= -1 and out.max() <= 1
    ours = ((out + 1) * 127.5).round().to(torch.int16).permute(1, 2, 0).numpy()
    assert np.abs(ours - pil_resize_center_crop(data, 32)).max() <= 1


def test_reconstruction_train_is_a_flip_or_crop_of_the_resized_image():
    tf = build_transforms("reconstruction", True, 16, make_options("reconstruction", hflip=0.0))
    image = decode_image(jpeg(40, 16, seed=2))  # shorter side already 16: crops are windows of the image
    full = BatchNormalize((0.5,) * 3, (0.5,) * 3)(image[None])[0]
    out = run(tf, jpeg(40, 16, seed=2))
    windows = [full[:, :, x : x + 16] for x in range(40 - 16 + 1)]
    assert any(torch.allclose(out, w) for w in windows)


def test_reconstruction_scale_jitter_is_validated_and_applied():
    with pytest.raises(ValueError, match="1 <= min <= max"):
        build_transforms("reconstruction", True, 16, make_options("reconstruction", scale=(0.5, 1.0)))
    tf = build_transforms("reconstruction", True, 16, make_options("reconstruction", scale=(1.0, 2.0)))
    assert tf.draft_size is None and run(tf, jpeg(50, 40)).shape == (3, 16, 16)  # full decoding by default
    drafted = build_transforms("reconstruction", True, 16, make_options("reconstruction", scale=(1.0, 2.0),
                                                                          draft=True))
    assert drafted.draft_size == 32  # the largest jittered side: draft decoding keeps at least that


def test_batch_normalize_equals_torchvision_normalize():
    images = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    expected = v2.Normalize(mean, std)(v2.ToDtype(torch.float32, scale=True)(images))
    assert torch.allclose(BatchNormalize(mean, std)(images), expected, atol=1e-5)


def test_classification_eval_uses_crop_pct():
    opt = make_options("classification")
    tf = build_transforms("classification", False, 224, opt)
    assert tf.draft_size == 256 and tf.needs_label and tf.batch is None  # floor(224 / 0.875)
    assert run(tf, jpeg(300, 200)).shape == (3, 224, 224)


def test_classification_train_deit_recipe_and_soft_targets():
    opt = make_options("classification", num_classes=4)
    assert (
        opt.randaugment_magnitude,
        opt.random_erasing,
        opt.mixup_alpha,
        opt.cutmix_alpha,
        opt.label_smoothing,
    ) == (9, 0.25, 0.8, 1.0, 0.1)
    tf = build_transforms("classification", True, 24, opt)
    assert tf.draft_size is None and tf.erase is not None
    images = torch.stack(
        [tf.normalize(tf.sample(decode_image(jpeg(40, 30, seed=s)))[None])[0] for s in range(6)]
    )
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    mixed, target = tf.batch(images, labels)
    assert mixed.shape == images.shape and target.shape == (6, 4)
    assert torch.allclose(target.sum(1), torch.ones(6))
    assert target.min() >= 0.1 / 4 - 1e-6  # label smoothing floor


def test_mixing_disabled_keeps_integer_labels_and_smoothing_alone_smooths():
    opt = make_options("classification", mixup_alpha=0.0, cutmix_alpha=0.0)
    assert not opt.mixing and build_transforms("classification", True, 16, opt).batch is None
    smooth_only = MixBatch(ClassificationOptions(num_classes=3, mix_prob=0.0, label_smoothing=0.3))
    _, target = smooth_only(torch.zeros(2, 3, 4, 4), torch.tensor([0, 2]))
    assert torch.allclose(target, torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]]))


def test_cifar_protocol_eval_is_identity_plus_normalisation():
    opt = make_options("classification", protocol="cifar")
    assert (opt.num_classes, opt.mixing, opt.randaugment_magnitude, opt.crop_pct) == (10, False, None, 1.0)
    data = jpeg(32, 32, seed=5)
    out = run(build_transforms("classification", False, 32, opt), data)
    pixels = decode_image(data).float() / 255
    expected = (pixels - torch.tensor(CIFAR10_MEAN).view(3, 1, 1)) / torch.tensor(CIFAR10_STD).view(3, 1, 1)
    assert torch.allclose(out, expected, atol=1e-5)


def test_cifar_protocol_train_pads_and_crops():
    opt = make_options("classification", protocol="cifar", hflip=0.0)
    tf = build_transforms("classification", True, 32, opt)
    image = decode_image(encode_png(noise_image(32, 32, 9)))
    torch.manual_seed(0)
    outs = [tf.sample(image) for _ in range(8)]
    assert all(o.shape == (3, 32, 32) and o.dtype == torch.uint8 for o in outs)
    padded = torch.nn.functional.pad(image, (4, 4, 4, 4))
    for out in outs:  # each output is a 32x32 window of the zero-padded image
        assert any(torch.equal(out, padded[:, y : y + 32, x : x + 32]) for y in range(9) for x in range(9))


def encode_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def test_options_reject_unknown_names_and_protocols():
    with pytest.raises(TypeError, match="valid options"):
        make_options("classification", mix_up=0.5)
    with pytest.raises(ValueError, match="protocol"):
        make_options("classification", protocol="places")
    with pytest.raises(ValueError, match="crop_pct"):
        build_transforms("classification", False, 32, make_options("classification", crop_pct=1.5))


# -- DeiT's RandAugment: timm's rand-m9-mstd0.5-inc1 ---------------------------------------------------------------
def kodak_image() -> torch.Tensor:
    """A real photograph: the first bundled Kodak image, decoded to uint8 (3, H, W)."""
    from loopdata.assets import bundled_kodak_urls
    from loopdata.shards import iter_samples

    sample = next(iter(iter_samples(bundled_kodak_urls("train")[0])))
    return decode_image(sample["jpg"])


def randaugment_of(tf) -> TimmRandAugment | None:
    found = [t for t in tf.sample.transforms if isinstance(t, TimmRandAugment)]
    assert len(found) <= 1
    return found[0] if found else None


def test_imagenet_train_uses_timms_deit_randaugment_with_create_transforms_hparams():
    from timm.data import create_transform
    from timm.data.auto_augment import RandAugment

    opt = make_options("classification")
    assert randaugment_config_string(opt) == "rand-m9-mstd0.5-inc1"
    ra = randaugment_of(build_transforms("classification", True, 224, opt))
    assert ra is not None and ra.config == "rand-m9-mstd0.5-inc1" and isinstance(ra.transform, RandAugment)
    assert ra.transform.num_layers == 2 and ra.transform.choice_weights is None
    assert all(op.magnitude == 9 and op.magnitude_std == 0.5 and op.prob == 0.5 for op in ra.transform.ops)
    names = [op.name for op in ra.transform.ops]  # timm's increasing-severity op set ("inc1")
    assert {"SolarizeIncreasing", "PosterizeIncreasing", "ColorIncreasing", "SharpnessIncreasing"} <= set(names)
    assert not {"Solarize", "Posterize", "Color"} & set(names)
    # ... with exactly the hparams timm's own create_transform gives DeiT's pipeline (bicubic, 224)
    deit = create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic",
                            mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    (theirs,) = [t for t in deit.transforms if isinstance(t, RandAugment)]
    assert repr(ra.transform) == repr(theirs)
    for ours_op, their_op in zip(ra.transform.ops, theirs.ops, strict=True):
        assert (ours_op.name, ours_op.hparams, ours_op.kwargs) == (their_op.name, their_op.hparams, their_op.kwargs)
    assert ra.transform.ops[0].hparams["translate_const"] == 100 and ra.transform.ops[0].kwargs["fillcolor"] == (
        124, 116, 104)


def test_timm_randaugment_runs_on_a_real_image_reproducibly_without_touching_global_rngs():
    import random

    opt = make_options("classification")
    tf = build_transforms("classification", True, 64, opt)
    plain = build_transforms("classification", True, 64, make_options("classification", randaugment_magnitude=None))
    assert randaugment_of(plain) is None
    image = kodak_image()
    assert image.shape[0] == 3 and min(image.shape[1:]) >= 256  # a real photograph, not noise
    random.seed(7)
    np.random.seed(7)
    py_state, np_state = random.getstate(), np.random.get_state()[1].copy()
    outs, crops = [], []
    for seed in range(8):
        torch.manual_seed(seed)
        outs.append(tf.sample(image))
        torch.manual_seed(seed)
        crops.append(plain.sample(image))  # the same crop and flip (RandAugment draws after them)
    assert random.getstate() == py_state and np.array_equal(np.random.get_state()[1], np_state)
    assert all(o.shape == (3, 64, 64) and o.dtype == torch.uint8 for o in outs)
    changed = sum(not torch.equal(o, c) for o, c in zip(outs, crops))
    assert changed >= 4  # at least one of 2 ops (p = 0.5 each) changes the image in ~3/4 of the draws
    torch.manual_seed(3)
    assert torch.equal(tf.sample(image), outs[3])  # seeded by torch's RNG alone: reproducible (resume, workers)
    assert len({o.numpy().tobytes() for o in outs}) == 8


def test_randaugment_options_build_the_timm_string_and_bad_values_are_named():
    opt = make_options("classification", randaugment_magnitude=7, randaugment_ops=3, randaugment_mstd=1.0,
                       randaugment_increasing=False)
    assert randaugment_config_string(opt) == "rand-m7-n3-mstd1-inc0"
    ra = randaugment_of(build_transforms("classification", True, 32, opt))
    assert ra.transform.num_layers == 3 and {op.magnitude for op in ra.transform.ops} == {7}
    assert "Solarize" in [op.name for op in ra.transform.ops] and ra.transform.ops[0].magnitude_std == 1.0
    full = make_options("classification", randaugment_config="rand-m5-n1-mstd0-inc1")
    ra = randaugment_of(build_transforms("classification", True, 32, full))
    assert ra.config == "rand-m5-n1-mstd0-inc1" and ra.transform.num_layers == 1
    assert {(op.magnitude, op.magnitude_std) for op in ra.transform.ops} == {(5, 0.0)}
    # CIFAR has no RandAugment by default; a config string turns it on
    assert randaugment_of(build_transforms("classification", True, 32, make_options("classification",
                                                                                    protocol="cifar"))) is None
    assert randaugment_of(build_transforms("classification", True, 32, make_options(
        "classification", protocol="cifar", randaugment_config="rand-m9-mstd0.5-inc1"))) is not None
    with pytest.raises(ValueError, match=r"randaugment_magnitude must be an integer in \[0, 10\].*got 15"):
        build_transforms("classification", True, 32, make_options("classification", randaugment_magnitude=15))
    with pytest.raises(ValueError, match="starting with 'rand'.*'augmix-m5'"):
        build_transforms("classification", True, 32, make_options("classification", randaugment_config="augmix-m5"))
    with pytest.raises(ValueError, match="'rand-q5' is not a valid timm RandAugment string"):
        build_transforms("classification", True, 32, make_options("classification", randaugment_config="rand-q5"))
    with pytest.raises(ValueError, match="repeated_aug must be an integer >= 1"):
        build_transforms("classification", True, 32, make_options("classification", repeated_aug=0))


def test_randaugment_posterize_at_the_top_of_the_magnitude_range_does_not_crash() -> None:
    """m10 (which DeiT's m9 reaches through mstd noise) asks timm's PosterizeIncreasing for 0 bits; Pillow >= 11
    refuses 0, which stopped training at a random step. 0 bits is a black image, 1..7 match ImageOps.posterize."""
    from PIL import Image, ImageOps

    from loopdata.transforms import posterize_keep_bits

    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8))
    assert np.asarray(posterize_keep_bits(img, 0)).max() == 0
    for bits in range(1, 8):
        assert np.array_equal(np.asarray(posterize_keep_bits(img, bits)), np.asarray(ImageOps.posterize(img, bits)))
    assert posterize_keep_bits(img, 8) is img
    ra = TimmRandAugment("rand-m10-n1-mstd0-inc1-p1.0", 32, (0.5, 0.5, 0.5))  # p1.0: every op applies
    posterize = [op for op in ra.transform.ops if op.name == "PosterizeIncreasing"]
    assert posterize and posterize[0].aug_fn is posterize_keep_bits
    ra.transform.ops = posterize  # every call now posterizes at magnitude 10: 0 bits
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    assert int(ra(image).max()) == 0
