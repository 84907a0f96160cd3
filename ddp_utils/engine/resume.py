"""Continuing a run: what it must save to resume at the next batch, its checkpoint files, the resume itself.

- :class:`TrainState`: where training stands beyond the weights, optimizer, EMA and scaler (the
  epoch and batch, the accumulation phase, each rank's running loss, early stopping, the last
  validation). With it, everything the next step depends on is in ``last.pt`` or follows from
  (seed, epoch, step, index): the data order, every augmentation, the multi-scale size, the
  warm-up and the LR schedule. Batches are counted globally (global batch ``k`` is the same
  images whatever the number of processes), so a run resumes with another number of processes.
- :class:`~ddp_utils.engine.checkpoint.Checkpointer` (in ``checkpoint/``) writes it: a run's
  ``weights/last.pt``, ``best.pt`` and ``epochN.pt``, and the clock of periodic mid-epoch saves.
- :func:`find_resume` (find and check, before anything is written: rank 0 decides, every rank
  follows) and :func:`restore_training` (put the state back).

A refusal is a :class:`ResumeError` naming the file and what to do instead.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from ..distributed import DistInfo, all_gather_object, broadcast_object, launch_key
from ..distributed.parallel import de_parallel
from ..log import LOGGER
from .checkpoint import FOREIGN_KEY, CheckpointError, foreign_resume_message, load_pretrained, to_plain

_EMPTY_VAL = {"precision": 0.0, "recall": 0.0, "map50": 0.0, "map": 0.0}
_TOP_LEVEL = ("epoch", "best_fitness")  # TrainState's fields that the checkpoint keeps at its top level only


@dataclasses.dataclass
class TrainState:
    """Where a run stands: the part of a checkpoint that lets a resume continue at the next global batch.

    Attributes:
        epoch: the epoch in progress (the next one to train when ``batch`` is 0).
        batch: global batches of ``epoch`` already trained; ``batches`` when the epoch is trained but
            not yet validated (a stop at its end).
        batches: batches per epoch (the same for any number of processes at the same total batch).
        batch_size: the total batch size over all processes.
        world_size: the processes that saved it.
        last_opt_step: the global iteration of the last optimizer step: the accumulation phase.
        loss: per rank, the running mean (box, obj, cls) loss over the epoch's trained batches.
        best_fitness: the best fitness so far.
        best_epoch: the epoch that reached it (early stopping counts from there).
        last_val: the last validation: ``metrics`` (precision, recall, map50, map), ``val_loss``
            (box, obj, cls) and ``maps`` (per-class mAP@0.5:0.95, what ``--image-weights`` draws by).
        skipped: optimizer steps skipped so far in the run because their gradients were not finite.

    The checkpoint keeps :attr:`epoch` and :attr:`best_fitness` once, at its top level (``epoch`` there is the
    last epoch done: ``self.epoch - 1``); :meth:`as_dict` leaves them out of ``train_state``.

    Examples:
        >>> state = TrainState(epoch=2, batch=5, batches=8, batch_size=16, world_size=2)
        >>> TrainState.from_checkpoint({"epoch": 1, "train_state": state.as_dict()}).where()
        'epoch 3, batch 5/8'
        >>> TrainState.from_checkpoint({"epoch": 4}).where()  # a checkpoint saved at an epoch's end
        'epoch 6'
    """

    epoch: int = 0
    batch: int = 0
    batches: int = 0
    batch_size: int = 0
    world_size: int = 1
    last_opt_step: int = -1
    loss: list[list[float]] = dataclasses.field(default_factory=list)
    best_fitness: float = 0.0
    best_epoch: int = -1
    last_val: dict[str, Any] = dataclasses.field(default_factory=dict)
    skipped: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain values for the checkpoint's ``train_state``: all but :attr:`epoch` and :attr:`best_fitness`,
        which the checkpoint holds once, as YOLOv5's does (``epoch``, the last epoch done, is ``self.epoch - 1``)."""
        return to_plain({k: v for k, v in dataclasses.asdict(self).items() if k not in _TOP_LEVEL})

    @classmethod
    def from_checkpoint(cls, ckpt: Mapping[str, Any]) -> TrainState:
        """The state a checkpoint records; one from before ``train_state`` existed starts the epoch after its own."""
        epoch = int(ckpt.get("epoch", -1))
        top = dict(epoch=epoch + 1, best_fitness=float(ckpt.get("best_fitness", 0.0) or 0.0))
        recorded = ckpt.get("train_state")
        if isinstance(recorded, Mapping):
            known = {f.name for f in dataclasses.fields(cls)} - set(_TOP_LEVEL)
            return cls(**{k: v for k, v in recorded.items() if k in known}, **top)
        return cls(**top, best_epoch=epoch)

    def where(self) -> str:
        """``"epoch 3, batch 12/24"`` (from 1, as the log counts epochs), or ``"epoch 3"`` at its start."""
        if self.batch == 0:
            return f"epoch {self.epoch + 1}"
        return f"epoch {self.epoch + 1}, batch {self.batch}/{self.batches}"

    def rank_loss(self, rank: int, world_size: int) -> torch.Tensor | None:
        """The running loss this rank continues from: its own at the same scale, else the mean of all ranks'.

        None when the epoch had not started.
        """
        if self.batch == 0 or not self.loss:
            return None
        losses = torch.tensor(self.loss, dtype=torch.float32)
        return losses[rank] if world_size == len(self.loss) else losses.mean(0)

    def epoch_done(
        self,
        last_opt_step: int,
        stopper: Any,
        metrics: Mapping[str, float],
        val_loss: torch.Tensor,
        maps: Any = None,
        skipped: int | None = None,
    ) -> TrainState:
        """The state once :attr:`epoch` is trained and validated: the next epoch, from its first batch.

        Args:
            last_opt_step: the step's ``last_opt_step`` (the accumulation phase carries over).
            stopper: the :class:`~ddp_utils.engine.EarlyStopping` that just saw the epoch (its best fitness and epoch).
            metrics: the validation's precision, recall, map50, map.
            val_loss: its (box, obj, cls) loss.
            maps: per-class mAP@0.5:0.95 (``--image-weights`` draws the next epochs by it), or None.
            skipped: the optimizer steps skipped so far in the run (None: as it was).
        """
        best = self.best_fitness if stopper.best_fitness is None else max(self.best_fitness, stopper.best_fitness)
        last_val = {
            "metrics": {k: float(metrics[k]) for k in _EMPTY_VAL},
            "val_loss": [float(x) for x in val_loss],
            "maps": None if maps is None else [float(x) for x in maps],
        }
        return dataclasses.replace(
            self,
            epoch=self.epoch + 1,
            batch=0,
            last_opt_step=int(last_opt_step),
            loss=[],
            best_fitness=float(best),
            best_epoch=int(stopper.best_epoch),
            last_val=last_val,
            skipped=self.skipped if skipped is None else int(skipped),
        )

    def metrics(self) -> tuple[dict[str, float], torch.Tensor]:
        """The last validation's ``(metrics, val_loss)`` (zeros before the first)."""
        val = self.last_val or {}
        return {**_EMPTY_VAL, **val.get("metrics", {})}, torch.tensor(val.get("val_loss", [0.0] * 3))


