"""Does an epoch's fitness rank an evolution's trials as their last epoch does? The question pruning stands on.

    python benchmarks/evolve/evolve_ranking.py --evolve-csv runs/evolve/exp/evolve.csv --data shapes.yaml \
        --weights base.pt --hyp hyp.start.yaml --epochs 10 --out benchmarks/results/evolve-ranking.json

Trains every trial of a finished evolution again (its hyperparameters, as its evolve.csv has them), each validated
after every epoch, ``--workers`` runs at a time (the cores split between them), and reports:

- per epoch, the Spearman rank correlation between that epoch's fitness and the last epoch's, over the trials: how
  well a pruner judging at that epoch ranks the trials as their ends do;
- the last epoch's fitness against the one evolve.csv recorded (the same values and seed, another thread count):
  the noise of one training, for these values;
- the median pruner replayed over the trials in their order (train.py's ``--evolve-prune median``: judged from the
  first epoch after the trial's warm-up, ``warmup_min_iters`` counted, on the trial's best fitness so far, to 3
  decimals, below the median of the complete trials' at that epoch, once two are complete; the last epoch never):
  which trials it cuts, at which epoch, the trial-epochs it spends, and whether it keeps the best.

An evolution of YOLOv5's serial scheme (``--evolve-prune off``) suits it best: every trial trained to its end, so the
replay judges every trial the study drew, not only those another pruner let through.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import optuna
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "evolve"))  # evolve.py
sys.path.insert(0, str(REPO))

from evolve import command, curves, fitness, run_workers  # noqa: E402

from ddp_utils.data.config import check_dataset  # noqa: E402
from ddp_utils.data.labels import find_images  # noqa: E402
from ddp_utils.engine.optim_setup import optimizer_from_hyp  # noqa: E402
from ddp_utils.evolve.records import read_evolve_csv  # noqa: E402
from ddp_utils.evolve.settings import EvolveSettings  # noqa: E402
from ddp_utils.evolve.trial import TrialStopper  # noqa: E402
from ddp_utils.hyp import load_hyp  # noqa: E402


def spearman(a: list[float], b: list[float]) -> float:
    """The Spearman rank correlation of two equally long lists (ties ranked by their order: few, at 5 decimals)."""
    ra, rb = (np.argsort(np.argsort(np.asarray(x), kind="stable"), kind="stable") for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


def warmup_epochs(hyp: dict, batches_per_epoch: int) -> float:
    """How many epochs a training of ``hyp`` warms up for, ``warmup_min_iters`` counted (what the pruner waits for):
    the warm-up train.py builds (the batch size and the epochs do not bear on its length)."""
    setup = optimizer_from_hyp(torch.nn.Linear(1, 1), hyp, batch_size=1, epochs=1, batches_per_epoch=batches_per_epoch)
    return setup.warmup.epochs


def batches(data: str, batch_size: int) -> int:
    """Batches per epoch of one process over the data yaml's train images (found as the dataset finds them)."""
    return -(-len(find_images(check_dataset(data)["train"])) // batch_size)


def replay_median(trials: list[dict], epochs: int) -> dict:
    """train.py's median pruner replayed over fully trained ``trials`` (in order; each ``curve``, ``warmup``): its
    own :class:`TrialStopper` over the pruner :class:`EvolveSettings` makes, on a study in memory."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    settings = EvolveSettings(generations=len(trials), evolve_dir=Path("replay"), storage_url="", study_name="replay",
                              hyp={}, space={}, data={}, epochs=epochs, prune="median")  # fmt: skip
    study = optuna.create_study(direction="maximize", pruner=settings.make_pruner())
    pruned, spent = {}, 0
    for trial in trials:
        live = study.ask()
        stopper = TrialStopper(patience=epochs, epochs=epochs, trial=live, warmup_epochs=trial["warmup"])
        for epoch, value in enumerate(trial["curve"]):
            if stopper(epoch, value):
                break
        spent += stopper.pruned_at or epochs
        if stopper.pruned_at:
            pruned[trial["trial"]] = stopper.pruned_at
            study.tell(live, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(live, trial["curve"][-1])
    best = max(trials, key=lambda t: t["final"])["trial"]
    return {"pruned_after_epoch": pruned, "trial_epochs": spent, "of": epochs * len(trials), "best": best,
            "best_kept": best not in pruned}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--evolve-csv", type=Path, required=True, help="a finished evolution's evolve.csv")
    parser.add_argument("--data", required=True)
    parser.add_argument("--hyp", required=True, help="the evolution's --hyp (the values evolve.csv lacks)")
    parser.add_argument("--weights", default="", help="the evolution's --weights (fine-tuning)")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="runs at a time")
    parser.add_argument("--batches-per-epoch", type=int, help="default: the train images over --batch-size")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = read_evolve_csv(args.evolve_csv)
    base = load_hyp(args.hyp)
    nb = args.batches_per_epoch or batches(args.data, args.batch_size)
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="evolve-ranking-") as tmp:
        work = Path(tmp)
        cmds = []
        for row in rows:
            number = int(row["trial"])
            hyp = {**base, **{k: v for k, v in row.items() if k in base}}  # evolve.csv's hyp columns
            (work / f"hyp{number}.yaml").write_text(json.dumps(hyp))  # JSON is YAML
            extra = ("--hyp", str(work / f"hyp{number}.yaml"), "--noplots", "--exist-ok")
            extra += ("--weights", args.weights) if args.weights else ()
            cmds.append(command(args, Path(args.data), work / "trials", str(number), *extra))
        for i in range(0, len(cmds), args.workers):
            run_workers(cmds[i : i + args.workers], max(cores // args.workers, 1), work / f"batch{i}")
        found = curves(work)
    trials = [{"trial": int(row["trial"]), "recorded": round(fitness(row), 5),
               "warmup": warmup_epochs({**base, **row}, nb), "curve": found[int(row["trial"])],
               "final": found[int(row["trial"])][-1]}
              for row in rows]  # fmt: skip
    finals = [t["final"] for t in trials]
    by_epoch = [round(spearman([t["curve"][e] for t in trials], finals), 3) for e in range(args.epochs - 1)]
    gaps = [t["final"] - t["recorded"] for t in trials]
    report = {
        "setup": {k: str(v) for k, v in vars(args).items()} | {"cores": cores},
        "trials": trials,
        "spearman_with_last_epoch_by_epoch": by_epoch,
        "rerun_against_recorded": {
            "spearman": round(spearman(finals, [t["recorded"] for t in trials]), 3),
            "mean_abs_gap": round(statistics.fmean(abs(g) for g in gaps), 5),
            "max_abs_gap": round(max(abs(g) for g in gaps), 5),
        },  # fmt: skip
        "median_replay": replay_median(trials, args.epochs),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
