"""How fast is the training loader, how close to the decode bound, and how much memory per node?

Measures, side by side in one run on one synthetic dataset:

- images/s of ``create_dataloader`` (all-mosaic hyp, imgsz 640, batch 16) at workers 0 and
  2, with cache none / ram / disk (a full epoch after a warm-up epoch, so worker start-up and
  cache building are not counted);
- the decode bound: ``cv2.imread`` + resize of the 4 images a mosaic sample needs, in 1 and
  in 2 processes (what a no-cache loader can reach at best);
- label-cache cold build and warm start on 500 and 5,000 images;
- peak RSS and PSS per process and per node (loader process plus its workers), one process
  and a 2-process gloo job with the RAM cache.

Run:  python benchmarks/speed/dataloader.py            (prints a markdown table)
      python benchmarks/speed/dataloader.py --n 200 --label-n 500 --quick
Never run by the tests.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ddp_utils.data import load_hyp  # noqa: E402  (after the repo is on sys.path)

HYP = load_hyp("hyp.scratch-low.yaml")  # YOLOv5's augmentation: all-mosaic, no mixup


def proc_kib(pid: int, file: str, field: str) -> int:
    """A ``<field>: <n> kB`` line of ``/proc/<pid>/<file>``; 0 when the process or the line is gone."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))
    except (OSError, AttributeError):
        return 0


def pss_kib(pid: int) -> int:
    return proc_kib(pid, "smaps_rollup", "Pss")


def rss_kib(pid: int) -> int:
    return proc_kib(pid, "status", "VmRSS")


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