class ResumeError(ValueError):
    """``--resume`` names something that cannot be resumed; the message says what to use instead."""


@dataclasses.dataclass(frozen=True)
class Resume:
    """A run to continue: its ``weights/last.pt``, loaded, and the options it recorded.

    Attributes:
        checkpoint: the ``<run>/weights/last.pt`` continued from.
        ckpt: the loaded checkpoint (weights, optimizer, EMA, scaler, options, train state).
        opt: the run's recorded options; options added since take their defaults.
        state: where it stopped (:class:`TrainState`).
    """

    checkpoint: Path
    ckpt: dict[str, Any]
    opt: argparse.Namespace
    state: TrainState

    @property
    def save_dir(self) -> Path:
        """The run directory: the checkpoint's ``weights/`` parent."""
        return self.checkpoint.parent.parent

    @property
    def finished(self) -> bool:
        """The run has trained all its epochs: nothing to resume."""
        return self.state.epoch >= int(self.opt.epochs)


def latest_checkpoint(project: str | Path, run_key: str | None = None) -> Path | None:
    """The newest ``<project>/<run>/weights/last.pt``, for ``--resume`` without a path.

    Args:
        project: the directory that holds the runs (``runs/train``).
        run_key: when given, only runs whose ``opt.yaml`` records this ``run_key`` count: an
            elastic restart finds its own run, never another job's in the same project.

    Returns:
        The path, or None when there is none.

    Examples:
        >>> latest_checkpoint("no/such/project") is None
        True
    """
    candidates = sorted(Path(project).glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in candidates:
        if run_key is None or _recorded_options(candidate.parent.parent).get("run_key") == run_key:
            return candidate
    return None


def _recorded_options(run_dir: Path) -> dict[str, Any]:
    """The run directory's ``opt.yaml``, or {} when it has none (or an unreadable one)."""
    try:
        recorded = yaml.safe_load((run_dir / "opt.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def run_checkpoint(path: str | Path) -> Path:
    """What ``--resume PATH`` continues: a run directory (or its ``weights/``) means its ``weights/last.pt``.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     (Path(tmp) / "exp" / "weights").mkdir(parents=True)
        ...     [run_checkpoint(Path(tmp) / p).relative_to(tmp).as_posix() for p in ("exp", "exp/weights")]
        ['exp/weights/last.pt', 'exp/weights/last.pt']
        >>> run_checkpoint("runs/train/exp/weights/best.pt").as_posix()  # a file stays itself (and is refused later)
        'runs/train/exp/weights/best.pt'
    """
    path = Path(path)
    if not path.is_dir():
        return path
    return path / "last.pt" if path.name == "weights" else path / "weights" / "last.pt"


def _checkpoint_to_resume(opt: argparse.Namespace, info: DistInfo, run_key: str) -> Path | None:
    """Rank 0's choice: the given path, the project's newest last.pt, or an elastic restart's own."""
    if opt.resume:
        return run_checkpoint(opt.resume) if isinstance(opt.resume, str) else latest_checkpoint(opt.project)
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


def check_run_directory(path: Path, ckpt: Mapping[str, Any]) -> None:
    """Refuse a ``last.pt`` that is not in the run directory it was saved in (a copy of the file alone).

    The checkpoint records its run directory (``opt["save_dir"]``) and launch (``opt["run_key"]``).
    It resumes where it lies when that directory is the recorded one (resolved), or when the
    directory's ``opt.yaml`` records the same run: the whole run was moved or copied, its
    results.csv and plots with it. A ``last.pt`` copied into some other ``X/weights/`` would make
    ``X`` a run without its history, so it is refused.

    Raises:
        ResumeError: one line naming the file, the run it belongs to and what to do instead.
    """
    recorded = ckpt["opt"].get("save_dir")
    if not recorded or recorded == "None":  # written before runs recorded their directory
        return
    here = path.parent.parent
    if Path(recorded).resolve() == here.resolve():
        return
    options = _recorded_options(here)
    if options.get("run_key") == ckpt["opt"].get("run_key") and options.get("save_dir") == recorded:
        return  # the run directory itself was moved or copied
    raise ResumeError(
        f"--resume {path}: this last.pt was saved by the run in {recorded}, and {here} is not that run "
        f"(its opt.yaml records {'another run' if options else 'nothing'}): resume the run where it is "
        f"(--resume {Path(recorded) / 'weights' / 'last.pt'}), or start a new run from this file with --weights {path}"
    )


def _check_scale(path: Path, ckpt: Mapping[str, Any], info: DistInfo) -> None:
    """The recorded total batch must split evenly over this launch's processes (a resume keeps the total)."""
    batch_size = int(ckpt["opt"].get("batch_size") or 0)
    if batch_size > 0 and batch_size % info.world_size:
        raise ResumeError(
            f"--resume {path}: the run trains {batch_size} images per step in total, which {info.world_size} "
            f"processes cannot share evenly: resume with a number of processes that divides {batch_size}"
        )


def find_resume(opt: argparse.Namespace, info: DistInfo, defaults: Mapping[str, Any]) -> Resume | None:
    """What this launch continues, checked before anything is written (rank 0 decides, all follow).

    With ``--resume`` (a run directory, its ``weights/last.pt``, or the project's newest ``last.pt``),
    or by itself on an elastic restart (torchrun ``--max-restarts``, a SLURM requeue), which finds its
    own run by the launch key recorded in ``opt.yaml``. Every rank raises the same error, or none. The run may resume
    with another number of processes than it was saved with, when they divide its total batch.

    Args:
        opt: the parsed options.
        info: this process in the job.
        defaults: every option's default; a resumed run's options added since take these.

    Returns:
        The run to continue (see :attr:`Resume.finished`), or None for a new run.

    Raises:
        FileNotFoundError: the checkpoint is missing (a run directory given: its ``weights/last.pt``).
        ResumeError: not a run's ``weights/last.pt``, a copy outside its run, stripped, foreign, without
            options, or a total batch this number of processes cannot share.
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
        given = opt.resume if isinstance(opt.resume, str) else None
        if given is not None and Path(given) != last:  # a directory: the run's last.pt is not there
            raise FileNotFoundError(
                f"--resume {given}: a directory without {last.relative_to(given).as_posix()}; give a run's "
                "directory or its weights/last.pt"
            )
        raise FileNotFoundError(f"--resume {last}: no such checkpoint; give a run's directory or its weights/last.pt")
    _check_location(last)
    if all(all_gather_object(last.is_file())):
        ckpt = load_pretrained(last)
    else:  # nodes without a shared file system get rank 0's copy
        ckpt = broadcast_object(load_pretrained(last) if info.is_main else None)
    check_resumable(last, ckpt)
    check_run_directory(last, ckpt)
    _check_scale(last, ckpt, info)
    resumed = argparse.Namespace(**{**defaults, **ckpt["opt"], "resume": str(last), "weights": str(last)})
    resume = Resume(last, ckpt, resumed, TrainState.from_checkpoint(ckpt))
    if resume.finished:
        LOGGER.info(f"{last} has finished all {resumed.epochs} epochs: nothing to resume")
    else:
        LOGGER.info(f"resuming {resume.save_dir} at {resume.state.where()}{_scale_change(resume, info)}")
    return resume


def _scale_change(resume: Resume, info: DistInfo) -> str:
    """``" (saved by 2 processes x 8 images, now 1 x 16)"`` when the number of processes changed, else ``""``."""
    saved, total = resume.state.world_size, int(resume.opt.batch_size)
    if saved == info.world_size or total <= 0:
        return ""
    return (
        f" (saved by {saved} process(es) x {total // saved} images, now {info.world_size} x "
        f"{total // info.world_size}: the same {total} images per step)"
    )


def restore_training(
    ckpt: Mapping[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    ema: Any | None = None,
    scaler: Any | None = None,
) -> TrainState:
    """Put a resumed run back where the checkpoint left it.

    Loads the weights into ``model`` (the raw ``train_model`` weights when the checkpoint
    has them, else the EMA's) and into ``ema.ema`` (restoring ``ema.updates``), the
    optimizer and the scaler state when given and present.

    Returns:
        The :class:`TrainState` to continue from (``state.epoch``, ``state.batch``...).

    Raises:
        CheckpointError: the checkpoint was stripped (no optimizer state) while an optimizer was given.
    """
    if optimizer is not None and ckpt.get("optimizer") is None:
        raise CheckpointError(
            "this checkpoint cannot resume training: it was stripped (no optimizer state, epoch -1); "
            "start a new run with it as pretrained weights instead"
        )
    de_parallel(model).load_state_dict(ckpt.get("train_model") or ckpt["model"])
    if ema is not None:
        ema.ema.load_state_dict(ckpt["model"])
        ema.updates = int(ckpt.get("ema_updates", 0))
    if optimizer is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    if scaler is not None and ckpt.get("scaler") is not None:
        scaler.load_state_dict(ckpt["scaler"])
    return TrainState.from_checkpoint(ckpt)


def start_state(
    resume: Resume | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: Any,
    scaler: Any,
    batches: int,
    batch_size: int,
) -> TrainState:
    """Where training starts: a new run's first batch, or a resumed run put back (:func:`restore_training`) at the
    batch it stopped at, with ``batches`` per epoch and ``batch_size`` images per step in total now.

    A resumed epoch whose batches per epoch changed (another dataset or batch size) starts again at its first.
    """
    state = TrainState()
    if resume is not None:
        state = restore_training(resume.ckpt, model, optimizer, ema, scaler)
        if state.batch and state.batches != batches:
            LOGGER.warning(f"the run stopped at {state.where()}, but an epoch has {batches} batches now")
            state.batch = 0
    return dataclasses.replace(state, batches=batches, batch_size=batch_size)


def gather_losses(loss: torch.Tensor) -> list[list[float]]:
    """Every rank's running loss, in rank order (a collective: every rank calls it); ``[loss]`` without a group."""
    return [list(map(float, item)) for item in all_gather_object(loss.detach().float().cpu().tolist())]


__all__ = [
    "Resume",
    "ResumeError",
    "TrainState",
    "check_resumable",
    "check_run_directory",
    "find_resume",
    "gather_losses",
    "latest_checkpoint",
    "restore_training",
    "run_checkpoint",
]
