"""How fast do real training steps run, how well does DDP scale, and how long do they wait for data?

Measures, on the synthetic shapes data (made into a temp dir), real training steps as
train.py runs them: yolov5n, ``create_dataloader`` with the hyp.shapes.yaml augmentation
(mosaic), ComputeLoss, SGD from ``smart_optimizer``, DDP over gloo, gradient clipping:

- images/s of 1 process vs N processes on the SAME TOTAL batch (16 = 1 x 16 = 2 x 8), so
  (img/s with 2 procs) / (img/s with 1 proc) is the DDP scaling efficiency on this machine;
- per step, the time blocked on ``next(loader)`` (data wait) vs forward + backward + step
  (compute, timed with ``ddp_utils.time_synchronized``), and their sum over the timed epoch;
- with loader workers 0 and 1 per process.

Threads: torch gets cpu_count // nproc threads per process (2 cores: 1 process x 2 threads,
2 processes x 1 thread), so the training processes never oversubscribe the cores by
themselves; loader workers then compete with them, which is what the workers column shows.
The single process also runs with 1 thread (--one-proc-threads): on a shared, loaded
machine 2 intra-op threads can be much slower than 1 (each parallel region waits for the
slower thread, and a descheduled thread stalls it), which would inflate the DDP "speed-up".

Runs are interleaved (1-proc, 2-proc, 1-proc, 2-proc, ... for each workers value, for
--rounds rounds) so that a noisy shared machine slows both alike; the table gives medians.

On a GPU (torch.cuda.is_available()) it also measures yolov5s at 640 with AMP (autocast +
GradScaler) in one process, and the share of the time the GPU waits for data; on a CPU-only
machine that part is skipped.

Run:  python benchmarks/speed/train_throughput.py                       (prints a markdown table)
      python benchmarks/speed/train_throughput.py --steps 4 --warmup 1 --rounds 1 --nproc 1 2 --workers 0
Never run by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
GPU_WARMUP = 5  # cuDNN and the caching allocator settle in the first steps


# ---------------------------------------------------------------- worker (one training process)


def train_steps(opt: argparse.Namespace) -> dict | None:
    """Run warm-up + timed training steps in this process (one rank); rank 0 returns the figures."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddp_utils as du
    from ddp_utils.data import create_dataloader, load_hyp
    from ddp_utils.engine import smart_optimizer
    from ddp_utils.yolo import ComputeLoss, Model

    cuda = opt.device == "cuda"
    info = du.init_distributed(backend="nccl" if cuda else "gloo")  # CPU runs on a GPU machine too
    finished = False
    try:
        device = torch.device("cuda", max(info.local_rank, 0)) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        torch.set_num_threads(opt.threads)
        torch.manual_seed(0)
        hyp = load_hyp(opt.hyp)
        hyp.setdefault("label_smoothing", 0.0)
        model = Model(opt.cfg, ch=3, nc=opt.nc).to(device)
        stride = max(int(model.stride.max()), 32)
        optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
        scaler = torch.amp.GradScaler("cuda", enabled=cuda)
        if info.distributed:
            model = DDP(model, device_ids=[device.index] if cuda else None)
        compute_loss = ComputeLoss(model, hyp)
        batch = opt.batch_size // info.world_size
        loader, _ = create_dataloader(
            opt.train,
            opt.imgsz,
            batch,
            stride,
            hyp=hyp,
            augment=True,
            rank=info.local_rank,
            workers=opt.workers,
            shuffle=True,
            seed=0,
        )
        steps = opt.warmup + opt.steps
        if len(loader) < steps:
            raise SystemExit(f"{opt.train}: {len(loader)} batches per epoch on this rank, need {steps}")
        model.train()
        batches = iter(loader)
        data_time = compute_time = 0.0
        for i in range(steps):
            if i == opt.warmup:  # start the timed window together on every rank
                du.barrier()
                data_time = compute_time = 0.0
                t_start = time.perf_counter()
            t0 = time.perf_counter()
            imgs, targets, _paths, _shapes = next(batches)
            imgs = imgs.to(device, non_blocking=True).float() / 255
            t1 = time.perf_counter()
            with torch.autocast(device.type, enabled=cuda):
                pred = model(imgs)
                loss, _items = compute_loss(pred, targets.to(device))
                if info.distributed:
                    loss *= info.world_size  # as train.py: DDP averages gradients, the loss is a per-image sum
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            t2 = du.time_synchronized(device)
            data_time += t1 - t0
            compute_time += t2 - t1
        wall = time.perf_counter() - t_start
        per_rank = du.all_gather_object({"data": data_time, "compute": compute_time, "wall": wall})
        loader.close()
        finished = True
    finally:
        du.cleanup(wait=finished)  # on an error, leave at once so the peer fails fast instead of hanging
    if not info.is_main:
        return None
    return {
        "nproc": info.world_size,
        "workers": loader.num_workers,
        "threads": opt.threads,
        "steps": opt.steps,
        "batch_size": opt.batch_size,
        "wall": max(r["wall"] for r in per_rank),
        "data": statistics.mean(r["data"] for r in per_rank),
        "compute": statistics.mean(r["compute"] for r in per_rank),
    }


