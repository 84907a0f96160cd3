"""``train.py --resume``: real train.py processes on the CPU, stopped anywhere, resumed anywhere.

- A run stopped by a signal in the middle of an epoch (during the warm-up, after it, inside an
  accumulation window) and resumed ends bit-identical to one never stopped: last.pt (weights, EMA,
  optimizer) and results.csv, with ``--multi-scale`` and ``--image-weights`` too, and with the images made by
  the device path (``--augment-on device``).
- A run saved by 2 processes resumes with 1 and one saved by 1 with 2 (the same total batch),
  ending where the uninterrupted run does but for rounding (compared in float64, where rounding
  does not hide a difference); a total the new number of processes cannot share is one line,
  before anything is written.
- Everything that can refuse a resume (a missing file, a run's best.pt or epochN.pt, a stripped,
  converted or YOLOv5 checkpoint) is one line and exit code 2 with every path under the test's
  directory (folders included, the run's working directory among them) untouched; a finished run
  exits 0, also without a write.
- A last.pt copied outside its run (taken from a cluster) resumes, as YOLOv5 resumes it, from what
  it holds into a new run directory named in the log, bit-identical to the uninterrupted run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch import nn

from ddp_utils.data import make_shapes_dataset
from ddp_utils.engine import ModelEMA
from ddp_utils.run import Checkpointer, TrainState, load_checkpoint, strip_optimizer
from tests.multiproc import REPO_ROOT, Worker, describe, run_watching
from tests.test_train import results, run, torchrun, train_env

pytestmark = pytest.mark.timeout(200)

PROGRESS = re.compile(r"^(\d+)/\d+ .* (\d+)/(\d+) \d+%")  # a plain progress line: "epoch/epochs ... batch/batches 37%"
NB = 8  # batches per epoch: 64 images, 8 per step


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """64 + 16 synthetic images, and hyperparameters whose warm-up ends early in epoch 1 (4 iterations)."""
    return small_run_data(tmp_path_factory.mktemp("resume"), n_val=16)


def small_run_data(root: Path, n_val: int) -> dict[str, Path]:
    """64 training images (8 steps of 8) and ``n_val`` held out, with their data yaml; hyp.shapes.yaml with a
    warm-up that ends early in epoch 1 (4 iterations)."""
    make_shapes_dataset(root / "shapes", n_train=64, n_val=n_val, size=(128, 160), seed=0, max_objects=4)
    data_yaml = root / "shapes.yaml"
    data_yaml.write_text(
        f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
        "names: {0: circle, 1: square, 2: triangle, 3: star}\n"
    )
    hyp = yaml.safe_load((REPO_ROOT / "configs" / "hyps" / "hyp.shapes.yaml").read_text())
    hyp.update(warmup_epochs=0.5, warmup_min_iters=2)
    (root / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    return {"data": data_yaml, "hyp": root / "hyp.yaml"}


def args(data: dict[str, Path], project: Path, name: str, *extra: str) -> list[str]:
    return [
        "train.py", "--data", str(data["data"]), "--hyp", str(data["hyp"]), "--cfg", "yolov5n.yaml",
        "--imgsz", "128", "--batch-size", "8", "--device", "cpu", "--project", str(project), "--name", name, *extra,
    ]  # fmt: skip


def progress_env() -> dict[str, str]:
    return train_env() | {"DDP_UTILS_PROGRESS": "plain", "DDP_UTILS_PROGRESS_SECONDS": "0"}


def signal_at(epoch: int, batch: int, sig: int = signal.SIGTERM):
    """An ``on_line`` that sends ``sig`` once rank 0's progress shows ``epoch`` (from 1) at ``batch`` or later."""
    sent = []

    def on_line(line: str, proc: subprocess.Popen) -> None:
        match = PROGRESS.match(line)
        if match and not sent and int(match.group(1)) == epoch and int(match.group(2)) >= batch:
            sent.append(line)
            proc.send_signal(sig)

    return on_line


