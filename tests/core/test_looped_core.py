import pytest
import torch

import loopcore as lc
from lv_testing import randomize_

PASSES = [1, 2, 4]


def make_core(sharing: str = "global", kind: str = "conv", fusion_mode: str = "last", dim: int = 32) -> lc.LoopedCore:
    kwargs = {"num_heads": 2} if kind == "attention" else {}
    core = lc.LoopedCore(
        lc.block_factory(kind, dim, dim, **kwargs), 4, PASSES, dim, sharing=sharing,
        features_last=kind == "attention", fusion_mode=fusion_mode,
        window_sizes=[4, None, None] if kind == "attention" else None,
    )
    return randomize_(core, std=0.05)


def sample(kind: str = "conv", dim: int = 32) -> torch.Tensor:
    return torch.randn(2, dim, 8, 8) if kind == "conv" else torch.randn(2, 8, 8, dim)


def manual_recursion(core: lc.LoopedCore, h0: torch.Tensor, scale: int, passes: int,
                     bypass: int | None = None) -> list[torch.Tensor]:
    """The looped core's recursion written out longhand: h_{t+1} = Core(h_t + [t>0] g_s P_s(h_0), c_{s,t})."""
    states, h = [], h0
    for t in range(passes):
        x = h if t == 0 else h + core.injection_gates[str(scale)] * core.injections[str(scale)](h0)
        if t != bypass:
            cond = core.embedding.scale.weight[scale] + core.embedding.loop.weight[t]
            for k in range(core.num_blocks):
                x = core.blocks[core.block_index(scale, t, k)](x, cond, window_size=core.window_sizes[scale])
            h = x
        states.append(h)
    return states


@pytest.mark.parametrize("sharing,expected", [("global", 4), ("scale", 12), ("none", 28)])
def test_stored_blocks_and_counted_applications(sharing: str, expected: int) -> None:
    core = make_core(sharing)
    assert len(core.blocks) == expected == lc.stored_block_count(4, PASSES, sharing)
    calls = []
    handles = [b.register_forward_pre_hook(lambda m, a, i=i: calls.append(i)) for i, b in enumerate(core.blocks)]
    h = sample()
    for s in range(3):
        h = core(h, s).output
    for handle in handles:
        handle.remove()
    assert len(calls) == 28 == core.applications
    assert len(set(calls)) == expected  # every stored block is used


def test_sharing_rules_give_same_graph_shapes() -> None:
    x = sample()
    outs = {s: make_core(s)(x, 2).output for s in lc.SHARING_RULES}
    assert {o.shape for o in outs.values()} == {x.shape}


def test_none_sharing_with_copied_weights_equals_global() -> None:
    shared, unshared = make_core("global"), make_core("none")
    unshared.load_state_dict(
        {k: v for k, v in shared.state_dict().items() if not k.startswith("blocks.")}, strict=False
    )
    for s, n in enumerate(PASSES):
        for t in range(n):
            for k in range(4):
                unshared.blocks[unshared.block_index(s, t, k)].load_state_dict(shared.blocks[k].state_dict())
    x = sample()
    assert torch.equal(shared(x, 2).output, unshared(x, 2).output)


@pytest.mark.parametrize("kind", ["conv", "attention"])
def test_core_matches_longhand_recursion(kind: str) -> None:
    core, x = make_core(kind=kind), sample(kind)
    with torch.no_grad():
        core.injection_gates["2"].fill_(0.7)  # the gate starts at 0; make injection matter
    for s, n in enumerate(PASSES):
        torch.testing.assert_close(core(x, s).output, manual_recursion(core, x, s, n)[-1], rtol=1e-5, atol=1e-6)


def test_injection_gate_starts_at_zero_and_only_stages_with_repeats_have_one() -> None:
    core = lc.LoopedCore(lc.block_factory("conv", 32, 32), 4, PASSES, 32)
    assert sorted(core.injection_gates.keys()) == ["1", "2"]
    assert all(float(g.detach()) == 0.0 for g in core.injection_gates.values())


