"""Data of the LoopVAE study: ImageNet-sample images split into training and held-out shards, plus Kodak.

The shared ImageNet sample (800 images, one per class, ``../shared/data/imagenet-sample``) is split by
sorted key: every ``holdout_every``-th image is held out of training (40 of 800 by default) and
evaluated at 256^2; the rest train, together with the bundled Kodak crops kodim01-20. kodim21-24 (the
bundled ``kodak-val``) are never trained on. Image bytes are copied unchanged.

With ``validation_offset`` a further ``1 / holdout_every`` of the images (index ``i % holdout_every ==
validation_offset``) leaves training as a *validation* split: the images that model selection (the
recipe search, the release run's learning curve) may look at, disjoint from both reported sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import loopdata
from loopdata.shards import expand_urls, iter_samples
from loopdata.writer import TarShardWriter


@dataclass
class StudyData:
    """Comma-separated shard lists of the study's splits."""

    train: str  # ImageNet-sample minus the held-out images, plus kodim01-20
    kodak_val: str  # kodim21-24
    imagenet_holdout: str  # every holdout_every-th ImageNet-sample image by sorted key
    num_train: int
    num_holdout: int
    validation: str = ""  # every holdout_every-th image at validation_offset (empty without one)
    num_validation: int = 0


def prepare_study_data(shared: Path, out: Path, holdout_every: int = 20, validation_offset: int | None = None
                       ) -> StudyData:
    """Write (once) ``out/imagenet-train-*.tar``, ``out/imagenet-holdout-*.tar`` (and, with
    ``validation_offset``, ``out/imagenet-val-*.tar``) from ``shared``."""
    if validation_offset is not None and not 0 < validation_offset < holdout_every:
        raise ValueError(f"validation_offset must be in 1..{holdout_every - 1}, got {validation_offset}")
    source = shared / "imagenet-sample"
    urls = expand_urls(str(source / "*.tar"))
    if not urls:
        raise FileNotFoundError(
            f"no ImageNet-sample shards in {source}; the study needs ../shared/data (or LOOPVISION_SHARED_DATA)"
        )
    done = out / "DONE"
    if not done.is_file():
        samples = sorted((s for url in urls for s in iter_samples(url)), key=lambda s: s["__key__"])
        with (TarShardWriter(out, "imagenet-train") as train, TarShardWriter(out, "imagenet-holdout") as hold,
              TarShardWriter(out, "imagenet-val") as val):
            for i, sample in enumerate(samples):
                members = {k: v for k, v in sample.items() if not k.startswith("__")}
                split = hold if i % holdout_every == 0 else val if i % holdout_every == validation_offset else train
                split.add(sample["__key__"], members)
        done.write_text(f"{len(samples)} samples, holdout_every={holdout_every}, "
                        f"validation_offset={validation_offset}\n")
    train_urls = expand_urls(str(out / "imagenet-train-*.tar"))
    hold_urls = expand_urls(str(out / "imagenet-holdout-*.tar"))
    val_urls = expand_urls(str(out / "imagenet-val-*.tar"))
    kodak_train = [str(u) for u in loopdata.bundled_kodak_urls("train")]
    n_train = sum(1 for u in train_urls for _ in iter_samples(u))
    n_hold = sum(1 for u in hold_urls for _ in iter_samples(u))
    return StudyData(
        train=",".join(train_urls + kodak_train),
        kodak_val=",".join(str(u) for u in loopdata.bundled_kodak_urls("val")),
        imagenet_holdout=",".join(hold_urls), num_train=n_train + 20, num_holdout=n_hold,
        validation=",".join(val_urls), num_validation=sum(1 for u in val_urls for _ in iter_samples(u)),
    )


RELEASE_VALIDATION_OFFSET = 10  # ImageNet-sample image i is validation when i % 20 == 10 (held out: i % 20 == 0)


def release_data(shared: str | None, out: Path, purpose: str) -> StudyData:
    """The release's data (the study's split plus the validation images) from ``shared`` (default: found);
    exits naming ``purpose`` when the shared ImageNet sample is not there."""
    root = Path(shared) if shared else loopdata.find_shared_data()
    if root is None:
        raise SystemExit(f"{purpose} needs the shared data (ImageNet sample): pass --shared DIR")
    return prepare_study_data(root, out, validation_offset=RELEASE_VALIDATION_OFFSET)


if __name__ == "__main__":
    shared = loopdata.assets.find_shared_data()
    print(prepare_study_data(shared, Path("runs/study-vae/data")))
