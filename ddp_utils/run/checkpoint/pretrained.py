"""Reading a checkpoint to start from: ours, or YOLOv5's converted without running its pickle.

:func:`load_pretrained` gives our checkpoint format for either kind of file, so a training script
takes both for ``--weights``; :func:`convert_yolov5_checkpoint` writes a YOLOv5 file as ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...downloads import DownloadError, released_weights
from ...log import LOGGER
from ...yolo.foreign import read_yolov5_checkpoint, yolov5_model
from .disk import load_checkpoint, save_checkpoint
from .format import UnsafeCheckpointError, build_checkpoint

FOREIGN_KEY = "foreign"  # set in load_pretrained's dict when the file was YOLOv5's, not ours


def yolov5_to_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a YOLOv5 checkpoint and return it in our checkpoint format (fp32, epoch -1: not resumable).

    Besides the :data:`~ddp_utils.run.CHECKPOINT_KEYS`, it has ``names`` (the class names)
    and ``converted_from`` (the source file).

    Raises:
        FileNotFoundError, ForeignCheckpointError: see :func:`~ddp_utils.yolo.foreign.read_yolov5_checkpoint`.
    """
    read = read_yolov5_checkpoint(path)
    model, report = yolov5_model(read, str(path))
    best = read["best_fitness"]
    ckpt = build_checkpoint(
        model, epoch=-1, best_fitness=float(best) if isinstance(best, (int, float)) else 0.0, hyp=read["hyp"]
    )
    ckpt.update(names=list(model.names), converted_from=str(path))
    derived = f", {len(report['derived'])} derived ones recomputed" if report["derived"] else ""
    LOGGER.info(
        f"{path}: read {report['transferred']} tensors of a {read['class_path']} without unpickling it{derived}"
    )
    return ckpt


def convert_yolov5_checkpoint(src: str | Path, dst: str | Path | None = None) -> Path:
    """Write a YOLOv5 checkpoint as ours; ``dst`` defaults to ``<stem>-ddp.pt`` beside ``src``.

    Examples:
        >>> convert_yolov5_checkpoint("yolov5s.pt")  # doctest: +SKIP
        PosixPath('yolov5s-ddp.pt')
    """
    src = Path(src)
    dst = Path(dst) if dst is not None else src.with_name(f"{src.stem}-ddp.pt")
    ckpt = yolov5_to_checkpoint(src)
    save_checkpoint(ckpt, dst)
    return dst


def load_pretrained(path: str | Path) -> dict[str, Any]:
    """A checkpoint dict in our format from our checkpoint or from YOLOv5's (read without running it).

    For a YOLOv5 file the dict has ``ckpt["foreign"] == "yolov5"``: fine for ``--weights``, not for
    ``--resume`` (no optimizer, another program's options).

    A bare name of YOLOv5's released weights (``yolov5s.pt``, ``yolov5n6.pt``...) that is not a
    file here is downloaded first (:func:`~ddp_utils.downloads.released_weights`), as YOLOv5 does.

    Raises:
        FileNotFoundError: no such file (for a release name: nor could it be downloaded; the message
            names the URL to fetch by hand).
        CheckpointError: not a torch checkpoint.
        ForeignCheckpointError: a pickled model this reader cannot map (an Ultralytics 8 model, a
            pickle that tries to call something, an unknown layout).
    """
    if not Path(path).exists():  # YOLOv5's habit: --weights yolov5s.pt fetches its release by name
        try:
            path = released_weights(path) or path
        except DownloadError as exc:
            raise FileNotFoundError(str(exc)) from None
    try:
        return load_checkpoint(path)
    except UnsafeCheckpointError:
        pass  # pickled objects: YOLOv5's layout, read without unpickling
    ckpt = yolov5_to_checkpoint(path)
    ckpt[FOREIGN_KEY] = "yolov5"
    return ckpt


def foreign_resume_message(path: str | Path) -> str:
    """The one-line refusal for ``--resume`` of a checkpoint :func:`load_pretrained` marked foreign."""
    return f"{path} is a YOLOv5 checkpoint: resume is only for ddp_utils runs; fine-tune from it with --weights {path}"
