"""YOLOv5 v7.0's own train.py, its epochs timed by its own callback hooks (not read off tqdm's display, which
refreshes once a second: +-15 % on a 3 s epoch), and its first batch from the process's start.

It imports YOLOv5's ``train`` module from ``--yolov5 DIR`` (nothing of YOLOv5 is copied here or imported by
ddp_utils), registers two actions on a ``utils.callbacks.Callbacks`` (``on_train_epoch_start``, which YOLOv5 runs
at the top of each epoch, and ``on_train_epoch_end``, which it runs after the epoch's last optimizer step and the
scheduler, before validation) and calls ``train.main(opt, callbacks)``, the options parsed by YOLOv5's own
``parse_opt`` from the arguments after ``--``. Each action waits for the device first, so an epoch's time is its
work done, not its work queued. Each finished epoch appends one JSON line ``{"epoch": e, "seconds": s}`` to
``--times`` at once, so a run cut short keeps the epochs it finished; a third (``on_train_batch_end``) writes
``{"first_batch_s": s}`` once, the seconds from this process's start to the end of YOLOv5's first batch (the
GPU check's first-step row, beside ours).

Run (from anywhere; YOLOv5 runs in its directory):
      python benchmarks/gpu/yolov5_timed.py --yolov5 ../yolov5 --times epochs.jsonl -- --data D.yaml --epochs 4 ...
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()  # this process's start, near enough (the interpreter's own start is before it)


class EpochTimer:
    """The callbacks: the start of each epoch, and its end written to ``path`` as one JSON line; the first batch's
    end once."""

    def __init__(self, path: Path) -> None:
        self.path, self.started, self.first_batch = path, None, False

    @staticmethod
    def _now() -> float:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # a deliberate wait: the epoch's queued work belongs to it
        return time.perf_counter()

    def start(self, *args, **kwargs) -> None:
        self.started = self._now()

    def batch_end(self, *args, **kwargs) -> None:
        if self.first_batch:
            return
        self.first_batch = True
        with self.path.open("a") as out:
            out.write(json.dumps({"first_batch_s": self._now() - STARTED}) + "\n")

    def end(self, *args, epoch: int | None = None, **kwargs) -> None:
        if self.started is None:
            return
        seconds = self._now() - self.started
        with self.path.open("a") as out:
            out.write(json.dumps({"epoch": epoch, "seconds": seconds}) + "\n")
        self.started = None


def read_times(path: Path) -> list[float]:
    """Each finished epoch's seconds, in epoch order, from the file the timer wrote ([] when none finished)."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row["seconds"] for row in sorted((row for row in rows if "epoch" in row), key=lambda row: row["epoch"])]


def read_first_batch(path: Path) -> float | None:
    """The seconds from the process's start to the end of its first batch, if it got there."""
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next((row["first_batch_s"] for row in rows if "first_batch_s" in row), None)


def run_yolov5(yolov5: Path, times: Path, args: list[str]) -> None:
    """YOLOv5's ``train.main`` with the timer's two actions registered; ``args`` are its train.py's options."""
    yolov5 = yolov5.resolve()
    if not (yolov5 / "train.py").is_file() or not (yolov5 / "utils" / "callbacks.py").is_file():
        raise SystemExit(f"yolov5_timed: {yolov5} is no YOLOv5 checkout (no train.py and utils/callbacks.py)")
    os.chdir(yolov5)  # YOLOv5 resolves its models/ and data/ from its own directory
    sys.path.insert(0, str(yolov5))  # its train, utils, models before anything of the same name
    sys.argv = [str(yolov5 / "train.py"), *args]
    yolov5_train = importlib.import_module("train")  # YOLOv5's, from its checkout
    callbacks = importlib.import_module("utils.callbacks").Callbacks()  # YOLOv5's

    timer = EpochTimer(times.resolve())
    callbacks.register_action("on_train_epoch_start", name="gpu_check_epoch_start", callback=timer.start)
    callbacks.register_action("on_train_epoch_end", name="gpu_check_epoch_end", callback=timer.end)
    callbacks.register_action("on_train_batch_end", name="gpu_check_first_batch", callback=timer.batch_end)
    yolov5_train.main(yolov5_train.parse_opt(), callbacks)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ours, theirs = _split(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--yolov5", type=Path, required=True, help="a YOLOv5 v7.0 checkout")
    parser.add_argument("--times", type=Path, required=True, help="where each finished epoch's seconds go (JSON lines)")
    opt = parser.parse_args(ours)
    opt.times.unlink(missing_ok=True)
    run_yolov5(opt.yolov5, opt.times.resolve(), theirs)


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our options, YOLOv5's options): the arguments before and after the first ``--``."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


if __name__ == "__main__":
    main()
