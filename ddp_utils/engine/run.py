"""One training run: what ``--resume`` continues, the settled options (:class:`Run`), its directory.

A run directory (``runs/train/exp3``) is written only by the run that owns it: a new run claims a
fresh one (:func:`make_run_dir`); a resumed run writes into the directory of the ``last.pt`` it
continues, and only after every reason to refuse the resume has been checked
(:func:`find_resume`). A refusal is a :class:`ResumeError` naming the file and what to do.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..data.config import check_dataset
from ..data.loader import EpochLoader
from ..distributed import DistInfo, all_gather_object, broadcast_object, launch_key
from ..hyp import load_hyp
from ..log import LOGGER
from .amp import resolve_amp
from .loggers import increment_path, yaml_save
from .loop import TrainStep
from .pretrained import FOREIGN_KEY, foreign_resume_message, load_pretrained
from .resume import latest_checkpoint
from .signals import requeue_signal


class ResumeError(ValueError):
    """``--resume`` names something that cannot be resumed; the message says what to use instead."""


@dataclasses.dataclass(frozen=True)
class Resume:
    """A run to continue: its ``weights/last.pt``, loaded, and the options it recorded.

    Attributes:
        checkpoint: the ``<run>/weights/last.pt`` continued from.
        ckpt: the loaded checkpoint (weights, optimizer, EMA, scaler, options).
        opt: the run's recorded options; options added since take their defaults.
        start_epoch: the first epoch still to train.
    """

    checkpoint: Path
    ckpt: dict[str, Any]
    opt: argparse.Namespace
    start_epoch: int

    @property
    def save_dir(self) -> Path:
        """The run directory: the checkpoint's ``weights/`` parent."""
        return self.checkpoint.parent.parent

    @property
    def finished(self) -> bool:
        """The run has trained all its epochs: nothing to resume."""
        return self.start_epoch >= int(self.opt.epochs)


def _checkpoint_to_resume(opt: argparse.Namespace, info: DistInfo, run_key: str) -> Path | None:
    """Rank 0's choice: the given path, the project's newest last.pt, or an elastic restart's own."""
    if opt.resume:
        return Path(opt.resume) if isinstance(opt.resume, str) else latest_checkpoint(opt.project)
    if info.restart_count > 0:
        last = latest_checkpoint(opt.project, run_key=run_key)
        if last is None:
            LOGGER.warning(f"elastic restart {info.restart_count}: no last.pt of this run yet, starting over")
        return last
    return None


def check_resumable(path: Path, ckpt: Mapping[str, Any]) -> None:
    """Refuse a checkpoint that cannot continue a run: foreign, stripped, or without the run's options.

    Raises:
        ResumeError: one line naming ``path`` and what to do instead.

    Examples:
        >>> try:
        ...     check_resumable(Path("runs/x/weights/last.pt"), {"epoch": -1, "optimizer": None})
        ... except ResumeError as exc:
        ...     print(str(exc)[:65])
        --resume runs/x/weights/last.pt: this checkpoint was stripped (no
    """
    if ckpt.get(FOREIGN_KEY):
        raise ResumeError(f"--resume: {foreign_resume_message(path)}")
    if ckpt.get("optimizer") is None:
        raise ResumeError(
            f"--resume {path}: this checkpoint was stripped (no optimizer state, epoch {ckpt.get('epoch', -1)}): "
            f"it cannot resume training; start a new run from it with --weights {path}"
        )
    if not isinstance(ckpt.get("opt"), Mapping) or "epochs" not in ckpt["opt"]:
        raise ResumeError(f"--resume {path}: the checkpoint records no training options; use --weights {path}")


def _check_location(path: Path) -> None:
    # A run is continued from its own weights/last.pt, as YOLOv5 does: best.pt and epochN.pt are
    # earlier states of a run whose last.pt, results.csv and plots have moved on.
    if path.name != "last.pt" or path.parent.name != "weights":
        raise ResumeError(
            f"--resume {path}: a run is resumed from its <run>/weights/last.pt; "
            f"to start a new run from this file use --weights {path}"
        )


