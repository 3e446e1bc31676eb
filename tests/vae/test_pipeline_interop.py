"""LoopVAE as the ``vae`` of real diffusers pipelines (tiny random components, nothing downloaded), the
diffusers folder layout of releases, and the model card."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from diffusers import (
    AutoModel,
    DDIMScheduler,
    DiffusionPipeline,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)
from PIL import Image

import loopvae
from looprun.checkpoint import sha256_file
from looprun.release import LEGACY_WEIGHTS_NAME, WEIGHTS_NAME, save_release
from loopvae import LoopVAE
from lv_testing import randomize_

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pip install -e .[dev])")


def _tiny_vae() -> LoopVAE:
    torch.manual_seed(0)
    return randomize_(loopvae.create_model("loopvae-cnn-tiny")).eval()


def _tiny_clip(tmp: Path):
    """A CLIP tokenizer from a 4-token vocabulary written here, and a 1-layer random CLIP text encoder."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "a</w>": 2, "photo</w>": 3}
    (tmp / "vocab.json").write_text(json.dumps(vocab))
    (tmp / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = transformers.CLIPTokenizer(str(tmp / "vocab.json"), str(tmp / "merges.txt"), model_max_length=8)
    config = transformers.CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
        max_position_embeddings=8, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    return tokenizer, transformers.CLIPTextModel(config).eval()


def _sd_pipeline(vae: LoopVAE, tmp: Path) -> StableDiffusionPipeline:
    tokenizer, text_encoder = _tiny_clip(tmp)
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=vae.config.latent_channels, out_channels=vae.config.latent_channels,
        block_out_channels=(32, 64), layers_per_block=1, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=32,
    )
    return StableDiffusionPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=DDIMScheduler(clip_sample=False),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )


def test_the_config_carries_what_pipelines_read() -> None:
    vae = _tiny_vae()
    cfg = vae.config
    assert 2 ** (len(cfg.block_out_channels) - 1) == cfg.latent_factor == 8  # pipelines' vae_scale_factor
    assert list(cfg.block_out_channels) == [cfg.width] * 4  # the width at full resolution, 2x, 4x and 8x
    assert (cfg.latent_channels, cfg.scaling_factor, cfg.shift_factor, cfg.force_upcast) == (16, 1.0, 0.0, False)
    with pytest.raises(ValueError, match="block_out_channels .* latent_factor 8 needs 4"):
        LoopVAE(width=48, num_blocks=1, norm_num_groups=8, block_out_channels=(48, 48))


def test_stable_diffusion_pipeline_runs_end_to_end_with_a_loopvae(tmp_path: Path) -> None:
    vae = _tiny_vae()
    pipe = _sd_pipeline(vae, tmp_path)
    assert pipe.vae_scale_factor == 8
    out = pipe("a photo", num_inference_steps=2, height=64, width=48, output_type="pil",
               generator=torch.Generator().manual_seed(0))
    (image,) = out.images
    assert isinstance(image, Image.Image) and image.size == (48, 64) and image.mode == "RGB"


def test_flux_pipeline_applies_the_shift_factor_and_decodes(tmp_path: Path) -> None:
    vae = _tiny_vae()
    vae.register_to_config(scaling_factor=0.5, shift_factor=0.25)
    seen: list[torch.Tensor] = []
    decode = vae.decode
    vae.decode = lambda z, *a, **k: seen.append(z) or decode(z, *a, **k)  # type: ignore[method-assign]
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=4 * vae.config.latent_channels, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer)
    assert pipe.vae_scale_factor == 8
    embeds = dict(prompt_embeds=torch.randn(1, 8, 32), pooled_prompt_embeds=torch.randn(1, 32), height=64, width=64,
                  num_inference_steps=2, guidance_scale=1.0)
    latents = pipe(**embeds, output_type="latent", generator=torch.Generator().manual_seed(0)).images
    images = pipe(**embeds, output_type="pil", generator=torch.Generator().manual_seed(0)).images
    assert images[0].size == (64, 64)
    # FLUX decodes latents / scaling_factor + shift_factor, 16 channels at 1/8 of the image side
    assert seen[-1].shape == (1, 16, 8, 8)
    unpacked = pipe._unpack_latents(latents, 64, 64, pipe.vae_scale_factor)
    torch.testing.assert_close(seen[-1], unpacked / 0.5 + 0.25)


