"""Where runs at two scales part, step by step: each step's own difference, and the accumulated one.

    python benchmarks/reproducibility/scale_steps.py [--n-train 64] [--imgsz 128] [--seed 3]
        [--dtypes float32 float64] [--dir DIR]

Trains train.py's first epoch (its loader, optimizer and warm-up, EMA, group-normalised loss, and
GroupBatchNorm under DDP) on the synthetic set of ``benchmarks/reproducibility/reproducibility.py``, with the model and
images in each dtype asked for, three ways:

- the reference: one process on one thread (``OMP_NUM_THREADS=1``), its state saved after every step;
- ``threads2``: one process on 2 threads;
- ``ddp-sync-bn``: 2 processes x half the global batch, ``--sync-bn`` (gloo).

Each of the other two runs twice: freely (the difference accumulated step after step, what
``reproducibility.py`` reports at the epoch's end: ``||a - b|| / ||a||`` of the weights and buffers),
and restarted before every step from the reference's state after the step before (weights, buffers,
optimizer, EMA), so that a step's result shows that step's own difference, printed relative to the
reference step's update ``||a_k - b_k|| / ||a_k - a_(k-1)||``. The same images and math at two scales give
a step's own difference of float rounding (float64: some 1e-14); a difference in the data or the math
between them would show as one far larger, in float64 above all.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # this checkout's ddp_utils
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/reproducibility/: reproducibility
from child_env import with_pythonpath  # noqa: E402  (children keep the caller's PYTHONPATH)
from reproducibility import data_yaml, relative_norm_difference  # noqa: E402

CASES = {"threads2": (1, 2), "ddp-sync-bn": (2, 1)}  # (processes, threads per process)


def worker(args: argparse.Namespace) -> None:
    """One run of the epoch (this process's part of it); rank 0 saves the state after every step."""
    import ddp_utils as du
    from ddp_utils import engine
    from ddp_utils.data import check_dataset, class_frequency, create_dataloader, load_hyp
    from ddp_utils.engine.optim_setup import optimizer_from_hyp
    from ddp_utils.yolo import ComputeLoss, Model, scale_loss_gains
    from ddp_utils.yolo.finetune import grid_size

    torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = du.init_distributed(backend="gloo") if world > 1 else du.dist_info()
    data, hyp, dtype = check_dataset(args.data), load_hyp("hyp.shapes.yaml"), getattr(torch, args.dtype)
    nc = int(data["nc"])
    du.init_seeds(du.rank_seed(args.seed, info.rank))  # as train.py: DDP broadcasts rank 0's weights
    model = Model("yolov5n.yaml", ch=3, nc=nc)
    gs = grid_size(model)
    options = dict(hyp=hyp, augment=True, rank=info.local_rank, workers=0, shuffle=True, seed=args.seed)
    loader, dataset = create_dataloader(data["train"], args.imgsz, args.batch_size // world, gs, **options)
    model.initialize_biases(class_frequency(dataset.labels, nc))
    model.to(dtype)
    sizes = dict(batch_size=args.batch_size, epochs=1, batches_per_epoch=len(loader))
    optim = optimizer_from_hyp(model, hyp, **sizes)
    ema = engine.ModelEMA(model)
    loss_fn = ComputeLoss(model, scale_loss_gains(hyp, model.model[-1].nl, nc, args.imgsz), across_ranks=True)
    net = engine.wrap_model(model, torch.device("cpu"), distributed=world > 1, sync_bn=True)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    parts = (net, optim.optimizer, scaler, ema, loss_fn, optim.accumulate, optim.warmup)
    step = engine.TrainStep(*parts, world_size=world)
    out = Path(args.out)
    if info.rank <= 0:
        torch.save(model.state_dict(), out / "start.pt")
    loader.set_epoch(0)
    net.train()
    step.optimizer.zero_grad()
    for i, (imgs, targets, _, _) in enumerate(loader):
        if args.restart and i > 0:  # the reference's state after step i - 1, on every rank
            ref = torch.load(Path(args.restart) / f"step{i - 1}.pt", weights_only=True)
            model.load_state_dict(ref["model"])
            step.optimizer.load_state_dict(ref["optimizer"])
            ema.ema.load_state_dict(ref["ema"])
            ema.updates, step.last_opt_step = ref["ema_updates"], ref["last_opt_step"]
        step(imgs.to(dtype) / 255, targets, i, 0)
        if info.rank <= 0:
            state = {"model": model.state_dict(), "optimizer": step.optimizer.state_dict(), "ema": ema.ema.state_dict(),
                     "ema_updates": ema.updates, "last_opt_step": step.last_opt_step}  # fmt: skip
            torch.save(state, out / f"step{i}.pt")
    if world > 1:
        du.cleanup()


def run(nproc: int, threads: int, out: Path, args: argparse.Namespace, data: Path, restart: Path | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    own = [
        __file__, "--worker", "--out", str(out), "--threads", str(threads), "--data", str(data), "--imgsz",
        str(args.imgsz), "--batch-size", str(args.batch_size), "--seed", str(args.seed), "--dtype", args.dtype,
    ]  # fmt: skip
    if restart is not None:
        own += ["--restart", str(restart)]
    launcher = [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_port", str(29500 + os.getpid() % 1000)]  # fmt: skip
    env = with_pythonpath({**os.environ, "OMP_NUM_THREADS": str(threads)})
    result = subprocess.run([*launcher, *own], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{out.name} failed:\n{result.stderr[-3000:]}")


def steps(directory: Path) -> list[dict]:
    return [
        torch.load(directory / f"step{i}.pt", weights_only=True)["model"]
        for i in range(len(list(directory.glob("step*.pt"))))
    ]


def update_relative(a: dict, b: dict, before: dict) -> float:
    """``||a - b|| / ||a - before||``: two states' difference relative to the step that led to ``a``."""
    keys = [k for k, v in a.items() if v.is_floating_point()]
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in keys)
    den = sum(float((a[k].double() - before[k].double()).pow(2).sum()) for k in keys)
    return (num / den) ** 0.5 if den > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16, help="the global batch")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    parser.add_argument("--dir", default=None, help="where the data and runs go (default: a temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--out", "--data", "--restart", "--dtype"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    root = Path(args.dir or tempfile.mkdtemp(prefix="scale_steps_"))
    root.mkdir(parents=True, exist_ok=True)
    data = data_yaml(root, args.n_train)
    print(
        f"{args.n_train} images, imgsz {args.imgsz}, global batch {args.batch_size}, seed {args.seed}; against one "
        "process on one thread: a step's own difference (relative to its update), the accumulated one (to the weights)"
    )
    for dtype in args.dtypes:
        args.dtype = dtype
        ref = root / dtype / "reference"
        run(1, 1, ref, args, data)
        reference, start = steps(ref), torch.load(ref / "start.pt", weights_only=True)
        columns = {}
        for case, (nproc, threads) in CASES.items():
            run(nproc, threads, root / dtype / f"{case}-restarted", args, data, restart=ref)
            run(nproc, threads, root / dtype / case, args, data)
            restarted, free = steps(root / dtype / f"{case}-restarted"), steps(root / dtype / case)
            before = [start, *reference[:-1]]
            columns[case] = [
                (update_relative(a, b, p), relative_norm_difference(a, c))
                for a, b, c, p in zip(reference, restarted, free, before)
            ]
        print(f"\n{dtype}\n| step | " + " | ".join(f"{c}: own | accumulated" for c in CASES) + " |")
        print("|---|" + "---|---|" * len(CASES))
        for k in range(len(reference)):
            cells = " | ".join(f"{columns[c][k][0]:.1e} | {columns[c][k][1]:.1e}" for c in CASES)
            print(f"| {k + 1} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
