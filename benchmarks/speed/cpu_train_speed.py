"""Training speed on this CPU: our train.py in each compute mode beside YOLOv5's train.py, epoch by epoch.

    python benchmarks/speed/cpu_train_speed.py --yolov5 ../yolov5 --yolov5-python ../yolov5-venv/bin/python
        [--cfgs yolov5n.yaml yolov5s.yaml] [--modes off default] [--compile-cfgs yolov5n.yaml]
        [--bf16-cfgs yolov5n.yaml] [--epochs 3] [--rounds 1]

One synthetic shapes dataset (made as ``benchmarks/parity/parity.py`` makes it, with its hyp: nominal batch
64, ``--workers 0``, ``--noval --noplots``, ``OMP_NUM_THREADS`` the same for every run) is trained on
by YOLOv5's ``train.py`` (its checkout and interpreter; nothing of it imported here) and by ours in
each compute mode:

- ``off``: ``--amp off``, fp32 in NCHW: the exact path, YOLOv5's arithmetic;
- ``default``: no ``--amp``: the mode train.py picks for this CPU (``ddp_utils.engine.amp.train_mode``,
  named in the table: channels_last where oneDNN runs the convolutions, bf16 only where native and
  allowed by ``CPU_BF16_BY_DEFAULT``);
- ``compile``: the default mode plus ``--compile`` (inductor; its first epoch holds the compilation);
- ``bf16``: ``--amp bf16``: autocast to bf16, emulated (slow) on a CPU without avx512_bf16 or amx_bf16.

Each run's epochs are timed from its log, as parity.py times them (``parity_record.py``: YOLOv5's
progress bars, our epoch lines), so start-up checks and YOLOv5's final validation are left out. The
table gives, per model and mode, the first epoch (compilation, first-touch allocations) and the median of
the others (steady state), YOLOv5's steady epoch over ours (> 1: ours is faster), and the last epoch's
train loss (box + obj + cls, from results.csv): with one seed, the modes' losses show how far their
arithmetic moved the run (fp32 in either layout: rounding only; YOLOv5's: its own draws). The runs of one
round follow each other in the order of ``--modes`` (YOLOv5 first), the order reversed every other
round, so a change of load on a shared host hits all alike; medians over rounds. The host's load
average is printed with each run: on a shared host the figures are only as quiet as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))  # benchmarks/parity/: parity, parity_record
import parity  # noqa: E402  (the dataset, the options both trainers share, the timed runs)
from child_env import with_pythonpath  # noqa: E402  (children keep the caller's PYTHONPATH)
from parity_record import finished_run_host, ours_epoch_seconds  # noqa: E402

MODES = {  # our extra options per mode
    "off": ["--amp", "off"],
    "default": [],
    "compile": ["--compile"],
    "bf16": ["--amp", "bf16"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--yolov5", type=Path, help="an ultralytics/yolov5 checkout (v7.0); leave out to time our side only")
    add("--yolov5-python", default=None, help="the interpreter that runs YOLOv5 (its own venv); default: this one")
    add("--cfgs", nargs="+", default=["yolov5n.yaml", "yolov5s.yaml"], help="model yamls both trainers ship")
    add("--modes", nargs="+", choices=list(MODES), default=["off", "default"], help="our modes for every model")
    add("--compile-cfgs", nargs="*", default=["yolov5n.yaml"], help="models also timed with --compile")
    add("--bf16-cfgs", nargs="*", default=["yolov5n.yaml"], help="models also timed with --amp bf16 (slow here)")
    add("--bf16-epochs", type=int, default=1, help="epochs of the bf16 runs (emulated bf16 is several times slower)")
    add("--epochs", type=int, default=3)
    add("--rounds", type=int, default=1)
    add("--imgsz", type=int, default=128)
    add("--batch-size", type=int, default=16)
    add("--n-train", type=int, default=128, help="train images (a multiple of the batch size)")
    add("--size", type=int, nargs=2, default=[96, 160], metavar=("MIN", "MAX"), help="image sides (px)")
    add("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run")
    add("--hyp", default="hyp.shapes.yaml")
    add("--dir", type=Path, default=REPO / "runs" / "cpu_train_speed")
    add("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    problems = []
    if args.yolov5 is not None:
        problems += [p for cfg in args.cfgs for p in parity.yolov5_problems(args.yolov5, cfg)]
    if args.n_train % args.batch_size:
        problems.append(f"--n-train {args.n_train}: give a multiple of --batch-size {args.batch_size}")
    if min(args.epochs, args.rounds, args.bf16_epochs) < 1:
        problems.append("--epochs, --bf16-epochs and --rounds must be >= 1")
    if problems:
        parser.error("; ".join(problems))
    # what parity.prepare_inputs and parity.common_options read
    args.n_val, args.data_seed, args.ours_amp = 16, 0, None
    return args


def run_side(args: argparse.Namespace, inputs: dict[str, Path], cfg: str, mode: str) -> dict[str, Any]:
    """One training run, timed: its epochs' seconds from its log, and the load average around it."""
    epochs = args.bf16_epochs if mode == "bf16" else args.epochs
    run_args = argparse.Namespace(**{**vars(args), "cfg": cfg, "epochs": epochs})
    work = inputs["work"] / cfg.removesuffix(".yaml") / mode
    load_before = os.getloadavg()[0]
    if mode == "yolov5":
        result = parity.run_yolov5(run_args, {**inputs, "work": work}, 0)
    else:
        env = with_pythonpath(parity.thread_env(args.threads))
        command = [
            sys.executable, str(REPO / "train.py"), "--cfg", cfg, *parity.common_options(run_args, inputs, 0),
            "--progress", "off", "--project", str(work), "--name", "ours", *MODES[mode],
        ]  # fmt: skip
        work.mkdir(parents=True, exist_ok=True)
        log = work / "ours.log"
        wall, _ = parity.timed_run(command, inputs["work"], env, log)
        text = log.read_text(errors="replace")
        chosen = next((line.split("compute: ")[-1] for line in text.splitlines() if "compute: " in line), "")
        result = dict(
            wall_s=wall,
            epoch_s=ours_epoch_seconds(text, args.n_train),
            mode_line=chosen.strip(),
            losses=parity.train_losses(work / "ours" / "results.csv"),
        )
    result.update(load=[load_before, os.getloadavg()[0]], cfg=cfg, side=mode)
    print(
        f"cpu_train_speed: {cfg} {mode}: epochs {[round(s, 2) for s in result['epoch_s']]} s, "
        f"load {result['load'][0]:.1f}-{result['load'][1]:.1f}",
        flush=True,
    )
    return result


