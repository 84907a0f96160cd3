"""The main job's figures and the model summaries, measured again: one command, a short table to copy from.

    python benchmarks/readme_figures.py            # the main job (minutes on 2 cores), then the rest
    python benchmarks/readme_figures.py --skip-main-job

What it measures, and where each figure is stated (README.md, and the docs/ page named):

- the main job, ``python train.py`` exactly as the README types it, run from a fresh temporary
  directory (the synthetic dataset is generated inside it): its wall time, its CPU time (all
  processes: load on a shared machine stretches the wall time, hardly the CPU time), the peak
  resident memory of its process tree (sampled from /proc) and of its largest process
  (``ru_maxrss``), mAP@0.5 and mAP@0.5:0.95 after the last epoch, after epoch 1, and at the best
  epoch (by mAP@0.5:0.95), all read from the run's results.csv;
- the model summaries of docs/profiling.md: ``model_info`` of yolov5n and yolov5s at 640 px,
  unfused (the summary line) and fused (the numbers compared with YOLOv5's published table);
- the JPEG decode ratio of docs/data.md: ``read_image`` (simplejpeg) over ``cv2.imread`` on the
  main job's validation images; the PNG one: ``read_image`` (OpenCV, its codecs' stderr caught
  around the call) over ``cv2.imread`` on the same images written as PNGs; and what that catching costs a
  decode on its own (``caught_stderr``'s window around nothing, in microseconds).

The README's other figures name their own benchmark; the test-suite duration (docs/development.md) and
the fault-test timings (docs/reliability.md) come from running the tests, not from here. Never run by the tests.

It stays at the top of ``benchmarks/``, in no group: its figures are of several kinds (time, memory, accuracy, model
size), and it is the one command the README names for its table.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: child_env
from child_env import with_pythonpath  # noqa: E402  (children keep the caller's PYTHONPATH)

sys.path.insert(0, str(REPO))  # this checkout's ddp_utils, not another installed copy


def _tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants now (Linux /proc; 0 elsewhere)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            rss[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def _watch_rss(proc: subprocess.Popen, peak: list[int]) -> None:
    while proc.poll() is None:
        peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
        time.sleep(1.0)  # walking /proc costs CPU time the job would rather have


def main_job(workdir: Path, threads: int | None = None) -> dict:
    """Run ``python train.py`` in ``workdir`` (fresh), return its timings, memory and metrics.

    ``threads`` sets OMP_NUM_THREADS for the job (default: unset, as a user runs it). On a machine
    that other jobs load, torch's 2 intra-op threads wait on each other at every parallel region
    and a step can take 100 times longer; 1 thread avoids that (see train_throughput.py).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDP_UTILS_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env = with_pythonpath(env)
    log = workdir / "train.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "train.py")], cwd=workdir, env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
        peak = [0]
        watcher = threading.Thread(target=_watch_rss, args=(proc, peak), daemon=True)
        watcher.start()
        code = proc.wait()
        watcher.join()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise SystemExit(f"train.py exited {code}; see {log}:\n{log.read_text()[-3000:]}")
    (run_dir,) = sorted((workdir / "runs" / "train").iterdir())
    with open(run_dir / "results.csv", newline="") as f:
        rows = [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    best = max(rows, key=lambda r: r["metrics/mAP_0.5:0.95"])
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "tree_peak_rss_gb": peak[0] / 1e9,
        "largest_process_peak_rss_gb": after.ru_maxrss * 1024 / 1e9,  # kB on Linux
        "epochs": len(rows),
        "final": (rows[-1]["metrics/mAP_0.5"], rows[-1]["metrics/mAP_0.5:0.95"]),
        "epoch1": (rows[0]["metrics/mAP_0.5"], rows[0]["metrics/mAP_0.5:0.95"]),
        "best": (int(best["epoch"]) + 1, best["metrics/mAP_0.5"], best["metrics/mAP_0.5:0.95"]),
        "n_val": len(list((workdir / "datasets" / "shapes" / "images" / "val").glob("*.jpg"))),
        "val_images": workdir / "datasets" / "shapes" / "images" / "val",
        "results_csv": run_dir / "results.csv",
    }


def model_sizes() -> dict[str, dict]:
    """model_info of yolov5n and yolov5s at 640: as built (the summary line) and fused (YOLOv5's table)."""
    from ddp_utils import set_logging
    from ddp_utils.profiling import model_info
    from ddp_utils.yolo import Model

    set_logging(verbose=False)
    sizes = {}
    for name in ("yolov5n", "yolov5s"):
        model = Model(f"{name}.yaml").eval()
        built = model_info(model, imgsz=640)
        fused = model_info(model.fuse(), imgsz=640)
        sizes[name] = {
            "summary": built["summary"],
            "fused_params": fused["parameters"],
            "fused_gflops": fused["gflops"],
        }
    return sizes


