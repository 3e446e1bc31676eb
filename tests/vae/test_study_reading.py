"""The LoopVAE study's reading is computed from its numbers: change the numbers, the sentences change."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from study_loopvae_report import reading  # noqa: E402

GROUPS = {"global": ["global-s0", "global-s1"], "reference": ["flux-vae-tiny-s0", "flux-vae-tiny-s1"],
          "scale": ["scale-s0"], "none": ["none-s0"], "shortcuts": ["shortcuts-s0"],
          "deep-supervision": ["global-ds-s0"]}


def _stage(branch: str, scale: str, prefix: list[float], bypass: list[float]) -> dict:
    return {"branch": branch, "scale": scale, "passes": len(prefix),
            "prefix": [{"passes": k + 1, "psnr": v, "raw_psnr": v - 1, "out_of_range": 0.1 / (k + 1),
                        "clip_displacement": 0.01} for k, v in enumerate(prefix)],
            "bypass": [{"pass": t, "psnr": v} for t, v in enumerate(bypass)]}


def _interventions(dec2x: list[float], bypass2x: list[float]) -> dict:
    full = dec2x[-1]
    return {"num_images": 16, "baseline": {"psnr": full, "raw_psnr": full, "out_of_range": 0.01,
                                            "clip_displacement": 0.001},
            "stages": [_stage("encoder", "2x", [full], [full - 0.1]),
                       _stage("encoder", "4x", [full - 0.3, full], [full - 0.1, full - 0.2]),
                       _stage("decoder", "2x", dec2x, bypass2x)]}


def result(global_psnr: float = 24.0, reference_psnr: float = 23.0, dec2x=(18.0, 20.0, 22.0, 24.0),
           bypass2x=(23.0, 22.0, 20.0, 23.5)) -> dict:
    ev = {}
    for group, names in GROUPS.items():
        base = {"global": global_psnr, "reference": reference_psnr}.get(group, global_psnr - 0.5)
        for i, name in enumerate(names):
            ev[name] = {split: {"psnr": base + 0.05 * i, "baseline": {"psnr": 25.0}} for split in ("kodak", "imagenet")}
    return {"eval": ev, "groups": GROUPS, "num_holdout": 40,
            "params": {"global": 350_535, "reference": 1_031_401, "scale": 650_000, "none": 1_250_000},
            "gmacs": {"global": 7.23, "reference": 5.63}, "bundled": {"name": "global-s1"},
            "interventions": {"global-s1": _interventions(list(dec2x), list(bypass2x)),
                              "global-s0": _interventions(list(dec2x), list(bypass2x)),
                              "global-ds-s0": _interventions([22.0, 22.5, 23.0, 23.8], list(bypass2x))}}


def _line(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(start))


def test_weights_vs_quality_follows_the_sign_and_size_of_the_gap() -> None:
    above = _line(reading(result(24.0, 23.0)), "- **Weights vs quality (kodim21-24)")
    assert "above the FLUX-layout reference" in above and "+1.00 dB" in above and "holds" in above
    below = _line(reading(result(22.0, 23.0)), "- **Weights vs quality (kodim21-24)")
    assert "below the FLUX-layout reference" in below and "does not appear" in below
    close = _line(reading(result(23.02, 23.0)), "- **Weights vs quality (kodim21-24)")
    assert "within noise of" in close


def test_bicubic_truncation_monotonicity_and_bypass_are_decided_by_the_numbers() -> None:
    lines = reading(result(24.0))
    assert "target is ≥ +1.0 dB: not met" in _line(lines, "- **Against bicubic")
    assert "target is ≥ +1.0 dB: met" in _line(reading(result(26.5)), "- **Against bicubic")
    done = _line(lines, "  Decoder 2x")
    assert "18.00 → 20.00 → 22.00 → 24.00" in done and "costs 6.00 dB" in done and "≥ 5 dB: met" in done
    assert "2 of 2 multi-pass" in _line(lines, "- **Completing the recurrence")
    flat = reading(result(24.0, dec2x=(23.5, 24.1, 23.9, 24.0)))
    assert "1 of 2 multi-pass stages (not in: decoder 2x)" in _line(flat, "- **Completing the recurrence")
    assert "≥ 5 dB: not met" in _line(flat, "  Decoder 2x")
    bypass = _line(lines, "- **Bypass")
    assert "in 2 of 2 multi-pass stages" in bypass and "decoder 2x: pass 3 of 4" in bypass
    helps = _line(reading(result(24.0, bypass2x=(23.0, 24.2, 20.0, 23.5))), "- **Bypass")
    assert "in 1 of 2 multi-pass stages" in helps


@pytest.mark.parametrize("ds_prefix,expect", [
    ((22.0, 22.5, 23.0), "every early exit improves by more than the seed noise (0.05 dB): an any-time decoder"),
    ((18.01, 20.0, 22.0), "no early exit improves by more than the seed noise"),
    ((22.0, 20.0, 22.0), "the exits after 1 pass(es) improve by more than the seed noise"),
])
def test_deep_supervision_sentence_compares_early_exits(ds_prefix: tuple, expect: str) -> None:
    r = result(24.0)  # the plain run's decoder-2x prefix is 18 -> 20 -> 22 -> 24
    r["interventions"]["global-ds-s0"] = _interventions([*ds_prefix, 23.8], [23.0, 22.0, 20.0, 23.5])
    line = _line(reading(r), "- **Deep supervision")
    assert "full-depth PSNR by -0.20 dB" in line and expect in line


def test_a_noisy_reference_does_not_hide_a_gap_between_loopvae_variants() -> None:
    r = result(24.0, 23.0)
    r["eval"]["flux-vae-tiny-s1"] = {s: {"psnr": 25.0, "baseline": {"psnr": 25.0}} for s in ("kodak", "imagenet")}
    for split in ("kodak", "imagenet"):
        r["eval"]["shortcuts-s0"][split]["psnr"] = 24.3  # +0.28 dB over the global mean of 24.025
    lines = reading(r)
    assert "within noise of the FLUX-layout reference" in _line(lines, "- **Weights vs quality (kodim21-24)")
    assert "above the plain-conv model" in _line(lines, "- **Shortcuts")
