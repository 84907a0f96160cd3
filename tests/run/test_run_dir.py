"""The run directory's numbered name (``increment_path``, YOLOv5's name and behaviour), where a newcomer finds it."""

from __future__ import annotations

import threading

import ddp_utils
import ddp_utils.run
from ddp_utils.run import run_dir, start
from ddp_utils.run.run_dir import increment_path


def test_increment_path_lives_beside_the_run_directory_and_keeps_its_public_names():
    """YOLOv5's ``from utils.general import increment_path`` reads ``from ddp_utils import increment_path``."""
    assert ddp_utils.increment_path is ddp_utils.run.increment_path is increment_path
    assert start.increment_path is run_dir.increment_path  # make_run_dir names the run's directory with it
    assert "increment_path" in ddp_utils.__all__ and "increment_path" in ddp_utils.run.__all__


def test_increment_path_numbers_directories(tmp_path):
    base = tmp_path / "runs" / "train" / "exp"
    assert increment_path(base) == base and not base.exists()
    made = [increment_path(base, mkdir=True) for _ in range(3)]
    assert [p.name for p in made] == ["exp", "exp2", "exp3"] and all(p.is_dir() for p in made)
    assert increment_path(base) == base.with_name("exp4")
    assert increment_path(base, exist_ok=True) == base
    assert increment_path(base, sep="_") == base.with_name("exp_2")


def test_increment_path_keeps_a_file_suffix(tmp_path):
    (tmp_path / "results.txt").write_text("x")
    assert increment_path(tmp_path / "results.txt").name == "results2.txt"


def test_increment_path_never_gives_two_callers_the_same_directory(tmp_path):
    made, lock = [], threading.Lock()

    def claim():
        path = increment_path(tmp_path / "exp", mkdir=True)
        with lock:
            made.append(path)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(made) == 8 and len(set(made)) == 8
