"""``train.py --resume`` refuses before it writes: real train.py processes on the CPU, run directories byte-checked.

Everything that can refuse a resume (a missing file, a file that is not a run's weights/last.pt,
a stripped, converted or YOLOv5 checkpoint) is one line and exit code 2 with every file of the
run directory untouched; a finished run exits 0, also without a write. A run is resumed from its
``weights/last.pt``, as YOLOv5 resumes: best.pt and epochN.pt start new runs through --weights.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from ddp_utils.engine import Checkpointer, ModelEMA, strip_optimizer
from tests.multiproc import describe
from tests.test_train import run, train_env

pytestmark = pytest.mark.timeout(200)


def make_run(project: Path, epochs: int = 3, epoch_done: int = 0) -> Path:
    """A run directory as train.py leaves it after ``epoch_done + 1`` epochs (a tiny model stands in)."""
    save_dir = project / "exp"
    save_dir.mkdir(parents=True)
    opt = {"epochs": epochs, "data": "shapes.yaml", "project": str(project), "name": "exp", "save_dir": str(save_dir)}
    (save_dir / "opt.yaml").write_text(yaml.safe_dump(opt))
    (save_dir / "hyp.yaml").write_text("lr0: 0.01\n")
    (save_dir / "results.csv").write_text("epoch,metrics/mAP_0.5\n0,0.1\n")
    model = nn.Linear(2, 1)
    checkpoints = Checkpointer(save_dir, opt=opt, hyp={"lr0": 0.01}, save_period=1)
    checkpoints.save(epoch_done, model, ModelEMA(model), torch.optim.SGD(model.parameters(), lr=0.1), best=True)
    return save_dir


def snapshot(directory: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in directory.rglob("*")
        if p.is_file()
    }


def resume(target: Path, project: Path):
    time.sleep(0.01)  # a rewrite within the same clock tick would keep the mtime
    cmd = [sys.executable, "train.py", "--device", "cpu", "--project", str(project), "--resume", str(target)]
    return run(cmd, train_env(), 180)


def assert_refused(result, *named: str) -> None:
    assert result.returncode == 2, describe([result])
    assert "Traceback" not in result.stderr, describe([result])
    errors = [line for line in result.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and all(n in errors[0] for n in named), describe([result])


def test_a_stripped_last_pt_is_refused_before_anything_is_written(tmp_path):
    project = tmp_path / "runs"
    save_dir = make_run(project)
    strip_optimizer(save_dir / "weights" / "last.pt")  # what strip_optimizer leaves: epoch -1, no optimizer
    before = snapshot(project)
    assert_refused(resume(save_dir / "weights" / "last.pt", project), "stripped", "--weights")
    assert snapshot(project) == before


@pytest.mark.parametrize("name", ["best.pt", "epoch0.pt"])
def test_only_a_runs_last_pt_resumes_and_its_opt_yaml_stays(tmp_path, name):
    project = tmp_path / "runs"
    save_dir = make_run(project)
    before = snapshot(project)
    assert_refused(resume(save_dir / "weights" / name, project), name, "weights/last.pt", "--weights")
    assert snapshot(project) == before


def test_a_last_pt_outside_its_run_is_refused_and_the_directory_above_stays_empty(tmp_path):
    project = tmp_path / "runs"
    save_dir = make_run(project)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    shutil.copy(save_dir / "weights" / "last.pt", scratch / "last.pt")
    before = snapshot(tmp_path)
    assert_refused(resume(scratch / "last.pt", project), str(scratch / "last.pt"), "<run>/weights/last.pt")
    assert snapshot(tmp_path) == before


def test_a_yolov5_checkpoint_is_refused_naming_weights(tmp_path):
    yolo_yaml = Path(__file__).resolve().parents[1] / "configs" / "models" / "yolov5n.yaml"
    from tests.yolo import yolov5_standins as v5
    from tests.yolo.test_foreign import save_yolov5

    project = tmp_path / "runs"
    save_dir = make_run(project)
    model = v5.build(yaml.safe_load(yolo_yaml.read_text()))
    save_yolov5(v5.yolov5_checkpoint(model, epoch=5), save_dir / "weights" / "last.pt")  # YOLOv5's own, pickled
    before = snapshot(project)
    assert_refused(resume(save_dir / "weights" / "last.pt", project), "YOLOv5", "--weights")
    assert snapshot(project) == before


def test_a_missing_last_pt_is_refused(tmp_path):
    project = tmp_path / "runs"
    missing = project / "exp" / "weights" / "last.pt"
    assert_refused(resume(missing, project), str(missing), "no such checkpoint")
    assert not project.exists()


def test_a_finished_run_exits_0_without_a_write(tmp_path):
    project = tmp_path / "runs"
    save_dir = make_run(project, epochs=2, epoch_done=1)
    before = snapshot(project)
    result = resume(save_dir / "weights" / "last.pt", project)
    assert result.returncode == 0, describe([result])
    assert "has finished all 2 epochs: nothing to resume" in result.stderr + result.stdout, describe([result])
    assert snapshot(project) == before
