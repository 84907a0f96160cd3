"""How long the label scan takes cold (no cache) and warm (cache current), for 500 and 5,000 images.

    python benchmarks/speed/label_cache.py            # 500 and 5000 images, 5 repeats
    python benchmarks/speed/label_cache.py --n 500 --repeats 9

The images are real JPEGs (640x480, as in COCO) with YOLO labels of 1-10 rows. For scale,
``--baseline`` also times a scan done the way YOLOv5 does it (a full PIL ``verify`` and
EXIF read per image, labels parsed row by row, a process pool), written here from its
documented behaviour, so both run on the same machine under the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.pool import Pool
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ddp_utils.data.labels import find_images, img2label_paths, load_labels  # noqa: E402


def make_dataset(root: Path, n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    variants = []
    for _ in range(8):
        img = cv2.resize(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8), (640, 480))
        variants.append(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes())
    for i in range(n):
        (images / f"{i:06d}.jpg").write_bytes(variants[i % len(variants)])
        rows = rng.uniform(0.05, 0.95, (int(rng.integers(1, 11)), 5))
        rows[:, 0] = rng.integers(0, 80, len(rows))
        rows[:, 3:] *= 0.1
        lines = [f"{int(r[0])} {r[1]:.6f} {r[2]:.6f} {r[3]:.6f} {r[4]:.6f}\n" for r in rows]
        (labels / f"{i:06d}.txt").write_text("".join(lines))
    return find_images(images)


def _yolov5_style_verify(pair: tuple[str, str]) -> tuple:
    from PIL import Image, ImageOps

    im_file, lb_file = pair
    im = Image.open(im_file)
    im.verify()
    shape = ImageOps.exif_transpose(Image.open(im_file)).size if im.getexif() else im.size
    with open(im_file, "rb") as f:
        f.seek(-2, 2)
        complete = f.read() == b"\xff\xd9"
    with open(lb_file) as f:
        rows = [x.split() for x in f.read().strip().splitlines() if len(x)]
    lb = np.array(rows, dtype=np.float32)
    _, idx = np.unique(lb, axis=0, return_index=True)
    return shape, complete, lb[idx]


def baseline_scan(im_files: list[str]) -> float:
    start = time.perf_counter()
    with Pool(os.cpu_count()) as pool:
        list(pool.imap(_yolov5_style_verify, zip(im_files, img2label_paths(im_files))))
    return time.perf_counter() - start


def time_scan(im_files: list[str], cache: Path, cold: bool) -> float:
    if cold and cache.exists():
        cache.unlink()
    start = time.perf_counter()
    result = load_labels(im_files, cache_path=cache)
    seconds = time.perf_counter() - start
    assert result.cache_loaded is (not cold), result
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", action="store_true", help="also time a YOLOv5-style scan")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; median (min-max) of {args.repeats} runs")
    for n in args.n:
        with tempfile.TemporaryDirectory() as tmp:
            im_files = make_dataset(Path(tmp), n)
            cache = Path(tmp) / "labels" / "train.ddp.cache"
            rows = {"cold": [], "warm": [], "yolov5-style cold": []}
            for _ in range(args.repeats):
                rows["cold"].append(time_scan(im_files, cache, cold=True))
                rows["warm"].append(time_scan(im_files, cache, cold=False))
                if args.baseline:
                    rows["yolov5-style cold"].append(baseline_scan(im_files))
            for name, times in rows.items():
                if times:
                    print(
                        f"{n:>6} images  {name:<18} {statistics.median(times):.3f} s "
                        f"({min(times):.3f}-{max(times):.3f})  cache {cache.stat().st_size / 1e3:.0f} kB"
                    )


if __name__ == "__main__":
    main()