def find_resume(opt: argparse.Namespace, info: DistInfo, defaults: Mapping[str, Any]) -> Resume | None:
    """What this launch continues, checked before anything is written (rank 0 decides, all follow).

    With ``--resume`` (a path, or the project's newest ``last.pt``), or by itself on an elastic
    restart (torchrun ``--max-restarts``), which finds its own run by the launch key recorded in
    ``opt.yaml``. Every rank raises the same error, or none.

    Args:
        opt: the parsed options.
        info: this process in the job.
        defaults: every option's default; a resumed run's options added since take these.

    Returns:
        The run to continue (see :attr:`Resume.finished`), or None for a new run.

    Raises:
        FileNotFoundError: the checkpoint is missing.
        ResumeError: not a run's ``weights/last.pt``; stripped, foreign, or without options.
        CheckpointError: not a checkpoint file.
    """
    run_key = launch_key(info)
    last = _checkpoint_to_resume(opt, info, run_key) if info.is_main else None
    last, exists = broadcast_object((str(last), Path(last).is_file()) if last is not None else (None, False))
    if opt.resume and last is None:
        raise FileNotFoundError(f"--resume: no {opt.project}/*/weights/last.pt to resume; give the path")
    if last is None:
        return None
    last = Path(last)
    if not exists:
        raise FileNotFoundError(f"--resume {last}: no such checkpoint; give the path of a run's weights/last.pt")
    _check_location(last)
    if all(all_gather_object(last.is_file())):
        ckpt = load_pretrained(last)
    else:  # nodes without a shared file system get rank 0's copy
        ckpt = broadcast_object(load_pretrained(last) if info.is_main else None)
    check_resumable(last, ckpt)
    resumed = argparse.Namespace(**{**defaults, **ckpt["opt"], "resume": str(last), "weights": str(last)})
    resume = Resume(last, ckpt, resumed, start_epoch=int(ckpt.get("epoch", -1)) + 1)
    if resume.finished:
        LOGGER.info(f"{last} has finished all {resumed.epochs} epochs: nothing to resume")
    else:
        LOGGER.info(f"resuming {resume.save_dir} from epoch {resume.start_epoch + 1}")
    return resume


@dataclasses.dataclass(frozen=True)
class Run:
    """A run's settled options: the command line (or the resumed run's) with every default filled in.

    ``opt`` stays as parsed; what the data yaml, the model or AutoBatch decided lives in the
    fields, and :meth:`options` is what ``opt.yaml`` and every checkpoint record.
    """

    opt: argparse.Namespace
    save_dir: Path | None
    run_key: str
    data: dict[str, Any]
    hyp: dict[str, Any]
    hyp_source: str | dict[str, Any]
    epochs: int
    amp: str
    nc: int
    names: dict[int, str]
    imgsz: int | None = None
    batch_size: int | None = None
    resume: Resume | None = None

    def options(self) -> dict[str, Any]:
        """The options as this run uses them (``opt.yaml``; a resume reads them back)."""
        settled = dict(epochs=self.epochs, hyp=self.hyp_source, amp=self.amp, imgsz=self.imgsz)
        where = dict(batch_size=self.batch_size, run_key=self.run_key, save_dir=str(self.save_dir))
        return {**vars(self.opt), **settled, **where}

    def replace(self, **changes: Any) -> Run:
        """A copy with ``changes`` (the run object is frozen)."""
        return dataclasses.replace(self, **changes)


def start_run(opt: argparse.Namespace, info: DistInfo, device: Any, resume: Resume | None) -> Run:
    """Settle the data and hyperparameters: the data yaml (the node's first process downloads or
    generates the data), its ``train_defaults`` for what the command line left open, mixed precision.

    Raises:
        FileNotFoundError, ValueError: a data or hyperparameter yaml that is missing or wrong (one line).
    """
    data = check_dataset(opt.data)
    defaults = data.get("train_defaults", {})
    hyp_source = opt.hyp or defaults.get("hyp", "hyp.scratch-low.yaml")
    hyp = load_hyp(hyp_source) if isinstance(hyp_source, str) else dict(hyp_source)  # what the run uses, unchanged
    nc = 1 if opt.single_cls else int(data["nc"])
    names = {0: "item"} if opt.single_cls and len(data["names"]) != 1 else data["names"]
    return Run(
        opt=opt,
        save_dir=resume.save_dir if resume else None,
        run_key=launch_key(info),
        data=data,
        hyp=hyp,
        hyp_source=hyp_source,
        epochs=opt.epochs or defaults.get("epochs", 100),
        amp=resolve_amp(opt.amp, device),
        nc=nc,
        names=names,
        imgsz=opt.imgsz or defaults.get("imgsz", 640),
        batch_size=opt.batch_size,
        resume=resume,
    )


