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

Run:  python benchmarks/dataloader.py            (prints a markdown table)
      python benchmarks/dataloader.py --n 200 --label-n 500 --quick
Never run by the tests.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HYP = {
    "hsv_h": 0.015,
    "hsv_s": 0.7,
    "hsv_v": 0.4,
    "degrees": 0.0,
    "translate": 0.1,
    "scale": 0.5,
    "shear": 0.0,
    "perspective": 0.0,
    "flipud": 0.0,
    "fliplr": 0.5,
    "mosaic": 1.0,
    "mixup": 0.0,
}


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return int(re.search(r"^Pss:\s+(\d+) kB", f.read(), re.M).group(1))
    except (OSError, AttributeError):
        return 0


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))
    except (OSError, AttributeError):
        return 0


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


def loader_rate(images: Path, workers: int, cache: str | None, imgsz: int, batch: int, rank: int = -1) -> dict:
    from ddp_utils.data.loader import create_dataloader

    t = time.perf_counter()
    loader, dataset = create_dataloader(
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
    build = time.perf_counter() - t
    loader.set_epoch(0)
    for _ in loader:  # warm-up: workers start, page cache fills
        pass
    loader.set_epoch(1)
    n, t = 0, time.perf_counter()
    for imgs, *_ in loader:
        n += imgs.shape[0]
    seconds = time.perf_counter() - t
    loader.close()
    return {"images_per_s": n / seconds, "build_s": build, "workers": loader.num_workers}


def _decode_samples(args: tuple[list[str], int, int, int]) -> int:
    import cv2

    from ddp_utils.data.images import resize_long_side

    files, imgsz, samples, seed = args
    cv2.setNumThreads(1)
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        for i in rng.integers(0, len(files), 4):
            resize_long_side(cv2.imread(files[i]), imgsz, augment=True)
    return samples


def decode_bound(images: Path, imgsz: int, samples: int, processes: int) -> float:
    files = sorted(str(p) for p in images.glob("*.jpg"))
    _decode_samples((files, imgsz, 4, 99))  # warm the page cache path
    t = time.perf_counter()
    if processes == 1:
        done = _decode_samples((files, imgsz, samples, 0))
    else:
        with ProcessPoolExecutor(processes) as pool:
            done = sum(pool.map(_decode_samples, [(files, imgsz, samples // processes, p) for p in range(processes)]))
    return done / (time.perf_counter() - t)


def label_cache_times(root: Path, n: int, size: tuple[int, int]) -> dict:
    from ddp_utils.data import labels as labels_mod
    from ddp_utils.data.labels import find_images, label_cache_path, load_labels

    images = make_dataset(root, n, size)
    im_files = find_images(images)
    cache = label_cache_path(im_files)
    if cache.exists():
        cache.unlink()
    labels_mod._MEMORY_CACHE.clear()
    t = time.perf_counter()
    cold = load_labels(im_files, cache)
    cold_s = time.perf_counter() - t
    labels_mod._MEMORY_CACHE.clear()
    t = time.perf_counter()
    warm = load_labels(im_files, cache)
    warm_s = time.perf_counter() - t
    assert cold.cache_written and warm.cache_loaded
    return {"n": n, "cold_s": cold_s, "warm_s": warm_s}


def ddp_worker(images: str, imgsz: int, batch: int, workers: int, cache: str) -> None:
    """One rank of the 2-process job (started by :func:`ddp_memory`)."""
    import torch

    import ddp_utils as du

    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo")
    with MemorySampler() as mem:
        rate = loader_rate(Path(images), workers, cache if cache != "none" else None, imgsz, batch, info.local_rank)
        du.barrier()
    print(
        json.dumps({"rank": info.rank, **rate, "pss": mem.peak_pss, "tree_pss": mem.peak_tree_pss, "rss": mem.peak_rss})
    )
    du.cleanup()


def ddp_memory(images: Path, imgsz: int, batch: int, workers: int, cache: str) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        code = (
            f"import sys; sys.path.insert(0, {str(REPO)!r}); from benchmarks.dataloader import ddp_worker; "
            f"ddp_worker({str(images)!r}, {imgsz}, {batch}, {workers}, {cache!r})"
        )
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
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
    parser.add_argument("--label-n", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--label-size", type=int, nargs=2, default=(480, 640))
    parser.add_argument("--skip-ddp", action="store_true")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)

    import cv2

    from ddp_utils.log import set_logging

    set_logging(rank=0, verbose=False)
    cv2.setNumThreads(1)
    images = make_dataset(args.root / f"loader_{args.n}_{args.size[0]}_{args.size[1]}", args.n, tuple(args.size))
    clear_caches(images)
    samples = max(args.n // 2, 50)
    bound1 = decode_bound(images, args.imgsz, samples, 1)
    bound2 = decode_bound(images, args.imgsz, samples, 2)
    rows = []
    for cache in args.caches:
        for workers in args.workers:
            with MemorySampler() as mem:
                r = loader_rate(images, workers, None if cache == "none" else cache, args.imgsz, args.batch)
            bound = bound1 if workers == 0 else bound2
            rows.append(
                (
                    workers,
                    cache,
                    r["images_per_s"],
                    r["images_per_s"] / bound,
                    r["build_s"],
                    mem.peak_rss,
                    mem.peak_tree_pss,
                )
            )
    print(
        f"\n### Training loader, {args.n} images of {args.size[0]}-{args.size[1]} px, imgsz {args.imgsz}, "
        f"batch {args.batch}, all-mosaic hyp, {os.cpu_count()} CPUs\n"
    )
    print(
        f"Decode bound (imread + resize of 4 images per sample): 1 process {bound1:.1f} img/s, "
        f"2 processes {bound2:.1f} img/s\n"
    )
    print("| workers | cache | img/s | vs decode bound | build s | peak RSS main MiB | peak PSS main+workers MiB |")
    print("|---|---|---|---|---|---|---|")
    for w, c, rate, ratio, build, rss, pss in rows:
        print(f"| {w} | {c} | {rate:.1f} | {ratio:.2f}x | {build:.1f} | {rss / 1024:.0f} | {pss / 1024:.0f} |")

    print("\n### Label cache\n")
    print("| images | cold build s | warm start s |")
    print("|---|---|---|")
    for n in args.label_n:
        t = label_cache_times(
            args.root / f"labels_{n}_{args.label_size[0]}_{args.label_size[1]}", n, tuple(args.label_size)
        )
        print(f"| {n} | {t['cold_s']:.2f} | {t['warm_s']:.3f} |")

    if not args.skip_ddp:
        print("\n### Memory with the RAM cache: 1 process vs 2-process DDP (workers 2)\n")
        with MemorySampler() as mem:
            single = loader_rate(images, 2, "ram", args.imgsz, args.batch)
        ranks = ddp_memory(images, args.imgsz, args.batch, 2, "ram")
        buffer = sum(np.prod(s) for s in _resized(images, args.imgsz)) * 3 / 2**20
        print(f"RAM cache buffer: {buffer:.0f} MiB\n")
        print("| job | process | img/s | peak RSS MiB | peak PSS (process) MiB | peak PSS (with workers) MiB |")
        print("|---|---|---|---|---|---|")
        print(
            f"| single | main | {single['images_per_s']:.1f} | {mem.peak_rss / 1024:.0f} | "
            f"{mem.peak_pss / 1024:.0f} | {mem.peak_tree_pss / 1024:.0f} |"
        )
        for r in ranks:
            print(
                f"| DDP x2 | rank {r['rank']} | {r['images_per_s']:.1f} | {r['rss'] / 1024:.0f} | "
                f"{r['pss'] / 1024:.0f} | {r['tree_pss'] / 1024:.0f} |"
            )
        node = sum(r["tree_pss"] for r in ranks) / 1024
        print(
            f"| DDP x2 | node (sum) | {sum(r['images_per_s'] for r in ranks):.1f} | "
            f"{sum(r['rss'] for r in ranks) / 1024:.0f} | {sum(r['pss'] for r in ranks) / 1024:.0f} | {node:.0f} |"
        )


def _resized(images: Path, imgsz: int) -> list[tuple[int, int]]:
    from ddp_utils.data.images import resized_shape
    from ddp_utils.data.labels import find_images, load_labels

    label_set = load_labels(find_images(images))
    return [resized_shape(int(h), int(w), imgsz) for w, h in label_set.shapes]


if __name__ == "__main__":
    main()
