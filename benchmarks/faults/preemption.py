"""What a stop costs: steps redone after a SIGTERM, training lost to a SIGKILL, and how long a save holds a step.

    python benchmarks/faults/preemption.py [--parts sigterm sigkill save] [--trials 3]
        [--models yolov5s.yaml yolov5x.yaml]

- ``sigterm``: train.py (yolov5n, 64 synthetic images, 8 steps an epoch, 3 epochs, one process) gets SIGTERM at
  a random step, then ``--resume``; the steps the two parts trained together, minus the uninterrupted run's
  (8 x 3), are the steps redone (the goal: 0). Beside it, what a resume at the epoch's start (YOLOv5's) redoes:
  every step of the interrupted epoch already trained.
- ``sigkill``: the same run with ``--save-interval 0.002`` (0.12 s: a save about every second step, the
  scale of 30 minutes in a run whose steps take a second) gets SIGKILL at a random moment (no time to
  save); the training lost is what it trained after the step its last.pt holds, in steps and seconds,
  with the interval on and off (off: only the epoch ends save, as YOLOv5's does).
- ``save``: for each model, a trained state (weights, EMA, SGD momentum) saved through
  :class:`~ddp_utils.run.Checkpointer`: how long a background save holds the training step (the
  snapshot: a copy to host memory) against a save written in the step (serialise and write), and how
  long the background write takes.

Figures are measured side by side in one run; the machine and its load change the seconds, not the ratios.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import signal
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

from ddp_utils import LOGGER  # noqa: E402
from ddp_utils.data import make_shapes_dataset  # noqa: E402
from ddp_utils.engine import ModelEMA, smart_optimizer  # noqa: E402
from ddp_utils.run import Checkpointer, TrainState, load_checkpoint  # noqa: E402
from ddp_utils.yolo import Model  # noqa: E402

PROGRESS = re.compile(r"^(\d+)/\d+ .* inst \d+ size \d+ (\d+)/(\d+) \d+%")  # one line per trained step
NB, EPOCHS = 8, 3


def train_command(root: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable, str(REPO_ROOT / "train.py"), "--data", str(root / "shapes.yaml"), "--cfg", "yolov5n.yaml",
        "--hyp", "hyp.shapes.yaml", "--imgsz", "128", "--batch-size", "8", "--workers", "1", "--device", "cpu",
        "--epochs", str(EPOCHS), "--project", str(root / "runs"), "--name", name, *extra,
    ]  # fmt: skip


def run(cmd: list[str], act_at: tuple[float, int] | None = None, sig: int = signal.SIGTERM) -> tuple[int, list]:
    """Run ``cmd``; send ``sig`` once it trained ``act_at = (fraction of an epoch, epoch)``; return its steps.

    Each step comes back as ``(seconds since start, epoch, batch)``, read from its per-step progress lines.
    """
    env = dict(os.environ, DDP_UTILS_PROGRESS="plain", DDP_UTILS_PROGRESS_SECONDS="0", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    start, steps, sent = time.monotonic(), [], False
    for line in proc.stderr:  # type: ignore[union-attr]
        match = PROGRESS.match(line)
        if match:
            steps.append((time.monotonic() - start, int(match.group(1)), int(match.group(2))))
            if act_at and not sent and steps[-1][1] == act_at[1] and steps[-1][2] >= act_at[0] * NB:
                proc.send_signal(sig)
                sent = True
    return proc.wait(), steps


def sigterm_part(root: Path, trials: int, rng: random.Random) -> None:
    print("\nSIGTERM at a random step, then --resume (yolov5n, 8 steps an epoch, 3 epochs, one process)")
    print(
        "| trial | signal at | stopped at | steps trained, both parts | steps redone | a resume at the epoch's start |"
    )
    print("|---|---|---|---|---|---|")
    for trial in range(trials):
        name, at = f"term{trial}", (rng.uniform(0.1, 0.7), rng.randint(1, EPOCHS))
        _, first = run(train_command(root, name), act_at=at)
        last = root / "runs" / name / "weights" / "last.pt"
        state = TrainState.from_checkpoint(load_checkpoint(last))
        _, second = run([sys.executable, str(REPO_ROOT / "train.py"), "--resume", str(last)])
        total = len(first) + len(second)
        print(f"| {trial} | epoch {at[1]}, step {max(1, int(at[0] * NB))}/{NB} | {state.where()} | {total} | "
              f"{total - NB * EPOCHS} | {state.batch} |")  # fmt: skip


def sigkill_part(root: Path, trials: int, rng: random.Random) -> None:
    print("\nSIGKILL at a random moment (no time to save), then --resume: the training lost")
    print("| --save-interval | trial | killed after step | resumed at | steps lost | seconds lost |")
    print("|---|---|---|---|---|---|")
    for interval in ("0.002", "0"):  # minutes: a save about every second step of this run; never
        for trial in range(trials):
            name, at = f"kill{interval}_{trial}", (rng.uniform(0.3, 0.9), rng.randint(2, EPOCHS))
            _, first = run(train_command(root, name, "--save-interval", interval), act_at=at, sig=signal.SIGKILL)
            done = first
            kill_time, (killed_epoch, killed_batch) = done[-1][0], done[-1][1:]
            state = TrainState.from_checkpoint(load_checkpoint(root / "runs" / name / "weights" / "last.pt"))
            kept = [s for s in done if (s[1] - 1, s[2]) <= (state.epoch, state.batch)]  # the steps last.pt holds
            since = kill_time - (kept[-1][0] if kept else 0.0)
            print(f"| {float(interval) * 60:.1f} s | {trial} | epoch {killed_epoch}, step {killed_batch}/{NB} | "
                  f"{state.where()} | {len(done) - len(kept)} | {since:.2f} |")  # fmt: skip


def trained_state(cfg: str, device: torch.device, imgsz: int = 64):
    """A model with its EMA and SGD momentum after one step: what a checkpoint holds mid-run."""
    torch.manual_seed(0)
    model = Model(cfg, ch=3, nc=80).to(device)
    optimizer = smart_optimizer(model, "SGD", lr=0.01)
    outputs = model(torch.rand(1, 3, imgsz, imgsz, device=device))  # training mode: one output per level
    sum(level.float().mean() for level in outputs).backward()
    optimizer.step()  # now the optimizer holds a momentum buffer per parameter
    return model, ModelEMA(model), optimizer


def save_part(models: list[str], repeats: int, device: torch.device) -> None:
    LOGGER.setLevel(logging.WARNING)  # the models' and optimizers' own lines would break the table
    print(f"\nOne save of a trained state (weights, EMA, SGD momentum) on {device}, this host")
    print(
        "| model | parameters | checkpoint | the step waits, background save | the step waits, save in the step "
        "| ratio | background write |"
    )
    print("|---|---|---|---|---|---|---|")
    for cfg in models:
        model, ema, optimizer = trained_state(cfg, device)
        training = SimpleNamespace(model=model, ema=ema, optimizer=optimizer)
        with tempfile.TemporaryDirectory() as tmp:
            background = Checkpointer(Path(tmp) / "bg", opt={"epochs": 1}, background=True)
            inline = Checkpointer(Path(tmp) / "inline", opt={"epochs": 1})
            held, writes, whole = [], [], []
            for _ in range(repeats):
                background.save(TrainState(epoch=0, batch=1), training)
                held.append(background.blocked_seconds)
                background.wait()
                writes.append(background.writer.last_seconds)
                inline.save(TrainState(epoch=0, batch=1), training)
                whole.append(inline.blocked_seconds)
            size = (Path(tmp) / "inline" / "weights" / "last.pt").stat().st_size
        params = sum(p.numel() for p in model.parameters())
        a, b, w = (statistics.median(x) for x in (held, whole, writes))
        print(f"| {cfg} | {params / 1e6:.1f} M | {size / 2**20:.0f} MiB | {a * 1000:.0f} ms | {b * 1000:.0f} ms | "
              f"{a / b:.2f} | {w * 1000:.0f} ms |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = ["sigterm", "sigkill", "save"]
    parser.add_argument("--parts", nargs="+", default=parts, choices=parts)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["yolov5s.yaml", "yolov5x.yaml"])
    parser.add_argument("--repeats", type=int, default=3, help="saves per model (the median is shown)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the saved model lives (save part): cpu or cuda:0")
    opt = parser.parse_args()
    rng = random.Random(opt.seed)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    print(f"host: {os.cpu_count()} cores, torch {torch.__version__}, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if {"sigterm", "sigkill"} & set(opt.parts):
            make_shapes_dataset(root / "shapes", n_train=64, n_val=16, size=(128, 160), seed=0, max_objects=4)
            (root / "shapes.yaml").write_text(
                f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
                "names: {0: circle, 1: square, 2: triangle, 3: star}\n"
            )
        if "sigterm" in opt.parts:
            sigterm_part(root, opt.trials, rng)
        if "sigkill" in opt.parts:
            sigkill_part(root, opt.trials, rng)
    if "save" in opt.parts:
        save_part(opt.models, opt.repeats, torch.device(opt.device))


if __name__ == "__main__":
    main()