def decode_ratio(images: Path, rounds: int = 5, suffix: str = ".jpg") -> float:
    """Median over rounds of (read_image's time / cv2.imread's time) over every ``suffix`` file in ``images``."""
    import cv2

    from ddp_utils.data.images import read_image

    files = sorted(images.glob(f"*{suffix}"))
    ratios = []
    for _ in range(rounds):
        start = time.perf_counter()
        for f in files:
            cv2.imread(str(f))
        opencv = time.perf_counter() - start
        start = time.perf_counter()
        for f in files:
            read_image(f)
        ratios.append((time.perf_counter() - start) / opencv)
    return statistics.median(ratios)


def window_microseconds(windows: int = 20_000, rounds: int = 5) -> float:
    """Median over rounds of the time one ``caught_stderr`` window takes around nothing, in microseconds."""
    from ddp_utils.data.decoder_text import caught_stderr

    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(windows):
            with caught_stderr():
                pass
        times.append((time.perf_counter() - start) / windows * 1e6)
    return statistics.median(times)


def png_copies(images: Path, directory: Path) -> Path:
    """Every JPEG in ``images`` written again as a PNG (OpenCV's) into ``directory``."""
    import cv2

    directory.mkdir(parents=True, exist_ok=True)
    for jpeg in sorted(images.glob("*.jpg")):
        cv2.imwrite(str(directory / f"{jpeg.stem}.png"), cv2.imread(str(jpeg)))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-main-job", action="store_true", help="only the model sizes and the decode ratio")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the main job (default: unset)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    opt = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="readme_figures_"))
    rows: list[tuple[str, str]] = []
    if not opt.skip_main_job:
        job = main_job(workdir, opt.threads)
        wall, cpu = divmod(round(job["wall_s"]), 60), divmod(round(job["cpu_s"]), 60)
        rows += [
            ("main job: wall time (dataset generation included)", f"{wall[0]} min {wall[1]} s"),
            ("main job: CPU time, all processes", f"{cpu[0]} min {cpu[1]} s"),
            ("main job: load average before / after", f"{job['load_before']:.1f} / {job['load_after']:.1f}"),
            ("main job: OMP_NUM_THREADS", str(opt.threads) if opt.threads else "unset (torch's default)"),
            ("main job: peak RSS, process tree (sampled)", f"{job['tree_peak_rss_gb']:.2f} GB"),
            ("main job: peak RSS, largest process", f"{job['largest_process_peak_rss_gb']:.2f} GB"),
            ("main job: epochs, validation images", f"{job['epochs']}, {job['n_val']}"),
            ("main job: final mAP@0.5, mAP@0.5:0.95", "{:.3f}, {:.3f}".format(*job["final"])),
            ("main job: epoch 1 mAP@0.5, mAP@0.5:0.95", "{:.3f}, {:.3f}".format(*job["epoch1"])),
            ("main job: best epoch, its mAP@0.5, mAP@0.5:0.95", "{}, {:.3f}, {:.3f}".format(*job["best"])),
        ]
        images = job["val_images"]
    else:
        from ddp_utils.data import make_shapes_dataset

        images = make_shapes_dataset(workdir / "shapes", n_train=1, n_val=64, size=(256, 384), seed=0) / "images/val"
    for name, size in model_sizes().items():
        fused = f"{size['fused_params'] / 1e6:.2f} M, {size['fused_gflops']:.2f}"
        rows += [
            (f"{name}: summary (640 px)", size["summary"]),
            (f"{name}: fused parameters, GFLOPs (640 px)", fused),
        ]  # fmt: skip
    rows.append(("read_image / cv2.imread time (JPEG decode)", f"{decode_ratio(images):.2f}"))
    pngs = png_copies(images, workdir / "png")
    rows.append(("read_image / cv2.imread time (PNG decode)", f"{decode_ratio(pngs, suffix='.png'):.2f}"))
    rows.append(("decoder stderr caught: one window, around nothing", f"{window_microseconds():.1f} us"))
    width = max(len(k) for k, _ in rows)
    print(f"\nREADME figures ({sys.platform}, {os.cpu_count()} cores, python {sys.version.split()[0]})")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if opt.keep or not opt.skip_main_job:
        print(f"\nfiles: {workdir}")


if __name__ == "__main__":
    main()
