"""YOLOv5's serial evolution against ours (pruning, workers in parallel), on the synthetic shapes data.

    python benchmarks/evolve/evolve.py --trials 6 --epochs 9 --workers 2 --out benchmarks/results/evolve.json

Two evolutions of train.py on the same data, from the same starting hyperparameters (the shapes hyp, with ``--start``
values over it if given), with the same seed, each trial from scratch (``--pretrain-epochs N`` fine-tunes every trial
from a base model trained first, untimed, as YOLOv5's guide evolves from pretrained weights). The default regime, 512
images at 128 px for 9 epochs, is one where fitness means something: the model takes off around epoch 3 and reaches
mAP@0.5:0.95 about 0.6 by epoch 9, and how fast it takes off is what the hyperparameters decide. (An earlier regime, 3
epochs fine-tuning a weak base model at fitness 0.09, scored every trial within noise of the start, and its first
epoch, still in warm-up, ranked nothing.)

- **serial** (YOLOv5's scheme): one worker, ``--evolve T --evolve-prune off``: every trial trains to its last epoch,
  validated only then, one trial after the other: a budget of T x E trial-epochs.
- **ours**: ``--workers`` workers started with the same command on one study (SQLite in the run directory), the
  cores split between them, ``--evolve-prune halving`` (``--prune median halving``: one study per pruner, one after
  the other, against the same serial run), and as many trials as fit in the same budget of trial-epochs
  (the study gets 3 x T trials; the workers are stopped, by SIGTERM, once its finished trials passed the budget, and
  the table counts what it had spent then). Each of its trials' fitness after every epoch is kept in the JSON (its
  ``ours`` maps each pruner to its figures; results written before ``--prune`` took several have them directly).
- **the spread of one training** (``--spread-seeds``, untimed): the start trained again with other seeds, so that a
  gap between two best fitnesses can be read against the fitness a seed alone moves.

For each: the best fitness found, the wall time, the trial-epochs trained; for ours also the wall time and the
trial-epochs at which a finished trial first reached the serial run's best fitness (at least it, not within the
spread). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ddp_utils.evolve.records import read_evolve_csv  # noqa: E402
from ddp_utils.run.loggers import METRIC_COLUMNS  # noqa: E402
from ddp_utils.yolo.metrics import fitness as metrics_fitness  # noqa: E402


def data_yaml(directory: Path, n_train: int, n_val: int) -> Path:
    """A shapes data yaml whose generator makes the images on first use (as data/shapes.yaml, smaller)."""
    path = directory / "shapes.yaml"
    path.write_text(
        f"path: {directory / 'shapes'}\ntrain: images/train\nval: images/val\n"
        "names: {0: circle, 1: square, 2: triangle, 3: star}\n"
        f"n_train: {n_train}\nn_val: {n_val}\nsize: [128, 192]\nseed: 0\nmax_objects: 4\n"
        "download: ddp_utils.data.synthetic:generate\ntrain_defaults: {hyp: hyp.shapes.yaml}\n"
    )
    return path


def start_hyp(directory: Path, overrides: list[str]) -> Path:
    """The shapes hyp with ``KEY=VALUE`` overrides: where both evolutions start."""
    import yaml

    hyp = yaml.safe_load((REPO / "configs" / "hyps" / "hyp.shapes.yaml").read_text())
    for item in overrides:
        key, _, value = item.partition("=")
        if key not in hyp or not value:
            raise SystemExit(f"--start {item}: give KEY=VALUE with a key of configs/hyps/hyp.shapes.yaml")
        hyp[key] = float(value)
    path = directory / "hyp.start.yaml"
    path.write_text(yaml.safe_dump(hyp, sort_keys=False))
    return path


def command(args: argparse.Namespace, data: Path, project: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable, str(REPO / "train.py"), "--data", str(data), "--imgsz", str(args.imgsz), "--epochs",
        str(args.epochs), "--batch-size", str(args.batch_size), "--device", "cpu", "--workers", "1", "--project",
        str(project), "--name", name, "--seed", str(args.seed), "--progress", "off", *extra,
    ]  # fmt: skip


def run_workers(cmds: list[list[str]], threads: int, log: Path, stop_when: Callable[[], bool] | None = None) -> float:
    """Start every command at once (``threads`` CPU threads each); wait for all; the wall time in seconds.

    With ``stop_when``, polled every second: once it says so, every worker gets SIGTERM (a worker stops as any run
    does, its trial saved and queued again) and the wall time is the time of that signal.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.monotonic()
    procs = []
    for i, cmd in enumerate(cmds):
        out = open(log.with_suffix(f".{i}.log"), "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT), out))
    stopped = None
    while stop_when is not None and stopped is None and any(proc.poll() is None for proc, _ in procs):
        time.sleep(1.0)
        if stop_when():
            stopped = time.monotonic() - start
            for proc, _ in procs:
                proc.send_signal(signal.SIGTERM)
    for proc, out in procs:
        proc.wait()
        out.close()
        if proc.returncode != 0 and stopped is None:
            raise SystemExit(f"a worker failed (exit {proc.returncode}): see {out.name}")
    return stopped if stopped is not None else time.monotonic() - start


def spent(evolve_dir: Path) -> int:
    """The trial-epochs of the finished trials in an evolution's evolve.csv (0 before the first; a file caught
    while it is written counts as before)."""
    try:
        return sum(int(row["epochs"]) for row in read_evolve_csv(evolve_dir / "evolve.csv"))
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def curves(evolve_dir: Path) -> dict[int, list[float]]:
    """Each trial's fitness after every epoch it validated (its results.csv), by trial number."""
    found = {}
    for path in sorted((evolve_dir / "trials").glob("*/results.csv")):
        with open(path, newline="") as f:
            rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
        found[int(path.parent.name)] = [round(fitness(row), 5) for row in rows]
    return found


def fitness(row: dict[str, float]) -> float:
    """train.py's fitness of an evolve.csv or results.csv row (its first four metric columns: P, R, mAP)."""
    return metrics_fitness([float(row[name]) for name in METRIC_COLUMNS[:4]])


def timeline(evolve_dir: Path, started: float) -> list[tuple[float, int, float, bool, int]]:
    """(seconds from the start, epochs, fitness, pruned, trial number) per finished trial, in the order they
    finished."""
    import optuna

    study = optuna.load_study(study_name=evolve_dir.name, storage=f"sqlite:///{evolve_dir / 'study.db'}")
    rows = {int(r["trial"]): r for r in read_evolve_csv(evolve_dir / "evolve.csv")}
    done = sorted((t for t in study.trials if t.number in rows), key=lambda t: t.datetime_complete)
    return [
        (t.datetime_complete.timestamp() - started, int(rows[t.number]["epochs"]), fitness(rows[t.number]),
         bool(rows[t.number]["pruned"]), t.number)
        for t in done
    ]  # fmt: skip


def summarise(events: list[tuple[float, int, float, bool, int]], budget: int, target: float | None) -> dict:
    """Best fitness, wall time and trial-epochs within ``budget``; when a complete trial first reached ``target``.

    ``wall_s`` is the time the last trial within the budget finished (the study may run on past it). ``start_fitness``
    is trial 0's (the unmutated start); ``best_trial`` the trial that found the best (0: nothing beat the start).
    """
    spent, best, best_trial, wall, reached = 0, 0.0, None, 0.0, None
    for seconds, epochs, fit, pruned, number in events:
        if spent >= budget:
            break
        spent, wall = spent + epochs, seconds
        if not pruned:
            if fit > best:
                best, best_trial = fit, number
            if target is not None and reached is None and fit >= target:
                reached = {"seconds": round(seconds, 1), "trial_epochs": spent}
    within = [e for e in events if e[0] <= wall]
    start = [fit for _, _, fit, pruned, number in events if number == 0 and not pruned]
    return {"best_fitness": best, "best_trial": best_trial, "start_fitness": start[0] if start else None,
            "wall_s": round(wall, 1), "trial_epochs": spent, "trials": len(within),
            "pruned": sum(1 for e in within if e[3]), "reached_serial_best": reached,
            "every_trial": [{"trial": number, "finished_s": round(seconds, 1), "epochs": epochs,
                             "fitness": round(fit, 5), "pruned": pruned}
                            for seconds, epochs, fit, pruned, number in events]}  # fmt: skip


def final_fitness(run_dir: Path) -> float:
    """The fitness of a plain run's last validation (its results.csv's last row)."""
    with open(run_dir / "results.csv", newline="") as f:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    return fitness(rows[-1])


def seed_spread(
    args: argparse.Namespace, data: Path, work: Path, weights: tuple[str, ...], start: float | None, cores: int
) -> dict:
    """The start trained with ``--spread-seeds`` other seeds (all at once, untimed), beside its trial 0's fitness."""
    seeds = [args.seed + 1 + i for i in range(args.spread_seeds)]
    cmds = []
    for seed in seeds:
        cmd = command(args, data, work, f"seed{seed}", *weights)
        cmd[cmd.index("--seed") + 1] = str(seed)
        cmds.append(cmd)
    if cmds:
        run_workers(cmds, max(cores // len(cmds), 1), work / "spread")
    values = ([start] if start is not None else []) + [final_fitness(work / f"seed{seed}") for seed in seeds]
    return {"seeds": ([args.seed] if start is not None else []) + seeds, "fitness": [round(v, 5) for v in values],
            "std": round(statistics.stdev(values), 5) if len(values) > 1 else None}  # fmt: skip


def shown(value: float | None) -> str:
    return "pruned" if value is None else f"{value:.5f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6, help="the serial run's trials (T)")
    parser.add_argument("--epochs", type=int, default=9, help="epochs a trial (E)")
    parser.add_argument("--workers", type=int, default=2, help="our workers, started together")
    parser.add_argument(
        "--prune",
        nargs="+",
        default=["halving"],
        choices=["median", "halving"],
        help="our pruner; several: one study each, after the same serial run",
    )
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--n-train", type=int, default=512)
    parser.add_argument("--n-val", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pretrain-epochs", type=int, default=0, help="a base model's epochs (0: from scratch)")
    parser.add_argument("--start", nargs="*", default=[], help="KEY=VALUE over the shapes hyp: the start")
    parser.add_argument("--spread-seeds", type=int, default=2, help="other seeds the start is trained with (untimed)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--keep", type=Path, help="work in this new directory and keep it (data, runs, logs)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if args.keep is not None and args.keep.exists():
        raise SystemExit(f"--keep {args.keep}: it exists; give a new directory")
    with tempfile.TemporaryDirectory(prefix="evolve-bench-") as tmp:
        work = Path(tmp) if args.keep is None else args.keep.resolve()
        work.mkdir(parents=True, exist_ok=True)
        data = data_yaml(work, args.n_train, args.n_val)
        make = f"from ddp_utils.data.config import check_dataset; check_dataset('{data}')"  # the images, before a clock
        subprocess.run([sys.executable, "-c", make], cwd=REPO, check=True, capture_output=True)
        budget = args.trials * args.epochs
        weights: tuple[str, ...] = ()
        if args.pretrain_epochs:
            base = command(args, data, work, "base")
            base[base.index("--epochs") + 1] = str(args.pretrain_epochs)
            run_workers([base], cores, work / "base")
            weights = ("--weights", str(work / "base" / "weights" / "best.pt"))
        weights += ("--hyp", str(start_hyp(work, args.start)))
        serial_cmd = command(
            args, data, work, "serial", "--evolve", str(args.trials), "--evolve-prune", "off", *weights
        )
        t0 = time.time()
        serial_wall = run_workers([serial_cmd], cores, work / "serial")
        serial = summarise(timeline(work / "serial", t0), budget, None)
        serial["run_wall_s"] = round(serial_wall, 1)
        ours = {}
        for prune in args.prune:  # one study per pruner, one after the other, against the same serial run
            name = f"ours-{prune}"
            cmd = command(args, data, work, name, "--evolve", str(3 * args.trials), "--evolve-prune", prune, *weights)
            t0 = time.time()
            wall = run_workers([cmd] * args.workers, max(cores // args.workers, 1), work / name,
                               stop_when=lambda name=name: spent(work / name) >= budget)  # fmt: skip
            ours[prune] = summarise(timeline(work / name, t0), budget, serial["best_fitness"])
            ours[prune]["run_wall_s"] = round(wall, 1)  # stopped once its finished trials spent the budget
            per_epoch = curves(work / name)
            for row in ours[prune]["every_trial"]:
                row["curve"] = per_epoch.get(row["trial"], [])
        spread = seed_spread(args, data, work, weights, serial["start_fitness"], cores)
    setup = {k: v for k, v in vars(args).items() if k not in ("out", "keep")}
    setup |= {"cores": cores, "budget_trial_epochs": budget}
    report = {"setup": setup, "serial": serial, "ours": ours, "start_over_seeds": spread}
    print(json.dumps(report, indent=1))
    print("\n| scheme | trials (pruned) | trial-epochs | start fitness | best fitness (trial) | wall time "
          "| reached the serial best at |\n| --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    print(f"| YOLOv5's serial (1 worker, every trial to epoch {args.epochs}) | {serial['trials']} (0) | "
          f"{serial['trial_epochs']} | {shown(serial['start_fitness'])} | {serial['best_fitness']:.5f} "
          f"({serial['best_trial']}) | {serial['wall_s']:.0f} s | - |")  # fmt: skip
    for prune, row in ours.items():
        reached = row["reached_serial_best"]
        at = f"{reached['seconds']:.0f} s, {reached['trial_epochs']} trial-epochs" if reached else "not reached"
        print(f"| ours ({args.workers} workers, {prune} pruning) | {row['trials']} ({row['pruned']}) | "
              f"{row['trial_epochs']} | {shown(row['start_fitness'])} | {row['best_fitness']:.5f} "
              f"({row['best_trial']}) | {row['wall_s']:.0f} s | {at} |")  # fmt: skip
    if spread["std"] is not None:
        print(f"\nThe start over seeds {spread['seeds']}: fitness {', '.join(f'{f:.5f}' for f in spread['fitness'])}, "
              f"standard deviation {spread['std']:.5f}")  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
