"""What the --evolve options settle before anything is written, and train.py without Optuna."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from ddp_utils.evolve.settings import EvolveSettings
from ddp_utils.evolve.space import SearchSpaceError
from ddp_utils.evolve.store import StoreError
from ddp_utils.run.options import check_options
from tests.multiproc import REPO_ROOT
from train import parse_opt


def test_yolov5s_project_moves_to_runs_evolve_and_the_study_is_project_name(tmp_path):
    settings = EvolveSettings.from_options(parse_opt(["--evolve", "5", "--data", "shapes.yaml", "--name", "s1"]))
    assert settings.evolve_dir.as_posix() == "runs/evolve/s1" and settings.study_name == "s1"
    assert settings.storage_url == f"sqlite:///{(settings.evolve_dir.resolve() / 'study.db').as_posix()}"
    assert settings.generations == 5 and settings.epochs == 20  # shapes.yaml's train_defaults
    assert settings.hyp["lr0"] == 0.02 and settings.first_values()["lr0"] == 0.02  # hyp.shapes.yaml, its default
    mine = EvolveSettings.from_options(parse_opt(["--evolve", "--project", str(tmp_path), "--epochs", "3"]))
    assert mine.evolve_dir == tmp_path / "exp" and mine.generations == 300 and mine.epochs == 3


@pytest.mark.parametrize(
    ("argv", "error", "message"),
    [
        (["--evolve-hyps", "lr9"], SearchSpaceError, r"^--evolve-hyps lr9: not a hyperparameter"),
        (["--evolve-storage", "study.db"], StoreError, r"^--evolve-storage study.db: not a database URL"),
        (["--evolve-heartbeat", "0"], ValueError, r"^--evolve-heartbeat 0.0: give seconds > 0"),
        (["--data", "nothing.yaml"], FileNotFoundError, r"nothing.yaml"),
    ],
)
def test_bad_settings_are_one_line_naming_the_option(argv, error, message):
    with pytest.raises(error, match=message):
        EvolveSettings.from_options(parse_opt(["--evolve", "2", *argv]))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_train_py_imports_optuna_only_for_evolve():
    code = "import sys, train; train.parse_opt([]); assert 'optuna' not in sys.modules, 'optuna imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=180)


def test_evolve_without_optuna_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna" else real(name, *a))
    with pytest.raises(
        ValueError, match=r"^--evolve keeps its trials in an Optuna study: pip install 'ddp_utils\[evolve\]'"
    ):
        check_options(parse_opt(["--evolve", "3"]), world_size=1)