def check_options(opt: argparse.Namespace, world_size: int) -> None:
    """Refuse bad combinations of train.py's options before any process group starts.

    Raises:
        ValueError: one line naming the option and what to do.

    Examples:
        >>> check_options(argparse.Namespace(batch_size=3, image_weights=False, epochs=None, sync_bn=False,
        ...                                  rect=False, multi_scale=False, requeue_signal="none"), world_size=2)
        Traceback (most recent call last):
        ValueError: --batch-size 3 does not divide by WORLD_SIZE=2: use a multiple of 2
    """
    if opt.batch_size < 1 and opt.batch_size != -1:
        raise ValueError(
            f"--batch-size {opt.batch_size}: give the total batch size, a positive integer, or -1 (AutoBatch)"
        )
    if opt.batch_size != -1 and opt.batch_size % world_size:
        raise ValueError(
            f"--batch-size {opt.batch_size} does not divide by WORLD_SIZE={world_size}: use a multiple of {world_size}"
        )
    if opt.image_weights and world_size > 1:
        raise ValueError("--image-weights works in a single process only: drop it or run without torchrun")
    if opt.epochs is not None and opt.epochs < 1:
        raise ValueError(f"--epochs {opt.epochs}: train at least one epoch")
    if opt.rect and opt.multi_scale:
        raise ValueError("--rect and --multi-scale do not go together: rect batches have fixed shapes")
    requeue_signal(opt.requeue_signal)  # a bad name is a ValueError naming it
    if opt.sync_bn and world_size == 1:
        LOGGER.warning("--sync-bn has no effect in a single process")


@dataclasses.dataclass
class Training:
    """What a run's epochs work with: the step (model, optimizer, EMA, loss), the schedule, the data, the score.

    Attributes:
        step: the :class:`~ddp_utils.engine.TrainStep`.
        scheduler: the per-epoch LR schedule.
        train_loader, val_loader: the loaders.
        labels: the training labels (for the label plot).
        start_epoch: the first epoch to train (after a resume: where it left off).
        best_fitness: the best fitness so far.
        last_val: the last validation's ``(metrics, val_loss)``; epochs ``--noval`` skips report it again.
    """

    step: TrainStep | None
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_loader: EpochLoader
    val_loader: EpochLoader
    labels: list
    start_epoch: int = 0
    best_fitness: float = 0.0
    last_val: tuple = dataclasses.field(
        default_factory=lambda: ({"precision": 0.0, "recall": 0.0, "map50": 0.0, "map": 0.0}, torch.zeros(3))
    )


def make_run_dir(project: str | Path, name: str, exist_ok: bool, info: DistInfo) -> Path:
    """Rank 0 claims ``project/name`` (or ``name2``, ``name3``, ... when taken); every rank gets the path."""
    new_dir = increment_path(Path(project) / name, exist_ok=exist_ok, mkdir=True) if info.is_main else None
    return Path(broadcast_object(str(new_dir) if new_dir is not None else None))


def record_run(run: Run, info: DistInfo) -> None:
    """Rank 0 writes the run's ``hyp.yaml`` and ``opt.yaml`` and logs the hyperparameters."""
    if info.is_main:
        yaml_save(run.save_dir / "hyp.yaml", run.hyp)
        yaml_save(run.save_dir / "opt.yaml", run.options())
        LOGGER.info("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in run.hyp.items()))


__all__ = [
    "Resume",
    "ResumeError",
    "Run",
    "Training",
    "check_options",
    "check_resumable",
    "find_resume",
    "make_run_dir",
    "record_run",
    "start_run",
]
