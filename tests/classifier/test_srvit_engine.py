"""SR-ViT and bViT run on the shared engine, loopcore.LoopedCore: its hooks and checkpointing work on classifiers."""

import pytest
import torch

import loopcore as lc
import srvit

TINY = dict(embed_dim=24, num_heads=2, patch_size=8, img_size=16, num_classes=5)


def _model(name: str, **overrides) -> srvit.RecursiveViT:
    torch.manual_seed(0)
    return srvit.create_model(name, **{**TINY, **overrides}).eval()


def _full_logits(model: srvit.RecursiveViT, x: torch.Tensor, steps: int | None = None) -> torch.Tensor:
    """Logits through the full computation (no class-token-only last application)."""
    return model.forward_head(model.forward_features(x, steps))


def test_the_engine_is_a_looped_core_holding_the_models_own_blocks_and_routers() -> None:
    model = _model("srvit-ti", depth=3, recursion=2, fusion_mode="query")
    assert isinstance(model.engine, lc.LoopedCore)
    assert model.engine.blocks is model.blocks and model.engine.fusions is model.fusions
    assert model.engine.passes == [2, 2, 2] and model.engine.sharing == "scale"
    assert model.engine.embedding is None and len(model.engine.injections) == 0  # no conditioning, no injection
    keys = set(model.state_dict())
    assert "blocks.2.attn.qkv.weight" in keys and "fusions.1.query.1.weight" in keys  # timm-style names kept
    assert not any(k.startswith("engine.") for k in keys)
    bvit = _model("bvit-ti", steps=4)
    assert bvit.engine.passes == [4] and bvit.engine.sharing == "global" and len(bvit.blocks) == 1


@pytest.mark.parametrize("name,overrides", [
    ("srvit-ti", dict(depth=2, recursion=3, fusion_mode="token")),
    ("srvit-ti", dict(depth=2, recursion=2, fusion_mode="last")),
    ("bvit-ti", dict(steps=3, solver="heun")),
])
def test_hooks_that_only_record_leave_the_logits_bit_identical(name: str, overrides: dict) -> None:
    model = _model(name, **overrides)
    x = torch.randn(2, 3, 16, 16)
    plain = _full_logits(model, x)
    hooks = lc.LoopHooks(record=True)
    with model.use_hooks(hooks):
        hooked = model(x)  # hooks installed: the full computation, every application recorded
    assert torch.equal(hooked, plain)
    torch.testing.assert_close(model(x), plain, rtol=1e-5, atol=1e-5)  # the class-token shortcut is back
    depth, r = model.config.depth, model.config.recursion
    assert [(rec.scale, rec.loop) for rec in hooks.records] == [(j, t) for j in range(depth) for t in range(r)]
    assert all(rec.relative_update.shape == (2,) and not rec.bypassed for rec in hooks.records)


def test_prefix_and_bypass_on_bvit_equal_running_fewer_steps() -> None:
    # bViT has no step conditioning: k applications of its shared block are k steps, whichever is skipped.
    model = _model("bvit-ti", steps=5)
    x = torch.randn(2, 3, 16, 16)
    for k in (1, 3):
        with model.use_hooks(lc.LoopHooks(prefix={0: k})):
            truncated = model(x)
        assert torch.equal(truncated, _full_logits(model, x, steps=k))
    for t in (0, 2, 4):
        hooks = lc.LoopHooks(bypass={(0, t)}, record=True)
        with model.use_hooks(hooks):
            bypassed = model(x)
        assert torch.equal(bypassed, _full_logits(model, x, steps=4))
        assert [rec.bypassed for rec in hooks.records] == [i == t for i in range(5)]
        assert float(hooks.records[t].relative_update.abs().max()) == 0.0


def test_prefix_on_srvit_truncates_one_block_and_changes_only_what_follows() -> None:
    model = _model("srvit-ti", depth=2, recursion=3, fusion_mode="query")
    x = torch.randn(2, 3, 16, 16)
    records = lc.LoopHooks(record=True, prefix={1: 1})
    with model.use_hooks(records):
        truncated = model.forward_trace(x)
    full = model.forward_trace(x)
    assert torch.equal(truncated.trajectory[0], full.trajectory[0])  # block 0 untouched
    assert [(r.scale, r.loop) for r in records.records] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    # one application of block 1, no fusion over a single pass: the trajectory state is that application
    assert truncated.fusion_weights[1] is None
    assert torch.equal(truncated.trajectory[1], model.blocks[1](full.trajectory[0]))


def test_per_pass_checkpointing_gives_the_same_gradients() -> None:
    x = torch.randn(2, 3, 16, 16)
    grads = []
    for enabled in (False, True):
        model = _model("srvit-ti", depth=2, recursion=2, fusion_mode="query", drop_path_rate=0.2).train()
        model.set_grad_checkpointing(enabled)
        assert model.engine.gradient_checkpointing is enabled
        torch.manual_seed(1)  # the same drop-path draws (checkpointing replays the RNG state)
        model(x).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-6)


def test_the_engine_refuses_a_conditioned_core_beyond_its_horizon_and_steps_an_unconditioned_one() -> None:
    conditioned = lc.LoopedCore(lambda: lc.PreNormBlock(8, 2), 1, [2], 8, features_last=True, conditioning=True,
                                block_call=None)
    with pytest.raises(ValueError, match="exceed the trained 2"):
        conditioned(torch.randn(1, 3, 8), 0, num_passes=3)
    torch.manual_seed(0)
    plain = lc.LoopedCore(lambda: lc.PreNormBlock(8, 2), 1, [2], 8, features_last=True, conditioning=False,
                          injection=False)
    torch.manual_seed(0)
    euler = lc.LoopedCore(lambda: lc.PreNormBlock(8, 2), 1, [2], 8, features_last=True, conditioning=False,
                          injection=False, solver=lc.ODESolver("euler", 1.0))
    h = torch.randn(2, 3, 8)
    assert torch.equal(plain(h, 0, num_passes=4).output, euler(h, 0, num_passes=4).output)  # Euler h=1 = the plain pass
    block = plain.blocks[0]
    assert torch.equal(plain(h, 0, num_passes=3).output, block(block(block(h))))
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in block.parameters())


@pytest.mark.parametrize("method", ["euler", "blackbox"])
def test_head_step_advances_the_leading_tokens_like_the_full_step(method: str) -> None:
    from srvit.head_path import head_step

    weight = torch.randn(8, 8) * 0.3
    block = lambda z, t: z + torch.tanh(z @ weight)  # token-wise residual map  # noqa: E731
    solver = lc.ODESolver(method, step_size=0.7)
    z = torch.randn(2, 5, 8)
    head_block = lambda full, t: block(full, t)[:, :2]  # noqa: E731
    torch.testing.assert_close(head_step(solver, head_block, z, 0, tokens=2), solver.step(block, z, 0)[:, :2])
    with pytest.raises(ValueError, match="cannot advance a subset"):
        head_step(lc.ODESolver("heun"), head_block, z, 0, tokens=2)
