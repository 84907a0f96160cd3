"""evolve.csv, hyp_evolve.yaml and evolve.png in YOLOv5's forms, written from a study."""

from __future__ import annotations

import numpy as np
import optuna
import yaml

from ddp_utils.evolve.records import (
    EXTRA_COLUMNS,
    METRIC_COLUMNS,
    TrialResult,
    evolve_figure,
    read_evolve_csv,
    trial_metrics,
    trial_results,
    write_records,
)
from ddp_utils.evolve.space import search_space
from ddp_utils.hyp import load_hyp
from ddp_utils.yolo.metrics import fitness

optuna.logging.set_verbosity(optuna.logging.WARNING)
BASE = {"lr0": 0.01, "nbs": 64, "mosaic": 1.0}


def study_with(results: list[tuple[str, float, list[float], int]]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    dist = {"lr0": optuna.distributions.FloatDistribution(1e-5, 0.1)}
    for state, lr0, metrics, epochs in results:
        attrs = {"metrics": metrics, "epochs": epochs}
        value = None if state != "complete" else float(fitness(np.array(metrics)))
        state = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
                 "failed": optuna.trial.TrialState.FAIL}[state]  # fmt: skip
        study.add_trial(optuna.create_trial(state=state, value=value, params={"lr0": lr0}, distributions=dist,
                                            user_attrs=attrs, intermediate_values={1: 0.0}))  # fmt: skip
    return study


def test_evolve_csv_has_yolov5s_columns_format_and_our_three_after_them(tmp_path):
    study = study_with([("complete", 0.01, [0.5, 0.4, 0.3, 0.2, 0.05, 0.04, 0.03], 3),
                        ("failed", 0.02, [], 1),  # no result
                        ("pruned", 0.03, [0.1, 0.1, 0.05, 0.02, 0.09, 0.08, 0.07], 1),
                        ("complete", 0.04, [0.6, 0.5, 0.4, 0.25, 0.05, 0.04, 0.03], 3)])  # fmt: skip
    best = write_records(tmp_path, trial_results(study, BASE), list(BASE), ["lr0"], total=4)
    lines = (tmp_path / "evolve.csv").read_text().splitlines()
    header = [k.strip() for k in lines[0].split(",")]
    assert header == [*METRIC_COLUMNS, "lr0", "nbs", "mosaic", *EXTRA_COLUMNS]
    assert all(len(cell) == 20 for line in lines for cell in line.split(","))  # YOLOv5's %20s / %20.5g
    # YOLOv5 reads it with np.loadtxt(skiprows=1) and takes the hyperparameters from column 7 on, in order
    x = np.loadtxt(tmp_path / "evolve.csv", ndmin=2, delimiter=",", skiprows=1)
    assert x.shape == (3, 13) and x[:, 7].tolist() == [0.01, 0.03, 0.04] and x[:, 8].tolist() == [64] * 3
    rows = read_evolve_csv(tmp_path / "evolve.csv")
    assert [(r["trial"], r["epochs"], r["pruned"]) for r in rows] == [(0, 3, 0), (2, 1, 1), (3, 3, 0)]
    assert best.number == 3 and best.fitness == fitness(np.array([0.6, 0.5, 0.4, 0.25]))


def test_hyp_evolve_yaml_is_the_best_complete_trial_and_loads_as_a_hyp(tmp_path):
    study = study_with([("complete", 0.01, [0.5, 0.4, 0.3, 0.2, 0.05, 0.04, 0.03], 3),
                        ("pruned", 0.03, [0.9, 0.9, 0.9, 0.9, 0.0, 0.0, 0.0], 1)])  # fmt: skip
    write_records(tmp_path, trial_results(study, BASE), list(BASE), ["lr0"], total=2)
    text = (tmp_path / "hyp_evolve.yaml").read_text()
    assert "# best trial: 0, fitness 0.21; 2 of 2 trials finished" in text  # a pruned one never wins
    assert load_hyp(tmp_path / "hyp_evolve.yaml") == BASE == yaml.safe_load(text)
    assert (tmp_path / "evolve.png").stat().st_size > 10_000


def test_a_trials_metrics_are_its_last_validation_and_its_epochs(tmp_path):
    columns = ["epoch", "train/box_loss", *METRIC_COLUMNS]
    rows = [[0, 0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], [1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]
    (tmp_path / "results.csv").write_text(
        "\n".join(",".join(f"{c:>20}" for c in line) for line in [columns, *rows]) + "\n"
    )
    assert trial_metrics(tmp_path) == ((0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8), 2)
    assert trial_metrics(tmp_path / "missing") is None


def test_a_result_knows_its_fitness():
    assert TrialResult(0, (0, 0, 0.5, 0.3, 0, 0, 0), {}, 1, False).fitness == 0.1 * 0.5 + 0.9 * 0.3


def overlapping_x_labels(fig) -> dict[str, list[str]]:
    """Each panel (by title) whose x tick labels overlap on the drawn figure: those labels."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = {}
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in labels]
        if any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]):
            found[ax.get_title()] = [t.get_text() for t in labels]
    return found


def test_no_panel_of_evolve_png_has_overlapping_tick_labels():
    """evolve.png of YOLOv5's space from hyp.scratch-low, 30 trials mutated as YOLOv5 mutates (factor 1 + 0.2 u
    N(0, 1), clipped to the limits): lrf sits on its floor 0.01 and above it, and matplotlib's default nine ticks
    wrote 0.00975 ... 0.01175 over each other (weight_decay's 0.00030 ... 0.00070 too)."""
    import matplotlib.pyplot as plt

    hyp = load_hyp("hyp.scratch-low.yaml")
    space = search_space(hyp)
    names = list(space)
    rng = np.random.default_rng(0)
    results = []
    for number in range(30):
        values = {k: bound.clip(hyp[k] * (1 + rng.normal() * 0.2 * rng.random())) for k, bound in space.items()}
        metrics = (0.0, 0.0, float(rng.random()), float(rng.random()) / 2, 0.0, 0.0, 0.0)
        results.append(TrialResult(number, metrics, hyp | values, 3, number % 7 == 3))
    fig = evolve_figure(results, names)
    try:
        lrf = next(ax for ax in fig.axes if ax.get_title().startswith("lrf"))
        assert len([t for t in lrf.get_xticklabels() if t.get_text()]) >= 3  # still a readable axis
        assert overlapping_x_labels(fig) == {}
        lrf.xaxis.set_major_locator(plt.MaxNLocator(nbins=9))  # positive control: matplotlib's default density
        assert "lrf" in " ".join(overlapping_x_labels(fig))
    finally:
        plt.close(fig)
