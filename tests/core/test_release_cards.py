"""Model cards: the front matter is huggingface_hub's ModelCardData (a valid model-index with dataset ids, not
display names), and every bundled card parses back with the metrics it states."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from looprun.release import card_front_matter, dataset_id

MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"


def test_front_matter_is_model_card_data_with_dataset_ids(tmp_path: Path) -> None:
    results = [{"task": "image-to-image", "dataset": "kodim21-24 (Kodak), 256²", "type": "psnr", "name": "PSNR",
                "value": 28.071234}]
    text = card_front_matter("my-vae", "diffusers", ["loopvision"], results) + "# my-vae\n"
    (tmp_path / "README.md").write_text(text)
    card = ModelCard.load(tmp_path / "README.md")
    (result,) = card.data.eval_results
    assert (result.dataset_type, result.dataset_name, result.metric_type, result.metric_value) == (
        "kodak", "kodim21-24 (Kodak), 256²", "psnr", 28.0712)
    assert card.data.library_name == "diffusers" and card.data.model_name == "my-vae"
    # nothing measured: no model-index at all
    assert "model-index" not in card_front_matter("x", "diffusers", ["t"])
    assert dataset_id("40 held-out ImageNet-sample images, 256²") == "imagenet-sample"
    assert dataset_id("CIFAR-10 test split") == "cifar-10" and dataset_id("My Photos 2026") == "my-photos-2026"


@pytest.mark.parametrize("name", sorted(p.name for p in MODELS.iterdir() if (p / "README.md").is_file()))
def test_bundled_cards_parse_with_their_metrics(name: str) -> None:
    card = ModelCard.load(MODELS / name / "README.md")
    results = card.data.eval_results
    assert results and {r.dataset_type for r in results} <= {"kodak", "imagenet-sample"}
    psnr = next(r.metric_value for r in results if r.dataset_type == "kodak" and r.metric_type == "psnr")
    assert f"{psnr:.2f}" in card.text  # the table states the number the metadata carries
