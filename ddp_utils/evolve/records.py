"""What an evolution leaves in its directory, in YOLOv5's forms, written from the study (whichever worker ran what).

- ``evolve.csv``: one row per finished trial (complete or pruned; failed trials are no result): YOLOv5's seven
  metric columns (P, R, mAP@0.5, mAP@0.5:0.95, the three validation losses), then every hyperparameter of the
  run's hyp in its order, right-aligned in 20 characters with 5 significant digits as YOLOv5 writes them; then
  three columns of ours, after YOLOv5's so its readers still find theirs by position: ``trial`` (the study's
  trial number), ``epochs`` (epochs trained) and ``pruned`` (1: stopped by the pruner after ``epochs`` epochs).
- ``hyp_evolve.yaml``: the best trial's hyperparameters, all of them, usable as ``--hyp``.
- ``evolve.png``: each evolved hyperparameter against fitness, the best marked, as YOLOv5's ``plot_evolve``.
- :func:`trial_line`: the one line logged per finished trial.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from ..files import mkstemp_shared
from ..run.loggers import METRIC_COLUMNS
from ..yolo.metrics import fitness

EXTRA_COLUMNS = ("trial", "epochs", "pruned")


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """One finished trial as evolve.csv has it.

    Attributes:
        number: the study's trial number.
        metrics: the seven values of :data:`METRIC_COLUMNS` (the trial's last validation).
        hyp: every hyperparameter the trial trained with.
        epochs: epochs trained.
        pruned: stopped by the pruner.
    """

    number: int
    metrics: tuple[float, ...]
    hyp: dict[str, float]
    epochs: int
    pruned: bool

    @property
    def fitness(self) -> float:
        """0.1 mAP@0.5 + 0.9 mAP@0.5:0.95 (YOLOv5's)."""
        return float(fitness(np.array(self.metrics)))


def trial_results(study: optuna.Study | Sequence[FrozenTrial], base: Mapping[str, float]) -> list[TrialResult]:
    """The study's finished trials (complete or pruned, with their metrics recorded), by trial number; from
    ``study``, or from its trials as one reading of it gave them."""
    trials = study.get_trials(deepcopy=False) if isinstance(study, optuna.Study) else study
    results = []
    for t in sorted(trials, key=lambda t: t.number):
        metrics = t.user_attrs.get("metrics")
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED) or not metrics:
            continue
        hyp = {**base, **t.params}
        pruned = t.state == TrialState.PRUNED
        epochs = int(t.user_attrs.get("epochs", 0))
        results.append(TrialResult(t.number, tuple(map(float, metrics)), hyp, epochs, pruned))
    return results


def best_result(results: Sequence[TrialResult]) -> TrialResult | None:
    """The fittest complete trial (a pruned one only when none completed); the earliest of equals.

    Examples:
        >>> a = TrialResult(0, (0, 0, 0.5, 0.3, 0, 0, 0), {}, 3, False)
        >>> b = TrialResult(1, (0, 0, 0.9, 0.8, 0, 0, 0), {}, 1, True)
        >>> best_result([a, b]).number
        0
    """
    pool = [r for r in results if not r.pruned] or list(results)
    return max(pool, key=lambda r: (r.fitness, -r.number), default=None)


def best_words(best: TrialResult) -> str:
    """The best trial in the lines' words: a pruned one (the best only when no trial completed) says so, with the
    epoch it reached: its fitness was judged there, not at the last epoch.

    Examples:
        >>> best_words(TrialResult(4, (0, 0, 0.5, 0.3, 0, 0, 0), {}, 3, False))
        'trial 4, fitness 0.32'
        >>> best_words(TrialResult(1, (0, 0, 0.2, 0.1, 0, 0, 0), {}, 2, True))
        'trial 1 (pruned after epoch 2), fitness 0.11'
    """
    return f"trial {best.number}{_pruned(best)}, fitness {best.fitness:.4g}"


def _pruned(result: TrialResult) -> str:
    return f" (pruned after epoch {result.epochs})" if result.pruned else ""


def csv_text(results: Sequence[TrialResult], keys: Sequence[str]) -> str:
    """evolve.csv's text: YOLOv5's header and number format, our three columns after its.

    Examples:
        >>> text = csv_text([TrialResult(2, (0.5, 0.4, 0.3, 0.2, 0.05, 0.04, 0.03), {"lr0": 0.01}, 3, True)], ["lr0"])
        >>> [line.split(",")[-4:] for line in text.splitlines()][1]
        ['                0.01', '                   2', '                   3', '                   1']
    """
    header = [*METRIC_COLUMNS, *keys, *EXTRA_COLUMNS]
    lines = [",".join(f"{k:>20s}" for k in header)]
    for r in results:
        values = [*r.metrics, *(r.hyp[k] for k in keys), r.number, r.epochs, int(r.pruned)]
        lines.append(",".join(f"{v:20.5g}" for v in values))
    return "\n".join(lines) + "\n"


def read_evolve_csv(path: str | Path) -> list[dict[str, float]]:
    """evolve.csv's rows as dicts of numbers (the header's names stripped).

    Examples:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "evolve.csv"
        >>> _ = path.write_text(csv_text([TrialResult(0, (0.5,) * 7, {"lr0": 0.01}, 2, False)], ["lr0"]))
        >>> read_evolve_csv(path)[0]["lr0"], read_evolve_csv(path)[0]["trial"]
        (0.01, 0.0)
    """
    lines = Path(path).read_text().splitlines()
    keys = [k.strip() for k in lines[0].split(",")]
    return [dict(zip(keys, map(float, line.split(",")))) for line in lines[1:] if line.strip()]


def best_yaml_text(best: TrialResult, total: int, finished: int) -> str:
    """hyp_evolve.yaml: a comment header (the best trial, its metrics), then every hyperparameter."""
    head = [
        "# ddp_utils hyperparameter evolution (train.py --evolve): the best trial's hyperparameters",
        f"# best trial: {best.number}, fitness {best.fitness:.5g}; {finished} of {total} trials finished"
        + (f"; pruned after epoch {best.epochs}: no trial trained to its last epoch" if best.pruned else ""),
        "# " + ", ".join(f"{k:>20s}" for k in METRIC_COLUMNS),
        "# " + ", ".join(f"{v:>20.5g}" for v in best.metrics),
        "",
    ]
    return "\n".join(head) + "\n" + yaml.safe_dump({k: _plain(v) for k, v in best.hyp.items()}, sort_keys=False)


def _plain(value: float) -> float | int:
    return int(value) if float(value).is_integer() and abs(value) < 2**31 else float(value)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (workers on one directory each rewrite it from the study), with the
    permissions a plain ``open`` gives (teammates read evolve.csv as they read YOLOv5's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = mkstemp_shared(path.parent, prefix=f".{path.name}.")  # the umask's mode, as a plain open gives
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_records(
    evolve_dir: Path, results: Sequence[TrialResult], keys: Sequence[str], evolved: Sequence[str], total: int
) -> TrialResult | None:
    """evolve.csv, hyp_evolve.yaml (when a trial finished) and evolve.png; returns the best trial."""
    write_text_atomic(evolve_dir / "evolve.csv", csv_text(results, keys))
    best = best_result(results)
    if best is not None:
        write_text_atomic(evolve_dir / "hyp_evolve.yaml", best_yaml_text(best, total, len(results)))
        plot_evolve(results, evolved, evolve_dir / "evolve.png")
    return best


X_TICKS = 4  # at most this many intervals on a panel's x axis: room for 7-character labels such as 0.00975


def plot_evolve(results: Sequence[TrialResult], names: Sequence[str], path: Path) -> None:
    """Each evolved hyperparameter against fitness, one panel each, points coloured by how many lie near them
    and the best trial marked with a cross, as YOLOv5's ``evolve.png``; pruned trials drawn hollow."""
    if not results or not names:
        return
    import matplotlib.pyplot as plt

    fig = evolve_figure(results, names)
    fig.savefig(path, dpi=150)
    plt.close(fig)


def evolve_figure(results: Sequence[TrialResult], names: Sequence[str]) -> Any:
    """:func:`plot_evolve`'s matplotlib figure (of at least one result and one name), not yet saved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fit = np.array([r.fitness for r in results])
    best = best_result(results)
    cols = min(5, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 2.2 * rows), squeeze=False, tight_layout=True)
    pruned = np.array([r.pruned for r in results])
    for i, ax in enumerate(axes.flat):
        if i >= len(names):
            ax.axis("off")
            continue
        name = names[i]
        values = np.array([r.hyp[name] for r in results])
        density = _density(values, fit)
        ax.scatter(values[~pruned], fit[~pruned], c=density[~pruned], cmap="viridis", s=14, edgecolors="none")
        ax.scatter(values[pruned], fit[pruned], facecolors="none", edgecolors="grey", s=14, linewidths=0.6)
        if best is not None:
            ax.plot(best.hyp[name], best.fitness, "k+", markersize=12)
            ax.set_title(f"{name} = {best.hyp[name]:.3g}", fontsize=8)
        ax.tick_params(labelsize=6)
        # a panel is 2.4 in wide: matplotlib's nine ticks of a narrow range (lrf 0.00975 ... 0.01175) overlap
        ax.xaxis.set_major_locator(MaxNLocator(nbins=X_TICKS))
        if i % cols:
            ax.set_yticklabels([])
        else:
            ax.set_ylabel("fitness", fontsize=7)
    return fig


def _density(x: np.ndarray, y: np.ndarray, bins: int = 20) -> np.ndarray:
    """How many points share each point's cell of a ``bins`` x ``bins`` histogram (the colour of a point)."""
    if len(x) < 2:
        return np.ones(len(x))
    counts, xe, ye = np.histogram2d(x, y, bins=bins)
    ix = np.clip(np.digitize(x, xe) - 1, 0, bins - 1)
    iy = np.clip(np.digitize(y, ye) - 1, 0, bins - 1)
    return counts[ix, iy]


def trial_line(result: TrialResult | None, number: int, state: str, finished: int, total: int, best: Any) -> str:
    """The one line logged when a trial ends.

    Examples:
        >>> r = TrialResult(3, (0.5, 0.4, 0.3, 0.2, 0.05, 0.04, 0.03), {}, 2, True)
        >>> print(*trial_line(r, 3, "pruned", 4, 8, r).split("; "), sep="\\n")
        evolve: trial 3 pruned after epoch 2 (4/8 finished): fitness 0.21, mAP@0.5 0.3, mAP@0.5:0.95 0.2
        best: trial 3 (pruned after epoch 2), 0.21
    """
    what = f"pruned after epoch {result.epochs}" if result is not None and result.pruned else state
    head = f"evolve: trial {number} {what} ({finished}/{total} finished)"
    tail = f"; best: trial {best.number}{_pruned(best)}, {best.fitness:.4g}" if best is not None else ""
    if result is None:
        return head + tail
    m = result.metrics
    return f"{head}: fitness {result.fitness:.4g}, mAP@0.5 {m[2]:.4g}, mAP@0.5:0.95 {m[3]:.4g}{tail}"


def trial_metrics(run_dir: Path) -> tuple[tuple[float, ...], int] | None:
    """A trial run's last validation (the seven evolve.csv metrics) and its epochs trained, from its results.csv."""
    import csv

    path = Path(run_dir) / "results.csv"
    if not path.is_file():
        return None
    with open(path, newline="", encoding="utf-8") as f:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    if not rows:
        return None
    return tuple(float(rows[-1][k]) for k in METRIC_COLUMNS), len({int(float(r["epoch"])) for r in rows})


__all__ = [
    "EXTRA_COLUMNS",
    "METRIC_COLUMNS",
    "TrialResult",
    "best_result",
    "best_words",
    "best_yaml_text",
    "csv_text",
    "evolve_figure",
    "plot_evolve",
    "read_evolve_csv",
    "trial_line",
    "trial_metrics",
    "trial_results",
    "write_records",
    "write_text_atomic",
]
