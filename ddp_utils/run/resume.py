"""Continuing a run: finding what to resume, checking it, and putting it back.

- :class:`~ddp_utils.run.train_state.TrainState` (in ``train_state.py``): where training stands beyond
  the weights, optimizer, EMA and scaler, to the batch.
- :class:`~ddp_utils.run.checkpoint.Checkpointer` (in ``checkpoint/``) writes it: a run's
  ``weights/last.pt``, ``best.pt`` and ``epochN.pt``.
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
from .checkpoint import FOREIGN_KEY, CheckpointError, foreign_resume_message, integrity, load_pretrained
from .train_state import TrainState


class ResumeError(ValueError):
    """``--resume`` names something that cannot be resumed; the message says what to use instead."""


@dataclasses.dataclass(frozen=True)
class Resume:
    """A run to continue: its ``weights/last.pt`` (or a copy of it taken elsewhere), loaded, and the options it
    recorded.

    Attributes:
        checkpoint: the file continued from: ``<run>/weights/last.pt``, or a copy outside its run.
        ckpt: the loaded checkpoint (weights, optimizer, EMA, scaler, options, train state).
        opt: the run's recorded options; options added since take their defaults.
        state: where it stopped (:class:`TrainState`).
        copy: the checkpoint is a copy outside the run that saved it (``last.pt`` taken from a cluster): it
            continues in a new run directory, claimed as a new run's once the inputs are checked.
    """

    checkpoint: Path
    ckpt: dict[str, Any]
    opt: argparse.Namespace
    state: TrainState
    copy: bool = False

    @property
    def save_dir(self) -> Path | None:
        """The run directory: the checkpoint's ``weights/`` parent; None for a copy (a new one, not yet claimed)."""
        return None if self.copy else self.checkpoint.parent.parent

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
    """Rank 0's choice: an elastic restart's own run (it may have moved on from what ``--resume`` named: a copy
    resumed into a new run directory), else the given path or the project's newest last.pt."""
    own = latest_checkpoint(opt.project, run_key=run_key) if info.restart_count > 0 else None
    if own is not None:
        return own
    if opt.resume:
        return run_checkpoint(opt.resume) if isinstance(opt.resume, str) else latest_checkpoint(opt.project)
    if info.restart_count > 0:
        LOGGER.warning(f"elastic restart {info.restart_count}: no last.pt of this run yet, starting over")
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


def in_its_run(path: Path, ckpt: Mapping[str, Any]) -> bool:
    """Whether ``path`` lies in the run directory that saved it, as ``<run>/weights/<file>``.

    The checkpoint records its run directory (``opt["save_dir"]``) and launch (``opt["run_key"]``). The file is
    in its run when that directory is the recorded one (resolved), or when the directory's ``opt.yaml`` records
    the same run (the whole run was moved or copied, its results.csv and plots with it); a checkpoint from before
    runs recorded their directory is in its run in any ``weights/``.
    """
    if path.parent.name != "weights":
        return False
    recorded = ckpt["opt"].get("save_dir")
    here = path.parent.parent
    if not recorded or recorded == "None" or Path(recorded).resolve() == here.resolve():
        return True
    options = _recorded_options(here)
    return options.get("run_key") == ckpt["opt"].get("run_key") and options.get("save_dir") == recorded


def check_run_file(path: Path, ckpt: Mapping[str, Any]) -> bool:
    """Whether ``path`` continues its run where it lies (True) or is a copy outside it (False), which continues in a
    new run directory, as YOLOv5 resumes any ``last.pt`` it is given from the options the file holds.

    Raises:
        ResumeError: ``best.pt`` or ``epochN.pt`` of a run in its own directory: an earlier state of a run whose
            ``last.pt``, results.csv and plots have moved on (one line: resume the run, or --weights).
    """
    if not in_its_run(path, ckpt):
        return False
    if path.name != "last.pt":
        raise ResumeError(
            f"--resume {path}: a run is resumed from its <run>/weights/last.pt, and this is an earlier state of "
            f"its run (resume it with --resume {path.parent / 'last.pt'}); to start a new run from this file use "
            f"--weights {path}"
        )
    return True


