"""The front door: README's answer is the studies' numbers, its snippets run as written, every docs page is
reachable from the docs map, every relative link resolves, and the quick-start example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
sys.path.insert(0, str(ROOT / "benchmarks"))


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out, fence = set(), False
    for line in path.read_text().splitlines():
        fence ^= line.startswith("```")
        if not fence and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


def test_readme_is_short_and_answers_first() -> None:
    lines = README.splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines; details belong in docs/"
    answer = next(i for i, line in enumerate(lines) if line.startswith("## The answer"))
    install = next(i for i, line in enumerate(lines) if line.startswith("## Install"))
    assert answer < 30 and install < 90
    # the withdrawn headline appears nowhere in README
    assert "+2.64" not in README and "+1.92" not in README


def test_answer_block_is_the_studies_numbers() -> None:
    import readme_answer

    block = README.split("<!-- BEGIN answer -->\n", 1)[1].split("\n<!-- END answer -->", 1)[0]
    assert block == readme_answer.render(), "README's answer is stale: run python benchmarks/readme_answer.py"


def test_answer_block_reads_each_study_once_its_primaries_are_read(tmp_path: Path) -> None:
    """The generated lines with the studies' families complete (results.json as the pages write them, with made-up
    numbers): the sharing line and rows carry the pre-registered verdict words; SR-ViT's row its interpretation."""
    import json
    import shutil

    import readme_answer

    for study in ("study_fair", "study_sharing", "study_srvit_depth"):
        shutil.copytree(ROOT / "docs" / study, tmp_path / "docs" / study)
    sharing = json.loads((tmp_path / "docs/study_sharing/results.json").read_text())
    rows = [("Q1", -0.05, 5, 0.2, "sharing costs < 0.2 dB"), ("Q2", -0.12, 3, 0.2, "sharing costs"),
            ("P2-long", -0.41, 3, None, "worse")]
    sharing["primaries"] = [{"id": i, "n": n, "diff": d, "ci": [d - 0.1, d + 0.1], "margin": m, "verdict": v,
                             "p_holm": 0.0123} for i, d, n, m, v in rows]
    sharing["conclusion"]["primaries"] = [{"id": i, "n": n, "psnr": {"diff": d, "ci": [d - 0.1, d + 0.1]},
                                           "ssim": {"diff": -0.002, "ci": [-0.004, 0.0]}, "verdict": v}
                                          for i, d, n, _, v in rows]
    depth = json.loads((tmp_path / "docs/study_srvit_depth/results.json").read_text())
    depth.update(primary={"id": "P1", "n": 5, "diff": -1.1, "ci": [-1.9, -0.3], "verdict": "worse"},
                 interpretation="uninformative")
    for name, data in (("study_sharing", sharing), ("study_srvit_depth", depth)):
        (tmp_path / "docs" / name / "results.json").write_text(json.dumps(data))
    block = readme_answer.render(tmp_path)
    assert "| 3 | -0.12 dB [-0.22, -0.02] | **sharing costs** (Holm p 0.0123; margin 0.20 dB) |" in block
    assert "| 3 | -0.41 dB [-0.51, -0.31] | **worse** (Holm p 0.0123) |" in block  # no margin: none named
    assert "Q1 (tied − untied, 12,000 crops): PSNR -0.05 dB [-0.15, +0.05], SSIM -0.002, 5 seeds, **sharing costs " \
           "< 0.2 dB**" in block and "under way" not in block
    assert "| 5 | -1.10 points [-1.90, -0.30] | **worse** (paired t; uninformative under the pre-registered rule) |" \
        in block


def test_every_docs_page_is_in_the_map_and_every_link_resolves() -> None:
    index = (ROOT / "docs/index.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    assert [p for p in pages if f"({p})" not in index] == []
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path) if path else doc
            if not resolved.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert broken == []


def test_readme_snippets_run_as_written(tmp_path: Path) -> None:
    """The reconstruction snippet on a bundled image, and the latent read-back on a folder `loopvae encode` wrote."""
    import io

    from PIL import Image

    import loopdata

    shard = loopdata.bundled_kodak_urls("val")[0]
    sample = next(iter(loopdata.shards.iter_samples(shard)))
    Image.open(io.BytesIO(sample.get("jpg") or sample["png"])).save(tmp_path / "photo.jpg")
    out = subprocess.run([sys.executable, "-m", "loopvae", "encode", "--checkpoint",
                          str(ROOT / "assets/models/loopvae-cnn-tiny"), "--data", shard,
                          "--out", str(tmp_path / "runs/latents"), "--device", "cpu"],
                         capture_output=True, text=True, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    blocks = [b for b in _python_blocks(README) if "from_pretrained" in b or "make_latent_loader" in b]
    assert len(blocks) == 2
    for block in blocks:
        code = block.replace('"assets/models/', f'"{ROOT}/assets/models/')
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
        assert run.returncode == 0, f"README snippet failed:\n{block}\n{run.stderr[-3000:]}"
    assert (tmp_path / "recon.png").is_file()


@pytest.mark.parametrize("script", ["examples/quickstart.py"])
def test_quickstart_example_runs(script: str, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(ROOT / script), "--out", str(tmp_path)], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "identical output: True" in run.stdout
    assert (tmp_path / "recon.png").is_file() and (tmp_path / "prefix.png").is_file()
    # the prefix curve ends at the full decoder's PSNR
    full = float(re.search(r"reconstruction PSNR ([\d.]+) dB", run.stdout).group(1))
    prefix = [float(v) for v in re.search(r"finest-stage prefix PSNR: (.*)", run.stdout).group(1).split(" -> ")]
    assert prefix[-1] == pytest.approx(full, abs=1e-6)