# ---------------------------------------------------------------- driver


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(worker_args: list[str], nproc: int, threads: int, out: Path, timeout: float) -> dict:
    """Start ``nproc`` ranks the way torchrun does (gloo over a free port); rank 0's figures."""
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
        if nproc > 1:
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc),
                GROUP_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        cmd = [sys.executable, __file__, "--_worker", str(out), "--_threads", str(threads), *worker_args]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))  # fmt: skip
    deadline = time.monotonic() + timeout
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            logs.append(p.communicate()[0])
    if any(p.returncode for p in procs) or not out.is_file():
        tail = "\n".join(log[-3000:] for log in logs)
        raise RuntimeError(f"{nproc}-process run failed (exit codes {[p.returncode for p in procs]}):\n{tail}")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def worker_args(opt: argparse.Namespace, train: Path, nc: int, **over) -> list[str]:
    values = {
        "cfg": opt.cfg,
        "imgsz": opt.imgsz,
        "batch_size": opt.batch_size,
        "steps": opt.steps,
        "warmup": opt.warmup,
        "hyp": opt.hyp,
        "device": "cpu",
        "workers": 0,
        **over,
    }
    args = [f"--{k.replace('_', '-')}={v}" for k, v in values.items()]
    return [*args, f"--_train={train}", f"--_nc={nc}"]


def summarise(runs: list[dict]) -> dict:
    """Medians over the repeats of one configuration."""
    ips = [r["batch_size"] * r["steps"] / r["wall"] for r in runs]
    return {
        "ips": statistics.median(ips),
        "ips_all": ips,
        "data_ms": statistics.median(1000 * r["data"] / r["steps"] for r in runs),
        "compute_ms": statistics.median(1000 * r["compute"] / r["steps"] for r in runs),
        "data_s": statistics.median(r["data"] for r in runs),
        "compute_s": statistics.median(r["compute"] for r in runs),
        "workers": runs[0]["workers"],
        "threads": runs[0]["threads"],
    }