def _where_it_continues(path: Path, ckpt: Mapping[str, Any], info: DistInfo) -> bool:
    """:func:`check_run_file` on rank 0 (it reads the run's opt.yaml, which a node without a shared file system
    lacks), its verdict or its error on every rank alike."""
    verdict: bool | str | None = None
    if info.is_main:
        try:
            verdict = check_run_file(path, ckpt)
        except ResumeError as exc:
            verdict = str(exc)
    verdict = broadcast_object(verdict)
    if isinstance(verdict, str):
        raise ResumeError(verdict)
    return bool(verdict)


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
    with another number of processes than it was saved with, when they divide its total batch. A checkpoint
    that is a copy outside the run that saved it (:func:`check_run_file`) resumes from the options and
    hyperparameters it holds into a new run directory (:attr:`Resume.copy`), which the caller claims.

    Args:
        opt: the parsed options.
        info: this process in the job.
        defaults: every option's default; a resumed run's options added since take these.

    Returns:
        The run to continue (see :attr:`Resume.finished`), or None for a new run.

    Raises:
        FileNotFoundError: the checkpoint is missing (a run directory given: its ``weights/last.pt``).
        ResumeError: an earlier state of a run in its directory (``best.pt``, ``epochN.pt``), stripped,
            foreign, without options, or a total batch this number of processes cannot share.
        CheckpointError: not a checkpoint file, or a damaged one (cut short, bytes changed): the message
            names the run's last good checkpoint and how to continue from it.
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
    ckpt = _load_whole(last, opt, info)
    check_resumable(last, ckpt)
    in_place = _where_it_continues(last, ckpt, info)
    _check_scale(last, ckpt, info)
    resumed = {**defaults, **ckpt["opt"], "resume": str(last), "weights": str(last)}
    if not in_place and isinstance(ckpt.get("hyp"), Mapping) and ckpt["hyp"]:
        resumed["hyp"] = dict(ckpt["hyp"])  # the values it trained with: its hyp yaml may not be here
    resume = Resume(last, ckpt, argparse.Namespace(**resumed), TrainState.from_checkpoint(ckpt), copy=not in_place)
    if resume.finished:
        LOGGER.info(f"{last} has finished all {resume.opt.epochs} epochs: nothing to resume")
    elif in_place:
        LOGGER.info(f"resuming {resume.save_dir} at {resume.state.where()}{_scale_change(resume, info)}")
    else:
        LOGGER.info(
            f"resuming {last} at {resume.state.where()}{_scale_change(resume, info)} in a new run directory under "
            f"{opt.project} (--project, --name; the line 'logging to' names it): this file is a copy outside the run "
            f"that saved it ({ckpt['opt'].get('save_dir')}), which it continues from the options it holds"
        )
    return resume


def _load_whole(last: Path, opt: argparse.Namespace, info: DistInfo) -> dict[str, Any]:
    """``last`` loaded on every rank once rank 0 found it whole (every record against its CRC-32: a changed
    byte in a tensor would load without error); else every rank raises the same one line (:func:`_unloadable`)."""
    shared = all(all_gather_object(last.is_file()))
    outcome: Any = None  # rank 0's copy for nodes without a shared file system, or what is wrong
    if info.is_main:
        try:
            integrity.check_integrity(last)
            outcome = None if shared else load_pretrained(last)
        except CheckpointError as exc:
            outcome = _unloadable(last, exc, opt, info)
    outcome = broadcast_object(outcome)
    if isinstance(outcome, str):
        raise CheckpointError(outcome)
    if not shared:
        return outcome
    try:
        return load_pretrained(last)
    except CheckpointError as exc:  # not even an archive (text, zeros): every rank reads it alike
        raise CheckpointError(_unloadable(last, exc, opt, info)) from None


def _unloadable(last: Path, exc: CheckpointError, opt: argparse.Namespace, info: DistInfo) -> str:
    """One line for a ``last.pt`` that does not load: what is wrong, and the run's checkpoint to continue from."""
    lead = f"--resume {last}" if opt.resume else f"elastic restart {info.restart_count} from {last}"
    damaged = isinstance(exc, integrity.DamagedCheckpointError)
    what = f"the checkpoint is damaged ({exc.detail})" if damaged else str(exc)
    others = sorted(p for p in last.parent.glob("*.pt") if p.name != last.name)
    found = integrity.last_good_checkpoint(others, _progress)
    if found is None:
        weights = integrity.last_good_checkpoint(others, _progress, resumable=False)
        start = f"start a new run from its weights with --weights {weights[0]}" if weights else "start again"
        return f"{lead}: {what}; no other checkpoint of this run can resume it: {start}"
    path, ckpt = found
    state = TrainState.from_checkpoint(ckpt)
    when = f"epoch {state.epoch} done" if state.batch == 0 else f"at {state.where()}"
    saved = f", saved {ckpt['date']}" if ckpt.get("date") else ""
    # moved aside, not written into: the files of one save may share their bytes (hard links)
    return (
        f"{lead}: {what}; the run's {path} ({when}{saved}) loads: continue from it with "
        f"`mv {last} {last}.damaged && cp {path} {last}` then `python train.py --resume {last}`"
    )


def _progress(ckpt: Mapping[str, Any]) -> tuple[int, int]:
    return dataclasses.astuple(TrainState.from_checkpoint(ckpt))[:2]  # (epoch, batch): how far it is


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
    "check_resumable",
    "check_run_file",
    "find_resume",
    "gather_losses",
    "in_its_run",
    "latest_checkpoint",
    "restore_training",
    "run_checkpoint",
]
