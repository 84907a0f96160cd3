"""Does our train.py learn as well as YOLOv5's? Both trained side by side on one dataset, over seeds.

    python benchmarks/parity/parity.py --yolov5 ../yolov5 --yolov5-python ../yolov5-venv/bin/python
    python benchmarks/parity/parity.py --ours-only --epochs 1          # our side alone: no YOLOv5 checkout
    python benchmarks/parity/parity.py --table runs/parity/results.json  # the tables again, from saved results
    python benchmarks/parity/parity.py --ours-only --ours-augment-on device  # the device path (torch ops on the CPU)

One synthetic shapes dataset (``ddp_utils.data.synthetic``: a train split and a held-out split
that neither trainer selects on) feeds YOLOv5's ``train.py`` (an ultralytics/yolov5 checkout, run by
its own interpreter, nothing of it imported here) and ours, with the same model yaml (yolov5n), hyp
yaml, epochs, image size, batch size and nominal batch, ``--workers 0``, ``--noval --noplots``, on the
CPU, one thread each (``OMP_NUM_THREADS``), one run after the other (the order alternates by seed, so a
change of load on a shared host hits both sides alike). Then THE SAME evaluator scores both final
models on the held-out split: ``ddp_utils.cli.val`` (``python -m ddp_utils val``), which reads
YOLOv5's ``last.pt`` without unpickling it. Both ``last.pt`` hold the final EMA (YOLOv5 stores it in
fp16, we in fp32).

The nominal batch: YOLOv5's train.py hard-codes ``nbs = 64`` and at least 100 warm-up iterations,
so the hyp given to both says ``nbs: 64`` and ``warmup_min_iters: 100`` (ours reads them; YOLOv5
ignores keys it does not know): both accumulate ``round(64 / batch)`` batches per optimizer step
(batch 16: 4) and scale the weight decay alike, with no edit of YOLOv5's tree.

Two things YOLOv5's train.py needs offline: it fetches Arial.ttf at start-up (given here: matplotlib's
DejaVuSans under that name in ``YOLOV5_CONFIG_DIR``), and with torch >= 2.6 it cannot reload its own
pickled checkpoints (``torch.load``'s default became ``weights_only=True``):
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` gives back the old default, in its process only. YOLOv5's
AutoAnchor stays on, as a user has it; its verdict is recorded per run (on this data it keeps the
default anchors: best possible recall 1.000).

Printed: held-out mAP@0.5 and mAP@0.5:0.95 per seed with mean and standard deviation (n - 1); the
epochs' wall time of each run (from its log, ``parity_record.py``: a whole process also holds YOLOv5's
online checks at start and its second validation of best.pt at the end), the whole process's wall and
CPU time, and the ratios ours / YOLOv5 where both sides ran on the same host; and the per-epoch train
losses (box, obj, cls; the mean over seeds) of both. The goal (ours' mean mAP@0.5:0.95 within one
standard deviation of YOLOv5's) is judged over two seeds or more with scores above 0.

Every finished run is written to ``<dir>/results.json`` at once, so ``--table`` prints the tables again.
Each run carries the key of what produced it: the regime (``setup.description``) and, for YOLOv5, its
checkout's commit and the interpreter (path, Python and torch versions); for ours, the compute mode
(``--ours-amp``, resolved as train.py resolves it on this CPU) and, for ``--ours-augment-on device`` (the
device path's decode and augmentation, its torch ops run on the CPU), where the images are made. A later
call keeps the runs in ``--dir`` and in ``--reuse FILE`` whose key is the current one and adds the missing
ones: ``--ours-amp bf16 --reuse benchmarks/results/parity-yolov5n-shapes.json`` trains only our side.
``--ours-bf16-conv fp32`` (with ``--ours-amp bf16``) computes the bf16 convolutions as ``bf16_conv.py`` says, fast on
a CPU without native bf16; its runs' key says so. ``parity_compare.py`` sets two results of our side side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # this checkout's ddp_utils, not another installed copy
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/parity/: parity_record
from child_env import with_pythonpath, without_checkout  # noqa: E402  (children keep the caller's PYTHONPATH)
from parity_record import finished_run_host, ours_epoch_seconds, side_keys, yolov5_epoch_seconds  # noqa: E402

NBS = 64  # YOLOv5's train.py: nbs = 64, hard-coded
WARMUP_MIN_ITERS = 100  # YOLOv5's train.py: nw = max(round(warmup_epochs * nb), 100)
LOSSES = ("box", "obj", "cls")
SIDES = ("yolov5", "ours")
STEADY_STD_RATIO = 1.5  # a short schedule's goal: ours' spread over seeds at most this times YOLOv5's,
STEADY_MEAN_RATIO = 0.95  # and ours' mean at least this fraction of YOLOv5's
NAMES = {0: "circle", 1: "square", 2: "triangle", 3: "star"}
YOLOV5_UNTIMED = (  # why YOLOv5's epoch times read "-": parity_record.py reads the progress bars of v7.0 alone
    "{log} holds no epoch progress bar in YOLOv5 v7.0's form (ending '100%|##########| 63/63 00:09': "
    "parity_record.YOLOV5_EPOCH_BAR), as a checkout of another version prints its bars otherwise; so YOLOv5's "
    "epochs are not timed, nor the epochs' ratio, while its whole process's wall and CPU time are"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--yolov5", type=Path, help="an ultralytics/yolov5 checkout (v7.0: its train.py needs no ultralytics package)")
    add("--yolov5-python", default=None, help="the interpreter that runs YOLOv5 (its own venv); default: this one")
    add("--ours-only", action="store_true", help="run our side alone (no YOLOv5 checkout needed)")
    add("--ours-amp", choices=["bf16", "off"], help="our --amp (default: none, train.py's mode for this CPU)")
    add("--ours-bf16-conv", choices=["torch", "fp32"], default="torch", help="with --ours-amp bf16: torch's own "
        "bf16 convolutions, or fp32 ones on the bf16-rounded operands, rounded to bf16 (bf16_conv.py: the same "
        "numbers, 6x as fast on a CPU without native bf16)")  # fmt: skip
    add("--ours-augment-on", choices=["workers", "device"], default="workers", help="our --augment-on (the CPU: "
        "device runs the device path's torch ops on the CPU)")  # fmt: skip
    add("--reuse", type=Path, nargs="+", default=[], help="results.json files whose runs with the current key count")
    add("--table", type=Path, help="print the tables of a results.json and exit")
    add("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--seed of each pair of runs")
    add("--epochs", type=int, default=30)
    add("--imgsz", type=int, default=160)
    add("--batch-size", type=int, default=16, help="batch size of both (accumulated to the nominal batch 64)")
    add("--cfg", default="yolov5n.yaml", help="model yaml: a name both trainers ship")
    add("--hyp", default="hyp.shapes.yaml", help="hyp yaml (ours or a path); nbs and warmup_min_iters are set")
    add("--n-train", type=int, default=1000, help="train images")
    add("--n-val", type=int, default=200, help="held-out images")
    add("--size", type=int, nargs=2, default=[160, 256], metavar=("MIN", "MAX"), help="image sides (px)")
    add("--data-seed", type=int, default=0, help="the synthetic dataset's seed")
    add("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run")
    add("--dir", type=Path, default=REPO / "runs" / "parity", help="work directory (dataset, runs, results.json)")
    args = parser.parse_args(argv)
    if args.table is not None:
        if not args.table.is_file():
            parser.error(f"--table {args.table}: no such file")
        return args
    problems = [
        f"--{name.replace('_', '-')} {getattr(args, name)} must be >= {low}"
        for name, low in (("epochs", 1), ("batch_size", 1), ("n_train", 1), ("n_val", 1), ("threads", 1))
        if getattr(args, name) < low
    ]
    if args.imgsz < 64 or args.imgsz % 32:
        problems.append(f"--imgsz {args.imgsz} must be a multiple of 32, at least 64")
    if not 32 <= args.size[0] <= args.size[1]:
        problems.append(f"--size {args.size[0]} {args.size[1]}: give the smallest and largest side, both >= 32")
    if args.ours_bf16_conv != "torch" and args.ours_amp != "bf16":
        problems.append(f"--ours-bf16-conv {args.ours_bf16_conv} is for --ours-amp bf16")
    if len(set(args.seeds)) != len(args.seeds):
        problems.append(f"--seeds {' '.join(map(str, args.seeds))}: each seed once")
    if args.ours_only:
        if args.yolov5 is not None:
            problems.append("--ours-only and --yolov5 exclude each other")
    elif args.yolov5 is None:
        problems.append("--yolov5 PATH (an ultralytics/yolov5 checkout) is needed, or --ours-only")
    else:
        problems += yolov5_problems(args.yolov5, args.cfg)
        python = args.yolov5_python or sys.executable
        if shutil.which(python) is None:
            problems.append(f"--yolov5-python {python}: no such interpreter")
    if problems:
        parser.error("; ".join(problems))
    return args


def yolov5_problems(checkout: Path, cfg: str) -> list[str]:
    """Why ``checkout`` is not a YOLOv5 tree this benchmark can run (empty when it is)."""
    if not (checkout / "train.py").is_file():
        return [f"--yolov5 {checkout}: no train.py there; give an ultralytics/yolov5 checkout"]
    if not (checkout / "models" / cfg).is_file():
        return [f"--yolov5 {checkout}: no models/{cfg} there"]
    train_py = (checkout / "train.py").read_text(encoding="utf-8", errors="replace")
    if "nbs = 64" not in train_py:
        return [f"--yolov5 {checkout}: its train.py does not set nbs = 64, which the hyp given to both assumes"]
    return []


# ---- the inputs both trainers share ----


def prepare_inputs(args: argparse.Namespace) -> dict[str, Path]:
    """The dataset (made once, reused while its settings match), the data yaml and the hyp yaml."""
    import yaml

    from ddp_utils.data.synthetic import make_shapes_dataset
    from ddp_utils.hyp import load_hyp

    work = args.dir.resolve()
    root = work / "shapes"
    manifest = dict(n_train=args.n_train, n_val=args.n_val, size=list(args.size), seed=args.data_seed)
    made = root / "shapes.json"
    if made.is_file():
        found = json.loads(made.read_text())
        if {k: found.get(k) for k in manifest} != manifest:
            raise SystemExit(f"parity: {root} holds another dataset ({found}); remove it or choose another --dir")
    else:
        make_shapes_dataset(root, args.n_train, args.n_val, tuple(args.size), args.data_seed, list(NAMES.values()))
    data = work / "data.yaml"
    data.write_text(
        yaml.safe_dump(dict(path=str(root), train="images/train", val="images/val", nc=len(NAMES), names=NAMES))
    )
    hyp = load_hyp(args.hyp)
    hyp.update(nbs=NBS, warmup_min_iters=WARMUP_MIN_ITERS)  # YOLOv5's hard-coded values, said out loud for ours
    hyp_file = work / "hyp.yaml"
    hyp_file.write_text(yaml.safe_dump(hyp, sort_keys=False))
    fonts = work / "yolov5_config"  # YOLOv5 fetches Arial.ttf into its config dir at start-up; offline, give one
    fonts.mkdir(exist_ok=True)
    if not (fonts / "Arial.ttf").is_file():
        import matplotlib

        shutil.copy(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf", fonts / "Arial.ttf")
    return dict(work=work, data=data, hyp=hyp_file, yolov5_config=fonts)


def common_options(args: argparse.Namespace, inputs: dict[str, Path], seed: int) -> list[str]:
    """The options both train.py take, with the same meaning."""
    return [
        "--data", str(inputs["data"]), "--hyp", str(inputs["hyp"]), "--epochs", str(args.epochs),
        "--imgsz", str(args.imgsz), "--batch-size", str(args.batch_size), "--workers", "0", "--seed", str(seed),
        "--device", "cpu", "--noval", "--noplots", "--exist-ok",
    ]  # fmt: skip


# ---- running one side ----


def timed_run(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, float]:
    """Run ``command`` to the end, its output to ``log``: (wall seconds, CPU seconds of it and its children)."""
    with log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise SystemExit(
            f"parity: {' '.join(command[:3])} ... exited {proc.returncode}; see {log}:\n" + "\n".join(tail)
        )
    return wall, usage.ru_utime + usage.ru_stime


def thread_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    return env


def run_yolov5(args: argparse.Namespace, inputs: dict[str, Path], seed: int) -> dict[str, Any]:
    run_dir = inputs["work"] / "yolov5" / f"seed{seed}"
    env = without_checkout(thread_env(args.threads))  # YOLOv5 imports its own models/ and utils/ from its checkout
    env.update(YOLOV5_CONFIG_DIR=str(inputs["yolov5_config"]), TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    command = [
        args.yolov5_python or sys.executable, "train.py", "--cfg", f"models/{args.cfg}", "--weights", "",
        *common_options(args, inputs, seed), "--project", str(run_dir.parent), "--name", run_dir.name,
    ]  # fmt: skip
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    wall, cpu = timed_run(command, args.yolov5.resolve(), env, run_dir.parent / f"seed{seed}.log")
    log = (run_dir.parent / f"seed{seed}.log").read_text(errors="replace")
    anchors = next((line for line in log.splitlines() if "Best Possible Recall" in line), "")
    result = finished_run(run_dir, wall, cpu)
    result["epoch_s"] = yolov5_epoch_seconds(log)
    if not result["epoch_s"]:
        print(
            f"parity: seed {seed}: yolov5: no epoch times: "
            + YOLOV5_UNTIMED.format(log=run_dir.parent / f"seed{seed}.log")
        )
    result["autoanchor"] = anchors.split("AutoAnchor:")[-1].replace("\x1b[0m", "").strip()
    return result


def run_ours(args: argparse.Namespace, inputs: dict[str, Path], seed: int) -> dict[str, Any]:
    run_dir = inputs["work"] / "ours" / f"seed{seed}"
    env = with_pythonpath(thread_env(args.threads))
    conv = [str(Path(__file__).resolve().parent / "bf16_conv.py")] if args.ours_bf16_conv == "fp32" else []
    command = [
        sys.executable, *conv, str(REPO / "train.py"), "--cfg", args.cfg, *common_options(args, inputs, seed),
        "--progress", "off", "--project", str(run_dir.parent), "--name", run_dir.name,
    ]  # fmt: skip
    command += ["--amp", args.ours_amp] if args.ours_amp else []
    command += ["--augment-on", args.ours_augment_on]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    wall, cpu = timed_run(command, inputs["work"], env, run_dir.parent / f"seed{seed}.log")
    result = finished_run(run_dir, wall, cpu)
    log = (run_dir.parent / f"seed{seed}.log").read_text(errors="replace")
    result["epoch_s"] = ours_epoch_seconds(log, args.n_train)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return result | dict(commit=commit or "unknown")


def finished_run(run_dir: Path, wall: float, cpu: float) -> dict[str, Any]:
    """What a run left: its per-epoch train losses (results.csv) and the held-out scores of its last.pt."""
    return dict(
        wall_s=wall,
        cpu_s=cpu,
        losses=train_losses(run_dir / "results.csv"),
        weights=str(run_dir / "weights" / "last.pt"),
        host=finished_run_host(),
    )


def train_losses(results_csv: Path) -> list[list[float]]:
    """[[box, obj, cls] per epoch] from a results.csv, ours or YOLOv5's (whose header is padded with spaces)."""
    with results_csv.open(newline="") as f:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    return [[float(row[f"train/{name}_loss"]) for name in LOSSES] for row in rows]


