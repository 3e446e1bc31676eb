"""srvit models: parameter counts, exact identities between the families, the ODE view, the timm surface."""

import math

import pytest
import timm
import torch
from torch import nn

import srvit
from loopcore.flops import count_parameters
from loopcore.softmor import router_parameter_count
from srvit.trainer import parameter_groups

TINY = dict(img_size=16, patch_size=4, num_classes=7, embed_dim=24, num_heads=2)


def tiny(name: str, **overrides) -> srvit.RecursiveViT:
    return srvit.create_model(name, **{**TINY, **overrides}).eval()


def images(batch: int = 3, size: int = 16) -> torch.Tensor:
    return torch.randn(batch, 3, size, size)


def randomize_heads_(model: srvit.RecursiveViT) -> srvit.RecursiveViT:
    """SoftMoR routers start as `mean` (zero last layer); give them random values so identities are not trivial."""
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.2)
    return model


def full_logits(model: srvit.RecursiveViT, x: torch.Tensor, steps: int | None = None) -> torch.Tensor:
    """Logits through the full-sequence path (``model(x)`` computes the last application for the class token only)."""
    return model.forward_head(model.forward_features(x, steps))


def manual_recursion(model: srvit.RecursiveViT, x: torch.Tensor, steps: int) -> torch.Tensor:
    """Reference: every block applied `steps` times as a plain loop, then norm, class token, head."""
    z = model.embed(x)
    for block in model.blocks:
        for _ in range(steps):
            z = block(z)
    return model.head(model.norm(z)[:, 0])


def test_registry_lists_the_nine_names_and_rejects_unknown_ones() -> None:
    assert srvit.list_models() == sorted(f"{f}-{s}" for f in ("vit", "bvit", "srvit") for s in ("ti", "s", "b"))
    assert srvit.list_models("bvit-*") == ["bvit-b", "bvit-s", "bvit-ti"]
    with pytest.raises(KeyError, match="unknown model 'vit-l'"):
        srvit.create_model("vit-l")
    with pytest.raises(TypeError, match="steps"):
        srvit.create_model("srvit-s", steps=4)
    with pytest.raises(TypeError, match="srvit-s"):
        srvit.create_model("vit-s", recursion=2)


@pytest.mark.parametrize(
    ("name", "overrides", "expected", "tolerance"),
    [
        ("vit-ti", {}, 5.72e6, 0.001),
        ("vit-s", {}, 22.05e6, 0.001),
        ("vit-b", {}, 86.57e6, 0.001),
        ("srvit-s", {"recursion": 4}, 23.75e6, 0.2e6 / 23.75e6),
        ("bvit-b", {}, 8.6e6, 0.05),
    ],
)
def test_parameter_counts_match_the_papers_on_meta(name, overrides, expected, tolerance) -> None:
    with torch.device("meta"):
        model = srvit.create_model(name, **overrides)
    assert all(p.is_meta for p in model.parameters())
    assert abs(count_parameters(model) - expected) <= tolerance * expected, count_parameters(model)


def test_srvit_parameters_are_vit_plus_one_router_per_block_and_r1_is_vit() -> None:
    with torch.device("meta"):
        vit = count_parameters(srvit.create_model("vit-s"))
        r1 = count_parameters(srvit.create_model("srvit-s", recursion=1))
        r4 = count_parameters(srvit.create_model("srvit-s", recursion=4))  # default router: query
        last = count_parameters(srvit.create_model("srvit-s", recursion=4, fusion_mode="last"))
        token = count_parameters(srvit.create_model("srvit-s", recursion=4, fusion_mode="token"))
    assert vit == r1 == last == 22_050_664  # timm's deit_small_patch16_224
    assert token - vit == 12 * router_parameter_count(384, 4, "token") == 12 * 148_997
    query_router = router_parameter_count(384, 4, "query")
    assert r4 - vit == 12 * router_parameter_count(384, 4) == 12 * query_router == 12 * 148_612
    assert r4 == 23_834_008 and token == 23_838_628
    assert abs(r4 - 23.75e6) <= 0.2e6 and abs(token - 23.75e6) <= 0.2e6  # the paper's +1.7M, either router


def test_vit_s_computes_timms_deit_small_with_the_same_weights() -> None:
    """Numerical cross-check against the reference implementation (timm only as the oracle)."""
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=16, patch_size=4, num_classes=7, embed_dim=24, depth=3, num_heads=2
    ).eval()
    ours = tiny("vit-s", depth=3)
    ours.load_state_dict(ref.state_dict())
    x = images()
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), rtol=1e-5, atol=1e-5)


