"""How far apart are the trained weights of runs that should train the same model?

Trains yolov5n on a small synthetic set with one seed and one global batch, the same way
several times, and prints the worst relative difference of the trained weights (last.pt's
``train_model``) and of their EMA (its ``model``) of each run against the first:

    python benchmarks/reproducibility/reproducibility.py [--n-train 64] [--imgsz 128] [--epochs 2] [--batch-size 16]
        [--seed 3] [--cases rerun workers2 ddp ddp-sync-bn] [--extra --multi-scale] [--dir DIR]

- ``rerun``: the same command again (one process, ``--workers 0``);
- ``workers2``: ``--workers 2``;
- ``threads2``: the reference's command with ``OMP_NUM_THREADS=2`` instead of 1 (another float summation order);
- ``ddp``: ``torchrun --nproc_per_node 2``, each process half the global batch, gloo;
- ``ddp-sync-bn``: the same with ``--sync-bn``;
- ``resume``: one process stopped by SIGTERM in the middle of the first epoch, then ``--resume`` (one process);
- ``resume-2to1-sync-bn``, ``resume-1to2-sync-bn``: 2 processes (``--sync-bn``) stopped so, resumed by one, and
  the other way round: a resume at another scale should land as close as the other scale from scratch does.

Two figures per run: the relative norm of the difference, ``||a - b|| / ||a||`` over all the
floating-point tensors together, and the worst tensor's ``max|a - b| / max|a|`` (BatchNorm
running statistics included; a BatchNorm bias that is still near zero makes this one large).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddp_utils.run import load_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
from child_env import with_pythonpath  # noqa: E402  (children keep the caller's PYTHONPATH)

CASES = {
    "rerun": (1, ["--workers", "0"]),
    "workers2": (1, ["--workers", "2"]),
    "threads2": (1, ["--workers", "0"]),
    "ddp": (2, ["--workers", "0"]),
    "ddp-sync-bn": (2, ["--workers", "0", "--sync-bn"]),
    # (processes before the stop, processes after it), stopped half-way through the first epoch
    "resume": ((1, 1), ["--workers", "0"]),
    "resume-2to1-sync-bn": ((2, 1), ["--workers", "0", "--sync-bn"]),
    "resume-1to2-sync-bn": ((1, 2), ["--workers", "0", "--sync-bn"]),
}
THREADS = {"threads2": 2}  # OMP_NUM_THREADS of a case; the others run on one thread per process
PROGRESS = re.compile(r"^1/\d+ .* (\d+)/(\d+) \d+%")  # a plain progress line of the first epoch


def worst_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest ``max|a - b| / max|a|`` over the floating-point tensors of two state dicts, and its key."""
    if set(a) != set(b):
        raise ValueError(f"different keys: {sorted(set(a) ^ set(b))[:5]}")
    worst, where = 0.0, ""
    for key, x in a.items():
        if not x.is_floating_point():
            continue
        scale = float(x.double().abs().max())
        diff = float((x.double() - b[key].double()).abs().max()) / (scale if scale > 0 else 1.0)
        if diff > worst:
            worst, where = diff, key
    return worst, where


def relative_norm_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """``||a - b|| / ||a||`` over all the floating-point tensors of two state dicts together."""
    keys = [k for k, v in a.items() if v.is_floating_point()]
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in keys)
    den = sum(float(a[k].double().pow(2).sum()) for k in keys)
    return (num / den) ** 0.5 if den > 0 else 0.0


def data_yaml(directory: Path, n_train: int, seed: int = 0) -> Path:
    """A shapes data yaml whose generator makes ``n_train`` + 16 images on first use."""
    path = directory / "repro.yaml"
    path.write_text(
        f"path: {directory / 'repro'}\ntrain: images/train\nval: images/val\n"
        "names: {0: circle, 1: square, 2: triangle, 3: star}\n"
        f"n_train: {n_train}\nn_val: 16\nsize: [128, 160]\nseed: {seed}\nmax_objects: 4\n"
        "download: ddp_utils.data.synthetic:generate\n"
    )
    return path


def train_command(nproc: int, data: Path, project: Path, name: str, args: argparse.Namespace, extra: list[str]):
    common = [
        "train.py", "--data", str(data), "--cfg", "yolov5n.yaml", "--hyp", "hyp.shapes.yaml", "--imgsz",
        str(args.imgsz), "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--seed", str(args.seed),
        "--device", "cpu", "--noval", "--noplots", "--project", str(project), "--name", name, "--exist-ok",
        *extra, *args.extra,
    ]  # fmt: skip
    if nproc == 1:
        return [sys.executable, *common]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
            str(29500 + os.getpid() % 1000), *common]  # fmt: skip


def train(nproc, data: Path, project: Path, name: str, args: argparse.Namespace, extra: list[str]) -> dict:
    """Train a case to the end; ``nproc`` a pair (before, after): stopped half-way through epoch 1, then resumed."""
    env = with_pythonpath({**os.environ, "OMP_NUM_THREADS": str(THREADS.get(name, 1))})
    start = time.perf_counter()
    last = project / name / "weights" / "last.pt"
    if isinstance(nproc, tuple):
        stop_half_way(train_command(nproc[0], data, project, name, args, extra), env)
        resume = train_command(nproc[1], data, project, name, args, [])
        cmd = [*resume[: resume.index("train.py") + 1], "--resume", str(last)]
    else:
        cmd = train_command(nproc, data, project, name, args, extra)
    result = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return load_checkpoint(last)


def stop_half_way(cmd: list[str], env: dict[str, str]) -> None:
    """Run ``cmd`` until SIGTERM, sent once the first epoch is half trained, stops it."""
    env = {**env, "DDP_UTILS_PROGRESS": "plain", "DDP_UTILS_PROGRESS_SECONDS": "0"}
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sent, lines = False, []
    for line in proc.stderr:  # type: ignore[union-attr]
        lines.append(line)
        match = PROGRESS.match(line)
        if match and not sent and 2 * int(match.group(1)) >= int(match.group(2)):
            proc.send_signal(signal.SIGTERM)
            sent = True
    if proc.wait() not in (0, 1) or not any("stopped at epoch 1, batch" in line for line in lines):
        raise SystemExit(f"{' '.join(cmd)} did not stop in the middle of its first epoch:\n{''.join(lines[-40:])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="the global batch")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py arguments, for all")
    parser.add_argument("--dir", default=None, help="where the data and runs go (default: a temp dir)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="repro_"))
    root.mkdir(parents=True, exist_ok=True)
    data = data_yaml(root, args.n_train)
    reference = train(1, data, root / "runs", "reference", args, ["--workers", "0"])
    print(f"{args.n_train} images, imgsz {args.imgsz}, global batch {args.batch_size}, {args.epochs} epochs, "
          f"seed {args.seed}, extra {args.extra}")  # fmt: skip
    print("| against one process, --workers 0 | trained weights: relative norm of the difference "
          "| worst tensor: max abs diff / max abs | their EMA: worst tensor |")  # fmt: skip
    print("|---|---|---|---|")
    for case in args.cases:
        nproc, extra = CASES[case]
        other = train(nproc, data, root / "runs", case, args, extra)
        model, model_key = worst_relative_difference(reference["train_model"], other["train_model"])
        ema, ema_key = worst_relative_difference(reference["model"], other["model"])
        norm = relative_norm_difference(reference["train_model"], other["train_model"])
        print(f"| {case} | {norm:.2e} | {model:.2e} ({model_key}) | {ema:.2e} ({ema_key}) |", flush=True)


if __name__ == "__main__":
    main()