def steady(epoch_s: list[float]) -> float:
    """The median epoch after the first (the only one when there is one)."""
    return statistics.median(epoch_s[1:] or epoch_s)


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| model | run | first epoch (s) | steady epoch (s) | YOLOv5 / ours (steady) | last epoch's loss | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for cfg in dict.fromkeys(run["cfg"] for run in runs):
        by_side: dict[str, list[dict]] = {}
        for run in runs:
            if run["cfg"] == cfg:
                by_side.setdefault(run["side"], []).append(run)
        theirs = (
            statistics.median(steady(r["epoch_s"]) for r in by_side.get("yolov5", [])) if "yolov5" in by_side else None
        )
        for side, side_runs in by_side.items():
            first = statistics.median(r["epoch_s"][0] for r in side_runs)
            ours = statistics.median(steady(r["epoch_s"]) for r in side_runs)
            ratio = f"{theirs / ours:.2f}x" if theirs and side != "yolov5" else ""
            load = statistics.median(sum(r["load"]) / 2 for r in side_runs)
            name = "YOLOv5 train.py" if side == "yolov5" else f"ours {side}"
            words = side_runs[0].get("mode_line", "")
            name += f" ({words})" if words else ""
            losses = [sum(r["losses"][-1]) for r in side_runs if r["losses"]]
            loss = f"{statistics.median(losses):.6f}" if losses else ""
            model = cfg.removesuffix(".yaml")
            lines.append(f"| {model} | {name} | {first:.2f} | {ours:.2f} | {ratio} | {loss} | {load:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    inputs = parity.prepare_inputs(args)
    sides = (["yolov5"] if args.yolov5 is not None else []) + list(args.modes)
    runs = []
    start = time.time()
    for r in range(args.rounds):
        for cfg in args.cfgs:
            order = sides + [
                mode
                for mode, cfgs in (("compile", args.compile_cfgs), ("bf16", args.bf16_cfgs))
                if cfg in cfgs and mode not in sides
            ]
            for mode in order if r % 2 == 0 else order[::-1]:
                runs.append(run_side(args, inputs, cfg, mode))
    print(f"\nhost: {finished_run_host()}; {args.threads} thread(s) per run; {time.time() - start:.0f} s in all")
    print(
        f"regime: {args.n_train} images of {args.size[0]}-{args.size[1]} px, --imgsz {args.imgsz}, "
        f"--batch-size {args.batch_size}, {args.epochs} epochs ({args.bf16_epochs} for bf16), {args.hyp}, workers 0\n"
    )
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
