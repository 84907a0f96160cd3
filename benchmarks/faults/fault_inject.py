"""Run train.py with a fault that a signal cannot inject: a non-finite loss at one training step, or one tied to rank
0's checkpoint saves (a full disk, a kill the moment a save is on disk).

    torchrun --nproc_per_node 2 benchmarks/faults/fault_inject.py --nan-at 13 --nan-rank 1 -- --data ...
    torchrun ... benchmarks/faults/fault_inject.py --fill-before-save 1 --filler /mnt/small/filler -- --data ...
    torchrun ... benchmarks/faults/fault_inject.py --fill-before-final --filler /mnt/small/filler -- --data ...
    torchrun ... benchmarks/faults/fault_inject.py --fill-at-step 1 --filler /mnt/small/filler -- --data ...
    torchrun ... benchmarks/faults/fault_inject.py --kill-after-save 2 -- --data ...

- ``--nan-at``: the loss that ``TrainStep`` computes at its ``--nan-at``-th training forward (counted from 0 in this
  process, validation's forwards not counted) on rank ``--nan-rank`` is multiplied by NaN.
- ``--fill-before-save N``: just before rank 0's N-th counted save is written, the file system of ``--filler`` (a
  small tmpfs holding the run) is filled to its last byte with that file: the save fails with a real "No space left
  on device" in the background writer, and the filler is removed once it has: the saves after it land, and nothing
  else of the run was written while the disk was full.
- ``--fill-before-final``: the file system is filled just before rank 0's final save (the last epoch's), and stays
  full: the run's last save fails.
- ``--fill-at-step N``: the file system is filled at rank 0's ``N``-th training loss (counted from 0 in this process,
  as ``--nan-at``): in epoch 1, before its first save, while its first batches are drawn to the run directory
  (train_batch{i}.jpg, drawn after step i); it is freed once the first save after it has failed, as for
  ``--fill-before-save``.
- ``--kill-after-save N``: rank 0 kills itself (SIGKILL) once its N-th counted save is on disk.

Counted are the saves from epoch 2 on (the end of epoch 1 included) that are not the run's final one (epoch 1 still
draws its first batches into the run directory), in rank 0's checkpoint writer: each fault comes at the same point
of the run's story on any host, however fast; none depends on when a benchmark reads a line. Each prints one line
(``fault_inject: ...``) when it acts. Everything else is train.py as a user runs it (``runpy``, as ``__main__``).
A benchmark's tool, never imported by the package.
"""

from __future__ import annotations

import argparse
import errno
import os
import runpy
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from ddp_utils.run.checkpoint import CheckpointWriteError  # noqa: E402
from ddp_utils.run.checkpoint import disk as checkpoint_files  # noqa: E402
from ddp_utils.yolo import loss as loss_module  # noqa: E402


def inject_nan(at: int, rank: int) -> None:
    """Make the ``at``-th training loss of rank ``rank`` NaN (a forward with gradients: training, not validation)."""
    if int(os.environ.get("RANK", "0")) != rank:
        return
    original = loss_module.ComputeLoss.__call__
    calls = [0]

    def call(self, pred, targets):  # noqa: ANN001
        loss, items = original(self, pred, targets)
        if torch.is_grad_enabled():
            if calls[0] == at:
                loss = loss * float("nan")
            calls[0] += 1
        return loss, items

    loss_module.ComputeLoss.__call__ = call


