"""``looprun.training_loop.run_training_command``: what ``loopvae train`` and ``srvit train`` print and return for
each way a run ends (the trainer itself is replaced by a function that ends the run that way)."""

from __future__ import annotations

from pathlib import Path

import pytest

from looprun.training_loop import NonFiniteLossError, TrainResult, run_training_command


def _result(stopped_by: str | None, validation: list[dict] | None = None) -> TrainResult:
    return TrainResult(Path("run"), 120, stopped_by, None if stopped_by else Path("run/release"), {}, [],
                       validation=validation or [])


def test_a_non_finite_loss_is_one_line_and_exit_status_3(capsys: pytest.CaptureFixture[str]) -> None:
    def train(*_: object) -> TrainResult:
        raise NonFiniteLossError("non-finite loss at step 7; stopped without saving")

    assert run_training_command("srvit train", train, {}, "d", "o", None) == 3
    captured = capsys.readouterr()
    assert captured.err == "srvit train: non-finite loss at step 7; stopped without saving\n" and captured.out == ""


def test_a_stopped_run_says_how_to_resume_and_a_finished_one_where_its_release_is(
        capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple] = []

    def train(*args: object) -> TrainResult:
        seen.append(args)
        return _result("SIGTERM")

    assert run_training_command("loopvae train", train, {"k": 1}, "d.tar", "out", "v.tar") == 0
    assert seen == [({"k": 1}, "d.tar", "out", "v.tar")]
    assert capsys.readouterr().out == "stopped at step 120 (SIGTERM); rerun the same command to resume\n"
    done = _result(None, [{"top1": 0.5, "num_images": 10}])
    summary = lambda r: f"; top-1 {100 * r.validation[-1]['top1']:.0f}%"  # noqa: E731
    assert run_training_command("srvit train", lambda *_: done, {}, "d", "o", None, summary) == 0
    assert capsys.readouterr().out == f"finished at step 120; release artifact: {Path('run/release')}; top-1 50%\n"


def test_any_other_error_propagates_to_the_command_error_handler() -> None:
    def train(*_: object) -> TrainResult:
        raise FileNotFoundError("d.tar")

    with pytest.raises(FileNotFoundError):
        run_training_command("loopvae train", train, {}, "d.tar", "o", None)
