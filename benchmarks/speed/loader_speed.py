"""How fast is our training loader against YOLOv5's, on the same images, side by side?

    python benchmarks/speed/loader_speed.py --yolov5 ../yolov5 --yolov5-python ../yolov5-venv/bin/python
        [--cases mosaic640 tiny64] [--rounds 5] [--dir runs/loader_speed]

Both loaders as a training run has them: ``create_dataloader`` with ``cache='ram'``, ``workers=0``
(the loader in the training process: what it costs shows in the epoch), batch 16, shuffled,
``hyp.scratch-low.yaml``'s augmentation (every sample a mosaic, HSV, flips), each in its own
interpreter (YOLOv5's in its checkout and venv: nothing of it is imported here), each with the
threads its library sets (YOLOv5 turns OpenCV's threads off at import; ours leaves them to OpenCV
where the loader runs in the training process, and turns them off in loader workers). The cases:

- ``mosaic640``: 400 synthetic shapes images of 480-640 px, ``--imgsz 640``: the mosaic's warps, HSV
  and the batch's assembly at full size;
- ``tiny64``: 10,000 images of 48-64 px, ``--imgsz 64``: the same steps on 64 x 64 samples cost
  little, so this is the per-sample overhead (Python, small allocations, labels), what a large dataset of
  small images pays once per image.

Each side's process builds its loader once (the RAM cache filled before timing), then times batches
on command: one warm-up epoch, then ``--rounds`` rounds of ``--batches`` batches each, the two sides
alternating (the order swapped every round), so a change of load on a shared host hits both alike.
Printed per case: images/s of each side (median over rounds), the ratio ours / YOLOv5 (median of the
per-round ratios, and its range), the host's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
from child_env import without_checkout  # noqa: E402  (children keep the caller's PYTHONPATH)

CASES = {  # images, their sides (px), imgsz, batches timed per round
    "mosaic640": dict(n=400, size=(480, 640), imgsz=640, batches=25),
    "tiny64": dict(n=10_000, size=(48, 64), imgsz=64, batches=100),
}
BATCH = 16


def side_process(side: str, setup: dict) -> None:
    """One side's loader, timing batches on each ``go`` line of stdin (run in that side's interpreter)."""
    hyp = setup["hyp"]
    if side == "yolov5":
        sys.path.insert(0, os.getcwd())
        from utils.dataloaders import create_dataloader  # YOLOv5's, found in its checkout only

        loader, _ = create_dataloader(
            setup["train"], setup["imgsz"], BATCH, 32, hyp=hyp, augment=True, cache="ram", workers=0, shuffle=True
        )
    else:
        sys.path.insert(0, str(REPO))
        from ddp_utils.data import create_dataloader

        loader, _ = create_dataloader(
            setup["train"], setup["imgsz"], BATCH, 32, hyp=hyp, augment=True, cache="ram", workers=0, shuffle=True
        )
    import cv2
    import torch

    epoch, batches = 0, None

    def next_batch():
        nonlocal epoch, batches
        if batches is not None:
            batch = next(batches, None)
            if batch is not None:
                return batch
        epoch += 1
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        batches = iter(loader)
        return next(batches)

    threads = dict(cv2=cv2.getNumThreads(), torch=torch.get_num_threads())
    print(json.dumps(dict(ready=len(loader), threads=threads)), flush=True)
    for line in sys.stdin:
        count = int(line.split()[1])
        start = time.perf_counter()
        images = sum(next_batch()[0].shape[0] for _ in range(count))
        print(json.dumps(dict(images=images, seconds=time.perf_counter() - start)), flush=True)


class Side:
    """A side's process, started in its interpreter and directory, answering ``go N`` with its timing."""

    def __init__(self, name: str, python: str, cwd: Path, setup_file: Path) -> None:
        env = without_checkout()
        env.setdefault("YOLOV5_CONFIG_DIR", str(setup_file.parent / "yolov5_config"))
        command = [python, str(Path(__file__).resolve()), "--side", name, "--setup", str(setup_file)]
        self.name = name
        self.proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ready = self._answer()

    def _answer(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise SystemExit(f"loader_speed: {self.name}'s process ended (exit {self.proc.wait()}); its errors are above")

    def time(self, batches: int) -> float:
        """images/s over ``batches`` batches."""
        self.proc.stdin.write(f"go {batches}\n")
        self.proc.stdin.flush()
        done = self._answer()
        return done["images"] / done["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_case(name: str, args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(REPO))
    from ddp_utils.data.synthetic import make_shapes_dataset
    from ddp_utils.hyp import load_hyp

    case = CASES[name]
    root = args.dir.resolve() / name
    if not (root / "shapes.json").is_file():
        make_shapes_dataset(root, case["n"], 1, case["size"], seed=0)
    fonts = args.dir.resolve() / "yolov5_config"  # YOLOv5 may fetch Arial.ttf into its config dir; offline, give one
    fonts.mkdir(exist_ok=True)
    if not (fonts / "Arial.ttf").is_file():
        import shutil

        import matplotlib

        shutil.copy(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf", fonts / "Arial.ttf")
    setup = dict(train=str(root / "images" / "train"), imgsz=case["imgsz"], hyp=load_hyp(args.hyp))
    setup_file = args.dir.resolve() / f"{name}.json"
    setup_file.write_text(json.dumps(setup))
    sides = {"ours": Side("ours", sys.executable, REPO, setup_file)}
    sides["yolov5"] = Side("yolov5", args.yolov5_python or sys.executable, args.yolov5.resolve(), setup_file)
    try:
        for side in sides.values():
            side.time(side.ready["ready"])  # a warm-up epoch
        rates: dict[str, list[float]] = {"ours": [], "yolov5": []}
        for r in range(args.rounds):
            for side_name in ("ours", "yolov5") if r % 2 == 0 else ("yolov5", "ours"):
                rates[side_name].append(sides[side_name].time(args.batches or case["batches"]))
    finally:
        for side in sides.values():
            side.close()
    ratios = [ours / theirs for ours, theirs in zip(rates["ours"], rates["yolov5"])]
    threads = {k: side.ready["threads"] for k, side in sides.items()}
    return dict(case=name, **case, rates=rates, ratios=ratios, threads=threads, load=os.getloadavg())


def table(results: list[dict]) -> str:
    lines = [
        "| case | ours img/s | YOLOv5 img/s | ours / YOLOv5 (median, range) | OpenCV threads ours / YOLOv5 | load |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        ours, theirs = statistics.median(r["rates"]["ours"]), statistics.median(r["rates"]["yolov5"])
        spread = f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}"
        cv2_threads = f"{r['threads']['ours']['cv2']} / {r['threads']['yolov5']['cv2']}"
        lines.append(
            f"| {r['case']} ({r['n']} images of {r['size'][0]}-{r['size'][1]} px, --imgsz {r['imgsz']}) | "
            f"{ours:.0f} | {theirs:.0f} | {statistics.median(r['ratios']):.2f}x ({spread}) | {cv2_threads} | "
            f"{r['load'][0]:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--yolov5", type=Path, help="an ultralytics/yolov5 checkout (v7.0)")
    add("--yolov5-python", help="the interpreter that runs YOLOv5 (its own venv); default: this one")
    add("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    add("--rounds", type=int, default=5)
    add("--batches", type=int, default=0, help="batches per round (default: the case's)")
    add("--hyp", default="hyp.scratch-low.yaml")
    add("--dir", type=Path, default=REPO / "runs" / "loader_speed")
    add("--json", type=Path, help="also write the results here")
    add("--side", help=argparse.SUPPRESS)
    add("--setup", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        side_process(args.side, json.loads(args.setup.read_text()))
        return 0
    if args.yolov5 is None or not (args.yolov5 / "utils" / "dataloaders.py").is_file():
        parser.error(f"--yolov5 {args.yolov5}: give an ultralytics/yolov5 checkout (with utils/dataloaders.py)")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} must be >= 1")
    args.dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.cases:
        results.append(run_case(name, args))
        print(f"loader_speed: {name}: ours {results[-1]['rates']['ours']}, yolov5 {results[-1]['rates']['yolov5']}")
    print("\n" + table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
