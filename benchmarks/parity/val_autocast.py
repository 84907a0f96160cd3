"""Does validating under bf16 autocast score as validating in fp32? The same checkpoints, both ways, side by side.

    python benchmarks/parity/val_autocast.py --results runs/parity/results.json [--data runs/parity/data.yaml]
    python benchmarks/parity/val_autocast.py --weights a/last.pt b/last.pt --data runs/parity/data.yaml --imgsz 160

Each checkpoint's weights (the final EMA, as train.py validates it: not fused) are scored on the data yaml's val split
by ``ddp_utils.yolo.evaluate``, as train.py's validation calls it, twice: in fp32 (``amp_dtype=None``) and with the
network under bf16 autocast (``amp_dtype=torch.bfloat16``, what a ``--amp bf16`` run validates in), the box decode and
NMS in fp32 either way. Printed: both mAP@0.5:0.95 and mAP@0.5 per checkpoint, their differences, and the goal
(issue 47): every |difference| of mAP@0.5:0.95 at most 0.002. ``--results`` takes the checkpoints of a parity
results.json (``parity.py``), with its data yaml and image size; ``--out`` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # this checkout's ddp_utils, not another installed copy

GOAL = 0.002  # issue 47: bf16 validation within 0.002 mAP@0.5:0.95 of an fp32 validation of the same weights
MODES = {"fp32": None, "bf16": "bfloat16"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, nargs="+", default=[], help="parity results.json files")
    parser.add_argument("--weights", type=Path, nargs="+", default=[], help="checkpoints (train.py's last.pt)")
    parser.add_argument("--data", type=Path, help="data yaml (default: the results.json's directory's data.yaml)")
    parser.add_argument("--imgsz", type=int, help="image size (default: the results.json's)")
    parser.add_argument("--batch-size", type=int, default=32, help="validation batch (train.py's: 2x its batch)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    problems = [f"--results {f}: no such file" for f in args.results if not f.is_file()]
    problems += [f"--weights {f}: no such file" for f in args.weights if not f.is_file()]
    if not args.results and not args.weights:
        problems.append("give --results or --weights")
    if args.results and not problems:
        setup = json.loads(args.results[0].read_text())["setup"]["args"]
        args.imgsz = args.imgsz or setup["imgsz"]
        args.data = args.data or Path(setup["dir"]) / "data.yaml"
    if args.data is None or args.imgsz is None:
        problems.append("--weights needs --data and --imgsz")
    elif not args.data.is_file():
        problems.append(f"--data {args.data}: no such file")
    if problems:
        parser.error("; ".join(problems))
    return args


def checkpoints(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """(label, last.pt) of every checkpoint asked for: the results' runs (by seed) and the --weights."""
    found = []
    for results in args.results:
        runs = json.loads(results.read_text())["runs"]
        amp = {run["ours"].get("key", {}).get("amp", "?") for run in runs.values() if "ours" in run}
        for seed in sorted(runs, key=int):
            if "ours" in runs[seed]:
                found.append((f"{'/'.join(sorted(amp))} seed {seed}", Path(runs[seed]["ours"]["weights"])))
    return found + [(str(weights), weights) for weights in args.weights]


def score(weights: Path, loader: Any, modes: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The checkpoint's EMA scored by ``evaluate`` in each mode: {mode: {"map50", "map", "seconds"}}."""
    import torch

    from ddp_utils.run.checkpoint import load_pretrained
    from ddp_utils.yolo import Model, evaluate

    ckpt = load_pretrained(weights)
    model = Model(ckpt["model_cfg"])
    model.load_state_dict(ckpt["model"])
    model.eval()
    scores = {}
    for mode, dtype in modes.items():
        start = time.perf_counter()
        metrics, _ = evaluate(model, loader, amp_dtype=getattr(torch, dtype) if dtype else None, verbose=False)
        scores[mode] = dict(map50=float(metrics["map50"]), map=float(metrics["map"]))
        scores[mode]["seconds"] = time.perf_counter() - start
    return scores


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the rows, and the goal's verdict over them."""
    header = ["checkpoint", "fp32 mAP@0.5:0.95", "bf16 mAP@0.5:0.95", "difference", "fp32 mAP@0.5", "bf16 mAP@0.5"]
    lines = ["| " + " | ".join([*header, "difference"]) + " |", "|---" * (len(header) + 1) + "|"]
    for row in rows:
        fp32, bf16 = row["scores"]["fp32"], row["scores"]["bf16"]
        lines.append(
            f"| {row['label']} | {fp32['map']:.4f} | {bf16['map']:.4f} | {bf16['map'] - fp32['map']:+.4f} | "
            f"{fp32['map50']:.4f} | {bf16['map50']:.4f} | {bf16['map50'] - fp32['map50']:+.4f} |"
        )
    if not rows:
        return "\n".join(lines)
    worst = max(abs(row["scores"]["bf16"]["map"] - row["scores"]["fp32"]["map"]) for row in rows)
    verdict = "met" if worst <= GOAL else "NOT met"
    lines += ["", f"goal: every |bf16 - fp32| of mAP@0.5:0.95 at most {GOAL}: largest {worst:.4f} over "
              f"{len(rows)} checkpoint(s): {verdict}"]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from ddp_utils.data import check_dataset, create_val_dataloader

    torch.set_num_threads(args.threads)
    data = check_dataset(str(args.data))
    loader, _ = create_val_dataloader(data["val"], args.imgsz, args.batch_size, 32, workers=0, prefix="val: ")
    rows = []
    for label, weights in checkpoints(args):
        rows.append(dict(label=label, weights=str(weights), scores=score(weights, loader, MODES)))
        print(f"val_autocast: {label}: {json.dumps(rows[-1]['scores'])}", flush=True)
    print("\n" + table(rows))
    if args.out is not None:
        record = dict(data=str(args.data), imgsz=args.imgsz, threads=args.threads, torch=torch.__version__,
                      cores=os.cpu_count(), rows=rows)  # fmt: skip
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
