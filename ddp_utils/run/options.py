"""train.py's command line: its options (YOLOv5's, and ours), their checks, and user mistakes as one line.

- :func:`add_train_options`: every option of train.py (``python train.py --help``), YOLOv5's names and defaults
  first; :func:`add_evolve_options`: ``--evolve`` and its settings; :func:`add_yolov5_options`: YOLOv5's
  options that do nothing here, accepted so its commands run.
- :func:`~ddp_utils.run.option_checks.validate_options` (raises :class:`OptionError`, a ``ValueError`` naming the
  option; the values' checks live in ``option_checks.py``) and :func:`check_options` (the same, and the notes a
  run logs): before any process group or file. An option left at its default is a
  :class:`~ddp_utils.run.option_checks.Default` (``--epochs`` 100, ``--imgsz`` 640, as YOLOv5's), which the
  data yaml's ``train_defaults`` may replace.
- :func:`user_errors`: a wrong path, file or value met while starting a run becomes one line and exit code 2
  on the command line, not a traceback; from Python (:func:`raising_user_errors`, what ``train.run`` runs in) it
  stays the exception it is, so a caller catches it and the interpreter goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import signal
from collections.abc import Iterator
from typing import Any, NoReturn

from ..data.download import DownloadError
from ..distributed import USAGE_EXIT_CODE, DistEnvError, RankFailedError, exit_usage_error, stall_timeout_from_env
from ..engine.cudnn import CUDNN_MODES
from ..log import LOGGER
from ..progress import PROGRESS_MODES
from ..yolo.foreign import ForeignCheckpointError
from .checkpoint import CheckpointError
from .option_checks import Default, OptionError, batch_image_bytes, batch_size_note, validate_options
from .saves import SAVE_FAILED_EXIT_CODE
from .signals import requeue_signal
from .trackers import TRACKERS


def add_train_options(parser: argparse.ArgumentParser) -> None:
    """Add train.py's options to ``parser`` (YOLOv5's names and defaults, then what modern trainers offer)."""
    add = parser.add_argument
    add("--weights", default="", help="checkpoint to start from, ours or YOLOv5's ('' trains from scratch)")
    add("--cfg", default="yolov5n.yaml", help="model yaml (configs/models/ or a path)")
    add("--data", default="shapes.yaml", help="dataset yaml (data/ or a path)")
    add("--hyp", default=None, help="hyperparameter yaml; default: the data yaml's, else hyp.scratch-low.yaml")
    add("--epochs", type=int, default=Default(100), help="default: the data yaml's train_defaults, else 100")
    add("--batch-size", type=int, default=16, help="total batch size over all processes; -1: AutoBatch (GPU)")
    add("--imgsz", "--img", "--img-size", type=int, default=Default(640),
        help="train/val size (px); default: the data yaml's train_defaults, else 640")  # fmt: skip
    add("--rect", action="store_true", help="rectangular training batches")
    add(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        help="resume the latest run, or the given run directory (or its weights/last.pt)",
    )
    add("--nosave", action="store_true", help="only save the final checkpoint")
    add("--noval", action="store_true", help="only validate after the final epoch")
    add("--noplots", action="store_true", help="save no plots (labels, batches, results)")
    add("--verbose", action="store_true", help="the per-class table after every validation, not only the last")
    add("--cache", nargs="?", const="ram", default=None, choices=["ram", "disk"], help="cache images")
    add("--image-weights", action="store_true", help="sample images by class weights (single process)")
    add("--device", default="", help="cuda device, i.e. 0 or 0,1,2,3 or cpu")
    add("--amp", default=None, choices=["fp16", "bf16", "off"], help="mixed precision; default fp16 on CUDA, else off")
    add("--compile", action="store_true", help="torch.compile the model (slow to start; off by default)")
    add("--multi-scale", action="store_true", help="vary image size +/- 50%%")
    add("--single-cls", action="store_true", help="train multi-class data as single-class")
    add("--optimizer", default="SGD", choices=["SGD", "Adam", "AdamW"])
    add("--sync-bn", action="store_true", help="SyncBatchNorm across processes (DDP only)")
    add("--workers", type=int, default=None, help="max data-loader workers per process (default: the cores' share)")
    add(
        "--augment-on",
        default="auto",
        choices=["auto", "workers", "device"],
        help="where training images are decoded and augmented: the loader workers (OpenCV), or the training "
        "device (nvJPEG and torch ops; the workers only draw and read bytes); auto: the device on CUDA",
    )
    add("--project", default="runs/train", help="save to project/name")
    add("--name", default="exp", help="save to project/name")
    add("--exist-ok", action="store_true", help="reuse project/name instead of incrementing")
    add("--quad", action="store_true", help="quad data loader")
    add("--cos-lr", action="store_true", help="cosine LR schedule")
    add("--label-smoothing", type=float, default=0.0)
    add("--patience", type=int, default=100, help="epochs without improvement before stopping (0: never)")
    add("--freeze", nargs="+", type=int, default=[0], help="freeze the first N layers, or the listed layers")
    add("--save-period", type=int, default=-1, help="also save epochN.pt every N epochs (-1: never)")
    add("--save-interval", type=float, default=30.0, help="minutes between mid-epoch saves of last.pt (0: never)")
    add("--seed", type=int, default=0)
    add("--deterministic", action="store_true", help="deterministic algorithms (slower)")
    _add_host_options(parser)
    add_evolve_options(parser)
    add_yolov5_options(parser)  # the rest of YOLOv5's: they do nothing here, or are refused (check_options)
    # torch.distributed.launch passes --local_rank; the rank always comes from the environment
    add("--local_rank", "--local-rank", type=int, default=-1, help=argparse.SUPPRESS)


def _add_host_options(parser: argparse.ArgumentParser) -> None:
    """Add ddp_utils' own options for the machinery around the step: cuDNN, SLURM, trackers, progress, debugging."""
    add = parser.add_argument
    add(
        "--cudnn-benchmark",
        default="off",
        choices=CUDNN_MODES,
        help="cuDNN: heuristics (off, YOLOv5's), autotune each new shape (on), or tune ahead, beside the workers "
        "(warm); ddp_utils/engine/cudnn.py",
    )
    add("--cudnn-benchmark-limit", type=int, default=None, help="algorithms cuDNN times per convolution (0: all)")
    add("--requeue-signal", help='save, requeue the SLURM job, exit on it (USR1 under SLURM, "none": off)')
    add("--trackers", nargs="+", default=[], choices=TRACKERS, help="also log to MLflow and/or Weights & Biases")
    add("--progress", choices=PROGRESS_MODES, help="a bar, plain lines every 10 s, or off (default: bar on a terminal)")
    add("--dist-debug", action="store_true", help="check collectives across ranks, NCCL flight recorder on timeout")


