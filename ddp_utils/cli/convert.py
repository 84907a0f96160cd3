"""Convert a YOLOv5 checkpoint into ddp_utils's own, without running the pickle it holds.

    python -m ddp_utils.convert yolov5s.pt              # writes yolov5s-ddp.pt beside it
    python -m ddp_utils.convert yolov5s.pt weights/s.pt

The output is a plain-data checkpoint (:func:`~ddp_utils.engine.load_checkpoint` reads it with
``weights_only=True``) that ``train.py --weights`` fine-tunes from. :func:`load_pretrained` does the
same in memory, so a training script can take either kind of file for ``--weights``. This module
sits above ``detect`` (the reader) and ``engine`` (our checkpoint format), which do not import each other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..detect.foreign import ForeignCheckpointError, read_yolov5_checkpoint, yolov5_model
from ..engine.checkpoint import (
    CheckpointError,
    UnsafeCheckpointError,
    build_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from ..log import LOGGER, set_logging

FOREIGN_KEY = "foreign"  # set in load_pretrained's dict when the file was YOLOv5's, not ours


def yolov5_to_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a YOLOv5 checkpoint and return it in our checkpoint format (fp32, epoch -1: not resumable).

    Besides the :data:`~ddp_utils.engine.CHECKPOINT_KEYS`, it has ``names`` (the class names)
    and ``converted_from`` (the source file).

    Raises:
        FileNotFoundError, ForeignCheckpointError: see :func:`~ddp_utils.detect.foreign.read_yolov5_checkpoint`.
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


def _load_ours(path: str | Path) -> dict[str, Any]:
    # load_checkpoint lets a few errors of a garbage file through (weights_only's unpickler raises
    # KeyError on "hi\n"); here they are what they mean: not a checkpoint
    try:
        return load_checkpoint(path)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint {path} is not a torch checkpoint ({type(exc).__name__}: {exc})") from None


def load_pretrained(path: str | Path) -> dict[str, Any]:
    """A checkpoint dict in our format from our checkpoint or from YOLOv5's (read without running it).

    For a YOLOv5 file the dict has ``ckpt["foreign"] == "yolov5"``: fine for ``--weights``, not for
    ``--resume`` (no optimizer, another program's options).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: not a torch checkpoint.
        ForeignCheckpointError: a pickled model this reader cannot map (an Ultralytics 8 model, a
            pickle that tries to call something, an unknown layout).
    """
    try:
        return _load_ours(path)
    except UnsafeCheckpointError:
        pass  # pickled objects: YOLOv5's layout, read without unpickling
    ckpt = yolov5_to_checkpoint(path)
    ckpt[FOREIGN_KEY] = "yolov5"
    return ckpt


def foreign_resume_message(path: str | Path) -> str:
    """The one-line refusal for ``--resume`` of a checkpoint :func:`load_pretrained` marked foreign."""
    return f"{path} is a YOLOv5 checkpoint: resume is only for ddp_utils runs; fine-tune from it with --weights {path}"


def parse_opt(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddp_utils.convert", description=__doc__.splitlines()[0])
    parser.add_argument("src", help="a checkpoint YOLOv5's train.py wrote, e.g. yolov5s.pt")
    parser.add_argument("dst", nargs="?", help="output file (default: <stem>-ddp.pt beside src)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m ddp_utils.convert``; exit 2 with one line on bad input."""
    opt = parse_opt(argv)
    set_logging()
    src = Path(opt.src)
    try:
        if not src.is_file():
            raise FileNotFoundError(f"{src} does not exist")
        try:
            _load_ours(src)
            raise CheckpointError(f"{src} is already a ddp_utils checkpoint: use it as it is")
        except UnsafeCheckpointError:
            pass
        dst = convert_yolov5_checkpoint(src, opt.dst)
    except (FileNotFoundError, CheckpointError, ForeignCheckpointError, OSError) as exc:
        print(f"convert: error: {exc}", file=sys.stderr)
        return 2
    print(f"converted {src} -> {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
