"""How much does an atomic, fsynced checkpoint save cost over a bare torch.save?

A YOLOv5s-sized checkpoint: 7.2 M fp32 weights plus the same again of SGD momentum.

    python benchmarks/checkpoint_save.py [--params 7.2e6] [--repeats 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ddp_utils.engine import load_checkpoint, save_checkpoint


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=7.2e6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    n = int(args.params)
    ckpt = {
        "model": {"w": torch.randn(n)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.randn(n)}}, "param_groups": []},
        "epoch": 1,
    }
    directory = Path(args.dir or tempfile.mkdtemp())
    directory.mkdir(parents=True, exist_ok=True)
    bare = timed(lambda: torch.save(ckpt, directory / "bare.pt"), args.repeats)
    atomic = timed(lambda: save_checkpoint(ckpt, directory / "atomic.pt"), args.repeats)
    load = timed(lambda: load_checkpoint(directory / "atomic.pt"), args.repeats)
    size = (directory / "atomic.pt").stat().st_size / 1e6
    print(f"checkpoint {size:.0f} MB in {directory}")
    print(f"torch.save              {bare * 1e3:8.0f} ms")
    print(f"save_checkpoint         {atomic * 1e3:8.0f} ms  (temp file + fsync + rename + dir fsync)")
    print(f"load_checkpoint         {load * 1e3:8.0f} ms  (weights_only=True)")


if __name__ == "__main__":
    main()