class MemorySampler:
    """Peak PSS of this process and of its process tree, and peak RSS of this process, sampled."""

    def __init__(self, every: float = 1.0) -> None:
        self.every, self.peak_pss, self.peak_tree_pss, self.peak_rss = every, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            own = pss_kib(me)
            tree = own + sum(pss_kib(c) for c in children(me))
            self.peak_pss = max(self.peak_pss, own)
            self.peak_tree_pss = max(self.peak_tree_pss, tree)
            self.peak_rss = max(self.peak_rss, rss_kib(me))
            self._stop.wait(self.every)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def make_dataset(root: Path, n: int, size: tuple[int, int]) -> Path:
    from ddp_utils.data.synthetic import make_shapes_dataset

    if not (root / "shapes.json").is_file():
        t = time.perf_counter()
        make_shapes_dataset(root, n, 0, size=size, seed=0)
        print(f"made {n} images of {size} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return root / "images" / "train"


def clear_caches(images: Path) -> None:
    for p in images.glob("*.npy"):
        p.unlink()
    for p in images.parent.parent.glob("labels/*.cache"):
        p.unlink()


def build_loader(images: Path, workers: int, cache: str | None, imgsz: int, batch: int, rank: int = -1):
    from ddp_utils.data.loader import create_dataloader

    t = time.perf_counter()
    loader, _ = create_dataloader(
        images,
        imgsz,
        batch,
        32,
        hyp=HYP,
        augment=True,
        cache=cache or False,
        rank=rank,
        workers=workers,
        shuffle=True,
        seed=0,
    )
    return loader, time.perf_counter() - t


def epoch_rate(loader, epoch: int) -> tuple[float, float]:
    """(images per second, CPU milliseconds per image) over one epoch, in steady state.

    The workers persist between epochs and, while idle, prefetch ``2 * workers`` batches of
    the next one. The wall clock skips those and starts when they have been taken. The CPU
    clock runs from the epoch's start until the workers are idle again, so it holds this
    epoch's batches but the prefetched ones and the next epoch's prefetch instead: the same
    work, divided by all the epoch's images. CPU time (this process and its workers) is
    what a shared, noisy machine cannot inflate: it is the cost of an image, whatever else runs.
    """
    skip = 2 * loader.num_workers
    loader.set_epoch(epoch)
    n, images, t, cpu = 0, 0, time.perf_counter(), process_cpu()
    for k, (imgs, *_) in enumerate(loader):
        images += imgs.shape[0]
        if k < skip:
            t = time.perf_counter()
        else:
            n += imgs.shape[0]
    rate = n / (time.perf_counter() - t)
    wait_until_workers_idle()
    return rate, (process_cpu() - cpu) * 1000 / max(images, 1)


def process_cpu() -> float:
    """CPU seconds of this process and its live children (the loader's workers)."""
    ticks = sum(cpu_ticks(c) for c in children(os.getpid()))
    return time.process_time() + ticks / os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0


def wait_until_workers_idle(limit: float = 20.0) -> None:
    """Wait until this process's children (loader workers done prefetching) stop using CPU."""
    deadline = time.monotonic() + limit
    before = sum(cpu_ticks(c) for c in children(os.getpid()))
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = sum(cpu_ticks(c) for c in children(os.getpid()))
        if now == before:
            return
        before = now


def _decode_samples(args: tuple[list[str], int, int, int, str]) -> tuple[int, float]:
    import cv2

    from ddp_utils.data.images import read_image, resize_long_side

    files, imgsz, samples, seed, decoder = args
    decode = read_image if decoder == "read_image" else cv2.imread
    cv2.setNumThreads(1)
    rng = np.random.default_rng(seed)
    cpu = time.process_time()
    for _ in range(samples):
        for i in rng.integers(0, len(files), 4):
            resize_long_side(decode(files[i]), imgsz, augment=True)
    return samples, time.process_time() - cpu


def decode_bound(
    files: list[str], imgsz: int, samples: int, pool: ProcessPoolExecutor | None, decoder: str = "cv2.imread"
) -> tuple[float, float]:
    """(mosaic samples per second, CPU ms per sample) when a process only decodes and resizes 4 images.

    ``decoder``: "cv2.imread" (the bound as the issue defines it) or "read_image" (the
    library's decoder, simplejpeg for JPEGs: the bound for the decoder the loader uses).
    """
    t = time.perf_counter()
    if pool is None:
        results = [_decode_samples((files, imgsz, samples, int(t), decoder))]
    else:
        tasks = [(files, imgsz, samples // 2, int(t) + p, decoder) for p in range(2)]
        results = list(pool.map(_decode_samples, tasks))
    done = sum(r[0] for r in results)
    return done / (time.perf_counter() - t), sum(r[1] for r in results) * 1000 / done


def label_cache_times(root: Path, n: int, size: tuple[int, int], repeats: int = 5) -> dict:
    """Median cold build (no cache file) and warm start (cache file, fresh process state) times.

    A full garbage collection runs before each timed call: with torch imported, the first
    one in a process takes ~0.2 s wherever it falls, and is no part of the label scan.
    """
    from ddp_utils.data import labels as labels_mod
    from ddp_utils.data.labels import find_images, label_cache_path, load_labels

    images = make_dataset(root, n, size)
    im_files = find_images(images)
    cache = label_cache_path(im_files)
    cold_s, warm_s = [], []
    for _ in range(repeats):
        cache.unlink(missing_ok=True)
        labels_mod._MEMORY_CACHE.clear()
        gc.collect()
        t = time.perf_counter()
        cold = load_labels(im_files, cache)
        cold_s.append(time.perf_counter() - t)
        labels_mod._MEMORY_CACHE.clear()
        gc.collect()
        t = time.perf_counter()
        warm = load_labels(im_files, cache)
        warm_s.append(time.perf_counter() - t)
        assert cold.cache_written and warm.cache_loaded
    return {"n": n, "cold_s": float(np.median(cold_s)), "warm_s": float(np.median(warm_s))}


def memory_worker(images: str, imgsz: int, batch: int, workers: int, cache: str) -> None:
    """One process of a memory run: a rank of a 2-process gloo job, or a single process."""
    import torch

    import ddp_utils as du

    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo")
    with MemorySampler(every=0.5) as mem:
        loader, _ = build_loader(
            Path(images), workers, None if cache == "none" else cache, imgsz, batch, info.local_rank
        )
        rate = epoch_rate(loader, 0)[0]
        du.barrier()
    record = {"rank": max(info.rank, 0), "rate": rate, "pss": mem.peak_pss, "tree": mem.peak_tree_pss}
    print(json.dumps({**record, "rss": mem.peak_rss}))
    du.cleanup()


def memory_run(images: Path, imgsz: int, batch: int, workers: int, cache: str, nprocs: int) -> list[dict]:
    """Start ``nprocs`` fresh processes (a gloo job when 2) and collect their peak memory."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(nprocs):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if nprocs > 1:
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs))
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        code = (
            f"import sys; sys.path.insert(0, {str(REPO)!r}); from benchmarks.speed.dataloader import memory_worker; "
            f"memory_worker({str(images)!r}, {imgsz}, {batch}, {workers}, {cache!r})"
        )
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "ddp_utils_bench")
    parser.add_argument("--n", type=int, default=500, help="images in the loader dataset")
    parser.add_argument("--size", type=int, nargs=2, default=(480, 640), help="smallest and largest image side")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--caches", nargs="+", default=["none", "ram", "disk"])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--label-n", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--label-size", type=int, nargs=2, default=(480, 640))
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)

    import cv2

    from ddp_utils.log import set_logging

    set_logging(rank=0, verbose=False)
    cv2.setNumThreads(1)
    images = make_dataset(args.root / f"loader_{args.n}_{args.size[0]}_{args.size[1]}", args.n, tuple(args.size))
    files = sorted(str(p) for p in images.glob("*.jpg"))
    clear_caches(images)
    configs = [(w, c) for c in args.caches for w in args.workers]
    loaders, builds = {}, {}
    for w, c in configs:  # build every loader first, then measure them round-robin under the same load
        loaders[w, c], builds[w, c] = build_loader(images, w, None if c == "none" else c, args.imgsz, args.batch)
        epoch_rate(loaders[w, c], 0)  # warm-up: workers start, caches fill
        wait_until_workers_idle()
    rates = {k: [] for k in configs}
    bounds = {k: [] for k in configs}
    own_bounds = {k: [] for k in configs}
    samples = max(min(args.n // 4, 128), 16)

    def bound(w: int, decoder: str) -> tuple[float, float]:
        # no loader's workers may still be prefetching, or they would slow the bound down
        wait_until_workers_idle()
        return decode_bound(files, args.imgsz, samples, None if w == 0 else pool, decoder)

    def mean(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        return (a[0] + b[0]) / 2, (a[1] + b[1]) / 2

    with ProcessPoolExecutor(2) as pool:
        pool.submit(int, 0).result()
        for r in range(args.rounds):
            for w, c in configs:
                # the decode bounds right before and right after each epoch, so that the bound and
                # the loader see the same machine load, even while it changes
                before = bound(w, "cv2.imread"), bound(w, "read_image")
                wait_until_workers_idle()
                rates[w, c].append(epoch_rate(loaders[w, c], 1 + r))
                after = bound(w, "cv2.imread"), bound(w, "read_image")
                bounds[w, c].append(mean(before[0], after[0]))
                own_bounds[w, c].append(mean(before[1], after[1]))
    for loader in loaders.values():
        loader.close()

    print(
        f"\n### Training loader, {args.n} images of {args.size[0]}-{args.size[1]} px, imgsz {args.imgsz}, "
        f"batch {args.batch}, all-mosaic hyp, {os.cpu_count()} CPUs, median of {args.rounds} interleaved rounds\n"
    )
    print("Decode bound: cv2.imread + resize of the 4 images a mosaic needs (1 process for workers 0, 2 for 2),")
    print("measured right before and after each loader epoch; 'own decoder' is the same with ddp_utils' read_image")
    print("(simplejpeg for JPEGs), the decoder the loader uses. CPU ms/img counts the main process and its")
    print("workers; idle-machine img/s = processes x 1000 / CPU ms (what the same code does on 2 free cores).\n")
    print(
        "| workers | cache | img/s (wall) | CPU ms/img | idle-machine img/s | decode CPU ms/img | "
        "decode / loader CPU | own decoder / loader CPU | vs no cache (CPU) | build s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    cpu = {k: float(np.median([x[1] for x in v])) for k, v in rates.items()}
    for w, c in configs:
        wall = float(np.median([x[0] for x in rates[w, c]]))
        decode_cpu = float(np.median([b[1] for b in bounds[w, c]]))
        ratio = float(np.median([b[1] / x[1] for b, x in zip(bounds[w, c], rates[w, c])]))
        own = float(np.median([b[1] / x[1] for b, x in zip(own_bounds[w, c], rates[w, c])]))
        base = cpu.get((w, "none"))
        vs = f"{base / cpu[w, c]:.2f}x" if base else "-"
        idle = max(w, 1) * 1000 / cpu[w, c]
        print(
            f"| {w} | {c} | {wall:.1f} | {cpu[w, c]:.1f} | {idle:.0f} | {decode_cpu:.1f} | {ratio:.2f} | {own:.2f} | "
            f"{vs} | "
            f"{builds[w, c]:.1f} |"
        )

    print("\n### Label cache (load_labels)\n")
    print("| images | cold build s (median of 5) | warm start s |")
    print("|---|---|---|")
    for n in args.label_n:
        size = tuple(args.label_size)
        t = label_cache_times(args.root / f"labels_{n}_{size[0]}_{size[1]}", n, size)
        print(f"| {n} | {t['cold_s']:.3f} | {t['warm_s']:.3f} |")

    if args.skip_memory:
        return
    buffer = sum(h * w for h, w in _resized(images, args.imgsz)) * 3 / 2**20
    print(f"\n### Peak memory, fresh processes, workers 2 (RAM cache buffer: {buffer:.0f} MiB)\n")
    print("| job | cache | process | img/s | peak RSS MiB | peak PSS MiB | peak PSS with workers MiB |")
    print("|---|---|---|---|---|---|---|")
    node = {}
    for nprocs in (1, 2):
        for cache in ("none", "ram"):
            recs = memory_run(images, args.imgsz, args.batch, 2, cache, nprocs)
            job = "single" if nprocs == 1 else "DDP x2"
            for r in recs:
                print(
                    f"| {job} | {cache} | rank {r['rank']} | {r['rate']:.1f} | {r['rss'] / 1024:.0f} | "
                    f"{r['pss'] / 1024:.0f} | {r['tree'] / 1024:.0f} |"
                )
            node[nprocs, cache] = sum(r["tree"] for r in recs) / 1024
            if nprocs > 1:
                print(
                    f"| {job} | {cache} | node | {sum(r['rate'] for r in recs):.1f} | "
                    f"{sum(r['rss'] for r in recs) / 1024:.0f} | {sum(r['pss'] for r in recs) / 1024:.0f} | "
                    f"{node[nprocs, cache]:.0f} |"
                )
    for nprocs in (1, 2):
        extra = node[nprocs, "ram"] - node[nprocs, "none"]
        print(
            f"\nRAM cache cost per node, {nprocs} process(es): {extra:.0f} MiB of PSS "
            f"= {extra / buffer:.2f} x the buffer (one copy per process would be {nprocs}x)"
        )


def _resized(images: Path, imgsz: int) -> list[tuple[int, int]]:
    from ddp_utils.data.images import resized_shape
    from ddp_utils.data.labels import find_images, load_labels

    label_set = load_labels(find_images(images))
    return [resized_shape(int(h), int(w), imgsz) for w, h in label_set.shapes]


if __name__ == "__main__":
    main()