def test_srvit_with_r1_is_exactly_vit_given_the_same_weights() -> None:
    vit = tiny("vit-s", depth=3)
    sr = tiny("srvit-s", depth=3, recursion=1)
    sr.load_state_dict(vit.state_dict())
    x = images()
    assert torch.equal(sr(x), vit(x))


def test_fusion_last_is_plain_recursion_and_token_fusion_is_not() -> None:
    last = tiny("srvit-s", depth=2, recursion=3, fusion_mode="last")
    x = images()
    assert torch.equal(full_logits(last, x), manual_recursion(last, x, 3))
    token = tiny("srvit-s", depth=2, recursion=3, fusion_mode="token")
    token.load_state_dict(last.state_dict(), strict=False)
    randomize_heads_(token)
    out = token(x)
    assert not torch.allclose(out, last(x), atol=1e-4)
    trace = token.forward_trace(x)
    assert len(trace.fusion_weights) == 2
    for w in trace.fusion_weights:
        assert w.shape == (3, 3, 1 + 16)
        torch.testing.assert_close(w.sum(dim=1), torch.ones(3, 17))


def test_bvit_euler_h1_is_bitwise_plain_recursion_and_other_solvers_differ() -> None:
    model = tiny("bvit-s", steps=5)
    assert model.config.depth == 1 and model.config.recursion == 5 and model.fusions is None
    x = images()
    assert torch.equal(full_logits(model, x), manual_recursion(model, x, 5))
    block, z0 = model.blocks[0], model.embed(x)
    heun = tiny("bvit-s", steps=5, solver="heun")
    heun.load_state_dict(model.state_dict())
    z = z0
    for _ in range(5):  # Heun with h = 1 on v(z) = B(z) - z is z <- (z + B(B(z))) / 2
        z = 0.5 * (z + block(block(z)))
    torch.testing.assert_close(heun(x), model.head(model.norm(z)[:, 0]), rtol=1e-5, atol=1e-5)
    blackbox = tiny("bvit-s", steps=5, solver="blackbox")
    blackbox.load_state_dict(model.state_dict())
    z = z0
    for _ in range(5):  # z' = B(z): z <- z + B(z)
        z = z + block(z)
    torch.testing.assert_close(blackbox(x), model.head(model.norm(z)[:, 0]), rtol=1e-5, atol=1e-5)
    half = tiny("bvit-s", steps=5, step_size=0.5)
    half.load_state_dict(model.state_dict())
    assert not torch.allclose(half(x), model(x), atol=1e-5)


def test_evaluation_beyond_the_horizon_runs_more_steps_with_the_same_weights() -> None:
    model = tiny("bvit-s", steps=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = images()
    assert torch.equal(full_logits(model, x, steps=9), manual_recursion(model, x, 9))
    assert not torch.equal(model(x, steps=9), model(x))
    per_step = model.forward_steps(x, steps=9)
    assert len(per_step) == 9
    for n in (1, 4):  # earlier states of a 9-step run are the final states of shorter runs
        assert torch.equal(per_step[n - 1], full_logits(model, x, steps=n))
    assert torch.equal(per_step[-1], model(x, steps=9))
    sr = randomize_heads_(tiny("srvit-s", depth=2, recursion=2, fusion_mode="token"))
    deeper = sr(x, steps=5)  # steps past R share the last step's router bias
    assert deeper.shape == (3, 7) and torch.isfinite(deeper).all()
    assert sr.forward_trace(x, steps=5).fusion_weights[0].shape == (3, 5, 17)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("vit-s", dict(depth=3)),
        ("srvit-s", dict(depth=2, recursion=3, fusion_mode="token")),
        ("srvit-s", dict(depth=2, recursion=3, fusion_mode="mean")),
        ("srvit-s", dict(depth=2, recursion=3, fusion_mode="query")),
        ("srvit-s", dict(depth=2, recursion=3, fusion_mode="last")),
        ("srvit-s", dict(depth=2, recursion=3, fusion_mode="global")),
        ("bvit-s", dict(steps=4)),
        ("bvit-s", dict(steps=4, solver="blackbox", step_size=0.5)),
        ("bvit-s", dict(steps=4, solver="heun")),
        ("bvit-s", dict(steps=4, loop_embedding=True)),
    ],
)
def test_class_token_only_last_application_matches_the_full_computation(name: str, overrides: dict) -> None:
    """model(x) skips every token but the class token in the last application; logits and gradients agree."""
    model = randomize_heads_(tiny(name, drop_path_rate=0.3, **overrides))
    x = images()
    for steps in (None, 6):
        torch.testing.assert_close(model(x, steps=steps), full_logits(model, x, steps), rtol=1e-5, atol=1e-6)
    model.train()  # same drop-path draws: the shortcut consumes the random stream like the full path
    grads = []
    for fn in (model, full_logits):
        torch.manual_seed(3)
        model.zero_grad()
        out = fn(model, x) if fn is full_logits else fn(x)
        out.square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for key, g in grads[1].items():
        torch.testing.assert_close(grads[0][key], g, rtol=1e-4, atol=1e-6, msg=key)
    assert model.computes_head_only == (overrides.get("solver", "euler") != "heun")


