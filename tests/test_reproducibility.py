"""The same seed gives the same run: bit-identical in one process for any worker count, and within
float tolerance for any number of processes with the same global batch and --sync-bn."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch

from ddp_utils.run import build_checkpoint, load_checkpoint, save_checkpoint
from ddp_utils.yolo import Model

from .multiproc import describe, launch
from .test_train import run, tiny_data_yaml, torchrun, train_env

SEED_ARGS = ("--seed", "3", "--batch-size", "16", "--noval", "--noplots", "--exist-ok")
BOUND = 1e-4  # relative norm of the difference of two runs' updates that float32 summation order explains


def global_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """``||a - b|| / ||a||`` over every floating-point tensor of two state dicts."""
    assert set(a) == set(b)
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a if a[k].is_floating_point())
    den = sum(float(a[k].double().pow(2).sum()) for k in a if a[k].is_floating_point())
    return (num / den) ** 0.5


def train_args(data: Path, project: Path, name: str, *extra: str) -> list[str]:
    return [
        "train.py", "--data", str(data), "--cfg", "yolov5n.yaml", "--hyp", "hyp.shapes.yaml", "--imgsz", "96",
        "--device", "cpu", "--project", str(project), "--name", name, *SEED_ARGS, *extra,
    ]  # fmt: skip


def trained(project: Path, name: str) -> dict:
    return load_checkpoint(project / name / "weights" / "last.pt")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_one_step_of_two_ranks_equals_one_process(tmp_path):
    """yolov5n's first step: 2 gloo ranks x 8 images with GroupBatchNorm and the group-normalised
    loss give one process's loss and gradients with 16 images (float32 summation order aside)."""
    data = tiny_data_yaml(tmp_path)
    for nprocs in (1, 2):
        workers = launch("tests.workers.repro_scenarios:one_step", nprocs, 360, (data, tmp_path, "16", "96"),
                         env=train_env())  # fmt: skip
        assert all(w.returncode == 0 for w in workers), describe(workers)
    one, two = (torch.load(tmp_path / f"step{n}.pt", weights_only=True) for n in (1, 2))
    assert torch.allclose(one["items"], two["items"], rtol=1e-5, atol=0), (one["items"], two["items"])
    worst = max(
        float((g - two["grads"][k]).abs().max() / g.abs().max().clamp(min=1e-12)) for k, g in one["grads"].items()
    )
    assert worst < 1e-3, f"gradients differ by up to {worst:.2e} (max |diff| / max |grad| of a tensor)"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_ranks_load_together_what_one_process_loads(tmp_path):
    """Step k of 2 ranks x 8, concatenated in rank order, is one process's step k x 16: images and targets."""
    data = tiny_data_yaml(tmp_path)
    for nprocs in (1, 2):
        workers = launch("tests.workers.repro_scenarios:epoch_batches", nprocs, 250, (data, tmp_path, "16", "96"),
                         env=train_env())  # fmt: skip
        assert all(w.returncode == 0 for w in workers), describe(workers)
    one = torch.load(tmp_path / "batches1_rank0.pt", weights_only=True)
    ranks = [torch.load(tmp_path / f"batches2_rank{r}.pt", weights_only=True) for r in range(2)]
    for epoch, batches in enumerate(one):
        assert len(batches) == len(ranks[0][epoch]) == len(ranks[1][epoch])
        for k, (imgs, targets) in enumerate(batches):
            assert torch.equal(torch.cat([r[epoch][k][0] for r in ranks]), imgs), f"epoch {epoch} step {k}"
            n0 = ranks[0][epoch][k][0].shape[0]
            shifted = ranks[1][epoch][k][1].clone()
            shifted[:, 0] += n0  # rank 1's image indices continue rank 0's
            assert torch.equal(torch.cat([ranks[0][epoch][k][1], shifted]), targets), f"epoch {epoch} step {k}"


@pytest.mark.slow
@pytest.mark.timeout(800)
def test_reruns_worker_counts_and_validation_every_epoch_are_bit_identical(tmp_path):
    """The same seed trains the same bits: run again, with loader workers, or validated after every epoch instead of
    only the last (``--noval``). The last is what makes an evolution's pruned study comparable with YOLOv5's serial
    one: a trial the pruner watches (validated every epoch) trains what an unwatched one does."""
    data, project, env = tiny_data_yaml(tmp_path), tmp_path / "runs", train_env()
    for name, workers in (("a", "0"), ("b", "0"), ("w2", "2"), ("val", "0")):
        cmd = [sys.executable, *train_args(data, project, name, "--epochs", "2", "--workers", workers)]
        if name == "val":
            cmd.remove("--noval")
        result = run(cmd, env, 280)
        assert result.returncode == 0, describe([result])
    first_epoch_val_loss = {}
    for name in ("a", "val"):
        first_row = next(csv.DictReader((project / name / "results.csv").read_text().splitlines()))
        first_epoch_val_loss[name] = float(first_row["val/box_loss"])
    assert first_epoch_val_loss["a"] == 0 < first_epoch_val_loss["val"], first_epoch_val_loss  # validated, or not
    a = trained(project, "a")
    for other in ("b", "w2", "val"):
        b = trained(project, other)
        for key in ("train_model", "model"):
            assert all(torch.equal(v, b[key][k]) for k, v in a[key].items()), f"{other} {key}"


