"""Progress in the mode that suits the output: a bar on a terminal, plain lines in a file, or nothing."""

from __future__ import annotations

import io
import os
import pty
import re

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


def test_refresh_interval_is_an_argument_of_each_reporter(monkeypatch):
    from ddp_utils import progress as progress_module

    monkeypatch.setenv(progress_module.PLAIN_SECONDS_ENV, "0")  # the default a given interval overrides
    plain = progress(3, mode="plain", interval=3600, file=io.StringIO())
    bar = progress(3, mode="bar", interval=3600, file=io.StringIO())
    assert (plain.interval, bar.interval, bar.bar.mininterval) == (3600, 3600, 3600)
    assert bar.due() and not bar.due()  # the first refresh is due at once, the next an hour later
    assert not plain.due()
    default = progress(3, mode="bar", file=io.StringIO())
    assert default.interval == progress_module.BAR_SECONDS and progress(3, mode="plain").interval == 0
    for reporter in (plain, bar, default):
        reporter.close()


def test_no_ddp_utils_variable_reaches_a_test():
    """The root conftest's fixture: whatever the shell or an earlier test set, a test starts without them."""
    assert [name for name in os.environ if name.startswith("DDP_UTILS_")] == []
    os.environ["DDP_UTILS_PROGRESS"] = "bar"  # left set on purpose: the fixture removes it after this test


def test_a_variable_left_by_an_earlier_test_is_gone():
    assert "DDP_UTILS_PROGRESS" not in os.environ


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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_val_progress_option_plain_lines_or_none(tmp_path):
    """``python -m ddp_utils val --progress``: the label scan as plain lines ending at n/n, or nothing."""
    import subprocess
    import sys

    import torch

    from ddp_utils.run import build_checkpoint, save_checkpoint
    from ddp_utils.yolo import Model

    from .multiproc import REPO_ROOT, launcher_env

    make_shapes_dataset(tmp_path / "shapes", n_train=1, n_val=5, size=(64, 96), seed=0)
    data = tmp_path / "shapes.yaml"
    data.write_text(f"path: {tmp_path / 'shapes'}\ntrain: images/train\nval: images/val\nnames: [a, b, c, d]\n")
    torch.manual_seed(0)
    save_checkpoint(build_checkpoint(Model("yolov5n.yaml", nc=4)), tmp_path / "w.pt")
    for mode in ("plain", "off"):
        for cache in (tmp_path / "shapes" / "labels").glob("*.cache"):
            cache.unlink()  # scan again
        cmd = [sys.executable, "-m", "ddp_utils", "val", "--weights", str(tmp_path / "w.pt"), "--data", str(data),
               "--imgsz", "64", "--device", "cpu", "--workers", "0", "--project", str(tmp_path / "runs"),
               "--progress", mode]  # fmt: skip
        env = {k: v for k, v in launcher_env().items() if k != PROGRESS_ENV}
        result = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=250)
        assert result.returncode == 0, result.stderr
        assert "\r" not in result.stderr
        scanned = re.search(r"^val: scanning .* 5/5 100% ", result.stderr, re.M)
        assert bool(scanned) == (mode == "plain"), result.stderr