def test_deep_supervision_reads_the_shared_head_every_k_steps() -> None:
    model = tiny("bvit-s", steps=12, deep_supervision_every=3)
    assert model.supervised_indices() == [2, 5, 8, 11]
    x = images()
    logits = model.forward_supervised(x)
    inter = model.forward_steps(x)
    assert len(logits) == 4 and len(inter) == 12
    for out, i in zip(logits, [2, 5, 8, 11]):
        assert torch.equal(out, inter[i])
    assert torch.equal(logits[-1], model(x))
    deep = tiny("srvit-s", depth=4, recursion=2, deep_supervision_every=2)
    assert deep.supervised_indices() == [1, 3] and len(deep.forward_supervised(x)) == 2
    assert tiny("vit-s", depth=4).supervised_indices() == [3]


def test_zero_initialised_loop_embedding_starts_as_the_unconditioned_bvit() -> None:
    plain = tiny("bvit-s", steps=3)
    looped = tiny("bvit-s", steps=3, loop_embedding=True)
    looped.load_state_dict(plain.state_dict(), strict=False)
    x = images()
    assert torch.equal(looped(x), plain(x))
    assert "step_embedding.weight" in looped.no_weight_decay()


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    grads = []
    for enable in (False, True):
        torch.manual_seed(0)
        model = randomize_heads_(tiny("srvit-s", depth=2, recursion=2)).train()
        model.set_grad_checkpointing(enable)
        model(images()).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-6, atol=1e-6)


def test_drop_path_is_random_in_training_and_off_in_eval() -> None:
    model = tiny("vit-s", depth=2, drop_path_rate=0.5)
    x = images(8)
    ref = model(x)
    model.train()
    torch.manual_seed(1)
    a = model(x)
    torch.manual_seed(2)
    b = model(x)
    assert not torch.equal(a, b)
    assert torch.equal(model.eval()(x), ref)


def test_weight_decay_groups_follow_deit() -> None:
    model = tiny("srvit-s", depth=2, recursion=2, fusion_mode="token")
    decay, no_decay = parameter_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert {"pos_embed", "cls_token", "norm.weight", "head.bias", "blocks.0.norm1.weight",
            "fusions.0.step_bias"} <= no_decay_names
    assert {names[id(p)] for p in decay["params"]} >= {"blocks.0.attn.qkv.weight", "head.weight",
                                                       "patch_embed.proj.weight", "fusions.1.router.1.weight"}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_save_load_round_trip_is_exact(tmp_path) -> None:
    from looprun.release import save_release

    model = randomize_heads_(tiny("srvit-s", depth=2, recursion=3))
    x = images()
    model.save_pretrained(tmp_path / "diffusers")
    save_release(model, tmp_path / "release")
    for folder in ("diffusers", "release"):
        loaded = srvit.RecursiveViT.from_pretrained(tmp_path / folder)
        assert torch.equal(loaded(x), model(x)), folder


