"""Where the data lives: the bundled Kodak shards (in the repo) and the optional shared data sets."""

from __future__ import annotations

import os
from pathlib import Path

SHARED_ENV = "LOOPVISION_SHARED_DATA"
KODAK_SPLITS = ("train", "val", "full")


def repo_root() -> Path:
    """The repository root (``pipelines/loopdata/assets.py`` -> three levels up)."""
    return Path(__file__).resolve().parents[2]


def find_shared_data() -> Path | None:
    """The shared data directory (ImageNet sample, CIFAR, Kodak shards), or ``None`` when absent.

    Looks at ``$LOOPVISION_SHARED_DATA`` first, then ``<repo>/../shared/data``. A user's clone usually has
    neither; callers must then skip (tests) or ask for a path (benchmarks).
    """
    candidates = []
    if os.environ.get(SHARED_ENV):
        candidates.append(Path(os.environ[SHARED_ENV]))
    candidates.append(repo_root().parent / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path
    return None


def bundled_kodak_dir() -> Path:
    """Directory of the committed Kodak shards (``<repo>/assets/kodak``)."""
    return repo_root() / "assets" / "kodak"


def bundled_kodak_urls(split: str = "train") -> list[str]:
    """Paths of the bundled Kodak shards of one split.

    Splits: ``"train"`` (kodim01-20, 384x256 / 256x384 JPEG), ``"val"`` (kodim21-24, same processing),
    ``"full"`` (kodim23 and kodim24, original 768x512 PNG bytes, for tiling tests). No labels.
    """
    if split not in KODAK_SPLITS:
        raise ValueError(f"unknown Kodak split {split!r}; choose one of {KODAK_SPLITS}")
    directory = bundled_kodak_dir()
    urls = sorted(str(p) for p in directory.glob(f"kodak-{split}-*.tar"))
    if not urls:
        raise FileNotFoundError(
            f"no bundled Kodak shards for split {split!r} in {directory}; regenerate them with "
            "`loopdata bundle-kodak --source <shared>/kodak/kodak-000000.tar`"
        )
    return urls


# Absolute paths of this machine that a committed artifact must not hold (see portable_text).
MACHINE_ROOTS = ("/work/", "/root/", "/home/", "/tmp/", "/Users/", "/mnt/", "/private/")


def portable_path(path: str | os.PathLike) -> str:
    """``path`` as recorded provenance: relative to the repository (``<repo>/...``), the shared data
    (``<data>/...``) or the home folder (``~/...``) when under one of them; a relative path or one elsewhere is
    kept as given. Artifacts that other machines read (releases, study results) never hold this machine's
    absolute paths."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    resolved = Path(text).resolve()
    roots = [("<repo>", repo_root())]
    shared = find_shared_data()
    if shared is not None:
        roots.append(("<data>", shared))
    roots.append(("~", Path.home()))
    for name, root in roots:
        try:
            rel = resolved.relative_to(root.resolve())
        except ValueError:
            continue
        return name if str(rel) == "." else f"{name}/{rel}"
    return text


def portable_text(text: str) -> str:
    """Every absolute path under the repository, the shared data or the home folder inside ``text`` (a log line,
    a comma-separated shard list, an error message) rewritten by :func:`portable_path`."""
    import re

    roots = [str(repo_root().resolve())]
    shared = find_shared_data()
    if shared is not None:
        roots.append(str(shared.resolve()))
        if str(shared) != str(shared.resolve()):
            roots.append(str(shared))
    roots.append(str(Path.home()))
    alternatives = "|".join(re.escape(r) for r in sorted(roots, key=len, reverse=True))
    pattern = re.compile("(" + alternatives + r")(?=$|[/\s,'\"])(/[^\s,'\"]*)?")  # whole path components only
    return pattern.sub(lambda m: portable_path(m.group(0)), text)
