"""loopcore: the shared, scale- and loop-conditioned recursive core of loopvision.

Main pieces: :class:`ScaleLoopEmbedding` (``c = e_s + e_t``), :class:`ModulatedBlock` (adaLN-Zero)
with :class:`ConvOperator` or :class:`AttentionOperator`, :class:`LoopedCore` (K stored blocks,
per-stage pass counts, sharing rules, gated injection, hooks, per-pass checkpointing),
:class:`SoftMoRFusion`, the ODE steppers in :mod:`loopcore.ode` and the pre-norm ViT block
:class:`PreNormBlock` that the recursive classifiers reuse (SR-ViT and bViT run on :class:`LoopedCore` too).
Model code only: the run infrastructure (config, checkpoints, distributed, EMA, logging, release
artifacts) is :mod:`looprun`.
"""

from .attention import Attention, AttentionOperator, Mlp, apply_rope_2d, rope_2d_cos_sin
from .conv_operator import ConvOperator
from .hooks import LoopHooks, PassRecord, relative_update
from .looped_core import SHARING_RULES, LoopedCore, StageOutput, stored_block_count
from .modulation import (
    ModulatedBlock,
    ScaleLoopEmbedding,
    attention_block,
    block_factory,
    broadcast_modulation,
    conv_block,
    set_fused_blocks,
)
from .ode import SOLVERS, ODESolver, euler_step, heun_step, residual_field, rk4_step, supervised_steps
from .prenorm import PreNormBlock, drop_path
from .softmor import FUSION_MODES, FusionOutput, SoftMoRFusion, fusion_entropy, router_parameter_count

__all__ = [
    "FUSION_MODES", "SHARING_RULES", "SOLVERS",
    "Attention", "AttentionOperator", "ConvOperator", "FusionOutput", "LoopHooks", "LoopedCore", "Mlp",
    "ModulatedBlock", "ODESolver", "PassRecord", "PreNormBlock", "ScaleLoopEmbedding", "SoftMoRFusion",
    "StageOutput", "apply_rope_2d", "attention_block", "block_factory", "broadcast_modulation", "conv_block",
    "drop_path", "euler_step",
    "fusion_entropy", "heun_step", "relative_update", "residual_field", "rk4_step", "rope_2d_cos_sin",
    "router_parameter_count", "set_fused_blocks", "stored_block_count", "supervised_steps",
]
__version__ = "0.1.0"