@torch.no_grad()
def test_a_saved_pipeline_folder_holds_the_loopvae_where_diffusers_looks(tmp_path: Path) -> None:
    vae = _tiny_vae()
    pipe = _sd_pipeline(vae, tmp_path)
    pipe.save_pretrained(tmp_path / "pipe")
    assert (tmp_path / "pipe" / "vae" / WEIGHTS_NAME).is_file()
    x = torch.rand(1, 3, 64, 64) * 2 - 1
    expected = vae(x).sample
    again = LoopVAE.from_pretrained(tmp_path / "pipe", subfolder="vae")
    assert torch.equal(again(x).sample, expected)
    reloaded = DiffusionPipeline.from_pretrained(tmp_path / "pipe")  # model_index.json names loopvae.model
    assert isinstance(reloaded.vae, LoopVAE) and torch.equal(reloaded.vae(x).sample, expected)
    assert reloaded.vae_scale_factor == 8
    auto = AutoModel.from_pretrained(str(tmp_path / "pipe"), subfolder="vae")
    assert isinstance(auto, LoopVAE) and torch.equal(auto(x).sample, expected)
    # and the loopvae tools take the pipeline's vae/ folder directly
    from loopvae.loading import load_tokenizer

    loaded = load_tokenizer(tmp_path / "pipe" / "vae")
    assert loaded.kind == "diffusers" and torch.equal(loaded.model(x).sample, expected)


@torch.no_grad()
def test_releases_use_the_diffusers_layout_with_a_card_and_legacy_releases_still_load(tmp_path: Path) -> None:
    vae = _tiny_vae()
    folder = save_release(vae, tmp_path / "release", {"step": 7, "weights": "ema", "data": "kodak"},
                          {"MACs per 256² reconstruction": "7.23 G"})
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(["README.md", "config.json", "release.json", WEIGHTS_NAME])
    info = json.loads((folder / "release.json").read_text())
    assert info["weights_file"] == WEIGHTS_NAME and info["sha256"] == sha256_file(folder / WEIGHTS_NAME)
    assert (info["step"], info["weights"]) == (7, "ema")
    card = (folder / "README.md").read_text()
    for fact in ("parameters: 350,535", "MACs per 256² reconstruction: 7.23 G", "step `7`", info["sha256"],
                 "metrics: none measured", '"latent_factor": 8'):
        assert fact in card, fact
    x = torch.rand(2, 3, 64, 64) * 2 - 1
    expected = vae(x).sample
    assert torch.equal(LoopVAE.from_pretrained(folder)(x).sample, expected)
    legacy = tmp_path / "legacy"
    shutil.copytree(folder, legacy)
    (legacy / WEIGHTS_NAME).rename(legacy / LEGACY_WEIGHTS_NAME)
    config = json.loads((legacy / "config.json").read_text())
    del config["block_out_channels"]  # written before the key existed
    (legacy / "config.json").write_text(json.dumps(config))
    old = LoopVAE.from_pretrained(legacy)
    assert list(old.config.block_out_channels) == [48] * 4 and torch.equal(old(x).sample, expected)


def test_a_trained_release_has_a_card_with_its_macs_and_provenance(tiny_run) -> None:
    release = tiny_run[0] / "release"
    card = (release / "README.md").read_text()
    info = json.loads((release / "release.json").read_text())
    assert info["sha256"] == sha256_file(release / WEIGHTS_NAME) and info["sha256"] in card
    assert "MACs per 256² reconstruction: 7.23 G" in card  # loopvae-cnn-tiny: 7.23 GMACs (test_shortcuts)
    assert info["model_name"] == "loopvae-cnn-tiny" and "kodak" in info["data"]
    assert "loopvae eval --checkpoint" in card and "40 steps" in card