def at_training_loss(at: int, act: Callable[[], None]) -> None:
    """Call ``act`` on rank 0 just before its ``at``-th training loss (a forward with gradients) is computed."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    original = loss_module.ComputeLoss.__call__
    calls = [0]

    def call(self, pred, targets):  # noqa: ANN001
        if torch.is_grad_enabled():
            if calls[0] == at:
                act()
            calls[0] += 1
        return original(self, pred, targets)

    loss_module.ComputeLoss.__call__ = call


def is_final(ckpt: Mapping[str, Any]) -> bool:
    """Whether ``ckpt`` is a run's final save: its last epoch done, at the epoch's end.

    Examples:
        >>> is_final({"epoch": 2, "opt": {"epochs": 3}, "train_state": {"batch": 0}})
        True
        >>> is_final({"epoch": 1, "opt": {"epochs": 3}, "train_state": {"batch": 4}})  # in the last epoch's steps
        False
    """
    return int(ckpt["epoch"]) + 1 >= int(ckpt["opt"]["epochs"]) and not ckpt.get("train_state", {}).get("batch")


def where(ckpt: Mapping[str, Any]) -> str:
    """Where a checkpoint stands, in the log's words.

    Examples:
        >>> where({"epoch": -1, "train_state": {"batch": 3, "batches": 8}}), where({"epoch": 1, "train_state": {}})
        ('epoch 1, batch 3/8', 'the end of epoch 2')
    """
    state = ckpt.get("train_state", {})
    if state.get("batch"):
        return f"epoch {int(ckpt['epoch']) + 2}, batch {state['batch']}/{state['batches']}"
    return f"the end of epoch {int(ckpt['epoch']) + 1}"


def epoch_of(ckpt: Mapping[str, Any]) -> int:
    """The epoch (from 1, as the log counts) a save stands in: the one in progress, or the next after an epoch's end.

    Examples:
        >>> epoch_of({"epoch": -1, "train_state": {"batch": 3}}), epoch_of({"epoch": 0, "train_state": {}})
        (1, 2)
    """
    return int(ckpt["epoch"]) + 2


class SaveHook:
    """Wraps the checkpoint writer's ``write_serialised``: what happens around rank 0's saves.

    Counted are the saves that stand in epoch ``from_epoch`` or later (the end of epoch 1 stands at epoch 2's start;
    epoch 1's own saves come while its first batches are still being drawn to the run directory) and are not the
    run's final one.

    Args:
        before: act just before the ``before``-th counted save is written (0: never), with ``first``.
        after: act once the ``after``-th counted save is on disk (0: never), with ``then``.
        first, then: what to do (given where that save stands).
        before_final: what to do before the final save is written, or None.
        on_failure: what to do when a save fails (given the error), or None.
        from_epoch: the first epoch whose saves count.
    """

    def __init__(
        self,
        *,
        before: int = 0,
        after: int = 0,
        first: Callable[[str], None] | None = None,
        then: Callable[[str], None] | None = None,
        before_final: Callable[[str], None] | None = None,
        on_failure: Callable[[CheckpointWriteError], None] | None = None,
        from_epoch: int = 2,
    ) -> None:
        self.before, self.after, self.first, self.then = before, after, first, then
        self.before_final, self.on_failure, self.from_epoch = before_final, on_failure, from_epoch
        self.counted = 0  # counted saves handed to the writer so far
        self.original = checkpoint_files.write_serialised

    def install(self) -> SaveHook:
        checkpoint_files.write_serialised = self.write
        return self

    def write(self, ckpt: Mapping[str, Any], paths: list) -> list[Path]:
        final, at = is_final(ckpt), where(ckpt)
        counted = not final and epoch_of(ckpt) >= self.from_epoch
        self.counted += counted
        if final and self.before_final is not None:
            self.before_final(at)
        if counted and self.counted == self.before and self.first is not None:
            self.first(at)
        try:
            written = self.original(ckpt, paths)
        except CheckpointWriteError as exc:
            if self.on_failure is not None:
                self.on_failure(exc)
            raise
        if counted and self.counted == self.after and self.then is not None:
            self.then(at)
        return written


def say(line: str) -> None:
    print(f"fault_inject: {line}", flush=True)


def fill(filler: Path) -> int:
    """Fill ``filler``'s file system to its last byte with that file; returns the bytes written."""
    size, chunk = 0, 2**20
    with open(filler, "wb", buffering=0) as f:
        while chunk:
            try:
                size += f.write(b"\0" * chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EFBIG):
                    raise
                chunk //= 2
    return size


def save_hook(opt: argparse.Namespace) -> SaveHook | None:
    """The hook the options ask for, on rank 0 (the rank that writes), else None."""
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    if opt.kill_after_save:

        def kill(at: str) -> None:
            say(f"killing rank 0 (SIGKILL) after its save at {at} reached the disk")
            os.kill(os.getpid(), signal.SIGKILL)

        return SaveHook(after=opt.kill_after_save, then=kill)
    if opt.filler is None:
        return None
    filler = Path(opt.filler)

    def full(before: str) -> Callable[[str], None]:
        return lambda at: say(f"filled the disk ({fill(filler) / 2**20:.1f} MiB) before the {before}save, at {at}")

    def freed(exc: CheckpointWriteError) -> None:
        if exc.errno == errno.ENOSPC and filler.exists():
            filler.unlink()
            say("freed the disk after the save failed")

    if opt.fill_before_final:
        return SaveHook(before_final=full("final "))
    if opt.fill_at_step is not None:
        step = opt.fill_at_step
        at_training_loss(step, lambda: say(f"filled the disk ({fill(filler) / 2**20:.1f} MiB) at training step {step}"))
        return SaveHook(on_failure=freed)
    return SaveHook(before=opt.fill_before_save, first=full(""), on_failure=freed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nan-at", type=int, default=None, help="the training forward (from 0) whose loss is NaN")
    parser.add_argument("--nan-rank", type=int, default=0, help="the rank it happens on")
    parser.add_argument("--fill-before-save", type=int, default=0, help="fill the disk before rank 0's N-th save")
    parser.add_argument("--fill-before-final", action="store_true", help="fill the disk before the final save")
    parser.add_argument("--fill-at-step", type=int, default=None, help="fill the disk at rank 0's N-th training loss")
    parser.add_argument("--filler", type=Path, default=None, help="the file that fills the disk (on its tmpfs)")
    parser.add_argument("--kill-after-save", type=int, default=0, help="SIGKILL rank 0 after its N-th save")
    split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    opt = parser.parse_args(sys.argv[1:split])
    if (opt.fill_before_save or opt.fill_before_final or opt.fill_at_step is not None) and opt.filler is None:
        parser.error("--fill-before-save, --fill-before-final and --fill-at-step need --filler")
    if opt.nan_at is not None:
        inject_nan(opt.nan_at, opt.nan_rank)
    hook = save_hook(opt)
    if hook is not None:
        hook.install()
    sys.argv = [str(REPO_ROOT / "train.py"), *sys.argv[split + 1 :]]
    runpy.run_path(str(REPO_ROOT / "train.py"), run_name="__main__")


if __name__ == "__main__":
    main()
