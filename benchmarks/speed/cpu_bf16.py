"""bf16 autocast against fp32 on this CPU, paired and interleaved: a bare training step, then train.py itself.

    python benchmarks/speed/cpu_bf16.py [--rounds 6] [--steps 3] [--train-rounds 2] [--train-epochs 2]
        [--train-images 192] [--out FILE]

What pays depends on the CPU's kind (``ddp_utils.engine.amp.cpu_kind``: ``amx_bf16``, ``avx512_bf16`` only,
or neither), so the record names the CPU, its bf16 flags and its kind, and docs/cpu.md keeps one row per kind.

- **step**: yolov5n, 320 px, batch 16, SGD (momentum 0.937, nesterov), channels_last, torch's threads = the
  cores; forward, a loss (the sum of the head's outputs: the same convolutions backward), backward, optimizer
  step. Each round times ``--steps`` steps per mode after one warm-up step, fp32 first in even rounds and bf16
  first in odd ones, so a shared host's noise falls on both alike; reported: each mode's median seconds a
  step, and the median and range of the rounds' ratios fp32 / bf16 (> 1: bf16 faster).
- **train.py**: its default mode (no ``--amp``) against ``--amp bf16`` on ``--train-images`` synthetic images, 320 px,
  batch 16, ``--workers 0 --noval --nosave --noplots``, ``--train-epochs`` epochs, alternating as above;
  reported: the last epoch's images a second from its epoch line (start-up and validation left out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env

from child_env import with_pythonpath  # noqa: E402

from ddp_utils import yolo  # noqa: E402
from ddp_utils.data import make_shapes_dataset  # noqa: E402
from ddp_utils.engine.amp import NATIVE_BF16_FLAGS, cpu_kind  # noqa: E402
from ddp_utils.host import cpu_flags  # noqa: E402

EPOCH_SPEED = re.compile(r"epoch (\d+)/\d+: .*, ([\d.]+) img/s")


def cpu_record() -> dict:
    flags = cpu_flags()
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        "unknown",
    )
    return {"cpu": model, "cores": os.cpu_count(), "bf16_flags": sorted(f for f in flags if "bf16" in f or "amx" in f),
            "kind": cpu_kind(flags), "torch": torch.__version__, "load": os.getloadavg()[0]}  # fmt: skip


def make_step(imgsz: int, batch: int):
    """A training step of yolov5n in channels_last; ``step(bf16)`` runs one and returns its seconds."""
    model = yolo.Model("yolov5n.yaml", ch=3, nc=4).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    images = torch.rand(batch, 3, imgsz, imgsz).contiguous(memory_format=torch.channels_last)

    def step(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            outputs = model(images)
            loss = sum(out.float().mean() for out in outputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return step


def paired(rounds: int, run) -> dict:
    """``run(bf16)`` -> seconds, alternating which mode goes first; medians and the rounds' ratios fp32 / bf16."""
    times: dict[bool, list[float]] = {False: [], True: []}
    ratios = []
    for index in range(rounds):
        this = {}
        for bf16 in (False, True) if index % 2 == 0 else (True, False):
            this[bf16] = run(bf16)
            times[bf16].append(this[bf16])
        ratios.append(this[False] / this[True])
    return {
        "fp32_s": round(statistics.median(times[False]), 4),
        "bf16_s": round(statistics.median(times[True]), 4),
        "speedup_median": round(statistics.median(ratios), 3),
        "speedup_range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


def bare_step(rounds: int, steps: int) -> dict:
    torch.set_num_threads(os.cpu_count() or 1)
    step = make_step(320, 16)
    for bf16 in (False, True):
        step(bf16)  # warm-up: first allocations, oneDNN's kernels for this shape

    def run(bf16: bool) -> float:
        return statistics.median(step(bf16) for _ in range(steps))

    return paired(rounds, run)


def train_run(root: Path, bf16: bool, epochs: int) -> float:
    """train.py on the shapes data; the last epoch's images a second (its epoch line)."""
    amp = ["--amp", "bf16"] if bf16 else []
    cmd = [sys.executable, str(REPO / "train.py"), "--data", str(root / "shapes.yaml"), "--cfg", "yolov5n.yaml",
           "--imgsz", "320", "--batch-size", "16", "--epochs", str(epochs), "--workers", "0", "--device", "cpu",
           "--noval", "--nosave", "--noplots", "--project", str(root / "runs"), "--name", "bf16" if bf16 else "default",
           "--exist-ok", *amp]  # fmt: skip
    env = with_pythonpath() | {"DDP_UTILS_DATASETS_DIR": str(root / "datasets")}  # the caller's PYTHONPATH kept
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    speeds = [float(m.group(2)) for m in EPOCH_SPEED.finditer(done.stdout + done.stderr)]
    if done.returncode != 0 or not speeds:
        raise SystemExit(f"train.py failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return 1.0 / speeds[-1]  # seconds an image: paired() divides fp32's by bf16's


def train_speed(rounds: int, epochs: int, images: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="cpu-bf16-"))
    make_shapes_dataset(root / "shapes", n_train=images, n_val=16, size=(320, 320), seed=0, max_objects=4)
    (root / "shapes.yaml").write_text(
        f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
        "names: {0: circle, 1: square, 2: triangle, 3: star}\n"
    )
    result = paired(rounds, lambda bf16: train_run(root, bf16, epochs))
    return {
        "default_img_s": round(1.0 / result["fp32_s"], 1),
        "bf16_img_s": round(1.0 / result["bf16_s"], 1),
        "speedup_median": result["speedup_median"],
        "speedup_range": result["speedup_range"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="paired rounds of the bare step (0: none)")
    parser.add_argument("--steps", type=int, default=3, help="steps timed per mode and round (their median)")
    parser.add_argument("--train-rounds", type=int, default=2, help="paired train.py runs (0: none)")
    parser.add_argument("--train-epochs", type=int, default=2)
    parser.add_argument("--train-images", type=int, default=192)
    parser.add_argument("--out", type=Path, default=None, help="also write the record here (JSON)")
    opt = parser.parse_args(argv)
    record = {**cpu_record(), "native_flags_known": list(NATIVE_BF16_FLAGS)}
    if opt.rounds > 0:
        record["step"] = bare_step(opt.rounds, opt.steps)
        print(json.dumps(record), flush=True)
    if opt.train_rounds > 0:
        record["train"] = train_speed(opt.train_rounds, opt.train_epochs, opt.train_images)
    record["load_after"] = os.getloadavg()[0]
    print(json.dumps(record, indent=1))
    if opt.out:
        opt.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
