"""Rewrite this machine's absolute paths in committed artifacts (release folders under ``assets/``, study results
and logs under ``docs/``) as ``<repo>/...``, ``<data>/...`` or ``~/...`` (:func:`loopdata.assets.portable_text`).

Only path strings change: no number, no weight file. The bundled model's weights are checked against the sha256
its ``release.json`` records before and after. New artifacts are written portable at the source (releases,
latent statistics); this script brings older committed files in line, and ``tests/test_provenance.py`` fails if
a committed artifact holds an absolute path again.

Usage: ``python benchmarks/portable_provenance.py`` (``--check`` only lists the files it would change).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from loopdata.assets import portable_text
from looprun.checkpoint import sha256_file

SUFFIXES = {".json", ".log", ".md", ".yaml", ".yml", ".txt"}


def artifact_files(root: Path) -> list[Path]:
    """Committed text artifacts under ``assets/`` and ``docs/``."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "assets", "docs"], capture_output=True, text=True,
                         check=True).stdout.split()
    return [root / f for f in out if Path(f).suffix in SUFFIXES]


def check_weights(root: Path) -> None:
    for release in (root / "assets" / "models").glob("*/release.json"):
        info = json.loads(release.read_text())
        weights = release.parent / info.get("weights_file", "diffusion_pytorch_model.safetensors")
        if sha256_file(weights) != info["sha256"]:
            raise SystemExit(f"{weights}: sha256 differs from {release}: stop, the weights changed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list the files that hold absolute paths; change none")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    check_weights(root)
    changed = []
    for path in artifact_files(root):
        if not path.is_file():  # tracked, but deleted in the working tree (a file being moved)
            continue
        text = path.read_text()
        new = portable_text(text)
        if new != text:
            changed.append(path.relative_to(root))
            if not args.check:
                path.write_text(new)
    check_weights(root)
    for name in changed:
        print(("would rewrite " if args.check else "rewrote ") + str(name))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