def configurations(opt: argparse.Namespace, cores: int) -> list[tuple[int, int]]:
    """(processes, torch threads per process) to run: cores // processes threads each, plus the extra 1-process ones."""
    configs = []
    for nproc in opt.nproc:
        threads = max(cores // nproc, 1)
        configs.append((nproc, threads))
        if nproc == 1:
            configs += [(1, t) for t in opt.one_proc_threads if t != threads]
    return configs


def cpu_table(results: dict, opt: argparse.Namespace, configs: list[tuple[int, int]]) -> str:
    refs = [c for c in configs if c[0] == min(opt.nproc)]
    ref_names = [f"vs {n} proc x {t} thr" for n, t in refs]
    lines = [
        "| workers/proc | procs x batch | torch threads/proc | img/s (median; all runs) | "
        + " | ".join(ref_names)
        + " | data wait ms/step | compute ms/step | timed epoch s: data + compute | data share |",
        "|---" * (8 + len(refs)) + "|",
    ]
    for workers in opt.workers:
        for nproc, threads in configs:
            s = results[(nproc, threads, workers)]
            runs = ", ".join(f"{x:.1f}" for x in s["ips_all"])
            ratios = " | ".join(f"{s['ips'] / results[(*ref, workers)]['ips']:.2f}" for ref in refs)
            share = s["data_s"] / (s["data_s"] + s["compute_s"])
            lines.append(
                f"| {s['workers']} | {nproc} x {opt.batch_size // nproc} | {threads} | {s['ips']:.1f} ({runs})"
                f" | {ratios} | {s['data_ms']:.0f} | {s['compute_ms']:.0f}"
                f" | {s['data_s']:.1f} + {s['compute_s']:.1f} | {share:.0%} |"
            )
    return "\n".join(lines)


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--cfg", default="yolov5n.yaml", help="model yaml (configs/models/ or a path)")
    add("--imgsz", type=int, default=320, help="train image size (CPU runs)")
    add("--batch-size", type=int, default=16, help="TOTAL batch size, split over the processes")
    add("--steps", type=int, default=6, help="timed steps per run, after the warm-up steps")
    add("--warmup", type=int, default=2, help="untimed warm-up steps per run")
    add("--workers", type=int, nargs="+", default=[0, 1], help="loader workers per process (each value a run)")
    add("--nproc", type=int, nargs="+", default=[1, 2], help="process counts to compare")
    add(
        "--one-proc-threads",
        type=int,
        nargs="*",
        default=[1],
        help="extra torch thread counts for the 1-process runs (besides cores // 1): a reference for the efficiency",
    )
    add("--rounds", type=int, default=2, help="interleaved repeats of every configuration")
    add("--hyp", default="hyp.shapes.yaml", help="augmentation and loss hyperparameters")
    add("--timeout", type=float, default=300, help="seconds before a run is killed")
    add("--gpu-cfg", default="yolov5s.yaml", help="model for the GPU measurement")
    add("--gpu-imgsz", type=int, default=640)
    add("--gpu-batch-size", type=int, default=32)
    add("--gpu-workers", type=int, default=8)
    add("--gpu-steps", type=int, default=20, help="timed steps of the GPU run, after 5 warm-up steps")
    add("--device", default="cpu", help=argparse.SUPPRESS)  # the workers' device
    add("--_worker", default=None, help=argparse.SUPPRESS)  # run as a training rank, write figures here
    add("--_threads", type=int, default=1, help=argparse.SUPPRESS)
    add("--_train", default=None, help=argparse.SUPPRESS)
    add("--_nc", type=int, default=4, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_worker(opt: argparse.Namespace) -> None:
    opt.workers, opt.threads, opt.train, opt.nc = opt.workers[0], opt._threads, opt._train, opt._nc
    result = train_steps(opt)
    if result is not None:
        tmp = Path(opt._worker).with_suffix(".partial")
        tmp.write_text(json.dumps(result))
        tmp.rename(opt._worker)


def main(opt: argparse.Namespace) -> None:
    import torch

    from ddp_utils.data import make_shapes_dataset

    cores = os.cpu_count() or 1
    if opt.steps < 1 or opt.warmup < 0 or opt.rounds < 1:
        raise SystemExit(f"--steps {opt.steps} --warmup {opt.warmup} --rounds {opt.rounds}: need 1+, 0+ and 1+")
    bad = [n for n in opt.nproc if n < 1 or opt.batch_size % n]
    if bad:
        raise SystemExit(f"--nproc {bad}: every process count must divide --batch-size {opt.batch_size}")
    with tempfile.TemporaryDirectory(prefix="train_throughput_") as tmp:
        # every rank needs warm-up + timed steps inside one epoch (no epoch boundary in the window)
        n_train = opt.batch_size * (opt.warmup + opt.steps)
        gpu = torch.cuda.is_available()
        if gpu:
            n_train = max(n_train, opt.gpu_batch_size * (GPU_WARMUP + opt.gpu_steps))
        root = make_shapes_dataset(Path(tmp) / "shapes", n_train=n_train, n_val=0)
        nc = len(json.loads((root / "shapes.json").read_text())["classes"])
        train = root / "images" / "train"
        out = Path(tmp) / "result.json"
        configs = configurations(opt, cores)
        runs: dict[tuple[int, int, int], list[dict]] = {}
        t0 = time.perf_counter()
        for rnd in range(opt.rounds):
            for workers in opt.workers:
                for nproc, threads in configs:
                    args = worker_args(opt, train, nc, workers=workers)
                    r = launch(args, nproc, threads, out, opt.timeout)
                    runs.setdefault((nproc, threads, workers), []).append(r)
                    ips = r["batch_size"] * r["steps"] / r["wall"]
                    print(
                        f"round {rnd + 1}/{opt.rounds} nproc {nproc} threads {threads} workers {r['workers']}: "
                        f"{ips:.1f} img/s, data {r['data']:.2f}s compute {r['compute']:.2f}s "
                        f"({time.perf_counter() - t0:.0f}s elapsed)",
                        file=sys.stderr,
                    )
        results = {key: summarise(value) for key, value in runs.items()}

        print(
            f"\n## Training throughput: {opt.cfg} at {opt.imgsz}, total batch {opt.batch_size}, CPU ({cores} cores)\n"
        )
        print(cpu_table(results, opt, configs))
        print(
            f"\n{opt.steps} timed steps after {opt.warmup} warm-up steps per run, {opt.rounds} interleaved rounds; "
            "gloo DDP; torch threads per process = cores // procs (extra 1-process rows: --one-proc-threads). "
            "'vs 1 proc x T thr' at the same workers is the DDP scaling efficiency against that baseline. "
            "Data wait and compute are per rank, averaged over ranks (compute includes DDP's gradient all-reduce, "
            "so a rank's wait for a slower peer); 'timed epoch' sums them over the timed "
            f"steps ({opt.batch_size * opt.steps} images of the epoch)."
        )
        print("\ncommand: python " + " ".join([os.path.relpath(__file__, Path.cwd()), *sys.argv[1:]]))

        if not gpu:
            print("\nGPU: torch.cuda.is_available() is False: yolov5s/640/AMP measurement skipped.")
            return
        args = worker_args(
            opt,
            train,
            nc,
            cfg=opt.gpu_cfg,
            imgsz=opt.gpu_imgsz,
            batch_size=opt.gpu_batch_size,
            workers=opt.gpu_workers,
            steps=opt.gpu_steps,
            warmup=GPU_WARMUP,
            device="cuda",
        )
        r = summarise([launch(args, 1, max(cores // 2, 1), out, opt.timeout)])
        share = r["data_s"] / (r["data_s"] + r["compute_s"])
        print(f"\n## GPU ({torch.cuda.get_device_name(0)}): {opt.gpu_cfg} at {opt.gpu_imgsz}, AMP, 1 process\n")
        print("| batch | workers | img/s | data wait ms/step | compute ms/step | GPU waits for data |")
        print("|---|---|---|---|---|---|")
        print(
            f"| {opt.gpu_batch_size} | {r['workers']} | {r['ips']:.1f} | {r['data_ms']:.0f} | {r['compute_ms']:.0f}"
            f" | {share:.0%} |"
        )


if __name__ == "__main__":
    options = parse_opt()
    if options._worker:
        run_worker(options)
    else:
        main(options)