def check_options(opt: argparse.Namespace, world_size: int) -> None:
    """Refuse bad combinations of train.py's options before any process group starts, then say in one
    line each what a given option does not do here (``--sync-bn`` alone, YOLOv5's options).

    Raises:
        OptionError: a :class:`ValueError`: one line naming the option and what to do (:func:`validate_options`).
        DistEnvError: the stall watchdog's variables hold no number of seconds.

    Examples:
        >>> check_options(argparse.Namespace(batch_size=3, image_weights=False, epochs=None, sync_bn=False,
        ...               resume=False, rect=False, multi_scale=False, requeue_signal="none"), world_size=2)
        Traceback (most recent call last):
        ddp_utils.run.option_checks.OptionError: --batch-size 3 does not divide by WORLD_SIZE=2: use a multiple of 2
    """
    validate_options(opt, world_size)
    stall_timeout_from_env()  # DDP_UTILS_STALL_TIMEOUT that is no number: one line naming it, before anything runs
    if opt.sync_bn and world_size == 1:
        LOGGER.warning("--sync-bn has no effect in a single process")
    for note in yolov5_option_notes(opt):
        LOGGER.info(note)


# YOLOv5's train.py options that change nothing here: (attribute, its default, the note when it was given)
_YOLOV5_ONLY = (
    ("noautoanchor", False, "anchors are the model yaml's (or the checkpoint's): ddp_utils runs no AutoAnchor check"),
    ("bucket", "", "a gsutil bucket for --evolve's evolve.csv: the study store shares it (--evolve-storage)"),
    ("upload_dataset", False, "YOLOv5's Weights & Biases logger option"),
    ("bbox_interval", -1, "YOLOv5's Weights & Biases logger option"),
    ("artifact_alias", "latest", "YOLOv5's Weights & Biases logger option"),
    ("ndjson_console", False, "YOLOv5's NDJSON logger option; results go to results.csv (and TensorBoard)"),
    ("ndjson_file", False, "YOLOv5's NDJSON logger option; results go to results.csv (and TensorBoard)"),
)