def stopped_at(cmd: list[str], last: Path, epoch: int, batch: int, resumes: TrainState | None = None) -> TrainState:
    """Run ``cmd`` until a SIGTERM at (epoch, batch) stops it mid-epoch; check where it stopped (and resumed)."""
    stopped = run_watching(cmd, progress_env(), 180, signal_at(epoch, batch))
    assert stopped.returncode in (0, 1), describe([stopped])  # torchrun's agent reports the signal: 1
    state = TrainState.from_checkpoint(load_checkpoint(last))
    assert f"stopped at {state.where()}: saved {last}" in stopped.stderr, describe([stopped])
    assert state.epoch == epoch - 1 and batch <= state.batch < NB, state  # in the middle, as asked
    # after a whole optimizer step: the accumulation window was finished, nothing is half-accumulated
    assert state.last_opt_step == state.epoch * NB + state.batch - 1, state
    if resumes is not None:
        assert f"resuming {last.parent.parent} at {resumes.where()}" in stopped.stderr, describe([stopped])
    return state


def resumed(cmd: list[str], last: Path, state: TrainState) -> str:
    """Run the resume ``cmd`` to the end; it says where it continues. Returns its log."""
    result = run(cmd, train_env(), 240)
    assert result.returncode == 0, describe([result])
    assert f"resuming {last.parent.parent} at {state.where()}" in result.stderr, describe([result])
    assert f"; resumed at {state.where()}" in result.stderr, describe([result])  # the resumed epoch's line
    return result.stderr


def assert_bit_identical(a: Path, b: Path, csv: bool = True) -> None:
    """Two runs' last.pt (raw weights, EMA, optimizer, EMA updates) and results.csv (``csv``), bit for bit."""
    ca, cb = load_checkpoint(a / "weights" / "last.pt"), load_checkpoint(b / "weights" / "last.pt")
    for key in ("train_model", "model"):
        for name, tensor in ca[key].items():
            assert torch.equal(tensor, cb[key][name]), f"{key} {name}"
    assert ca["ema_updates"] == cb["ema_updates"] and ca["optimizer"]["param_groups"] == cb["optimizer"]["param_groups"]
    for i, state in ca["optimizer"]["state"].items():
        assert torch.equal(state["momentum_buffer"], cb["optimizer"]["state"][i]["momentum_buffer"]), i
    assert ca["train_state"] == cb["train_state"]
    assert not csv or (a / "results.csv").read_bytes() == (b / "results.csv").read_bytes()


def stopped_once_ends_as_unstopped(
    data: dict[str, Path], tmp_path: Path, common: tuple[str, ...], stop: tuple[int, int], timeout: float
) -> Worker:
    """Train ``common`` uninterrupted ("full") and stopped once at ``stop`` (epoch, batch) then resumed ("cut"),
    and assert both end bit-identical; returns the uninterrupted run."""
    full = run([sys.executable, *args(data, tmp_path, "full", *common)], train_env(), timeout)
    assert full.returncode == 0, describe([full])
    last = tmp_path / "cut" / "weights" / "last.pt"
    state = stopped_at([sys.executable, *args(data, tmp_path, "cut", *common)], last, *stop)
    resumed([sys.executable, "train.py", "--resume", str(last)], last, state)
    assert_bit_identical(tmp_path / "full", tmp_path / "cut")
    return full


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stopped_in_the_warm_up_and_after_it_the_run_ends_bit_identical(data, tmp_path):
    common = ("--epochs", "3", "--workers", "2")
    full = run([sys.executable, *args(data, tmp_path, "full", *common)], train_env(), 180)
    assert full.returncode == 0, describe([full])
    cut = tmp_path / "cut"
    last = cut / "weights" / "last.pt"
    resume = [sys.executable, "train.py", "--resume", str(last)]
    early = stopped_at([sys.executable, *args(data, tmp_path, "cut", *common)], last, 1, 1)
    assert early.batch < 4  # in the warm-up (4 iterations)
    late = stopped_at(resume, last, 3, 3, resumes=early)  # the resumed run is stopped again, after the warm-up
    resumed(resume, last, late)  # and then runs to the end
    assert [r["epoch"] for r in results(cut)] == [0.0, 1.0, 2.0]  # each epoch once
    assert_bit_identical(tmp_path / "full", cut)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_multi_scale_and_image_weights_carry_over_a_mid_epoch_resume_bit_for_bit(data, tmp_path):
    common = ("--epochs", "3", "--workers", "1", "--multi-scale", "--image-weights")
    stopped_once_ends_as_unstopped(data, tmp_path, common, (3, 2), 180)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_device_path_stopped_mid_epoch_and_resumed_ends_bit_identical(data, tmp_path):
    # the images made by the device render on the loader thread (the compiled kernels, on the CPU here), the
    # workers kept across epochs, a stop in the middle of an epoch: nothing of it changes what is trained
    common = ("--epochs", "2", "--workers", "2", "--augment-on", "device")
    full = stopped_once_ends_as_unstopped(data, tmp_path, common, (2, 3), 400)
    assert "train: images made on the device cpu (--augment-on device)" in full.stderr, describe([full])


