"""``train.py --evolve``: real train.py processes on the CPU, tiny data, 1-2 epochs a trial.

What YOLOv5's --evolve writes, from a study store: two workers against one SQLite file and against a real
PostgreSQL server take every trial once; a trial trains on two processes under torchrun; a worker stopped by
SIGTERM mid-trial is continued by the next start, to the same bits; a hopeless trial is pruned; a diverging one
fails with its reason while the study goes on; a trial whose save fails ends the study with exit 74, and the next
start continues it; bad input is one line, exit 2, nothing written; Optuna's
dashboard shows the study's trials in a real headless Chromium.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from ddp_utils.data import make_shapes_dataset
from ddp_utils.evolve.records import read_evolve_csv
from ddp_utils.evolve.settings import EvolveSettings
from ddp_utils.evolve.study import Evolution
from ddp_utils.hyp import load_hyp
from tests.evolve.test_store import postgres_url
from tests.multiproc import REPO_ROOT, collect, describe, free_port, run_watching
from tests.test_train import run, start, torchrun, train_env
from tests.test_train_resume import assert_bit_identical, progress_env, snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
optuna.logging.set_verbosity(optuna.logging.WARNING)
FINISHED = re.compile(r"^evolve: trial (\d+) (complete|pruned after epoch \d+|failed) \(\d+/\d+ finished\)", re.M)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """32 + 16 synthetic images; a hyp with a short warm-up and no accumulation (4 optimizer steps an epoch)."""
    root = tmp_path_factory.mktemp("evolve")
    make_shapes_dataset(root / "shapes", n_train=32, n_val=16, size=(96, 128), seed=0, max_objects=3)
    data_yaml = root / "shapes.yaml"
    data_yaml.write_text(
        f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
        "names: {0: circle, 1: square, 2: triangle, 3: star}\n"
    )
    hyp = load_hyp("hyp.shapes.yaml") | {"warmup_epochs": 0.5, "warmup_min_iters": 2, "nbs": 8}
    (root / "hyp.yaml").write_text(yaml.safe_dump(hyp, sort_keys=False))
    (root / "hyp_diverges.yaml").write_text(yaml.safe_dump(hyp | {"obj": 1e39}, sort_keys=False))  # inf in fp32
    (root / "hyp_long_warmup.yaml").write_text(yaml.safe_dump(hyp | {"warmup_min_iters": 6}, sort_keys=False))
    return {"data": data_yaml, "hyp": root / "hyp.yaml", "hyp_diverges": root / "hyp_diverges.yaml",
            "hyp_long_warmup": root / "hyp_long_warmup.yaml", "root": root}  # fmt: skip


def evolve_args(data: dict[str, Path], project: Path, *extra: str, name: str = "exp") -> list[str]:
    return [
        "train.py", "--data", str(data["data"]), "--hyp", str(data["hyp"]), "--cfg", "yolov5n.yaml", "--imgsz", "64",
        "--batch-size", "8", "--workers", "1", "--device", "cpu", "--project", str(project), "--name", name,
        "--seed", "1", *extra,
    ]  # fmt: skip


def finished_lines(log: str) -> list[tuple[int, str]]:
    return [(int(n), state) for n, state in FINISHED.findall(log)]


def test_a_small_evolution_writes_what_yolov5_writes_and_a_second_start_has_nothing_left(data, tmp_path):
    cmd = [sys.executable, *evolve_args(data, tmp_path, "--evolve", "3", "--epochs", "2")]
    result = run(cmd, train_env(), 500)
    assert result.returncode == 0, describe([result])
    exp = tmp_path / "exp"
    for name in ("evolve.csv", "hyp_evolve.yaml", "evolve.png", "study.db"):
        assert (exp / name).is_file() and (exp / name).stat().st_size > 0, name
    lines = finished_lines(result.stderr)
    assert sorted(n for n, _ in lines) == [0, 1, 2], result.stderr  # one line per finished trial
    rows = read_evolve_csv(exp / "evolve.csv")
    hyp = load_hyp(data["hyp"])
    header = [k.strip() for k in (exp / "evolve.csv").read_text().splitlines()[0].split(",")]
    assert header[:4] == ["metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95"]
    assert header[7:-3] == list(hyp) and header[-3:] == ["trial", "epochs", "pruned"]
    assert [int(r["trial"]) for r in rows] == [0, 1, 2]
    assert {k: rows[0][k] for k in hyp} == pytest.approx(hyp)  # the first trial: the --hyp values unchanged
    assert all(any(r[k] != hyp[k] for k in hyp) for r in rows[1:])  # the others: mutated
    for r in rows:  # each trial's run: the hyperparameters evolve.csv says it trained with
        trained = load_hyp(exp / "trials" / str(int(r["trial"])) / "hyp.yaml")
        assert trained == pytest.approx({k: r[k] for k in hyp}, rel=1e-4)
        assert r["epochs"] == (int(r["epochs"]) if r["pruned"] else 2)
    best = load_hyp(exp / "hyp_evolve.yaml")  # usable as --hyp: every hyperparameter, the best trial's
    fitness = [0.1 * r["metrics/mAP_0.5"] + 0.9 * r["metrics/mAP_0.5:0.95"] for r in rows]
    complete = [i for i, r in enumerate(rows) if not r["pruned"]]
    winner = rows[max(complete, key=lambda i: fitness[i])]
    assert list(best) == list(hyp) and best == pytest.approx({k: winner[k] for k in hyp}, rel=1e-4)
    assert f"python train.py --hyp {exp / 'hyp_evolve.yaml'}" in result.stderr

    again = run(cmd, train_env(), 120)  # the same command: the study has all its trials, nothing trains
    assert again.returncode == 0, describe([again])
    assert "evolve: 3/3 trials finished" in again.stderr and "epoch 1/2" not in again.stderr, again.stderr
    assert read_evolve_csv(exp / "evolve.csv") == rows


def two_workers(cmd: list[str]) -> list:
    procs = [start(cmd, train_env()), start(cmd, train_env())]
    workers = collect(procs, time.monotonic(), 560, "two evolve workers")
    assert all(w.returncode == 0 for w in workers), describe(workers)
    return workers


def assert_each_trial_once(workers: list, exp: Path, generations: int) -> None:
    ran = [sorted(n for n, _ in finished_lines(w.stderr)) for w in workers]
    assert sorted(ran[0] + ran[1]) == list(range(generations)), describe(workers)  # each once, between them
    assert ran[0] and ran[1], ran  # both worked
    assert sorted(int(r["trial"]) for r in read_evolve_csv(exp / "evolve.csv")) == list(range(generations))


def test_two_workers_on_one_sqlite_store_run_each_trial_once(data, tmp_path):
    cmd = [sys.executable, *evolve_args(data, tmp_path, "--evolve", "4", "--epochs", "1")]
    assert_each_trial_once(two_workers(cmd), tmp_path / "exp", 4)


def test_two_workers_on_postgresql_run_each_trial_once(data, tmp_path):
    url, name = postgres_url(), f"evolve-{os.getpid()}-{time.time_ns()}"
    extra = ("--evolve", "4", "--epochs", "1", "--evolve-storage", url)
    cmd = [sys.executable, *evolve_args(data, tmp_path, *extra, name=name)]
    workers = two_workers(cmd)
    assert_each_trial_once(workers, tmp_path / name, 4)
    assert not (tmp_path / name / "study.db").exists()  # the study lives in the server
    study = optuna.load_study(study_name=name, storage=url)
    assert sorted(t.number for t in study.trials if t.state.is_finished()) == [0, 1, 2, 3]


@pytest.mark.multiprocess
def test_each_trial_trains_on_two_processes_under_torchrun(data, tmp_path):
    cmd = torchrun(2, *evolve_args(data, tmp_path, "--evolve", "2", "--epochs", "1"))
    result = run(cmd, train_env(), 560)
    assert result.returncode == 0, describe([result])
    assert result.stderr.count("2 process(es) x 4 images") == 2, result.stderr  # both trials, on both ranks' data
    rows = read_evolve_csv(tmp_path / "exp" / "evolve.csv")
    assert [int(r["trial"]) for r in rows] == [0, 1]
    assert sorted(n for n, _ in finished_lines(result.stderr)) == [0, 1]  # rank 0 alone records


def test_a_worker_stopped_mid_trial_is_continued_by_the_next_start_to_the_same_bits(data, tmp_path):
    extra = ("--evolve", "2", "--epochs", "2", "--save-interval", "0")
    full = run([sys.executable, *evolve_args(data, tmp_path, *extra, name="full")], train_env(), 500)
    assert full.returncode == 0, describe([full])
    cmd = [sys.executable, *evolve_args(data, tmp_path, *extra, name="cut")]
    sent: list[str] = []

    def stop_in_trial_1(line: str, proc: subprocess.Popen) -> None:
        sent.append(line) if line.startswith("evolve: trial 1 of 2 starts") else None
        if sent and len(sent) == 1 and re.match(r"^2/2 .* [2-3]/4 ", line):  # trial 1, epoch 2, mid-epoch
            sent.append(line)
            proc.send_signal(signal.SIGTERM)

    stopped = run_watching(cmd, progress_env(), 500, stop_in_trial_1)
    assert stopped.returncode == 0 and len(sent) == 2, describe([stopped])
    assert "evolve: trial 1 stopped and saved" in stopped.stderr, describe([stopped])
    # one instruction: the study continues the trial; a --resume of its last.pt would train it outside the study
    assert re.search(r"stopped at epoch 2, batch [2-4]/4: saved \S+/trials/1/weights/last.pt in ", stopped.stderr)
    assert "continue with" not in stopped.stderr and "--resume" not in stopped.stderr, stopped.stderr
    assert "evolve: 1/2 trials finished (0 pruned, 0 failed, 1 waiting); best so far: trial 0" in stopped.stderr
    assert "train with them" not in stopped.stderr, stopped.stderr  # the stop line's instruction is the only one
    again = run(cmd, train_env(), 300)
    assert again.returncode == 0, describe([again])
    assert "evolve: trial 1 continues its run" in again.stderr and "resuming" in again.stderr, again.stderr
    assert finished_lines(again.stderr) == [(1, "complete")]  # that trial, not a new one; trial 0 not again
    assert_bit_identical(tmp_path / "full" / "trials" / "1", tmp_path / "cut" / "trials" / "1")
    assert (tmp_path / "full" / "evolve.csv").read_bytes() == (tmp_path / "cut" / "evolve.csv").read_bytes()


@pytest.mark.parametrize(
    ("hyp", "epochs", "judged"),
    [
        ("hyp", 3, 2),  # a warm-up of 0.5 epochs (2 of the 4 batches an epoch): epoch 2 is the first judged
        ("hyp_long_warmup", 4, 3),  # warmup_min_iters 6 lengthens it to 1.5 epochs: epoch 2 began in it, 3 did not
    ],
)
def test_a_trial_far_below_the_finished_ones_is_pruned_on_its_first_epoch_after_the_warm_up(
    data, tmp_path, hyp, epochs, judged
):
    args = evolve_args(data, tmp_path, "--evolve", "1", "--epochs", str(epochs))
    args[args.index("--hyp") + 1] = str(data[hyp])
    from train import parse_opt

    settings = EvolveSettings.from_options(parse_opt(args[1:]))
    study = Evolution.open(settings, "test").study  # the study as train.py makes it, then two strong results
    dists = {k: optuna.distributions.FloatDistribution(b.low, b.high) for k, b in settings.space.items()}
    params = {k: settings.first_values()[k] for k in settings.space}
    attrs = {"metrics": [0.9, 0.9, 0.9, 0.9, 0.01, 0.01, 0.01], "epochs": epochs}
    for _ in range(2):
        study.add_trial(optuna.create_trial(value=0.9, params=params, distributions=dists, user_attrs=attrs,
                                            intermediate_values={e: 0.8 for e in range(1, epochs + 1)}))  # fmt: skip
    result = run([sys.executable, *args], train_env(), 300)
    assert result.returncode == 0, describe([result])
    assert f"evolve: trial 0 pruned after epoch {judged}: fitness" in result.stderr, result.stderr
    assert f"epoch {judged + 1}/{epochs}" not in result.stderr  # it stopped there
    (row,) = [r for r in read_evolve_csv(tmp_path / "exp" / "evolve.csv") if r["trial"] == 0]
    assert (row["epochs"], row["pruned"]) == (judged, 1)
    assert load_hyp(tmp_path / "exp" / "hyp_evolve.yaml")  # the best: one of the complete trials


def test_a_diverging_trial_fails_with_its_reason_and_the_study_goes_on(data, tmp_path):
    extra = ("--evolve", "2", "--epochs", "8", "--evolve-prune", "off", "--evolve-hyps", "obj=0.5:1e39")
    args = [*evolve_args(data, tmp_path, *extra), "--hyp", str(data["hyp_diverges"])]  # the later --hyp wins
    result = run([sys.executable, *args], train_env(), 560)
    assert result.returncode == 0, describe([result])  # a failed trial does not stop the study
    assert finished_lines(result.stderr) == [(0, "failed"), (1, "failed")], result.stderr
    assert "evolve: trial 0 failed: diverged: training diverged at epoch" in result.stderr
    assert read_evolve_csv(tmp_path / "exp" / "evolve.csv") == []  # never a result
    study = optuna.load_study(study_name="exp", storage=f"sqlite:///{tmp_path / 'exp' / 'study.db'}")
    reasons = [t.user_attrs["fail_reason"] for t in study.trials]
    assert all(r.startswith("diverged: training diverged") for r in reasons), reasons


def test_a_study_whose_saves_fail_ends_74_naming_the_trial_and_the_next_start_continues_it(data, tmp_path):
    """The issue's 1 MB tmpfs as --project: every trial's save failed, each printed a traceback, and the study said
    "2/2 trials finished (0 pruned, 2 failed)" with exit 0. Here every checkpoint write fails by a file-size limit
    that the study store and the small files stay under (no root, no mount), as the plain run's test does."""

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 2**20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    cmd = [sys.executable, *evolve_args(data, tmp_path, "--evolve", "2", "--epochs", "1", "--evolve-prune", "off")]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=small_disk)  # fmt: skip
    (result,) = collect([proc], time.monotonic(), 280, "a study on a full disk")
    output = describe([result])
    assert result.returncode == 74, output
    assert "Traceback" not in result.stderr and "trials finished (" not in result.stderr, output  # no summary after
    last = tmp_path / "exp" / "trials" / "0" / "weights" / "last.pt"
    said = result.stderr.strip().splitlines()[-1]  # after the prefix train.py gives exit 74's line
    assert said.endswith(
        f"evolve: trial 0: training ended after epoch 1 but could not save {last} (the warning above says why), "
        "and none is on disk: nothing to resume from; the study stops here, trial 0 back in its queue: free the "
        "disk, then start the same command again"
    ), output
    study = optuna.load_study(study_name="exp", storage=f"sqlite:///{tmp_path / 'exp' / 'study.db'}")
    waiting = optuna.trial.TrialState.WAITING  # trial 0 back in the queue (trial 1 queued beside it), none failed
    assert study.trials[0].number == 0 and {t.state for t in study.trials} == {waiting}, study.trials

    again = run(cmd, train_env(), 280)  # the disk freed: the same command takes trial 0 up again, and trial 1
    assert again.returncode == 0, describe([again])
    assert finished_lines(again.stderr) == [(0, "complete"), (1, "complete")], again.stderr


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (("--evolve", "0"), "--evolve 0: give the number of trials"),
        (("--evolve", "2", "--evolve-storage", "redis://127.0.0.1/0"), "--evolve-storage redis://127.0.0.1/0: not a"),
        (("--evolve", "2", "--evolve-storage", "postgresql://u:pw@127.0.0.1:PORT/db"), "cannot open the study store"),
        (("--evolve", "2", "--evolve-hyps", "lr0", "lr9"), "--evolve-hyps lr9: not a hyperparameter of the run's hyp"),
        (("--evolve", "2", "--name", "other"), "was made with another dataset"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(data, tmp_path, extra, named):
    extra = tuple(e.replace("PORT", str(free_port())) for e in extra)
    project = tmp_path / "runs"
    other = data["root"] / "other.yaml"  # a study named "other", made for another dataset
    other.write_text(data["data"].read_text().replace("val: images/val", "val: images/train"))
    from train import parse_opt

    made = parse_opt(evolve_args(data, project, "--evolve", "2", name="other")[1:] + ["--data", str(other)])
    Evolution.open(EvolveSettings.from_options(made), "test")
    before = snapshot(tmp_path)
    cmd = [sys.executable, *evolve_args(data, project, *extra, name=extra[-1] if "--name" in extra else "exp")]
    result = run(cmd, train_env(), 120)
    assert result.returncode == 2, describe([result])
    errors = [line for line in result.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and named in errors[0] and "Traceback" not in result.stderr, describe([result])
    assert "pw@" not in result.stderr  # a password is never printed
    assert snapshot(tmp_path) == before


def test_optunas_dashboard_shows_the_studys_trials_in_a_headless_browser(data, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        message = "no chromium here (Debian: apt-get install chromium)"
        if os.environ.get("REQUIRE_CHROMIUM", "").strip() not in ("", "0"):
            pytest.fail(f"{message}; $REQUIRE_CHROMIUM is set: this test must run here", pytrace=False)
        pytest.skip(message)
    from train import parse_opt

    settings = EvolveSettings.from_options(parse_opt(evolve_args(data, tmp_path, "--evolve", "3")[1:]))
    evolution = Evolution.open(settings, "test")
    for value in (0.2, 0.5, 0.3):  # three trials told as train.py tells them, no training needed to look
        trial = evolution.study.ask()
        trial.report(value / 2, step=1)
        evolution.study.tell(trial, value)
    port = free_port()
    dashboard = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) or "optuna-dashboard"
    serve = [dashboard, settings.storage_url, "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the dashboard did not come up"
                time.sleep(0.5)
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
               "--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp_path / 'b'}",
               "--virtual-time-budget=15000", "--dump-dom", f"http://127.0.0.1:{port}/dashboard/studies/1"]  # fmt: skip
        page = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False).stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style).*?</\1>", "", page, flags=re.S)))
    assert "exp (id=1)" in text, text[:2000]  # the study, by its --name
    assert all(f"trial #{n}" in text for n in (0, 1, 2)), text[:2000]  # its trials, in the intermediate values
    assert "Best Trial (number=1)" in text and np.isclose(float(text.split("Best Trial (number=1)")[1].split()[0]), 0.5)
