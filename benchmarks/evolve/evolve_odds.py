"""How often could any pruner meet ``evolve.py``'s goal? The odds with a perfect one, where trials are independent.

    python benchmarks/evolve/evolve_odds.py --trials 12 30 300 --epochs 10 --judged-after 2

``benchmarks/evolve/evolve.py`` asks ours to reach the best fitness of YOLOv5's serial scheme (T trials of E epochs,
each to its end) within a third of its T x E trial-epochs. Both bests are maxima of random trials, so one run meets the
goal or misses it partly by chance. This computes that chance for a pruner that cannot be bettered:

- each trial's final fitness is an independent draw from one continuous distribution, trial 0 (the start) shared by
  both schemes; only ranks matter then, so the odds hold for every distribution;
- the serial best is the best of the start and T - 1 draws;
- ours trains the start to its end, then judges every new trial after ``--judged-after`` epochs (train.py's median
  pruner judges from the first epoch after the warm-up: the second with the shapes hyp's ``warmup_epochs`` 1) and
  knows its end there: a trial goes on only if it will beat the best complete trial so far (a complete trial costs E
  epochs), any other is cut after ``--judged-after`` epochs; in one worker's order (parallel workers judge some
  trials against an older best and complete more of them: they can only do worse);
- ours meets the goal when a complete trial within ``--fraction`` of the budget reaches the serial best.

A real pruner ranks worse than this one, so these are upper bounds. YOLOv5's mutation draws trials around the best so
far rather than independently: where that makes later trials better, the serial scheme, which completes every one, is
helped as much as ours. The draws are made with a fixed seed: the figures repeat.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def goal_odds(trials: int, epochs: int, judged_after: int, fraction: float = 1 / 3, samples: int = 100_000,
              seed: int = 0) -> float:  # fmt: skip
    """The share of ``samples`` simulated evolutions in which ours, with the perfect pruner, reached the serial best
    of ``trials`` trials within ``fraction`` of ``trials * epochs`` trial-epochs."""
    if trials < 1 or epochs < 1 or not 1 <= judged_after < epochs or not 0 < fraction <= 1:
        raise ValueError("need trials >= 1, epochs >= 1, 1 <= judged_after < epochs and 0 < fraction <= 1")
    rng = np.random.default_rng(seed)
    budget = trials * epochs * fraction
    starts = rng.random(samples)
    serial_best = np.maximum(starts, rng.random((samples, trials - 1)).max(axis=1, initial=0.0))
    draws_needed = int(budget // judged_after) + 1  # no evolution within the budget draws more trials than this
    met = 0
    for start, target, draws in zip(starts, serial_best, rng.random((samples, draws_needed)), strict=True):
        best, spent = start, epochs
        for value in draws:
            if best >= target:
                break
            if value > best:  # the perfect pruner lets it go to its end
                if spent + epochs > budget:
                    break
                spent, best = spent + epochs, value
            elif spent + judged_after > budget:
                break
            else:
                spent += judged_after
        met += best >= target and spent <= budget
    return met / samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, nargs="+", default=[12, 30, 300], help="the serial run's trials (T)")
    parser.add_argument("--epochs", type=int, nargs="+", default=[10], help="epochs a trial (E)")
    parser.add_argument("--judged-after", type=int, default=2, help="the epochs a cut trial costs")
    parser.add_argument("--fraction", type=float, default=1 / 3, help="the share of T x E the goal allows")
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args()
    rows = [{"trials": t, "epochs": e, "judged_after": args.judged_after, "fraction": round(args.fraction, 4),
             "odds": round(goal_odds(t, e, args.judged_after, args.fraction, args.samples), 3)}
            for e in args.epochs for t in args.trials]  # fmt: skip
    print(f"| trials (T) | epochs (E) | a cut trial costs | odds a perfect pruner reaches the serial best within "
          f"{args.fraction:.3g} of T x E |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['trials']} | {row['epochs']} | {row['judged_after']} epochs | {row['odds']:.3f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"samples": args.samples, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