def initial_weights(path: Path, nc: int = 4) -> dict[str, torch.Tensor]:
    """A yolov5n checkpoint from seed 3 at ``path``, for ``--weights``: every run compared starts from it."""
    torch.manual_seed(3)
    model = Model("yolov5n.yaml", ch=3, nc=nc)
    save_checkpoint(build_checkpoint(model), path)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def relative_difference_of_changes(start: dict, a: dict, b: dict) -> float:
    """``||(a - start) - (b - start)|| / ||a - start||`` over every floating-point tensor: how far two runs'
    updates differ, relative to the update itself (the whole weights would hide a small update)."""
    keys = [k for k, v in start.items() if v.is_floating_point()]
    assert set(keys) <= set(a) and set(keys) <= set(b)
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in keys)
    den = sum(float((a[k].double() - start[k].double()).pow(2).sum()) for k in keys)
    assert den > 0, "the run did not change the weights"
    return (num / den) ** 0.5


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_torchrun_two_by_eight_with_sync_bn_equals_one_process_by_sixteen(tmp_path):
    """After an epoch from the same weights, the two runs' updates agree to float tolerance; without
    --sync-bn they do not (each rank's BatchNorm statistics are its own), so the bound is seen to tell.

    An epoch and not more: this tiny run from scratch amplifies float32 rounding about 1000-fold in its
    second epoch, so far that one process with 2 threads differs from itself with 1 by 2e-3 (README).
    """
    data, project, env = tiny_data_yaml(tmp_path), tmp_path / "runs", train_env()
    start = initial_weights(tmp_path / "init.pt")
    common = ("--epochs", "1", "--workers", "0", "--weights", str(tmp_path / "init.pt"))
    one = run([sys.executable, *train_args(data, project, "one", *common)], env, 280)
    assert one.returncode == 0, describe([one])
    for name, extra in (("sync", ("--sync-bn",)), ("own", ())):
        two = run(torchrun(2, *train_args(data, project, name, *common, *extra)), env, 280)
        assert two.returncode == 0, describe([two])
    a, synced, own = trained(project, "one"), trained(project, "sync"), trained(project, "own")
    diff = relative_difference_of_changes(start, a["train_model"], synced["train_model"])
    without = relative_difference_of_changes(start, a["train_model"], own["train_model"])
    print(f"relative difference of the updates: --sync-bn {diff:.2e}, without {without:.2e}")
    assert diff < BOUND, f"the updates differ by {diff:.2e} (relative norm) with --sync-bn"
    assert without > 10 * BOUND, f"without --sync-bn the updates differ by only {without:.2e}: the bound tells nothing"
    assert a["ema_updates"] == synced["ema_updates"] > 0
    assert a["optimizer"]["param_groups"][0]["lr"] == synced["optimizer"]["param_groups"][0]["lr"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_two_ranks_train_an_epoch_as_one_process_does_in_float64(tmp_path):
    """train.py's first epoch (loader, warm-up, group-normalised loss, GroupBatchNorm, DDP, EMA) in float64:
    2 gloo ranks x 8 with --sync-bn update the weights as 1 x 16 does to 1e-9 of the update, where float64
    rounding puts them (about 1e-14 measured) and float32 rounding cannot (about 1e-6 of an update per
    step, then amplified step after step); without --sync-bn they differ by far more, so the bound tells.

    Any difference between the scales in the images, their split, the loss's normalisation, BatchNorm's
    statistics or buffers, the LR and warm-up would show here above the bound; float32 figures cannot tell
    such a difference from rounding (issue 29: 2 x 8 after an epoch 20 times the 2-thread figure).
    """
    data = tiny_data_yaml(tmp_path)
    for nprocs, sync_bn in ((1, "1"), (2, "1"), (2, "0")):
        args = (data, tmp_path, "16", "96", sync_bn)
        workers = launch("tests.workers.repro_scenarios:float64_epoch", nprocs, 300, args, env=train_env())
        assert all(w.returncode == 0 for w in workers), describe(workers)
    one, synced, own = (
        torch.load(tmp_path / f"float64_{name}.pt", weights_only=True) for name in ("1_1", "2_1", "2_0")
    )
    assert one["steps"] == synced["steps"] == 2 and one["ema_updates"] == synced["ema_updates"] == 2
    assert one["lr"] == synced["lr"]
    assert all(v.dtype != torch.float32 for v in one["model"].values()), "the model did not train in float64"
    diff = relative_difference_of_changes(one["start"], one["model"], synced["model"])
    without = relative_difference_of_changes(one["start"], one["model"], own["model"])
    print(f"float64, relative difference of the updates: --sync-bn {diff:.2e}, without {without:.2e}")
    assert diff < 1e-9, f"2 x 8 with --sync-bn updates the weights {diff:.2e} (relative norm) apart from 1 x 16"
    assert without > 1e-4, f"without --sync-bn the updates differ by only {without:.2e}: the bound tells nothing"
    # the EMA is float32 by design (ModelEMA): float32 rounding of all but equal weights
    assert global_relative_difference(one["ema"], synced["ema"]) < 1e-6


def test_group_normalised_loss_without_a_group_is_the_plain_loss():
    from ddp_utils.yolo import ComputeLoss, Model, load_model_yaml

    cfg, _ = load_model_yaml("yolov5n.yaml")
    model = Model({**cfg, "width_multiple": 0.0625}, nc=3)
    hyp = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0}
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.3], [1, 2, 0.3, 0.6, 0.1, 0.1], [1, 0, 0.7, 0.2, 0.3, 0.2]])
    preds = model(torch.rand(2, 3, 64, 64))
    for dense in (False, True):
        plain = ComputeLoss(model, hyp, dense=dense)(preds, targets)
        grouped = ComputeLoss(model, hyp, dense=dense, across_ranks=True)(preds, targets)
        assert torch.equal(plain[0], grouped[0]) and torch.equal(plain[1], grouped[1])
