"""How much does an atomic, fsynced checkpoint save cost over a bare torch.save, in time and in host memory?

    python benchmarks/speed/checkpoint_save.py [--parts time memory] [--params 7.2e6] [--repeats 5] [--dir /tmp]
        [--models yolov5s.yaml yolov5x.yaml]

- ``time``: a YOLOv5s-sized checkpoint (``--params`` fp32 weights plus the same again of SGD momentum):
  a bare ``torch.save``, :func:`save_checkpoint` (temp file, fsync, rename, directory fsync) and
  :func:`load_checkpoint`.
- ``memory``: for each model, a trained state (weights, EMA, SGD momentum) saved once through
  :class:`~ddp_utils.run.Checkpointer` to last.pt, best.pt and epochN.pt, in a fresh process each:
  the peak host memory the save adds (Linux's VmHWM, reset just before), in the save itself and as a
  multiple of the file, inline and in the background. The host snapshot is one copy of the file's
  size; anything above it is a serialised copy. (How long a save holds the step: ``faults/preemption.py --parts save``.)
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from ddp_utils.run import load_checkpoint, save_checkpoint  # noqa: E402


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_part(params: float, repeats: int, directory: Path) -> None:
    n = int(params)
    ckpt = {
        "model": {"w": torch.randn(n)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.randn(n)}}, "param_groups": []},
        "epoch": 1,
    }
    bare = timed(lambda: torch.save(ckpt, directory / "bare.pt"), repeats)
    atomic = timed(lambda: save_checkpoint(ckpt, directory / "atomic.pt"), repeats)
    load = timed(lambda: load_checkpoint(directory / "atomic.pt"), repeats)
    size = (directory / "atomic.pt").stat().st_size / 1e6
    print(f"checkpoint {size:.0f} MB in {directory}")
    print(f"torch.save              {bare * 1e3:8.0f} ms")
    print(f"save_checkpoint         {atomic * 1e3:8.0f} ms  (temp file + fsync + rename + dir fsync)")
    print(f"load_checkpoint         {load * 1e3:8.0f} ms  (weights_only=True)")


def _peak_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def one_save(cfg: str, background: bool, directory: Path) -> dict:
    """In this (fresh) process: one save of a trained ``cfg`` model through Checkpointer; what it cost."""
    from ddp_utils import LOGGER
    from ddp_utils.engine import ModelEMA, smart_optimizer
    from ddp_utils.run import Checkpointer, TrainState
    from ddp_utils.yolo import Model

    LOGGER.setLevel(logging.WARNING)
    torch.manual_seed(0)
    model = Model(cfg, ch=3, nc=80)
    optimizer = smart_optimizer(model, "SGD", lr=0.01)
    sum(level.float().mean() for level in model(torch.rand(1, 3, 64, 64))).backward()
    optimizer.step()  # the optimizer holds a momentum buffer per parameter
    optimizer.zero_grad(set_to_none=True)
    ema = ModelEMA(model)
    checkpoints = Checkpointer(directory, opt={"epochs": 1}, save_period=1, background=background)
    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # VmHWM := VmRSS: the peak from here on is the save's
    before = _peak_kib()
    checkpoints.save(TrainState(epoch=1), SimpleNamespace(model=model, ema=ema, optimizer=optimizer), best=True)
    landed = checkpoints.wait()
    added = (_peak_kib() - before) * 1024
    return {"size": checkpoints.last.stat().st_size, "added": added, "landed": landed}


def memory_part(models: list[str], directory: Path) -> None:
    print("\nOne save (last.pt, best.pt, epoch0.pt) of a trained state through Checkpointer, a fresh process each")
    print("| model | checkpoint | peak memory the save adds: inline | in the background |")
    print("|---|---|---|---|")
    for cfg in models:
        row = {}
        for how in ("inline", "background"):
            out = directory / f"{Path(cfg).stem}-{how}"
            cmd = [sys.executable, __file__, "--one-save", cfg, how, str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            row[how] = json.loads(done.stdout.strip().splitlines()[-1])
        size = row["inline"]["size"]
        inline, background = (row[h]["added"] for h in ("inline", "background"))
        print(f"| {cfg} | {size / 2**20:.0f} MiB | {inline / 2**20:.0f} MiB ({inline / size:.2f}x) | "
              f"{background / 2**20:.0f} MiB ({background / size:.2f}x) |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["time", "memory"], choices=["time", "memory"])
    parser.add_argument("--params", type=float, default=7.2e6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["yolov5s.yaml", "yolov5x.yaml"])
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--one-save", nargs=3, metavar=("CFG", "HOW", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_save:
        cfg, how, out = args.one_save
        print(json.dumps(one_save(cfg, how == "background", Path(out))))
        return
    directory = Path(args.dir or tempfile.mkdtemp())
    directory.mkdir(parents=True, exist_ok=True)
    if "time" in args.parts:
        time_part(args.params, args.repeats, directory)
    if "memory" in args.parts:
        memory_part(args.models, directory)


if __name__ == "__main__":
    main()
