"""Convert a YOLOv5 checkpoint into ddp_utils's own, without running the pickle it holds.

    python -m ddp_utils convert yolov5s.pt              # writes yolov5s-ddp.pt beside it (or: ddp-convert)
    python -m ddp_utils convert yolov5s.pt weights/s.pt

The output is a plain-data checkpoint (:func:`~ddp_utils.run.load_checkpoint` reads it with
``weights_only=True``) that ``train.py --weights`` fine-tunes from. The work is
:mod:`ddp_utils.run.checkpoint`'s; this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..log import set_logging
from ..run.checkpoint import CheckpointError, UnsafeCheckpointError, convert_yolov5_checkpoint, load_checkpoint
from ..yolo.foreign import ForeignCheckpointError


def parse_opt(argv: Sequence[str] | None = None, prog: str = "python -m ddp_utils convert") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("src", help="a checkpoint YOLOv5's train.py wrote, e.g. yolov5s.pt")
    parser.add_argument("dst", nargs="?", help="output file (default: <stem>-ddp.pt beside src)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, prog: str = "python -m ddp_utils convert") -> int:
    """``python -m ddp_utils convert`` (``ddp-convert``); exit 2 with one line on bad input."""
    opt = parse_opt(argv, prog)
    set_logging()
    src = Path(opt.src)
    try:
        if not src.is_file():
            raise FileNotFoundError(f"{src} does not exist")
        try:
            load_checkpoint(src)
            raise CheckpointError(f"{src} is already a ddp_utils checkpoint: use it as it is")
        except UnsafeCheckpointError:
            pass
        dst = convert_yolov5_checkpoint(src, opt.dst)
    except (FileNotFoundError, CheckpointError, ForeignCheckpointError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(f"converted {src} -> {dst}")
    return 0
