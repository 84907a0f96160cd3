"""evolve/study.py's lines, against a real study store (SQLite, and PostgreSQL when one runs): the per-trial line
reads the study once (its count and its best agree, whatever another worker finishes meanwhile), and the worker's
last line says how to use the results only once the study is done."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import optuna
import pytest

from ddp_utils.evolve import records as records_module
from ddp_utils.evolve import study as study_module
from ddp_utils.evolve.records import METRIC_COLUMNS
from ddp_utils.evolve.settings import EvolveSettings
from ddp_utils.evolve.study import Evolution
from ddp_utils.evolve.trial import TrialStopper
from tests.evolve.test_store import postgres_url
from train import parse_opt

optuna.logging.set_verbosity(optuna.logging.WARNING)
TRAIN_WITH = "train with them: python train.py --hyp"


@pytest.fixture(autouse=True)
def no_figure(monkeypatch):
    """evolve.png takes seconds a trial on a loaded host, and is tested in test_records.py: these tests read lines."""
    monkeypatch.setattr(records_module, "plot_evolve", lambda *args: None)


def settings_for(tmp_path: Path, generations: int, storage: str | None = None, name: str = "exp") -> EvolveSettings:
    argv = ["--evolve", str(generations), "--project", str(tmp_path), "--name", name, "--evolve-prune", "off"]
    return EvolveSettings.from_options(parse_opt(argv + (["--evolve-storage", storage] if storage else [])))


def trained(plan, map50_95: float, epochs: int = 1) -> None:
    """The trial's run as train.py leaves it: a results.csv whose last row is its validation."""
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    values = [0.5, 0.5, map50_95, map50_95, 0.05, 0.04, 0.03]  # fitness: map50_95
    header = ",".join(["epoch", *METRIC_COLUMNS])
    rows = "".join(f"{epoch},{','.join(map(str, values))}\n" for epoch in range(epochs))
    (run_dir / "results.csv").write_text(f"{header}\n{rows}")


def finish(evolution: Evolution, claimed, map50_95: float) -> None:
    trial, plan = claimed
    trained(plan, map50_95)
    evolution.finish(trial, plan, TrialStopper(patience=100, epochs=1, trial=None, prune=False))


def lines(caplog, start: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_the_trial_line_counts_and_names_the_best_from_one_reading_of_the_study(tmp_path, caplog, monkeypatch, store):
    """Two workers: trial 1 ends on worker B while worker A's better trial 0 ends between B's reading of the results
    and its count. Read twice, B said ``trial 1 complete (2/4 finished) ...; best: trial 1`` with trial 0 finished."""
    url = postgres_url() if store == "postgresql" else None
    name = f"best-{os.getpid()}-{time.time_ns()}" if url else "exp"
    settings = settings_for(tmp_path, 4, url, name)
    a, b = Evolution.open(settings, "worker-a"), Evolution.open(settings, "worker-b")
    claimed_a, claimed_b = a.claim(False), b.claim(False)
    assert (claimed_a[0].number, claimed_b[0].number) == (0, 1)
    real, pending = study_module.trial_results, [claimed_a]

    def a_finishes_meanwhile(*args, **kwargs):
        results = real(*args, **kwargs)
        if pending:  # once: worker A's trial 0, the better one, ends right after B read the results
            finish(a, pending.pop(), 0.6)
        return results

    monkeypatch.setattr(study_module, "trial_results", a_finishes_meanwhile)
    caplog.set_level(logging.INFO, logger="ddp_utils")
    finish(b, claimed_b, 0.1)
    (line,) = lines(caplog, "evolve: trial 1 complete")
    assert "(1/4 finished)" in line and line.endswith("best: trial 1, 0.1"), line  # what B read, consistently
    (line_a,) = lines(caplog, "evolve: trial 0 complete")
    assert "(2/4 finished)" in line_a and line_a.endswith("best: trial 0, 0.6"), line_a


def test_the_last_line_says_how_to_use_the_results_only_once_the_study_is_done(tmp_path, caplog):
    """Under SIGTERM the worker said ``trial 1 stopped and saved; start the same command again to continue it``, then
    ``... train with them: python train.py --hyp ...``: two instructions. A worker that ended while another still
    ran a trial also said "train with them" of results still to come."""
    settings = settings_for(tmp_path, 3)
    a, b = Evolution.open(settings, "worker-a"), Evolution.open(settings, "worker-b")
    finish(a, a.claim(False), 0.3)  # trial 0
    running = b.claim(False)  # trial 1, on worker B
    line = a.summary()
    assert line.startswith("evolve: 1/3 trials finished (0 pruned, 0 failed, 1 running elsewhere, 1 waiting)"), line
    assert line.endswith(f"best so far: trial 0, fitness 0.3; results in {settings.evolve_dir}"), line
    assert TRAIN_WITH not in line

    caplog.set_level(logging.INFO, logger="ddp_utils")
    b.pause(running[0])  # a signal stopped worker B: its trial goes back to the queue
    (stopped,) = lines(caplog, "evolve: trial 1 stopped and saved")
    assert stopped.endswith("start the same command again to continue it")  # B's one instruction
    line = b.summary()
    assert line.startswith("evolve: 1/3 trials finished (0 pruned, 0 failed, 2 waiting)"), line
    assert "best so far: trial 0" in line and TRAIN_WITH not in line and "--resume" not in line

    finish(b, b.claim(False), 0.5)  # trial 1 again, then trial 2: the study is done
    finish(a, a.claim(False), 0.1)
    assert a.claim(False) is None
    line = a.summary()
    assert line.startswith("evolve: 3/3 trials finished (0 pruned, 0 failed); best: trial 1, fitness 0.5"), line
    assert line.endswith(f"{TRAIN_WITH} {settings.evolve_dir / 'hyp_evolve.yaml'}"), line


def test_when_every_trial_was_pruned_the_best_is_named_pruned_at_its_epoch_and_never_to_train_with(tmp_path, caplog):
    """The summary said ``best: trial 1, fitness ...; train with them`` of settings judged at an early epoch."""
    settings = settings_for(tmp_path, 2)
    evolution = Evolution.open(settings, "worker")
    caplog.set_level(logging.INFO, logger="ddp_utils")
    for map50_95 in (0.2, 0.4):  # both cut by the pruner after their second epoch (of the study's three)
        trial, plan = evolution.claim(False)
        trained(plan, map50_95, epochs=2)
        stopper = TrialStopper(patience=100, epochs=3, trial=None, prune=False)
        stopper.pruned_at = 2
        evolution.finish(trial, plan, stopper)
    (line,) = lines(caplog, "evolve: trial 1 pruned after epoch 2")
    assert line.endswith("best: trial 1 (pruned after epoch 2), 0.4"), line
    line = evolution.summary()
    assert line.startswith("evolve: 2/2 trials finished (2 pruned, 0 failed); best: trial 1 (pruned after epoch 2), "
                           "fitness 0.4, and no trial trained to its last epoch"), line  # fmt: skip
    assert TRAIN_WITH not in line and "train with them" not in line, line
    head = (settings.evolve_dir / "hyp_evolve.yaml").read_text().splitlines()[1]
    assert head.endswith("pruned after epoch 2: no trial trained to its last epoch"), head
