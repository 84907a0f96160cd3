"""run/resume.py's choice of what a launch continues, and where: a run's own last.pt in place, an earlier state of a
run refused, a copy outside its run (a last.pt taken from a cluster) into a new run directory with the options and
hyperparameters it holds, and an elastic restart back in the run it made. Real checkpoint files, no training."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch import nn

from ddp_utils.distributed import DistInfo, launch_key
from ddp_utils.engine import ModelEMA
from ddp_utils.run import Checkpointer, TrainState
from ddp_utils.run.resume import ResumeError, find_resume
from train import parse_opt

HYP = {"lr0": 0.0123, "momentum": 0.9}
SINGLE = DistInfo()


def make_run(save_dir: Path, run_key: str = "single/pid=1", hyp_file: str = "/cluster/home/me/hyp.yaml") -> Path:
    """A run directory as train.py leaves it mid-training (a tiny model stands in): opt.yaml, weights/last.pt and
    best.pt, recording its directory, launch and a hyp yaml that is only on the machine that trained it."""
    save_dir.mkdir(parents=True)
    opt = {"epochs": 3, "data": "shapes.yaml", "project": str(save_dir.parent), "name": save_dir.name,
           "save_dir": str(save_dir), "run_key": run_key, "batch_size": 8, "hyp": hyp_file}  # fmt: skip
    (save_dir / "opt.yaml").write_text(yaml.safe_dump(opt))
    model = nn.Linear(2, 1)
    training = SimpleNamespace(model=model, ema=ModelEMA(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    Checkpointer(save_dir, opt=opt, hyp=HYP).save(TrainState(epoch=1, batch=3, batches=8, batch_size=8), training,
                                                  best=True)  # fmt: skip
    return save_dir / "weights" / "last.pt"


def resume_opt(target: Path, project: Path) -> argparse.Namespace:
    return parse_opt(["--resume", str(target), "--project", str(project)])


def test_a_runs_own_last_pt_continues_in_place_with_its_recorded_options(tmp_path):
    last = make_run(tmp_path / "runs" / "exp")
    resume = find_resume(resume_opt(last, tmp_path / "runs"), SINGLE, vars(parse_opt([])))
    assert not resume.copy and resume.save_dir == last.parent.parent and resume.state.where() == "epoch 2, batch 3/8"
    assert resume.opt.hyp == "/cluster/home/me/hyp.yaml"  # as before: the run's own hyp file


def test_a_last_pt_copied_from_elsewhere_resumes_into_a_new_directory_from_what_it_holds(tmp_path, caplog):
    """YOLOv5 resumes ``--resume /elsewhere/last.pt`` (a copy taken from a cluster) from the options the file
    holds; it was refused ("a run is resumed from its <run>/weights/last.pt"). It continues in a new run directory
    (the caller claims it under --project/--name), with the hyperparameters it trained with (its hyp yaml is on
    the cluster), and the log says so."""
    last = make_run(tmp_path / "cluster" / "exp")
    for copy in (tmp_path / "elsewhere" / "last.pt", tmp_path / "other" / "weights" / "last.pt"):
        copy.parent.mkdir(parents=True)
        shutil.copy(last, copy)
    shutil.rmtree(tmp_path / "cluster")  # the run stayed on the cluster
    for copy in (tmp_path / "elsewhere" / "last.pt", tmp_path / "other" / "weights" / "last.pt"):
        caplog.clear()
        caplog.set_level("INFO", logger="ddp_utils")
        resume = find_resume(resume_opt(copy, tmp_path / "here"), SINGLE, vars(parse_opt([])))
        assert resume.copy and resume.save_dir is None and resume.checkpoint == copy
        assert resume.opt.hyp == HYP and resume.opt.epochs == 3 and resume.state.where() == "epoch 2, batch 3/8"
        (said,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resuming")]
        assert said.startswith(
            f"resuming {copy} at epoch 2, batch 3/8 in a new run directory under {tmp_path / 'here'}"
        )
        assert f"a copy outside the run that saved it ({tmp_path / 'cluster' / 'exp'})" in said
    assert not (tmp_path / "here").exists()  # nothing claimed yet: train.py does, once the inputs are checked


def test_an_earlier_state_of_a_run_in_its_directory_is_refused_and_its_copy_elsewhere_resumes(tmp_path):
    last = make_run(tmp_path / "runs" / "exp")
    best = last.parent / "best.pt"
    with pytest.raises(ResumeError, match=r"an earlier state of its run \(resume it with --resume .*last.pt\)"):
        find_resume(resume_opt(best, tmp_path / "runs"), SINGLE, vars(parse_opt([])))
    copy = tmp_path / "elsewhere" / "best.pt"
    copy.parent.mkdir()
    shutil.copy(best, copy)
    assert find_resume(resume_opt(copy, tmp_path / "runs"), SINGLE, vars(parse_opt([]))).copy


def test_an_elastic_restart_continues_the_run_it_made_not_the_copy_it_was_started_with(tmp_path):
    """torchrun restarts the job with the same command, ``--resume /elsewhere/last.pt``: it must continue the new run
    directory that copy went into (its opt.yaml records this launch), not start a third from the stale copy."""
    copy = make_run(tmp_path / "cluster" / "exp")
    restarted = DistInfo(restart_count=1)
    mine = make_run(tmp_path / "runs" / "exp2", run_key=launch_key(restarted))  # what the first attempt made
    resume = find_resume(resume_opt(copy, tmp_path / "runs"), restarted, vars(parse_opt([])))
    assert resume.checkpoint == mine and not resume.copy and resume.save_dir == mine.parent.parent
