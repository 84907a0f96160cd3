"""One training run: the settled options (:class:`Run`), the options' checks, its directory, its parts.

A run directory (``runs/train/exp3``) is written only by the run that owns it: a new run claims a
fresh one (:func:`make_run_dir`); a resumed run writes into the directory of the ``last.pt`` it
continues, and only after every reason to refuse the resume has been checked
(:func:`~ddp_utils.engine.resume.find_resume`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import textwrap
from pathlib import Path
from typing import Any

import torch

from ..data.config import check_dataset
from ..data.loader import EpochLoader
from ..distributed import DistInfo, broadcast_object, launch_key
from ..host import mem_available
from ..hyp import load_hyp
from ..log import LOGGER
from .amp import resolve_amp
from .loggers import increment_path, yaml_save
from .loop import TrainStep
from .resume import Resume, TrainState, gather_losses
from .signals import requeue_signal


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


class OptionError(ValueError):
    """A train.py option with a value or combination it cannot train with; :attr:`option` names it.

    A :class:`ValueError`, so a caller of ``train.run(...)`` catches it by type; the command line
    prints its message as one line, ``train.py: error: ...``, and exits 2.

    Attributes:
        option: the option at fault, as typed on the command line (``"--imgsz"``).

    Examples:
        >>> exc = OptionError("--imgsz", "--imgsz -5: give the image size in pixels")
        >>> exc.option, isinstance(exc, ValueError)
        ('--imgsz', True)
    """

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def validate_options(opt: argparse.Namespace, world_size: int) -> None:
    """Refuse bad values and combinations of train.py's options, saying nothing else.

    What :func:`check_options` checks; ``train.run(...)`` calls it first, so that a bad value from
    Python is an exception the caller can catch.

    Raises:
        OptionError: one line naming the option, its value and what to do.

    Examples:
        >>> validate_options(argparse.Namespace(batch_size=3, image_weights=False, epochs=None, sync_bn=False,
        ...                  resume=False, rect=False, multi_scale=False, requeue_signal="none"), world_size=2)
        Traceback (most recent call last):
        ddp_utils.engine.run.OptionError: --batch-size 3 does not divide by WORLD_SIZE=2: use a multiple of 2
    """
    if opt.batch_size < 1 and opt.batch_size != -1:
        raise OptionError(
            "--batch-size",
            f"--batch-size {opt.batch_size}: give the total batch size, a positive integer, or -1 (AutoBatch)",
        )
    if opt.batch_size != -1 and opt.batch_size % world_size and not opt.resume:  # a resume keeps its recorded total
        raise OptionError(
            "--batch-size",
            f"--batch-size {opt.batch_size} does not divide by WORLD_SIZE={world_size}: use a multiple of {world_size}",
        )
    if opt.image_weights and world_size > 1:
        raise OptionError(
            "--image-weights", "--image-weights works in a single process only: drop it or run without torchrun"
        )
    if opt.epochs is not None and opt.epochs < 1:
        raise OptionError("--epochs", f"--epochs {opt.epochs}: train at least one epoch")
    _check_ranges(opt)
    _check_image_memory(opt, world_size)
    if opt.rect and opt.multi_scale:
        raise OptionError("--rect", "--rect and --multi-scale do not go together: rect batches have fixed shapes")
    try:
        requeue_signal(opt.requeue_signal)
    except ValueError as exc:
        raise OptionError("--requeue-signal", str(exc)) from None
    if getattr(opt, "evolve", None) is not None:
        raise OptionError(
            "--evolve",
            "--evolve: ddp_utils' train.py does not evolve hyperparameters (YOLOv5's genetic search); run YOLOv5's "
            "train.py --evolve, or a sweep tool that calls train.py with --hyp",
        )


def check_options(opt: argparse.Namespace, world_size: int) -> None:
    """Refuse bad combinations of train.py's options before any process group starts, then say in one
    line each what a given option does not do here (``--sync-bn`` alone, YOLOv5's options).

    Raises:
        OptionError: a :class:`ValueError`: one line naming the option and what to do (:func:`validate_options`).

    Examples:
        >>> check_options(argparse.Namespace(batch_size=3, image_weights=False, epochs=None, sync_bn=False,
        ...               resume=False, rect=False, multi_scale=False, requeue_signal="none"), world_size=2)
        Traceback (most recent call last):
        ddp_utils.engine.run.OptionError: --batch-size 3 does not divide by WORLD_SIZE=2: use a multiple of 2
    """
    validate_options(opt, world_size)
    if opt.sync_bn and world_size == 1:
        LOGGER.warning("--sync-bn has no effect in a single process")
    for note in yolov5_option_notes(opt):
        LOGGER.info(note)


# YOLOv5's train.py options that change nothing here: (attribute, its default, the note when it was given)
_YOLOV5_ONLY = (
    ("noautoanchor", False, "anchors are the model yaml's (or the checkpoint's): ddp_utils runs no AutoAnchor check"),
    ("bucket", "", "a gsutil bucket for --evolve, which ddp_utils does not do"),
    ("upload_dataset", False, "YOLOv5's Weights & Biases logger option"),
    ("bbox_interval", -1, "YOLOv5's Weights & Biases logger option"),
    ("artifact_alias", "latest", "YOLOv5's Weights & Biases logger option"),
    ("ndjson_console", False, "YOLOv5's NDJSON logger option; results go to results.csv (and TensorBoard)"),
    ("ndjson_file", False, "YOLOv5's NDJSON logger option; results go to results.csv (and TensorBoard)"),
)


def add_yolov5_options(parser: argparse.ArgumentParser) -> None:
    """YOLOv5's train.py options that ddp_utils' does not use, accepted (unlisted in --help) so its commands run.

    :func:`check_options` says in one line what each given one does here (nothing), or refuses it (``--evolve``).
    """
    add = parser.add_argument
    add("--noautoanchor", action="store_true", help=argparse.SUPPRESS)
    add("--evolve", type=int, nargs="?", const=300, help=argparse.SUPPRESS)
    add("--bucket", default="", help=argparse.SUPPRESS)
    add("--entity", default=None, help=argparse.SUPPRESS)
    add("--upload_dataset", "--upload-dataset", nargs="?", const=True, default=False, help=argparse.SUPPRESS)
    add("--bbox_interval", "--bbox-interval", type=int, default=-1, help=argparse.SUPPRESS)
    add("--artifact_alias", "--artifact-alias", default="latest", help=argparse.SUPPRESS)
    add("--ndjson-console", action="store_true", help=argparse.SUPPRESS)
    add("--ndjson-file", action="store_true", help=argparse.SUPPRESS)


def yolov5_option_notes(opt: argparse.Namespace) -> list[str]:
    """One line per YOLOv5 option given that does nothing here, so a YOLOv5 command runs and says so.

    Examples:
        >>> yolov5_option_notes(argparse.Namespace(noautoanchor=True, bucket=""))[0][:46]
        '--noautoanchor: accepted for YOLOv5 compatibil'
    """
    return [
        f"--{name.replace('_', '-')}: accepted for YOLOv5 compatibility, does nothing here ({why})"
        for name, default, why in _YOLOV5_ONLY
        if getattr(opt, name, default) != default
    ]


MAX_SEED = 2**63 - 1  # torch keeps a seed in 64 bits, and each rank adds its rank to it

# option: (a test its value must pass, what to use instead); options a Namespace lacks are not checked
_RANGES = {
    "imgsz": (lambda v: v is None or v >= 1, "give the image size in pixels, e.g. 640 (a multiple of the stride)"),
    "workers": (lambda v: v is None or v >= 0, "give a number of loader workers >= 0 (0: load in the process)"),
    "patience": (lambda v: v >= 0, "give epochs without improvement >= 0 (0: never stop early)"),
    "save_interval": (lambda v: math.isfinite(v) and v >= 0, "give minutes >= 0 (0: no mid-epoch saves)"),
    "label_smoothing": (lambda v: 0 <= v < 1, "give a value in [0, 1), e.g. 0.1"),
    "freeze": (lambda v: all(i >= 0 for i in v), "give layer counts or indices >= 0"),
    "seed": (lambda v: 0 <= v <= MAX_SEED, f"give a seed >= 0 and at most 2**63 - 1 ({MAX_SEED})"),
}


def _check_ranges(opt: argparse.Namespace) -> None:
    """Every numeric option within its range, or one line naming the option, the value and what to use."""
    for name, (valid, advice) in _RANGES.items():
        if hasattr(opt, name) and not valid(getattr(opt, name)):
            value = getattr(opt, name)
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            option = f"--{name.replace('_', '-')}"
            raise OptionError(option, f"{option} {shown}: {advice}")


def batch_image_bytes(imgsz: int, images: int, multi_scale: bool = False, float_copy: bool = True) -> int:
    """Host memory that one batch of ``images`` square images of ``imgsz`` pixels takes at the least:
    the uint8 images a loader hands over, plus the float32 copy the model reads when it runs on the CPU.

    A lower bound: the model's activations, the loader's prefetched batches and the caches come on top.

    Args:
        imgsz: the image side in pixels.
        images: images in one process's batch.
        multi_scale: ``--multi-scale``, which draws sizes up to 1.5 x ``imgsz``.
        float_copy: the float32 batch is in host memory too (training on the CPU).

    Examples:
        >>> batch_image_bytes(640, 16) / 2**20  # 16 images of 640 x 640 x 3, and their float copy
        93.75
        >>> round(batch_image_bytes(100_000, 16) / 2**40, 2)  # TiB: what --imgsz 100000 asks of a CPU run
        2.18
    """
    side = math.ceil(imgsz * 1.5) if multi_scale else imgsz
    return images * 3 * side * side * (1 + (4 if float_copy else 0))


def _check_image_memory(opt: argparse.Namespace, world_size: int) -> None:
    """Refuse an ``--imgsz`` whose one batch of images this host cannot hold, before anything is written."""
    imgsz = getattr(opt, "imgsz", None)
    available = mem_available()
    if not imgsz or available is None:
        return
    images = max(opt.batch_size // world_size, 1) if opt.batch_size > 0 else 1  # AutoBatch: one image at least
    multi_scale = bool(getattr(opt, "multi_scale", False))
    on_cpu = str(getattr(opt, "device", "")).strip().lower() == "cpu" or not torch.cuda.is_available()
    needed = batch_image_bytes(imgsz, images, multi_scale, float_copy=on_cpu)
    if needed > available:
        raise OptionError(
            "--imgsz",
            f"--imgsz {imgsz}: one batch of {images} images of {imgsz} x {imgsz} px"
            f"{' (up to 1.5 x with --multi-scale)' if multi_scale else ''} needs at least {_gib(needed)} of "
            f"memory in each process, and this host has {_gib(available)} available: give a smaller --imgsz "
            "or --batch-size",
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


@dataclasses.dataclass
class Training:
    """What a run's epochs work with: the step (model, optimizer, EMA, loss), the schedule, the data, the state.

    Attributes:
        step: the :class:`~ddp_utils.engine.TrainStep`.
        scheduler: the per-epoch LR schedule.
        train_loader, val_loader: the loaders.
        labels: the training labels (the label plot, ``--image-weights``).
        state: where training stands (:class:`~ddp_utils.engine.resume.TrainState`): the epoch and batch
            to continue at, the best fitness, the last validation.
    """

    step: TrainStep
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_loader: EpochLoader
    val_loader: EpochLoader
    labels: list
    state: TrainState = dataclasses.field(default_factory=TrainState)

    def state_at(self, stats: Any, world_size: int, skipped: int) -> TrainState:
        """Where training stands now: :attr:`state`, at ``stats``' batch of its epoch when given (a mid-epoch save,
        or an epoch trained but not validated). With ``stats``, a collective: every rank's running loss is gathered.

        Args:
            stats: the epoch's :class:`~ddp_utils.engine.EpochStats` so far, or None (the state at an epoch's end).
            world_size: the processes training now (a resume reports a change of scale).
            skipped: the optimizer steps skipped so far in the run (non-finite gradients).
        """
        now = dict(world_size=world_size, skipped=skipped)
        if stats is not None:
            now.update(batch=stats.batch, last_opt_step=self.step.last_opt_step, loss=gather_losses(stats.loss))
        return dataclasses.replace(self.state, **now)


def make_run_dir(project: str | Path, name: str, exist_ok: bool, info: DistInfo) -> Path:
    """Rank 0 claims ``project/name`` (or ``name2``, ``name3``, ... when taken); every rank gets the path."""
    new_dir = increment_path(Path(project) / name, exist_ok=exist_ok, mkdir=True) if info.is_main else None
    return Path(broadcast_object(str(new_dir) if new_dir is not None else None))


def record_run(run: Run, info: DistInfo) -> None:
    """Rank 0 writes the run's ``hyp.yaml`` and ``opt.yaml`` and logs the hyperparameters."""
    if info.is_main:
        yaml_save(run.save_dir / "hyp.yaml", run.hyp)
        yaml_save(run.save_dir / "opt.yaml", run.options())
        pairs = ", ".join(f"{k}={v}" for k, v in run.hyp.items())
        LOGGER.info(textwrap.fill(pairs, width=110, initial_indent="hyperparameters: ", subsequent_indent="  "))


__all__ = [
    "MAX_SEED",
    "OptionError",
    "Run",
    "Training",
    "add_yolov5_options",
    "batch_image_bytes",
    "check_options",
    "make_run_dir",
    "record_run",
    "start_run",
    "validate_options",
    "yolov5_option_notes",
]
