"""timm interoperability: checkpoint files read as timm reads them, and timm ViT (DeiT) state dicts in srvit.

**Checkpoint files** (:func:`read_checkpoint`, :func:`load_checkpoint`, behind
``srvit.create_model(name, checkpoint_path=...)``): ``.safetensors`` or ``torch.save`` files (``.pth`` / ``.pt`` /
``.bin``, read with ``weights_only=True``), the state dict possibly nested as timm's ``load_checkpoint`` finds it
(``state_dict_ema`` / ``model_ema`` first when ``use_ema``, then ``state_dict``, then ``model``) and with
``module.`` / ``_orig_mod.`` wrapper prefixes removed. Both are timm's own code
(:func:`timm.models.load_state_dict`); this module adds the checks and the errors that name the file and keys.
Nothing is ever downloaded.

**The DeiT recipe** (:func:`convert_timm_vit_state_dict`, :func:`load_timm_vit_state_dict`): a timm
``VisionTransformer`` with class-token pooling (``deit_tiny|small|base_patch16_224``, ``vit_*_patch16_224``) has
exactly srvit's parameter names, so the mapping is the identity on names and shapes::

    timm                                   srvit (RecursiveViT)
    patch_embed.proj.{weight,bias}         patch_embed.proj  Conv2d(3, d, p, stride=p)
    cls_token (1, 1, d), pos_embed (1, 1 + N, d)   the same ([cls; patches] + pos_embed)
    blocks.i.norm1 / norm2                 blocks.i.norm1 / norm2  (LayerNorm, eps 1e-6)
    blocks.i.attn.qkv (3d, d)              blocks.i.attn.qkv  (rows q | k | v, heads contiguous in each)
    blocks.i.attn.proj, mlp.fc1, mlp.fc2   the same (exact GELU between fc1 and fc2)
    norm, head                             norm, head (class token -> LayerNorm -> Linear)

What the recipe adds is checking: timm features srvit does not have (a distillation token, register tokens,
LayerScale, QK-norm, average pooling, ...) are refused by name instead of being dropped silently, every shape is
compared, and the srvit parameters timm has no counterpart for (SoftMoR routers ``fusions.*``, the bViT step
embedding) are the only ones allowed to stay at their initialisation, which is how an SR-ViT is warm-started
from DeiT weights. A different resolution resamples ``pos_embed`` with timm's ``resample_abs_pos_embed`` when
asked (``resample_pos_embed=True``); a different class count keeps srvit's fresh head (``load_head=False``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .model import RecursiveViT

# Every key of the supported timm layout, with the srvit key it becomes (the identity: see the module docstring).
_TIMM_VIT_KEY = re.compile(
    r"^(?:cls_token|pos_embed|patch_embed\.proj\.(?:weight|bias)"
    r"|blocks\.\d+\.(?:norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(?:weight|bias)"
    r"|norm\.(?:weight|bias)|head\.(?:weight|bias))$"
)
# timm ViT features srvit does not implement: key pattern -> what it is.
_UNSUPPORTED_TIMM_FEATURES = (
    (re.compile(r"^(?:dist_token|head_dist\.)"), "a distillation token and head (deit_*_distilled_*)"),
    (re.compile(r"^reg_token"), "register tokens (vit_*_reg*)"),
    (re.compile(r"\.ls[12]\.gamma$"), "LayerScale (DeiT III, CaiT-style ls1/ls2)"),
    (re.compile(r"\.attn\.(?:q_norm|k_norm)\."), "QK-norm"),
    (re.compile(r"\.attn\.(?:q|k|v|q_proj|k_proj|v_proj|q_bias|v_bias)\b"), "separate q/k/v projections or biases"),
    (re.compile(r"^fc_norm\."), "average pooling with fc_norm (global_pool='avg'), not the class token"),
    (re.compile(r"^norm_pre\."), "a pre-trunk norm (CLIP-style norm_pre)"),
    (re.compile(r"^attn_pool\."), "attention pooling (global_pool='map')"),
    (re.compile(r"^patch_embed\.norm\."), "a patch-embedding norm"),
    (re.compile(r"\.mlp\.(?:norm|fc1_g|fc1_x)\."), "a gated or normed MLP (SwiGLU / scale_mlp_norm)"),
)
# srvit parameters without a timm counterpart: they keep their initialisation (zero-initialised routers = `mean`).
_SRVIT_ONLY = re.compile(r"^(?:fusions\.|step_embedding\.)")


class CheckpointLoadError(RuntimeError):
    """A checkpoint file or state dict does not fit the model; the message names the file, keys and shapes."""


def _describe(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


def read_checkpoint(path: str | os.PathLike, use_ema: bool = True) -> dict[str, torch.Tensor]:
    """The state dict stored in ``path`` (a local file; see the module docstring for the formats and nesting).

    Raises:
        FileNotFoundError: ``path`` is not a file.
        CheckpointLoadError: the file cannot be read, or holds no ``str -> Tensor`` mapping.
    """
    from timm.models import load_state_dict

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint_path={str(path)!r} is not a file; pass a local .safetensors or .pth/.pt state dict "
            "(srvit never downloads weights)"
        )
    try:
        state = load_state_dict(str(path), use_ema=use_ema, device="cpu", weights_only=True)
    except Exception as err:  # torch / safetensors raise many types for unreadable files
        raise CheckpointLoadError(
            f"{path}: cannot read a state dict ({type(err).__name__}: {err}); expected a .safetensors file or a "
            f"torch.save'd dict of tensors, possibly nested under 'model' / 'state_dict' / 'model_ema'"
        ) from err
    bad = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor)) if isinstance(state, dict) else None
    if bad is None or bad:
        what = f"non-tensor entries {_describe(bad)}" if bad else f"a {type(state).__name__}"
        raise CheckpointLoadError(
            f"{path}: expected a state dict of tensors (possibly under 'model' / 'state_dict' / 'model_ema'), "
            f"found {what}"
        )
    return state


def load_checkpoint(model: RecursiveViT, path: str | os.PathLike, use_ema: bool = True) -> RecursiveViT:
    """Load the state dict in ``path`` into ``model`` strictly: every key and shape must match (srvit names).

    A timm ViT checkpoint (its names are srvit's) loads as well when the architecture matches; for checked
    loading of timm weights into SR-ViT / other resolutions use :func:`load_timm_vit_state_dict`.

    Raises:
        CheckpointLoadError: missing or unexpected keys, or shape mismatches, each named with the file.
    """
    state = read_checkpoint(path, use_ema)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in set(own) & set(state) if state[k].shape != own[k].shape
    )
    if missing or unexpected or shapes:
        problems = []
        if missing:
            problems.append(f"missing keys: {_describe(missing)}")
        if unexpected:
            problems.append(f"unexpected keys: {_describe(unexpected)}")
        if shapes:
            problems.append(f"shape mismatches: {_describe(shapes, 4)}")
        raise CheckpointLoadError(
            f"{path} does not fit {model.config.family} (depth {model.config.depth}, embed_dim "
            f"{model.config.embed_dim}, num_classes {model.config.num_classes}, img_size {model.config.img_size}): "
            + "; ".join(problems)
            + ". Build the model with the checkpoint's overrides (e.g. num_classes=...), or convert timm weights "
            "with srvit.load_timm_vit_state_dict(model, srvit.read_checkpoint(path), ...)"
        )
    model.load_state_dict(state, strict=True)
    return model


def convert_timm_vit_state_dict(
    state_dict: dict[str, torch.Tensor], model: RecursiveViT, *, resample_pos_embed: bool = False,
    load_head: bool = True,
) -> dict[str, torch.Tensor]:
    """Map a timm ``VisionTransformer`` (DeiT layout) state dict onto ``model``'s keys, checking everything.

    Args:
        state_dict: timm's ``model.state_dict()`` or a file's (``module.`` prefixes are removed).
        model: the target; its depth, width and MLP ratio must match the timm model's.
        resample_pos_embed: a ``pos_embed`` for another patch grid is resampled (bicubic, timm's
            ``resample_abs_pos_embed``) to ``model``'s grid instead of raising.
        load_head: ``False`` drops timm's ``head.*`` so ``model`` keeps its own (e.g. fine-tuning to other classes).

    Returns:
        The state dict in srvit names; :func:`load_timm_vit_state_dict` loads it.

    Raises:
        CheckpointLoadError: a timm feature srvit lacks, an unknown key, a missing parameter, or a shape mismatch.
    """
    from timm.layers import resample_abs_pos_embed
    from timm.models import clean_state_dict

    state = clean_state_dict(dict(state_dict))
    for pattern, feature in _UNSUPPORTED_TIMM_FEATURES:
        hits = sorted(k for k in state if pattern.search(k))
        if hits:
            raise CheckpointLoadError(
                f"the timm state dict has {feature} ({_describe(hits, 3)}), which srvit's RecursiveViT does not "
                "implement; use a class-token ViT without it (e.g. deit_small_patch16_224)"
            )
    unknown = sorted(k for k in state if not _TIMM_VIT_KEY.match(k))
    if unknown:
        raise CheckpointLoadError(
            f"keys outside the timm DeiT/ViT layout: {_describe(unknown)}; expected only patch_embed.proj, cls_token, "
            "pos_embed, blocks.i.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}, norm and head"
        )
    if not load_head:
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
    own = model.state_dict()
    converted: dict[str, torch.Tensor] = {}
    shapes = []
    for key, value in state.items():
        if key not in own:
            continue  # reported below with the other unexpected keys
        target = own[key].shape
        if key == "pos_embed" and value.shape != target and resample_pos_embed and value.shape[-1] == target[-1]:
            grid = model.config.img_size // model.config.patch_size
            value = resample_abs_pos_embed(value, new_size=[grid, grid], num_prefix_tokens=1)
        if value.shape != target:
            shapes.append(f"{key}: timm {tuple(value.shape)} vs srvit {tuple(target)}")
        converted[key] = value
    unexpected = sorted(set(state) - set(own))
    missing = sorted(k for k in set(own) - set(converted) if not _SRVIT_ONLY.match(k)
                     and not (k.startswith("head.") and not load_head))
    if shapes or unexpected or missing:
        hints = []
        if any(s.startswith("pos_embed") for s in shapes):
            hints.append("pass resample_pos_embed=True for another resolution or patch grid")
        if any(s.startswith("head.") for s in shapes) or any(k.startswith("head.") for k in unexpected + missing):
            hints.append("pass load_head=False to keep srvit's own head (other num_classes)")
        hints.append("build the srvit model with the timm model's depth / embed_dim / num_heads / mlp_ratio")
        problems = [f"{name}: {_describe(keys, 4)}" for name, keys in
                    (("shape mismatches", shapes), ("timm keys srvit lacks", unexpected),
                     ("srvit parameters timm lacks", missing)) if keys]
        raise CheckpointLoadError(
            f"the timm ViT state dict does not fit this {model.config.family} model: " + "; ".join(problems)
            + "; " + "; ".join(hints)
        )
    return converted


def load_timm_vit_state_dict(
    model: RecursiveViT, state_dict: dict[str, torch.Tensor], *, resample_pos_embed: bool = False,
    load_head: bool = True,
) -> list[str]:
    """Load a timm DeiT/ViT state dict into ``model`` (see :func:`convert_timm_vit_state_dict` for the arguments).

    Returns:
        The names of ``model``'s parameters left at their initialisation: the SoftMoR routers / step embedding
        timm has no counterpart for, and ``head.*`` with ``load_head=False``; empty for ``vit-*`` models.
    """
    converted = convert_timm_vit_state_dict(
        state_dict, model, resample_pos_embed=resample_pos_embed, load_head=load_head
    )
    result = model.load_state_dict(converted, strict=False)
    if result.unexpected_keys:  # cannot happen after the conversion's checks; kept as a guard
        raise CheckpointLoadError(f"unexpected keys after conversion: {_describe(sorted(result.unexpected_keys))}")
    return sorted(result.missing_keys)