EVOLVE_PRUNERS = ("median", "halving", "off")
EVOLVE_SAMPLERS = ("yolov5", "tpe")


def add_evolve_options(parser: argparse.ArgumentParser) -> None:
    """``--evolve [N]`` (YOLOv5's: N trials, 300 when bare) and ours that shape it (:mod:`ddp_utils.evolve`)."""
    add = parser.add_argument
    add("--evolve", type=int, nargs="?", const=300, metavar="N", help="evolve hyperparameters: N trials (bare: 300)")
    add("--evolve-storage", metavar="URL", help="the study store (default: sqlite in the evolve directory; "
        "postgresql://USER@HOST:PORT/DB shares one study between workers on many nodes)")  # fmt: skip
    add("--evolve-prune", default="median", choices=EVOLVE_PRUNERS, help="stop hopeless trials early (off: as YOLOv5)")
    add("--evolve-sampler", default="yolov5", choices=EVOLVE_SAMPLERS, help="YOLOv5's mutation, or Optuna's TPE")
    add("--evolve-hyps", nargs="+", metavar="NAME[=LOW:HIGH]", help="hyperparameters to evolve (default: YOLOv5's)")
    add("--evolve-heartbeat", type=float, default=60.0, metavar="SECONDS", help="between a trial's heartbeats; a "
        "worker silent for one more, the stall timeout and a restart (300 s) is lost, its trial retried")  # fmt: skip


def add_yolov5_options(parser: argparse.ArgumentParser) -> None:
    """YOLOv5's train.py options that ddp_utils' does not use, accepted (unlisted in --help) so its commands run.

    :func:`check_options` says in one line what each given one does here (nothing).
    """
    add = parser.add_argument
    add("--noautoanchor", action="store_true", help=argparse.SUPPRESS)
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


def options_with(opt: argparse.Namespace, values: dict[str, Any], world_size: int) -> argparse.Namespace:
    """``opt`` with ``values`` set over it (``train.run(**values)``), checked as the command line's would be.

    Raises:
        TypeError: a name that is not an option (YOLOv5's ``run`` would set it and ignore it).
        OptionError: a value the command line refuses, naming the option.

    Examples:
        >>> options_with(argparse.Namespace(epochs=3), {"epoch": 5}, 1)
        Traceback (most recent call last):
        TypeError: train.run: no option named epoch (python train.py --help lists them)
    """
    unknown = sorted(set(values) - set(vars(opt)))
    if unknown:
        raise TypeError(f"train.run: no option named {', '.join(unknown)} (python train.py --help lists them)")
    opt = argparse.Namespace(**{**vars(opt), **values})
    validate_options(opt, world_size)
    return opt


def control_settings(opt: argparse.Namespace, is_main: bool) -> dict[str, Any]:
    """The run's :class:`~ddp_utils.run.control.StepControl` settings from its options: SIGTERM and Ctrl-C stop
    and save, ``--requeue-signal`` also requeues, ``--save-interval`` minutes between saves on rank 0's clock
    (none with ``--nosave``)."""
    requeue = requeue_signal(opt.requeue_signal)
    return dict(
        signals=(signal.SIGTERM, signal.SIGINT),
        requeue_signals=(requeue,) if requeue else (),
        save_interval=0.0 if opt.nosave else opt.save_interval * 60,
        keeps_clock=is_main,
    )


DIVERGED_EXIT_CODE = 3  # a run stopped because its steps stayed non-finite (its last.pt: the last finite state)
# the data and model yaml errors are ValueErrors; these are what a wrong path, file or value raises
USER_ERRORS = (
    FileNotFoundError,
    ValueError,
    CheckpointError,
    ForeignCheckpointError,
    DistEnvError,
    DownloadError,  # offline, a dataset that is not here yet: one line naming the URL
)