def held_out_scores(weights: str, data: Path, imgsz: int) -> dict[str, float]:
    """``python -m ddp_utils val`` on the held-out split, in this process: precision, recall, mAP@0.5, mAP@0.5:0.95."""
    import torch

    import ddp_utils as du
    from ddp_utils.cli import val

    opt = val.parse_opt(
        ["--weights", weights, "--data", str(data), "--imgsz", str(imgsz), "--workers", "0", "--progress", "off"]
    )
    with contextlib.redirect_stdout(io.StringIO()):  # its table: the figures go in ours
        metrics = val.validate(opt, torch.device("cpu"), du.dist_info())
    return {key: float(metrics[key]) for key in ("precision", "recall", "map50", "map")}


# ---- the report ----


def summary(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def report(results: dict[str, Any]) -> str:
    """The markdown tables of a results dict (what results.json holds)."""
    setup, runs = results["setup"], results["runs"]
    seeds = sorted({int(s) for s in runs}, key=int)
    sides = [side for side in SIDES if all(side in runs[str(s)] for s in seeds)]
    lines = [f"setup: {setup['description']}", ""]
    for side in sides:  # what made the runs, beyond the regime
        made = [runs[str(s)][side].get("key", {}) for s in seeds]
        keys = {json.dumps({k: v for k, v in key.items() if k != "regime"}) for key in made}
        lines += [f"{side}: {', '.join(sorted(keys))}"]
    timed = [s for s in seeds if len(sides) == 2 and _same_host(runs[str(s)])]
    for side, reason in results.get("skipped", {}).items():
        lines += [f"{side}: skipped ({reason})", ""]
    header = ["seed"]
    for label in ("mAP@0.5", "mAP@0.5:0.95"):
        header += [f"{side} {label}" for side in sides]
    header += [f"{side} epochs s" for side in sides] + [f"{side} wall s" for side in sides]
    header += [f"{side} CPU s" for side in sides]
    if timed:
        header += ["epochs YOLOv5/ours", "wall ours/YOLOv5", "CPU ours/YOLOv5"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    columns: dict[str, list[float]] = {h: [] for h in header[1:]}
    for seed in seeds:
        run = runs[str(seed)]
        row = [run[side]["scores"][key] for key in ("map50", "map") for side in sides]
        row += [sum(run[side].get("epoch_s", [])) or float("nan") for side in sides]
        row += [run[side]["wall_s"] for side in sides] + [run[side]["cpu_s"] for side in sides]
        if timed:
            theirs, ours = run["yolov5"], run["ours"]
            timed_both = theirs.get("epoch_s") and ours.get("epoch_s")
            epochs = sum(theirs["epoch_s"]) / sum(ours["epoch_s"]) if timed_both else float("nan")
            row += [epochs, ours["wall_s"] / theirs["wall_s"], ours["cpu_s"] / theirs["cpu_s"]]
            row[-3:] = row[-3:] if seed in timed else [float("nan")] * 3
        for h, v in zip(header[1:], row):
            if v == v:  # not NaN: a figure this run has
                columns[h].append(v)
        lines.append(f"| {seed} | " + " | ".join(_cell(h, v) for h, v in zip(header[1:], row)) + " |")
    stats = {h: summary(v) if v else (float("nan"), float("nan")) for h, v in columns.items()}
    lines.append("| mean | " + " | ".join(_cell(h, stats[h][0]) for h in header[1:]) + " |")
    lines.append("| std | " + " | ".join(_cell(h, stats[h][1]) for h in header[1:]) + " |")
    lines += untimed_lines(runs, seeds, sides)
    if len(sides) == 2:
        lines += ["", goal_line(columns["ours mAP@0.5:0.95"], columns["yolov5 mAP@0.5:0.95"])]
        if timed:
            lines[-1] += (
                f"; on the same host ({len(timed)} seed(s)): epochs' wall time YOLOv5/ours "
                + (f"{stats['epochs YOLOv5/ours'][0]:.2f}" if columns["epochs YOLOv5/ours"] else "- (no epoch times)")
                + ", whole process's wall ours/YOLOv5 "
                f"{stats['wall ours/YOLOv5'][0]:.2f}, CPU {stats['CPU ours/YOLOv5'][0]:.2f} "
                "(means of the per-seed ratios)"
            )
        lines += steadiness_lines(columns["ours mAP@0.5:0.95"], columns["yolov5 mAP@0.5:0.95"])
    anchors = {run["yolov5"].get("autoanchor") for run in runs.values() if "yolov5" in run}
    if anchors - {None, ""}:
        lines += ["", "YOLOv5 AutoAnchor: " + " / ".join(sorted(anchors - {None, ""}))]
    lines += ["", f"train loss per epoch, mean over {len(seeds)} seed(s): box / obj / cls", ""]
    lines += ["| epoch | " + " | ".join(sides) + (" | box ours/YOLOv5 |" if len(sides) == 2 else " |")]
    lines.append("|---|" + "---|" * (len(sides) + (len(sides) == 2)))
    curves = {side: _mean_curve([runs[str(s)][side]["losses"] for s in seeds]) for side in sides}
    for epoch in range(min(len(c) for c in curves.values())):
        cells = [" / ".join(f"{v:.4f}" for v in curves[side][epoch]) for side in sides]
        if len(sides) == 2:
            cells.append(f"{curves['ours'][epoch][0] / curves['yolov5'][epoch][0]:.3f}")
        lines.append(f"| {epoch + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def untimed_lines(runs: dict[str, Any], seeds: list[int], sides: list[str]) -> list[str]:
    """Why a side's epoch times read "-" for some seeds: runs recorded before epoch times were, or (YOLOv5's) logs
    whose progress bars are not v7.0's."""
    lines = []
    for side in sides:
        unread = [str(s) for s in seeds if "epoch_s" not in runs[str(s)][side]]
        if unread:
            lines += [f"{side} epochs s: - for seed(s) {', '.join(unread)}: recorded before parity.py read epoch times"]
    no_bar = [str(s) for s in seeds if "yolov5" in sides and runs[str(s)]["yolov5"].get("epoch_s") == []]
    if no_bar:
        why = YOLOV5_UNTIMED.format(log="its log (<--dir>/yolov5/seed<N>.log)")
        lines += [f"yolov5 epochs s: - for seed(s) {', '.join(no_bar)}: {why}"]
    return [""] + lines if lines else []


def goal_line(ours: list[float], theirs: list[float]) -> str:
    """The accuracy goal, judged only over two seeds or more of each side with some score above 0."""
    if min(len(ours), len(theirs)) < 2 or not any(ours + theirs):
        why = "fewer than 2 seeds" if min(len(ours), len(theirs)) < 2 else "every score is 0"
        return f"goal: not judged ({why}: no spread to judge it by)"
    (mean, _), (their_mean, spread) = summary(ours), summary(theirs)
    met = mean >= their_mean - spread
    return (
        f"goal: ours' mean held-out mAP@0.5:0.95 {mean:.3f} >= YOLOv5's mean minus one std "
        f"{their_mean:.3f} - {spread:.3f} = {their_mean - spread:.3f}: {'met' if met else 'NOT met'}"
    )


def steadiness_lines(ours: list[float], theirs: list[float]) -> list[str]:
    """A short schedule's question, over two seeds or more: as steady across seeds as YOLOv5, as good on average."""
    if min(len(ours), len(theirs)) < 2:
        return []
    (mean, ours_spread), (their_mean, spread) = summary(ours), summary(theirs)
    if spread <= 0 or their_mean <= 0:
        return []
    steady = ours_spread <= STEADY_STD_RATIO * spread and mean >= STEADY_MEAN_RATIO * their_mean
    return [
        f"steadiness over {len(ours)} seeds: std ours/YOLOv5 {ours_spread:.3f} / {spread:.3f} = "
        f"{ours_spread / spread:.2f} (at most {STEADY_STD_RATIO}), mean ours/YOLOv5 {mean / their_mean:.3f} "
        f"(at least {STEADY_MEAN_RATIO}): {'met' if steady else 'NOT met'}"
    ]


def _same_host(run: dict[str, Any]) -> bool:
    hosts = [run[side].get("host") for side in SIDES]
    return hosts[0] is not None and hosts[0] == hosts[1]


def _cell(header: str, value: float) -> str:
    if value != value:
        return "-"
    return f"{value:.0f}" if header.endswith(" s") else f"{value:.2f}" if "/" in header else f"{value:.3f}"


def _mean_curve(curves: list[list[list[float]]]) -> list[list[float]]:
    epochs = min(len(c) for c in curves)
    return [[statistics.fmean(c[e][k] for c in curves) for k in range(len(LOSSES))] for e in range(epochs)]


def describe(args: argparse.Namespace) -> str:
    import torch

    return (
        f"{args.cfg} from scratch, {args.n_train} train / {args.n_val} held-out synthetic shapes images of "
        f"{args.size[0]}-{args.size[1]} px (data seed {args.data_seed}), --imgsz {args.imgsz}, --batch-size "
        f"{args.batch_size} accumulated to nbs {NBS}, {args.epochs} epochs, hyp {Path(args.hyp).name} with nbs {NBS} "
        f"and warmup_min_iters {WARMUP_MIN_ITERS}, --workers 0, CPU, OMP_NUM_THREADS={args.threads}; "
        f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; held-out scores: "
        "python -m ddp_utils val on each last.pt (the final EMA)"
    )


def recorded_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options as results.json records them: paths (``--dir``, each ``--reuse``, ``--yolov5``) as strings."""

    def plain(value: Any) -> Any:
        if isinstance(value, list):
            return [plain(v) for v in value]
        return str(value) if isinstance(value, Path) else value

    return {key: plain(value) for key, value in vars(args).items()}


def reusable_runs(results: dict[str, Any], keys: dict[str, dict], seeds: set[str] | None) -> dict[str, dict]:
    """The runs of ``results`` (of ``seeds``; None: all) whose key is the current key of their side."""
    found = {}
    for seed, run in results.get("runs", {}).items():
        same = {side: r for side, r in run.items() if side in keys and r.get("key") == keys[side]}
        if same and (seeds is None or seed in seeds):
            found[seed] = same
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table is not None:
        print(report(json.loads(args.table.read_text())))
        return 0
    inputs = prepare_inputs(args)
    results_file = inputs["work"] / "results.json"
    results: dict[str, Any] = dict(setup=dict(description=describe(args), args=recorded_args(args)))
    results["runs"] = {}
    keys = side_keys(args, results["setup"]["description"])
    for source in ([results_file] if results_file.is_file() else []) + list(args.reuse):
        seeds = None if source == results_file else {str(seed) for seed in args.seeds}  # --dir's all, others' asked
        for seed, run in reusable_runs(json.loads(source.read_text()), keys, seeds).items():
            kept = results["runs"].setdefault(seed, {})
            kept.update({side: found for side, found in run.items() if side not in kept})
            print(f"parity: seed {seed}: keeping the run(s) of {', '.join(run)} from {source}", flush=True)
    if args.ours_only:
        results["skipped"] = {"yolov5": "--ours-only: no YOLOv5 checkout given"}
    runners = {"yolov5": run_yolov5, "ours": run_ours}
    started = time.perf_counter()
    for k, seed in enumerate(args.seeds):
        order = ["ours"] if args.ours_only else (["yolov5", "ours"] if k % 2 == 0 else ["ours", "yolov5"])
        run: dict[str, Any] = results["runs"].get(str(seed), {})
        for side in (side for side in order if side not in run):
            print(f"parity: seed {seed}: {side} training ...", flush=True)
            run[side] = runners[side](args, inputs, seed) | dict(key=keys[side])
            run[side]["scores"] = held_out_scores(run[side]["weights"], inputs["data"], args.imgsz)
            scores, wall = run[side]["scores"], run[side]["wall_s"]
            print(f"parity: seed {seed}: {side}: mAP@0.5 {scores['map50']:.3f} mAP@0.5:0.95 {scores['map']:.3f}, "
                  f"{wall:.0f} s", flush=True)  # fmt: skip
            results["runs"][str(seed)] = run
            results_file.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nparity: {len(args.seeds)} seed(s) in {(time.perf_counter() - started) / 60:.1f} min; {results_file}\n")
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
