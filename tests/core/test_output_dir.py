"""``looprun.output_dir.prepare_output_dir``: an output folder that cannot be made or written is one
``OutputWriteError`` line naming the flag, the folder and the reason, never a raw ``OSError``."""

import errno
from pathlib import Path

import pytest

from looprun.checkpoint import OutputWriteError
from looprun.cli_errors import run_command
from looprun.output_dir import prepare_output_dir
from lv_testing import read_only_filesystem


def test_a_new_or_existing_writable_folder_is_returned_and_left_clean(tmp_path: Path) -> None:
    made = prepare_output_dir(tmp_path / "a" / "b", "--out")
    assert made == tmp_path / "a" / "b" and made.is_dir() and not list(made.iterdir())  # no probe file left
    (made / "keep.txt").write_text("mine")
    assert prepare_output_dir(made) == made and [p.name for p in made.iterdir()] == ["keep.txt"]


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputWriteError, match=r"--out .*file: a file is in the way"):
        prepare_output_dir(tmp_path / "file")
    with pytest.raises(OutputWriteError, match=r"--save-dir .*file/sub: cannot create the folder: .*errno"):
        prepare_output_dir(tmp_path / "file" / "sub", "--save-dir")


def test_a_read_only_filesystem_is_one_line_with_exit_status_2(tmp_path: Path, capsys) -> None:
    with read_only_filesystem(tmp_path / "ro") as ro:
        for target, what in ((ro / "new", "cannot create the folder"), (ro / "old", "cannot write in this folder")):
            with pytest.raises(OutputWriteError) as caught:
                prepare_output_dir(target)
            assert caught.value.__cause__.errno == errno.EROFS  # not a PermissionError: it used to escape
            message = str(caught.value)
            assert message.startswith(f"--out {target}: {what}: Read-only file system (errno {errno.EROFS})")
            assert "\n" not in message
            assert run_command("loopvae", "eval", lambda t=target: prepare_output_dir(t) and 0) == 2
            assert capsys.readouterr().err.strip() == f"loopvae eval: error: {message}"
        assert not (ro / "new").exists()