# False inside raising_user_errors (train.run): a mistake is raised to the caller, never the interpreter's exit
_EXIT_ON_USER_ERROR: contextvars.ContextVar[bool] = contextvars.ContextVar("ddp_utils_exit_on_user_error", default=True)
_USER_ERROR_MARK = "ddp_utils_user_error"  # set on an exception user_errors let through


# The one line each code's end prints begins with its own words: argparse's "error" is a mistake in the inputs
# (2) only, never a run that trained and then diverged (3) or could not save (74)
EXIT_PREFIXES = {
    USAGE_EXIT_CODE: "train.py: error: ",
    DIVERGED_EXIT_CODE: "train.py: diverged: ",
    SAVE_FAILED_EXIT_CODE: "train.py: save failed: ",
}


def usage_error(message: str, code: int = USAGE_EXIT_CODE) -> NoReturn:
    """A user's mistake, or a run that cannot go on: one line (once per node) beginning with the code's
    :data:`EXIT_PREFIXES` (``train.py: error:`` for a mistake, exit 2), no traceback; torchrun's report names it."""
    exit_usage_error(EXIT_PREFIXES.get(code, EXIT_PREFIXES[USAGE_EXIT_CODE]) + message, code=code)


def exit_or_raise(exc: Exception, code: int = USAGE_EXIT_CODE) -> NoReturn:
    """``exc``, a mistake or a run that cannot go on: on the command line one line and exit ``code``, the line's
    prefix the code's (``train.py: error:`` 2, ``train.py: diverged:`` 3, ``train.py: save failed:`` 74); inside
    :func:`raising_user_errors` (``train.run``) ``exc`` itself is raised, marked for :func:`is_user_error`.

    Examples:
        >>> with raising_user_errors():
        ...     try:
        ...         exit_or_raise(FileNotFoundError("data /nonexistent.yaml: no such file"))
        ...     except FileNotFoundError as exc:
        ...         print(exc, is_user_error(exc))
        data /nonexistent.yaml: no such file True
    """
    if _EXIT_ON_USER_ERROR.get():
        usage_error(str(exc), code=code)
    setattr(exc, _USER_ERROR_MARK, True)
    raise exc


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a mistake in the inputs that :func:`user_errors` raised (under ``train.run``): every
    later run with the same inputs would meet it too."""
    return bool(getattr(exc, _USER_ERROR_MARK, False))


@contextlib.contextmanager
def raising_user_errors() -> Iterator[None]:
    """Inside, a mistake in the inputs is raised as the exception it is (an :class:`OptionError`, a
    ``FileNotFoundError`` naming the file...) instead of ending the interpreter: ``train.run``'s way."""
    token = _EXIT_ON_USER_ERROR.set(False)
    try:
        yield
    finally:
        _EXIT_ON_USER_ERROR.reset(token)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """A wrong path, file or value in the inputs: one line and exit code 2, before any run directory; inside
    :func:`raising_user_errors`, the exception itself (:func:`exit_or_raise`).

    A follower whose node's first process met the mistake (and said it) ends alike, without a traceback.
    """
    try:
        yield
    except USER_ERRORS as exc:
        LOGGER.debug("the user error's traceback", exc_info=True)
        exit_or_raise(exc)
    except RankFailedError as exc:
        if not exc.leader_raised(*USER_ERRORS):
            raise
        if _EXIT_ON_USER_ERROR.get():
            usage_error(exc.leader_message)
        setattr(exc, _USER_ERROR_MARK, True)
        raise


__all__ = [
    "DIVERGED_EXIT_CODE",
    "EXIT_PREFIXES",
    "USER_ERRORS",
    "OptionError",
    "add_evolve_options",
    "add_train_options",
    "add_yolov5_options",
    "batch_image_bytes",
    "batch_size_note",
    "check_options",
    "control_settings",
    "exit_or_raise",
    "is_user_error",
    "options_with",
    "raising_user_errors",
    "usage_error",
    "user_errors",
    "validate_options",
    "yolov5_option_notes",
]