@pytest.mark.parametrize("kind", ["conv", "attention"])
def test_inactive_hooks_are_bit_identical(kind: str) -> None:
    core, x = make_core(kind=kind), sample(kind)
    with torch.no_grad():
        core.injection_gates["2"].fill_(0.5)
    plain = core(x, 2).output
    assert torch.equal(core(x, 2, hooks=lc.LoopHooks()).output, plain)
    recorder = lc.LoopHooks(record=True, keep_tensors=True)
    with core.use_hooks(recorder):
        assert torch.equal(core(x, 2).output, plain)
    assert core.hooks is None
    assert [(r.scale, r.loop) for r in recorder.records] == [(2, t) for t in range(4)]
    assert torch.equal(recorder.records[-1].state_out, plain)
    assert torch.equal(recorder.records[0].state_in, x)
    # relative update recorded per sample, matching its definition
    r = recorder.records[1]
    delta = (r.state_out - r.state_in).flatten(1).pow(2).mean(1).sqrt()
    torch.testing.assert_close(r.relative_update, delta / r.state_in.flatten(1).pow(2).mean(1).sqrt())


def test_prefix_truncation() -> None:
    core, x = make_core(), sample()
    with torch.no_grad():
        core.injection_gates["2"].fill_(0.5)
    full = core(x, 2).output
    assert torch.equal(core(x, 2, hooks=lc.LoopHooks(prefix={2: 4})).output, full)
    states = manual_recursion(core, x, 2, 4)
    for k in (1, 2, 3):
        out = core(x, 2, hooks=lc.LoopHooks(prefix={2: k})).output
        torch.testing.assert_close(out, states[k - 1], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(out, full, atol=1e-4)
    # a prefix on another scale leaves this one untouched
    assert torch.equal(core(x, 2, hooks=lc.LoopHooks(prefix={1: 1})).output, full)
    with pytest.raises(ValueError, match="prefix for scale 2 must be in"):
        core(x, 2, hooks=lc.LoopHooks(prefix={2: 5}))


@pytest.mark.parametrize("bypassed", [0, 1, 3])
def test_bypass_replaces_exactly_the_named_pass(bypassed: int) -> None:
    core, x = make_core(), sample()
    with torch.no_grad():
        core.injection_gates["2"].fill_(0.5)
    hooks = lc.LoopHooks(record=True, keep_tensors=True, bypass={(2, bypassed)})
    out = core(x, 2, hooks=hooks).output
    ref = manual_recursion(core, x, 2, 4, bypass=bypassed)
    torch.testing.assert_close(out, ref[-1], rtol=1e-5, atol=1e-6)
    rec = hooks.records[bypassed]
    assert rec.bypassed and torch.equal(rec.state_out, rec.state_in)
    assert float(rec.relative_update.max()) == 0.0
    assert [r.loop for r in hooks.records] == [0, 1, 2, 3]  # later loop indices unchanged
    assert not torch.allclose(out, core(x, 2).output, atol=1e-4)


@pytest.mark.parametrize("kind", ["conv", "attention"])
def test_checkpointed_passes_give_same_gradients(kind: str) -> None:
    core, x = make_core(kind=kind), sample(kind)
    with torch.no_grad():
        core.injection_gates["2"].fill_(0.5)

    def grads() -> list[torch.Tensor]:
        core.zero_grad(set_to_none=True)
        core(x, 2).output.square().mean().backward()
        return [p.grad.clone() for p in core.parameters() if p.grad is not None]

    plain = grads()
    core.set_gradient_checkpointing(True)
    ckpt = grads()
    assert len(plain) == len(ckpt) > 0
    for a, b in zip(plain, ckpt):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_return_passes_and_meta_construction() -> None:
    core, x = make_core(), sample()
    out = core(x, 2, return_passes=True)
    assert len(out.pass_outputs) == 4 and out.pass_outputs[-1] is out.output
    with torch.device("meta"):
        meta = lc.LoopedCore(lc.block_factory("attention", 768, 768, num_heads=12), 6, [1, 1, 2, 3, 6], 768,
                             features_last=True, fusion_mode="token")
    assert all(p.is_meta for p in meta.parameters())
    assert len(meta.blocks) == 6


def test_bad_configuration_errors() -> None:
    factory = lc.block_factory("conv", 32, 32)
    with pytest.raises(ValueError, match="unknown sharing rule"):
        lc.LoopedCore(factory, 4, PASSES, 32, sharing="layer")
    with pytest.raises(ValueError, match="window_sizes has 2 entries for 3 stages"):
        lc.LoopedCore(factory, 4, PASSES, 32, window_sizes=[4, None])
    with pytest.raises(ValueError, match="unknown fusion_mode 'max'"):
        lc.LoopedCore(factory, 4, PASSES, 32, fusion_mode="max")
    with pytest.raises(IndexError, match="scale 3 outside"):
        lc.LoopedCore(factory, 4, PASSES, 32)(sample(), 3)


# Which stored block serves (scale, pass, slot) for PASSES = [1, 2, 4] and K = 4, written out by hand (not computed
# with the formula under test): `scale` has 4 blocks per scale; `none` one block per application, in run order.
BLOCK_TABLE = {
    "global": {(s, t): [0, 1, 2, 3] for s, n in enumerate(PASSES) for t in range(n)},
    "scale": {(0, 0): [0, 1, 2, 3], (1, 0): [4, 5, 6, 7], (1, 1): [4, 5, 6, 7],
              (2, 0): [8, 9, 10, 11], (2, 1): [8, 9, 10, 11], (2, 2): [8, 9, 10, 11], (2, 3): [8, 9, 10, 11]},
    "none": {(0, 0): [0, 1, 2, 3], (1, 0): [4, 5, 6, 7], (1, 1): [8, 9, 10, 11], (2, 0): [12, 13, 14, 15],
             (2, 1): [16, 17, 18, 19], (2, 2): [20, 21, 22, 23], (2, 3): [24, 25, 26, 27]},
}


@pytest.mark.parametrize("sharing", ["global", "scale", "none"])
def test_block_index_follows_the_written_out_table(sharing: str) -> None:
    core = make_core(sharing)
    for (s, t), blocks in BLOCK_TABLE[sharing].items():
        assert [core.block_index(s, t, k) for k in range(4)] == blocks, (s, t)


@pytest.mark.parametrize("sharing", ["scale", "none"])
def test_injection_at_every_scale_matches_a_longhand_from_the_table(sharing: str) -> None:
    core, x = make_core(sharing), sample()
    with torch.no_grad():  # every stage with a second pass injects (scale 0 has one pass and no injection)
        for key, gate in core.injection_gates.items():
            gate.fill_(0.3 + 0.2 * int(key))
    assert sorted(core.injection_gates) == ["1", "2"]
    for s, n in enumerate(PASSES):
        h = x
        for t in range(n):
            z = h if t == 0 else h + core.injection_gates[str(s)] * core.injections[str(s)](x)
            cond = core.embedding.scale.weight[s] + core.embedding.loop.weight[t]
            for index in BLOCK_TABLE[sharing][(s, t)]:
                z = core.blocks[index](z, cond, window_size=None)
            h = z
        torch.testing.assert_close(core(x, s).output, h, rtol=1e-5, atol=1e-6)
        if n > 1:  # the injection really changes the result
            with torch.no_grad():
                saved = core.injection_gates[str(s)].clone()
                core.injection_gates[str(s)].zero_()
                assert not torch.allclose(core(x, s).output, h, rtol=1e-4, atol=1e-5)
                core.injection_gates[str(s)].copy_(saved)
