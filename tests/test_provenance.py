"""Committed artifacts hold no machine's absolute paths (releases under assets/, study results and logs under docs/),
and the helpers that make recorded paths portable do what they say."""

import subprocess
import sys
from pathlib import Path

import pytest

from loopdata.assets import MACHINE_ROOTS, portable_path, portable_text, repo_root

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from portable_provenance import SUFFIXES  # noqa: E402


def test_no_committed_artifact_holds_an_absolute_path() -> None:
    root = repo_root()
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "assets", "docs"], capture_output=True,
                                text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the committed files cannot be listed")
    offenders = []
    for name in listed:
        path = root / name
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(r in line for r in MACHINE_ROOTS):
                offenders.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not offenders, "absolute paths in committed artifacts (run benchmarks/portable_provenance.py):\n" + \
        "\n".join(offenders[:20])


def test_portable_paths() -> None:
    root = repo_root()
    shard = root / "assets" / "kodak" / "kodak-val-000000.tar"
    assert portable_path(shard) == "<repo>/assets/kodak/kodak-val-000000.tar"
    assert portable_path(root) == "<repo>"
    assert portable_path("runs/x/release") == "runs/x/release"  # relative paths are kept as given
    assert portable_path("/opt/elsewhere/a.tar") == "/opt/elsewhere/a.tar"  # outside every root: unchanged
    home = Path.home()
    text = f"{root}/assets/a.tar,{root}/assets/b.tar and {home}/.cache/x.pth; {root}2/c.tar"
    assert portable_text(text) == f"<repo>/assets/a.tar,<repo>/assets/b.tar and ~/.cache/x.pth; {root}2/c.tar"


def test_a_release_records_portable_provenance(tmp_path: Path) -> None:
    import json

    from looprun.release import save_release
    from loopvae import create_model

    model = create_model("dcae-tiny", encoder_block_out_channels=(8, 8, 16, 16),
                         decoder_block_out_channels=(8, 8, 16, 16))
    data = f"{repo_root()}/assets/kodak/kodak-train-000000.tar"
    folder = save_release(model, tmp_path / "release", {"data": data, "run_dir": str(tmp_path / "run")})
    info = json.loads((folder / "release.json").read_text())
    assert info["data"] == "<repo>/assets/kodak/kodak-train-000000.tar"