def test_bad_inputs_raise_clear_errors() -> None:
    model = tiny("vit-s", depth=1)
    with pytest.raises(ValueError, match="img_size"):
        model(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        model(images(), steps=0)
    with pytest.raises(ValueError, match="unknown fusion"):
        tiny("srvit-s", fusion_mode="max")
    with pytest.raises(ValueError, match="unknown solver"):
        tiny("bvit-s", solver="euler2")
    with pytest.raises(ValueError, match="multiple of patch_size"):
        tiny("vit-s", img_size=18)


def test_every_registered_model_builds_at_tiny_size_and_runs() -> None:
    for name in srvit.list_models():
        model = tiny(name, depth=2) if not name.startswith("bvit") else tiny(name, steps=2)
        out = model(images(2))
        assert out.shape == (2, 7) and torch.isfinite(out).all(), name
        assert isinstance(model, nn.Module) and model.config.family == name.split("-")[0]


def test_recorded_fusion_weights_are_the_forwards_own_and_their_entropy_is_logged_per_block() -> None:
    from loopcore.softmor import fusion_entropy
    from srvit.trainer import fusion_entropy_logs

    torch.manual_seed(0)
    model = srvit.create_model("srvit-ti", depth=2, embed_dim=24, num_heads=2, patch_size=8, img_size=16,
                               num_classes=3, recursion=3, fusion_mode="token").eval()
    x = torch.randn(2, 3, 16, 16)
    with model.record_fusion_weights() as recorded:
        trace = model.forward_trace(x)
    assert len(recorded) == 2 and model._fusion_record is None  # restored on exit
    for got, want in zip(recorded, trace.fusion_weights):
        assert not got.requires_grad and torch.equal(got, want)
    # the logits-only forward records the class-token-only weights of the last block
    with model.record_fusion_weights() as head_only:
        model(x)
    assert [tuple(w.shape) for w in head_only] == [(2, 3, 5), (2, 3, 1)]
    logs = fusion_entropy_logs(recorded)
    assert logs["fusion_entropy/block01"] == pytest.approx(float(fusion_entropy(recorded[1])))
    blocks = (logs["fusion_entropy/block00"], logs["fusion_entropy/block01"])
    assert logs["fusion_entropy"] == pytest.approx(sum(blocks) / 2)
    uniform = fusion_entropy_logs([torch.full((2, 3, 5), 1 / 3)])
    assert uniform["fusion_entropy/block00"] == pytest.approx(math.log(3), rel=1e-5)
    one_step = torch.tensor([[[1.0], [0.0], [0.0]]])
    assert fusion_entropy_logs([one_step])["fusion_entropy"] == pytest.approx(0.0, abs=1e-5)
    assert fusion_entropy_logs([]) == {}
    # no record outside the context manager, and nothing recorded for a plain (last) recursion
    plain = srvit.create_model("srvit-ti", depth=1, embed_dim=24, num_heads=2, patch_size=8, img_size=16,
                               num_classes=3, recursion=2, fusion_mode="last")
    with plain.record_fusion_weights() as none:
        plain(x)
    assert none == []


# Exact counted parameters of every registered model at its defaults (1000 classes, 224², 16² patches; srvit at
# R = 4 with the query router), next to the paper figures (test_parameter_counts_match_the_papers_on_meta).
COUNTED = {
    "bvit-b": 8_601_064, "bvit-s": 2_531_560, "bvit-ti": 823_912, "srvit-b": 93_673_240, "srvit-s": 23_834_008,
    "srvit-ti": 6_166_744, "vit-b": 86_567_656, "vit-s": 22_050_664, "vit-ti": 5_717_416,
}


def test_every_registered_model_has_its_counted_parameters() -> None:
    assert sorted(COUNTED) == srvit.list_models()
    for name, count in COUNTED.items():
        with torch.device("meta"):
            model = srvit.create_model(name)
        assert count_parameters(model) == count, name


@pytest.mark.parametrize("name", srvit.list_models())
def test_every_registered_model_trains_at_tiny_size(name: str) -> None:
    """Forward and backward of a tiny copy (deep supervision on, drop path on): finite, every parameter used."""
    torch.manual_seed(0)
    depth = {} if name.startswith("bvit") else {"depth": 2}
    model = srvit.create_model(name, **{**TINY, **depth, "drop_path_rate": 0.1, "deep_supervision_every": 1}).train()
    randomize_heads_(model)
    logits = model.forward_supervised(images(2))
    assert all(out.shape == (2, 7) for out in logits)
    loss = sum(torch.nn.functional.cross_entropy(out, torch.tensor([1, 4])) for out in logits)
    loss.backward()
    assert torch.isfinite(loss)
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert not unused, unused[:5]
    assert all(torch.isfinite(p.grad).all() for p in model.parameters()), name


@torch.no_grad()
def test_use_solver_swaps_the_solver_at_evaluation_exactly() -> None:
    kwargs = dict(img_size=16, patch_size=4, num_classes=5, embed_dim=24, num_heads=2, depth=1)
    euler = srvit.create_model("bvit-s", steps=4, **kwargs).eval()
    heun = srvit.create_model("bvit-s", steps=4, solver="heun", step_size=0.5, **kwargs).eval()
    heun.load_state_dict(euler.state_dict())
    x = torch.rand(2, 3, 16, 16)
    plain = euler(x)
    solver = euler.use_solver("heun", 0.5)
    assert (solver.method, solver.step_size) == ("heun", 0.5) and euler.config.solver == "euler"
    assert torch.equal(euler(x), heun(x)) and not torch.allclose(euler(x), plain)
    assert euler.applications == 2 * heun.config.depth * heun.config.recursion
    euler.use_solver("euler", 1.0)
    assert torch.equal(euler(x), plain)