def relative_difference(a: Path, b: Path) -> float:
    """``||a - b|| / ||a||`` over the raw weights of two runs' last.pt."""
    wa, wb = (load_checkpoint(p / "weights" / "last.pt")["train_model"] for p in (a, b))
    floats = [k for k, v in wa.items() if v.is_floating_point()]
    diff = sum(float((wa[k].double() - wb[k].double()).square().sum()) for k in floats)
    return (diff / sum(float(wa[k].double().square().sum()) for k in floats)) ** 0.5


FLOAT64 = ("-m", "tests.workers.float64_train")  # train.py with its model and step in float64
ROUNDING = 1e-8  # float64 runs 2 x 4 vs 1 x 8, relative norm: 3e-14 after a resume, 2e-10 over a whole epoch


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("saved_by", "resumed_by", "sync_bn"), [(2, 1, True), (1, 2, True), (2, 1, False)], ids=["2-1", "1-2", "2-1-own-bn"]
)
def test_a_run_resumes_with_another_number_of_processes_as_the_same_math(data, tmp_path, saved_by, resumed_by, sync_bn):
    """Saved by 2 processes x 4 images, resumed by 1 x 8 (and the other way): the same images, learning rates,
    momentum, accumulation, loss scale and (with --sync-bn) BatchNorm statistics, so the run ends where the
    uninterrupted one does but for rounding. Signalled at batch 2 of 8, it stops after the next optimizer
    step (batch 4 here): the warm-up's last iteration and the accumulation of 2 batches lie in the resumed part.

    In float64 (tests/workers/float64_train.py). In float32 this run from scratch amplifies rounding so much
    that it cannot tell: resumed on the same 2 processes with 2 threads instead of 1, the weights end 1e-4
    apart; on 1 process with 1 thread, 4e-4; with 2 threads, 3e-5. In float64 those are 3e-14, and without
    --sync-bn (each process's BatchNorm statistics its own, 4 images, then 8) far above the bound: it tells.
    """
    bn = ("--sync-bn",) if sync_bn else ()
    common = ("--epochs", "1", "--workers", "0", *bn, "--seed", "3")

    def command(nproc: int, *train_args: str) -> list[str]:
        return torchrun(nproc, *FLOAT64, *train_args) if nproc > 1 else [sys.executable, *FLOAT64, *train_args]

    full = run(command(saved_by, *args(data, tmp_path, "full", *common)[1:]), train_env(), 300)
    assert full.returncode == 0, describe([full])
    last = tmp_path / "cut" / "weights" / "last.pt"
    resume = command(resumed_by, "--resume", str(last))
    state = stopped_at(command(saved_by, *args(data, tmp_path, "cut", *common)[1:]), last, 1, 2)
    assert state.world_size == saved_by
    log = resumed(resume, last, state)
    per_process = f"saved by {saved_by} process(es) x {8 // saved_by} images, now {resumed_by} x {8 // resumed_by}"
    assert per_process in log, log
    resumed_log = run(resume, train_env(), 120)  # finished: a resume now changes nothing and says so
    assert "has finished all 1 epochs" in resumed_log.stderr, describe([resumed_log])
    assert [r["epoch"] for r in results(tmp_path / "cut")] == [0.0]
    weights = load_checkpoint(last)["train_model"]
    assert all(v.dtype == torch.float64 for v in weights.values() if v.is_floating_point()), "not trained in float64"
    apart = relative_difference(tmp_path / "full", tmp_path / "cut")
    if sync_bn:
        assert apart < ROUNDING, f"{apart:.2e} apart, stopped at {state.where()} of {NB} batches"
    else:  # the control: a real difference in the math stands far above the bound
        assert apart > 1000 * ROUNDING, f"without --sync-bn only {apart:.2e} apart: the bound tells nothing"


