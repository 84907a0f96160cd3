"""train.py's option values checked before anything runs: each in its range, a batch the host can hold, a requeue
signal a process can catch, a hyp this trainer honours, an evolution a study can hold.

- :class:`OptionError`: a ``ValueError`` naming the option; the command line says it in one line and exits 2.
- :func:`validate_options`: every check, saying nothing (:func:`ddp_utils.run.options.check_options` adds the
  notes a run logs).
- :class:`Default` and :func:`chosen`: an option left at YOLOv5's default (``--epochs`` 100, ``--imgsz`` 640),
  which the data yaml's ``train_defaults`` may replace; one given on the command line stays.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import signal
from typing import Any

import torch
import yaml

from ..engine.cudnn import BENCHMARK_LIMIT_ADVICE, MAX_BENCHMARK_LIMIT
from ..host import memory_room
from ..hyp import load_hyp
from ..yamls import find_yaml, read_yaml
from .signals import requeue_signal


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


class Default(int):
    """An option's value left at its default (YOLOv5's), which the data yaml's ``train_defaults`` may replace.

    An ``int`` in every other way: ``parse_opt(True).epochs == 100`` as in YOLOv5, for a script that reads it.

    Examples:
        >>> Default(100) == 100, chosen(Default(100), 20), chosen(100, 20), chosen(None, 20)
        (True, 20, 100, 20)
    """


yaml.SafeDumper.add_representer(Default, yaml.representer.SafeRepresenter.represent_int)  # opt.yaml: a plain 100


def chosen(value: Any, fallback: Any) -> Any:
    """``value`` when the user gave it, else ``fallback`` (the data yaml's ``train_defaults``, or the default)."""
    return fallback if value is None or isinstance(value, Default) else value


def given(value: Any) -> Any:
    """``value`` when the user gave it, else None: what a check can hold the user to."""
    return chosen(value, None)


def validate_options(opt: argparse.Namespace, world_size: int) -> None:
    """Refuse bad values and combinations of train.py's options, saying nothing else.

    What :func:`~ddp_utils.run.options.check_options` checks; ``train.run(...)`` calls it first, so that a bad value
    from Python is an exception the caller can catch.

    Raises:
        OptionError: one line naming the option, its value and what to do.

    Examples:
        >>> validate_options(argparse.Namespace(batch_size=3, image_weights=False, epochs=None, sync_bn=False,
        ...                  resume=False, rect=False, multi_scale=False, requeue_signal="none"), world_size=2)
        Traceback (most recent call last):
        ddp_utils.run.option_checks.OptionError: --batch-size 3 does not divide by WORLD_SIZE=2: use a multiple of 2
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
    if getattr(opt, "augment_on", "auto") == "device" and opt.quad:
        raise OptionError(
            "--augment-on",
            "--augment-on device and --quad do not go together: quad batches are made in the loader workers; drop one",
        )
    if opt.rect and opt.multi_scale:
        raise OptionError("--rect", "--rect and --multi-scale do not go together: rect batches have fixed shapes")
    _check_requeue_signal(opt)
    _check_evolve(opt)
    _check_image_memory(opt, world_size)
    _check_hyp(opt)


MAX_SEED = 2**63 - 1  # torch keeps a seed in 64 bits, and each rank adds its rank to it
MAX_HEARTBEAT = 86_400.0  # a day: the grace that follows is a datetime interval; inf cannot be one
MAX_EVOLVE_TRIALS = 10_000  # the study queues every trial at its start (a few ms a row): 10,000 take about 30 s

# option: (a test its value must pass, what to use instead); options a Namespace lacks are not checked
_RANGES = {
    "imgsz": (lambda v: v is None or v >= 1, "give the image size in pixels, e.g. 640 (a multiple of the stride)"),
    "workers": (lambda v: v is None or v >= 0, "give a number of loader workers >= 0 (0: load in the process)"),
    "patience": (lambda v: v >= 0, "give epochs without improvement >= 0 (0: never stop early)"),
    "save_interval": (lambda v: math.isfinite(v) and v >= 0, "give minutes >= 0 (0: no mid-epoch saves)"),
    "label_smoothing": (lambda v: 0 <= v < 1, "give a value in [0, 1), e.g. 0.1"),
    "freeze": (lambda v: all(i >= 0 for i in v), "give layer counts or indices >= 0"),
    "seed": (lambda v: 0 <= v <= MAX_SEED, f"give a seed >= 0 and at most 2**63 - 1 ({MAX_SEED})"),
    "cudnn_benchmark_limit": (lambda v: v is None or 0 <= v <= MAX_BENCHMARK_LIMIT, BENCHMARK_LIMIT_ADVICE),
    "evolve": (
        lambda v: v is None or 1 <= v <= MAX_EVOLVE_TRIALS,
        f"give the number of trials, at least 1 and at most {MAX_EVOLVE_TRIALS:,} (bare: 300); the study queues "
        "them all when it starts: for more, start another study (--name) once this one is done",
    ),
    "evolve_heartbeat": (
        lambda v: 0 < v <= MAX_HEARTBEAT,  # nan fails both comparisons
        f"give seconds > 0 and at most {MAX_HEARTBEAT:.0f} (a day), e.g. 60",
    ),
}


def _check_ranges(opt: argparse.Namespace) -> None:
    """Every numeric option within its range, or one line naming the option, the value and what to use."""
    for name, (valid, advice) in _RANGES.items():
        if hasattr(opt, name) and not valid(getattr(opt, name)):
            value = getattr(opt, name)
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            option = f"--{name.replace('_', '-')}"
            raise OptionError(option, f"{option} {shown}: {advice}")


UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)  # the kernel acts on these itself: no handler can save a run
REQUEUE_ENV = "DDP_UTILS_REQUEUE_SIGNAL"  # what requeue_signal reads when --requeue-signal is not given


def _check_requeue_signal(opt: argparse.Namespace) -> None:
    """The requeue signal (``--requeue-signal``, else ``DDP_UTILS_REQUEUE_SIGNAL``) is a signal a handler can catch."""
    try:
        requeue = requeue_signal(opt.requeue_signal)
    except ValueError as exc:
        raise OptionError("--requeue-signal", str(exc)) from None
    if requeue in UNCATCHABLE:
        env = os.environ.get(REQUEUE_ENV)
        where = f"--requeue-signal {opt.requeue_signal}" if opt.requeue_signal is not None else f"{REQUEUE_ENV}={env}"
        raise OptionError(
            "--requeue-signal",
            f"{where}: {requeue.name} cannot be caught (the kernel stops or kills the process at once, so nothing "
            "could save the run): use USR1 (sbatch --signal=USR1@90), USR2, or none",
        )


def _check_evolve(opt: argparse.Namespace) -> None:
    if getattr(opt, "evolve", None) is not None and importlib.util.find_spec("optuna") is None:
        raise OptionError("--evolve", "--evolve keeps its trials in an Optuna study: pip install 'ddp_utils[evolve]'")


def _check_hyp(opt: argparse.Namespace) -> None:
    """Refuse a hyp whose ``anchors`` (anchors per output) YOLOv5 would honour and this trainer cannot.

    YOLOv5 builds its model with that many anchors per output and computes them with AutoAnchor; ddp_utils has
    no AutoAnchor and takes the model yaml's anchors, so the key would be ignored without a word. The hyp is
    ``--hyp``, else the data yaml's ``train_defaults`` one (read here when the data yaml is on disk); a missing
    or wrong file is left to the run's own one-line error, and ``--evolve`` refuses the key in its own words.
    """
    if getattr(opt, "evolve", None) is not None or getattr(opt, "resume", False):  # a resume: the run's own hyp
        return
    source = getattr(opt, "hyp", None)
    try:
        if source is None:
            data = read_yaml(find_yaml("data", opt.data))
            source = (data.get("train_defaults") or {}).get("hyp")
        hyp = load_hyp(source) if isinstance(source, str) else source
    except (OSError, ValueError, TypeError, AttributeError):
        return
    if isinstance(hyp, dict) and hyp.get("anchors"):  # YOLOv5 ignores 0 ("0 to ignore", its hyps say)
        raise OptionError(
            "--hyp",
            f"--hyp {source if isinstance(source, str) else '(dict)'}: anchors: {hyp['anchors']}: YOLOv5 builds its "
            "model with that many anchors per output and computes them with AutoAnchor; ddp_utils has no AutoAnchor "
            "and its models take their anchors from the model yaml (--cfg): remove anchors from the hyp (or set it "
            "to 0), and put the anchors you want in a model yaml",
        )


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
    """Refuse an ``--imgsz`` whose one batch of images this process cannot hold (the host's memory, its cgroup's
    limit, its ``ulimit -v``: :func:`~ddp_utils.host.memory_room`), before anything is written."""
    imgsz = given(getattr(opt, "imgsz", None))
    room = memory_room()
    if not imgsz or room is None:
        return
    available, limit = room
    images = max(opt.batch_size // world_size, 1) if opt.batch_size > 0 else 1  # AutoBatch: one image at least
    multi_scale = bool(getattr(opt, "multi_scale", False))
    on_cpu = str(getattr(opt, "device", "")).strip().lower() == "cpu" or not torch.cuda.is_available()
    needed = batch_image_bytes(imgsz, images, multi_scale, float_copy=on_cpu)
    if needed > available:
        raise OptionError(
            "--imgsz",
            f"--imgsz {imgsz}: one batch of {images} images of {imgsz} x {imgsz} px"
            f"{' (up to 1.5 x with --multi-scale)' if multi_scale else ''} needs at least {_gib(needed, available)} "
            f"of memory in each process, and this one can take {_gib(available, needed)} more ({limit}): give a "
            "smaller --imgsz or --batch-size",
        )


def batch_size_note(batch_size: int, images: int) -> str | None:
    """A warning for a total batch larger than the training set (YOLOv5 trains it, its loader cut to the images),
    else None.

    Examples:
        >>> print(batch_size_note(100_000, 32))  # doctest: +NORMALIZE_WHITESPACE
        --batch-size 100000 is more than the 32 training images: each step trains on those 32 (one step an epoch),
        while the weight decay and accumulation are scaled for 100000 images a step (weight decay x3125 what 32
        would give): give --batch-size 32 or less
        >>> batch_size_note(16, 32) is None
        True
    """
    if batch_size <= images or images < 1:
        return None
    return (
        f"--batch-size {batch_size} is more than the {images} training images: each step trains on those {images} "
        f"(one step an epoch), while the weight decay and accumulation are scaled for {batch_size} images a step "
        f"(weight decay x{batch_size / images:.4g} what {images} would give): give --batch-size {images} or less"
    )


def _gib(n: int, other: int) -> str:
    """``n`` in GiB, to one decimal, or two where one would show it equal to ``other``."""
    digits = 1 if f"{n / 2**30:.1f}" != f"{other / 2**30:.1f}" else 2
    return f"{n / 2**30:,.{digits}f} GiB"


__all__ = [
    "MAX_EVOLVE_TRIALS",
    "MAX_HEARTBEAT",
    "MAX_SEED",
    "Default",
    "OptionError",
    "batch_image_bytes",
    "batch_size_note",
    "chosen",
    "given",
    "validate_options",
]
