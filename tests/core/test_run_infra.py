"""Shared run infrastructure: configs, EMA, LR schedule, checkpoints, peak memory, MAC counting."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from loopcore.flops import count_macs
from looprun.checkpoint import CheckpointManager, CorruptCheckpointError
from looprun.config import ConfigError, apply_updates, parse_overrides, resolve_config, save_config
from looprun.optimization import EMA, lr_factor, make_scheduler


@dataclasses.dataclass
class Schema:
    lr: float = 1e-3
    steps: int = 10
    name: str = "a"
    flag: bool = False
    betas: tuple[float, float] = (0.9, 0.95)
    init_from: str | None = None


def test_config_layers_and_type_errors(tmp_path: Path) -> None:
    (tmp_path / "preset.yaml").write_text("lr: 2.0e-4\nsteps: 20\nbetas: [0.5, 0.9]\n")
    cfg = resolve_config(Schema, "preset", tmp_path, ["steps=30", "flag=true", "init_from=runs/x"])
    assert cfg == Schema(lr=2e-4, steps=30, flag=True, betas=(0.5, 0.9), init_from="runs/x")
    assert parse_overrides(["init_from=null"]) == {"init_from": None}
    with pytest.raises(ConfigError, match="unknown config key 'sped' in --set; valid keys: betas, flag"):
        apply_updates(Schema(), {"sped": 1}, "--set")
    with pytest.raises(ConfigError, match="config key 'steps' needs an integer, got 'ten'"):
        apply_updates(Schema(), {"steps": "ten"}, "--set")
    with pytest.raises(ConfigError, match="config key 'steps' needs an integer, got 2.5"):
        apply_updates(Schema(), {"steps": 2.5}, "--set")
    with pytest.raises(ConfigError, match="no config preset or file 'nope'; presets: preset"):
        resolve_config(Schema, "nope", tmp_path)
    with pytest.raises(ConfigError, match="is not key=value"):
        parse_overrides(["steps"])
    save_config(cfg, tmp_path / "resolved.yaml")
    assert resolve_config(Schema, str(tmp_path / "resolved.yaml"), tmp_path / "none") == cfg


def test_ema_follows_its_formula_and_resumes_exactly() -> None:
    model = torch.nn.Linear(3, 2)
    ema = EMA(model, decay=0.9)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)  # n=0: decay = min(0.9, 1/10) = 0.1
    torch.testing.assert_close(ema.module.weight, 0.1 * start + 0.9 * model.weight)
    ema.update(model)  # n=1: decay = min(0.9, 2/11)
    copy = EMA(torch.nn.Linear(3, 2), decay=0.9)
    copy.load_state_dict(ema.state_dict())
    assert torch.equal(copy.module.weight, ema.module.weight) and int(copy.num_updates) == 2
    assert not ema.module.training and not ema.module.weight.requires_grad


def test_lr_schedule_warmup_cosine_and_state() -> None:
    assert lr_factor(0, 10, 110) == pytest.approx(0.1)
    assert lr_factor(9, 10, 110) == pytest.approx(1.0)
    assert lr_factor(60, 10, 110, "cosine", 0.0) == pytest.approx(0.5)
    assert lr_factor(110, 10, 110, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(500, 10, 110, "constant") == 1.0
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(opt, 10, 110)
    for _ in range(5):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="unknown LR schedule"):
        make_scheduler(opt, 0, 10, "linear")


def test_checkpoints_are_atomic_pruned_verified_and_fall_back(tmp_path: Path, caplog) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        manager.save(step, {"model": {"w": torch.full((3,), float(step))}, "trainer": {"step": step}}, {"note": "x"})
    assert [p.name for p in manager.list_checkpoints()] == ["step-00000002", "step-00000003"]
    latest = manager.load_latest()
    assert latest.step == 3 and torch.equal(latest.state["model"]["w"], torch.full((3,), 3.0))
    meta = json.loads((latest.path / "metadata.json").read_text())
    assert meta["note"] == "x" and set(meta["files"]) == {"model.pt", "trainer.pt"}
    # plain tensors: loadable with weights_only=True
    assert torch.load(latest.path / "model.pt", weights_only=True)["w"].shape == (3,)
    # damage the newest: detected with a clear error, previous one used
    data = bytearray((latest.path / "model.pt").read_bytes())
    data[-10] ^= 0xFF
    (latest.path / "model.pt").write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="model.pt fails its sha256 check"):
        manager.load(latest.path)
    with caplog.at_level("ERROR"):
        fallback = manager.load_latest()
    assert fallback.step == 2
    assert "falling back to the previous checkpoint" in caplog.text
    # a half-written save (temporary directory, no rename) is invisible
    (tmp_path / ".tmp-step-00000009-123").mkdir()
    assert manager.load_latest().step == 2


def test_count_macs_of_linear_and_conv() -> None:
    lin = torch.nn.Linear(8, 4, bias=False)
    assert count_macs(lin, torch.zeros(5, 8)) == 5 * 8 * 4
    conv = torch.nn.Conv2d(3, 6, 3, padding=1)
    assert count_macs(conv, torch.zeros(1, 3, 10, 10)) == 10 * 10 * 6 * 3 * 9


def test_rank_failure_helper_reraises_the_own_error_and_passes_without_one() -> None:
    """Single process (no process group): the helper is a no-op without an error and re-raises the very error
    otherwise; the torchrun path (peers get RemoteRankError with the message) is exercised by the evaluation and
    encoding fault tests."""
    from looprun.distributed import DistributedContext, raise_if_any_rank_failed

    ctx = DistributedContext(rank=0, world_size=1)
    raise_if_any_rank_failed(None, "evaluation", ctx)
    error = ValueError("sample 'broken' of shard x.tar cannot be decoded")
    with pytest.raises(ValueError) as raised:
        raise_if_any_rank_failed(error, "evaluation", ctx)
    assert raised.value is error