# ---- what a resume refuses, before anything is written ----


def make_run(project: Path, epochs: int = 3, epoch_done: int = 0, name: str = "exp") -> Path:
    """A run directory as train.py leaves it after ``epoch_done + 1`` epochs (a tiny model stands in)."""
    save_dir = project / name
    save_dir.mkdir(parents=True)
    opt = {"epochs": epochs, "data": "shapes.yaml", "project": str(project), "name": name, "save_dir": str(save_dir),
           "run_key": f"single/pid={name}", "batch_size": 8}  # fmt: skip
    (save_dir / "opt.yaml").write_text(yaml.safe_dump(opt))
    (save_dir / "hyp.yaml").write_text("lr0: 0.01\n")
    (save_dir / "results.csv").write_text("epoch,metrics/mAP_0.5\n0,0.1\n")
    model = nn.Linear(2, 1)
    checkpoints = Checkpointer(save_dir, opt=opt, hyp={"lr0": 0.01}, save_period=1)
    state = TrainState(epoch=epoch_done + 1, batches=8, batch_size=8)
    training = SimpleNamespace(model=model, ema=ModelEMA(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    checkpoints.save(state, training, best=True)
    return save_dir


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every path below ``directory``, folders included: its kind, mtime and (for files) bytes."""
    return {
        str(p.relative_to(directory)): (p.is_dir(), p.stat().st_mtime_ns, None if p.is_dir() else p.read_bytes())
        for p in sorted(directory.rglob("*"))
    }


def resume(target: Path, root: Path, *extra: str):
    """``train.py --resume target`` with its working directory, project and datasets folder inside ``root``."""
    time.sleep(0.01)  # a rewrite within the same clock tick would keep the mtime
    cmd = [sys.executable, str(REPO_ROOT / "train.py"), "--device", "cpu", "--resume", str(target), *extra]
    env = train_env(datasets=root / "datasets")
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=180, check=False)


def assert_refused(result, *named: str) -> None:
    assert result.returncode == 2, describe([result])
    assert "Traceback" not in result.stderr, describe([result])
    errors = [line for line in result.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and all(n in errors[0] for n in named), describe([result])


def test_a_stripped_last_pt_is_refused_before_anything_is_written(tmp_path):
    save_dir = make_run(tmp_path / "runs")
    strip_optimizer(save_dir / "weights" / "last.pt")  # what strip_optimizer leaves: epoch -1, no optimizer
    before = snapshot(tmp_path)
    assert_refused(resume(save_dir / "weights" / "last.pt", tmp_path), "stripped", "--weights")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["best.pt", "epoch0.pt"])
def test_only_a_runs_last_pt_resumes_and_its_opt_yaml_stays(tmp_path, name):
    save_dir = make_run(tmp_path / "runs")
    before = snapshot(tmp_path)
    assert_refused(resume(save_dir / "weights" / name, tmp_path), name, "weights/last.pt", "--weights")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("where", ["alone", "into a directory without a run", "over another run's last.pt"])
def test_a_last_pt_copied_outside_its_run_is_not_refused_and_writes_nowhere_when_finished(tmp_path, where):
    """A copy is resumed from the options it holds, as YOLOv5 resumes it, in a new run directory; it was refused.
    Finished, it has nothing to do: exit 0, nothing written, the run it was copied over untouched."""
    save_dir = make_run(tmp_path / "runs", epochs=1, epoch_done=0)
    if where == "alone":
        copy = tmp_path / "scratch" / "last.pt"
    else:
        other = make_run(tmp_path / "runs", name="exp2") if "another" in where else tmp_path / "runs" / "exp2"
        copy = other / "weights" / "last.pt"
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(save_dir / "weights" / "last.pt", copy)
    before = snapshot(tmp_path)
    result = resume(copy, tmp_path)
    assert result.returncode == 0 and f"{copy} has finished all 1 epochs: nothing to resume" in result.stderr, describe(
        [result]
    )
    assert snapshot(tmp_path) == before


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_last_pt_copied_from_another_machine_resumes_into_a_new_run_directory_bit_identical(data, tmp_path):
    """``--resume /elsewhere/last.pt``, the run's directory not here (a copy taken from a cluster): it continues
    from the options and hyperparameters the file holds in the run directory --project/--name give, named in the
    log, and ends where the uninterrupted run does, bit for bit; the new directory then resumes in place."""
    common = ("--epochs", "2", "--workers", "1")
    full = run([sys.executable, *args(data, tmp_path, "full", *common)], train_env(), 180)
    assert full.returncode == 0, describe([full])
    last = tmp_path / "cut" / "weights" / "last.pt"
    state = stopped_at([sys.executable, *args(data, tmp_path, "cut", *common)], last, 2, 2)
    copy = tmp_path / "elsewhere" / "last.pt"
    copy.parent.mkdir()
    shutil.copy(last, copy)
    shutil.move(tmp_path / "cut", tmp_path / "on-the-cluster")  # the run is not here: its recorded directory is gone
    here = tmp_path / "here"
    cmd = [sys.executable, "train.py", "--resume", str(copy), "--project", str(here), "--name", "moved"]
    result = run(cmd, train_env(), 240)
    assert result.returncode == 0, describe([result])
    assert f"resuming {copy} at {state.where()} in a new run directory under {here} " in result.stderr, result.stderr
    assert f"logging to {here / 'moved'}" in result.stderr and f"; resumed at {state.where()}" in result.stderr
    assert not (tmp_path / "cut").exists()  # nothing written where the copy says its run was
    assert_bit_identical(tmp_path / "full", here / "moved", csv=False)
    full_rows = (tmp_path / "full" / "results.csv").read_text().splitlines()
    assert (here / "moved" / "results.csv").read_text().splitlines() == [full_rows[0], full_rows[2]]  # epoch 2 only
    assert yaml.safe_load((here / "moved" / "opt.yaml").read_text())["save_dir"] == str(here / "moved")
    again = run([sys.executable, "train.py", "--resume", str(here / "moved")], train_env(), 120)
    assert again.returncode == 0 and "has finished all 2 epochs: nothing to resume" in again.stderr, describe([again])


def test_a_whole_run_directory_moved_elsewhere_still_resumes(tmp_path):
    save_dir = make_run(tmp_path / "runs", epochs=1, epoch_done=0)  # finished: resuming it writes nothing
    moved = tmp_path / "elsewhere" / "exp"
    moved.parent.mkdir()
    shutil.move(save_dir, moved)
    before = snapshot(tmp_path)
    result = resume(moved / "weights" / "last.pt", tmp_path)
    assert result.returncode == 0 and "has finished all 1 epochs" in result.stderr, describe([result])
    assert snapshot(tmp_path) == before


def test_a_yolov5_checkpoint_is_refused_naming_weights(tmp_path):
    yolo_yaml = REPO_ROOT / "configs" / "models" / "yolov5n.yaml"
    from tests.yolo import yolov5_standins as v5
    from tests.yolo.test_foreign import save_yolov5

    save_dir = make_run(tmp_path / "runs")
    model = v5.build(yaml.safe_load(yolo_yaml.read_text()))
    save_yolov5(v5.yolov5_checkpoint(model, epoch=5), save_dir / "weights" / "last.pt")  # YOLOv5's own, pickled
    before = snapshot(tmp_path)
    assert_refused(resume(save_dir / "weights" / "last.pt", tmp_path), "YOLOv5", "--weights")
    assert snapshot(tmp_path) == before


def test_a_missing_last_pt_is_refused(tmp_path):
    missing = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    before = snapshot(tmp_path)
    assert_refused(resume(missing, tmp_path), str(missing), "no such checkpoint")
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_damaged_last_pt_is_one_line_naming_the_last_good_checkpoint_and_nothing_is_written(tmp_path):
    save_dir = make_run(tmp_path / "runs", epochs=5, epoch_done=0)  # last.pt, best.pt, epoch0.pt: one save
    opt = yaml.safe_load((save_dir / "opt.yaml").read_text())
    model = nn.Linear(2, 1)
    training = SimpleNamespace(model=model, ema=ModelEMA(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    checkpoints = Checkpointer(save_dir, opt=opt, hyp={"lr0": 0.01}, save_period=1)  # epoch 2: last.pt, epoch1.pt
    checkpoints.save(TrainState(epoch=2, batches=8, batch_size=8), training)
    last = save_dir / "weights" / "last.pt"
    os.truncate(last, last.stat().st_size // 2)  # cut short on the storage (epoch1.pt, the same bytes, with it)
    before = snapshot(tmp_path)
    result = resume(last, tmp_path)
    assert_refused(result, f"--resume {last}: the checkpoint is damaged (cut short at ", "python train.py --resume")
    good = re.search(r"the run's (\S+) \(epoch 1 done, saved [^)]+\) loads: continue from it with `mv ", result.stderr)
    assert good and Path(good.group(1)).name in ("best.pt", "epoch0.pt"), result.stderr
    assert snapshot(tmp_path) == before


def test_a_finished_run_exits_0_without_a_write(tmp_path):
    save_dir = make_run(tmp_path / "runs", epochs=2, epoch_done=1)
    before = snapshot(tmp_path)
    result = resume(save_dir / "weights" / "last.pt", tmp_path)
    assert result.returncode == 0, describe([result])
    assert "has finished all 2 epochs: nothing to resume" in result.stderr + result.stdout, describe([result])
    assert snapshot(tmp_path) == before


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_a_total_batch_the_new_number_of_processes_cannot_share_is_one_line(tmp_path):
    save_dir = make_run(tmp_path / "runs")  # 8 images per step in total
    before = snapshot(tmp_path)
    cmd = torchrun(3, str(REPO_ROOT / "train.py"), "--device", "cpu", "--resume", str(save_dir / "weights" / "last.pt"))
    result = subprocess.run(cmd, cwd=tmp_path, env=train_env(datasets=tmp_path / "datasets"), capture_output=True,
                            text=True, timeout=180, check=False)  # fmt: skip
    assert result.returncode == 1, describe([result])  # torchrun's own code when a worker fails (each exits 2)
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and "8 images per step in total, which 3 processes cannot share" in errors[0], result.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("given", ["the run directory", "its weights directory"])
def test_resume_given_a_run_directory_continues_its_weights_last_pt(tmp_path, given):
    save_dir = make_run(tmp_path / "runs", epochs=2, epoch_done=1)  # finished: resuming it writes nothing
    before = snapshot(tmp_path)
    result = resume(save_dir if given == "the run directory" else save_dir / "weights", tmp_path)
    assert result.returncode == 0, describe([result])
    assert f"{save_dir / 'weights' / 'last.pt'} has finished all 2 epochs: nothing to resume" in result.stderr, (
        describe([result])
    )
    assert snapshot(tmp_path) == before


def test_resume_given_a_directory_without_weights_last_pt_says_so(tmp_path):
    empty_run = tmp_path / "runs" / "exp"
    (empty_run / "weights").mkdir(parents=True)
    before = snapshot(tmp_path)
    assert_refused(resume(empty_run, tmp_path), f"--resume {empty_run}: a directory without weights/last.pt")
    assert snapshot(tmp_path) == before
