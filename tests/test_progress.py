"""Progress in the mode that suits the output: a bar on a terminal, plain lines in a file, or nothing."""

from __future__ import annotations

import io
import os
import pty

import pytest

from ddp_utils.data import make_shapes_dataset
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.progress import PROGRESS_ENV, PlainProgress, progress, progress_mode, set_progress_mode


@pytest.fixture(autouse=True)
def _no_env_mode(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)


def test_mode_is_bar_on_a_terminal_and_plain_in_a_file_or_pipe(tmp_path):
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as terminal:
            assert progress_mode(stream=terminal) == "bar"
    finally:
        os.close(leader)
        os.close(follower)
    with open(tmp_path / "log.txt", "w") as log:
        assert progress_mode(stream=log) == "plain"


def test_environment_and_explicit_mode_win_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "off")
    assert progress_mode(stream=io.StringIO()) == "off"
    assert progress_mode("bar") == "bar"
    set_progress_mode("plain")
    assert os.environ[PROGRESS_ENV] == "plain"
    monkeypatch.setenv(PROGRESS_ENV, "fancy")
    with pytest.raises(ValueError, match="DDP_UTILS_PROGRESS 'fancy' is not one of bar, plain, off"):
        progress_mode()
    with pytest.raises(ValueError, match="'loud'"):
        set_progress_mode("loud")


def test_plain_progress_prints_a_line_when_due_and_a_last_one_without_carriage_returns():
    out = io.StringIO()
    bar = PlainProgress(4, desc="epoch 1/2", interval=0.0, file=out)
    assert bar.due()
    for i in range(4):
        bar.set_description(f"epoch 1/2 loss {i}")
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" ")[4:6] for line in lines] == [["1/4", "25%"], ["2/4", "50%"], ["3/4", "75%"], ["4/4", "100%"]
                                                        ] + [["4/4", "100%"]]  # fmt: skip
    assert lines[2].startswith("epoch 1/2 loss 2 3/4") and "\r" not in out.getvalue()
    quiet = io.StringIO()
    slow = PlainProgress(4, interval=3600, file=quiet)
    slow.update(3)
    assert not slow.due() and quiet.getvalue() == ""


def test_off_mode_never_prints_nor_asks_for_a_description(capsys):
    with progress(3, desc="x", mode="off") as bar:
        bar.update(3)
        assert not bar.due()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("mode", ["bar", "plain"])
def test_label_scan_progress_ends_at_n_of_n(mode, tmp_path, capsys):
    make_shapes_dataset(tmp_path / "shapes", n_train=7, n_val=1, size=(64, 64), seed=0)
    set_progress_mode(mode)
    labels = load_labels(find_images(tmp_path / "shapes" / "images" / "train"), workers=1)
    assert len(labels.im_files) == 7
    err = capsys.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()
    scans = [line for line in final if "scanning" in line]
    assert scans and "7/7" in scans[-1] and "6/7" not in scans[-1], err
    assert ("\r" in err) == (mode == "bar"), err
