"""benchmarks/parity/parity.py and parity_step.py: their argument checks, the report, and our side end to end.

YOLOv5's side needs an ultralytics/yolov5 checkout (v7.0) and an interpreter that runs it: set
``DDP_UTILS_YOLOV5=<checkout>`` and ``DDP_UTILS_YOLOV5_PYTHON=<its venv's python>`` to run those tests
too; without them they are skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARITY = REPO / "benchmarks" / "parity" / "parity.py"
PARITY_STEP = REPO / "benchmarks" / "parity" / "parity_step.py"
YOLOV5 = os.environ.get("DDP_UTILS_YOLOV5")
YOLOV5_PYTHON = os.environ.get("DDP_UTILS_YOLOV5_PYTHON", sys.executable)
needs_yolov5 = pytest.mark.skipif(
    not YOLOV5,
    reason="YOLOv5's side needs a checkout: set DDP_UTILS_YOLOV5=<ultralytics/yolov5 v7.0> and "
    "DDP_UTILS_YOLOV5_PYTHON=<the interpreter of its venv>",
)
TINY = ["--epochs", "1", "--n-train", "16", "--n-val", "8", "--imgsz", "64", "--batch-size", "8", "--size", "64", "96"]


def load_parity():
    spec = importlib.util.spec_from_file_location("parity_benchmark", PARITY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(script: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout
    )


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    done = run(PARITY, "--yolov5", str(tmp_path / "nowhere"), "--epochs", "0", "--imgsz", "100", "--dir", str(tmp_path))
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert "--epochs 0 must be >= 1" in error and "--imgsz 100 must be a multiple of 32" in error
    assert f"--yolov5 {tmp_path / 'nowhere'}: no train.py there" in error
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir())  # nothing made

    not_v5 = tmp_path / "other"
    (not_v5 / "models").mkdir(parents=True)
    (not_v5 / "train.py").write_text("nbs = 16\n")
    (not_v5 / "models" / "yolov5n.yaml").write_text("nc: 80\n")
    done = run(PARITY, "--yolov5", str(not_v5))
    assert done.returncode == 2 and "does not set nbs = 64" in done.stderr

    done = run(PARITY)
    assert done.returncode == 2 and "--yolov5 PATH" in done.stderr and "--ours-only" in done.stderr
    done = run(PARITY_STEP, "--yolov5", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "give an ultralytics/yolov5 checkout" in done.stderr


def fixture_results(ours_map: list[float], theirs_map: list[float], hosts: tuple[str, str] = ("h", "h")) -> dict:
    runs = {}
    anchors = "5.90 anchors/target, 1.000 Best Possible Recall (BPR). Current anchors are a good fit"
    v5_key = dict(regime="fixture", commit="915bbf2", python="/v5/bin/python", python_version="3.11.7", torch="2.14.1")
    for k, (ours, theirs) in enumerate(zip(ours_map, theirs_map)):
        losses = [[0.1, 0.02, 0.04]] * 2
        runs[str(k)] = {
            "yolov5": dict(
                scores=dict(map50=0.9, map=theirs), wall_s=400.0, cpu_s=300.0, losses=losses, autoanchor=anchors,
                epoch_s=[150.0, 150.0], host=hosts[0], key=v5_key,
            ),
            "ours": dict(
                scores=dict(map50=0.95, map=ours), wall_s=300.0, cpu_s=240.0, losses=[[0.12, 0.02, 0.04]] * 2,
                epoch_s=[60.0, 60.0], host=hosts[1], key=dict(regime="fixture", amp="off", layout="channels_last"),
            ),
        }  # fmt: skip
    return dict(setup=dict(description="fixture"), runs=runs)


def test_report_gives_mean_std_ratios_the_goal_and_the_loss_curves():
    parity = load_parity()
    text = parity.report(fixture_results([0.81, 0.80, 0.83], [0.80, 0.82, 0.84]))
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    figures = "| 0.900 | 0.950 | 0.820 | 0.813 | 300 | 120 | 400 | 300 | 300 | 240 | 2.50 | 0.75 | 0.80 |"
    assert rows["| mean"] == "| mean " + figures
    assert rows["| std"].startswith("| std | 0.000 | 0.000 | 0.020 | 0.015 |")
    assert "0.813 >= YOLOv5's mean minus one std 0.820 - 0.020 = 0.800: met" in text
    assert "epochs' wall time YOLOv5/ours 2.50" in text and "whole process's wall ours/YOLOv5 0.75" in text
    assert "Best Possible Recall" in text and '"commit": "915bbf2"' in text and '"layout": "channels_last"' in text
    assert "| 2 | 0.1000 / 0.0200 / 0.0400 | 0.1200 / 0.0200 / 0.0400 | 1.200 |" in text
    assert "std ours/YOLOv5 0.015 / 0.020 = 0.76 (at most 1.5), mean ours/YOLOv5 0.992 (at least 0.95): met" in text
    assert "NOT met" in parity.report(fixture_results([0.70, 0.71, 0.72], [0.80, 0.82, 0.84]))
    spread = parity.report(fixture_results([0.78, 0.82, 0.86], [0.80, 0.82, 0.84]))  # mean equal, spread 2x
    steadiness = next(line for line in spread.splitlines() if line.startswith("steadiness"))
    assert "= 2.00 (at most 1.5)" in steadiness and "mean ours/YOLOv5 1.000" in steadiness
    assert steadiness.endswith("NOT met")


def test_report_judges_no_goal_from_one_seed_or_zero_scores_and_times_only_one_host():
    parity = load_parity()
    one = parity.report(fixture_results([0.9], [0.5]))
    assert "goal: not judged (fewer than 2 seeds" in one and "met" not in one.replace("not judged", "")
    zeros = parity.report(fixture_results([0.0, 0.0], [0.0, 0.0]))
    assert "goal: not judged (every score is 0" in zeros and ": met" not in zeros
    apart = parity.report(fixture_results([0.81, 0.80], [0.80, 0.82], hosts=("AVX512", "AVX2")))
    assert ": met" in apart and "YOLOv5/ours" not in apart  # scores hold anywhere, times only side by side
    assert "| mean | 0.900 | 0.950 | 0.810 | 0.805 | 300 | 120 | 400 | 300 | 300 | 240 |" in apart


def test_report_says_why_yolov5s_epoch_times_read_a_dash():
    """A YOLOv5 checkout whose progress bars are not v7.0's leaves no epoch times in its log: the report says so
    (and which seeds), as it does for runs recorded before epoch times were read; times found say nothing."""
    parity = load_parity()
    results = fixture_results([0.81, 0.80, 0.83], [0.80, 0.82, 0.84])
    results["runs"]["1"]["yolov5"]["epoch_s"] = []  # parity_record found no v7.0 bar in the log
    del results["runs"]["2"]["yolov5"]["epoch_s"]  # a results.json from before epoch times
    text = parity.report(results)
    seed_rows = [line.split(" | ") for line in text.splitlines() if line.startswith(("| 0 |", "| 1 |", "| 2 |"))][:3]
    assert [row[5] for row in seed_rows] == ["300", "-", "-"]  # yolov5 epochs s (the loss table's rows follow)
    notes = [line for line in text.splitlines() if line.startswith("yolov5 epochs s: - for seed(s)")]
    assert len(notes) == 2, text
    assert notes[0].startswith("yolov5 epochs s: - for seed(s) 2: recorded before")
    assert notes[1].startswith("yolov5 epochs s: - for seed(s) 1: its log (<--dir>/yolov5/seed<N>.log) holds no")
    assert "YOLOv5 v7.0's form" in notes[1] and "parity_record.YOLOV5_EPOCH_BAR" in notes[1]
    assert "epochs' wall time YOLOv5/ours 2.50" in text  # seed 0, timed on both sides, still gives the ratio
    assert "yolov5 epochs s: -" not in parity.report(fixture_results([0.81, 0.80], [0.80, 0.82]))


def test_runs_are_reused_only_under_the_same_key():
    parity = load_parity()
    results = fixture_results([0.81, 0.80, 0.83], [0.80, 0.82, 0.84])
    keys = {side: results["runs"]["0"][side]["key"] for side in ("yolov5", "ours")}
    assert set(parity.reusable_runs(results, keys, None)) == {"0", "1", "2"}
    assert set(parity.reusable_runs(results, keys, {"1", "7"})) == {"1"}
    other_commit = {**keys, "yolov5": {**keys["yolov5"], "commit": "abc"}}
    other_python = {**keys, "yolov5": {**keys["yolov5"], "python_version": "3.12.1"}}
    for changed in (other_commit, other_python):
        assert {side for run in parity.reusable_runs(results, changed, None).values() for side in run} == {"ours"}
    bf16 = {"ours": {**keys["ours"], "amp": "bf16"}}  # --ours-only: no YOLOv5 key at all
    assert parity.reusable_runs(results, bf16, None) == {}


def test_the_options_are_recorded_as_json_with_reused_files():
    parity = load_parity()
    args = parity.parse_args(["--ours-only", "--reuse", "a/results.json", "b/results.json", "--dir", "runs/p"])
    recorded = json.loads(json.dumps(parity.recorded_args(args)))
    assert recorded["reuse"] == ["a/results.json", "b/results.json"] and recorded["dir"] == "runs/p"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ours_only_end_to_end_then_the_table_again(tmp_path):
    done = run(PARITY, "--ours-only", "--seeds", "3", *TINY, "--dir", str(tmp_path), timeout=580)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    ours = results["runs"]["3"]["ours"]
    assert set(results["runs"]["3"]) == {"ours"} and "no YOLOv5 checkout" in results["skipped"]["yolov5"]
    assert 0 <= ours["scores"]["map"] <= ours["scores"]["map50"] <= 1 and ours["wall_s"] > 0 and ours["cpu_s"] > 0
    assert len(ours["losses"]) == 1 and all(v > 0 for v in ours["losses"][0])
    assert "yolov5: skipped (--ours-only" in done.stdout and "| 3 | " in done.stdout
    again = run(PARITY, "--table", str(tmp_path / "results.json"))
    assert again.returncode == 0 and again.stdout.strip() in done.stdout
    # the same settings again: the run is kept, not redone
    kept = run(PARITY, "--ours-only", "--seeds", "3", *TINY, "--dir", str(tmp_path), timeout=120)
    assert (
        kept.returncode == 0 and "seed 3: keeping the run(s) of ours" in kept.stdout and "training" not in kept.stdout
    )
    assert again.stdout.strip() in kept.stdout


@needs_yolov5
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_both_sides_one_epoch(tmp_path):
    args = ["--yolov5", YOLOV5, "--yolov5-python", YOLOV5_PYTHON, "--seeds", "0", *TINY, "--dir", str(tmp_path)]
    done = run(PARITY, *args, timeout=880)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run0 = json.loads((tmp_path / "results.json").read_text())["runs"]["0"]
    assert set(run0) == {"yolov5", "ours"} and "Best Possible Recall" in run0["yolov5"]["autoanchor"]
    assert "epochs' wall time YOLOv5/ours" in done.stdout and run0["yolov5"]["epoch_s"] and run0["ours"]["epoch_s"]


@needs_yolov5
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_first_step_agrees_with_yolov5(tmp_path):
    args = ["--yolov5", YOLOV5, "--yolov5-python", YOLOV5_PYTHON, "--n-train", "32", "--imgsz", "64", "--epochs", "1"]
    done = run(PARITY_STEP, *args, "--batch-size", "8", "--dir", str(tmp_path), timeout=580)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in done.stdout.splitlines()}
    assert float(rows["first batch's loss items (box, obj, cls)"][1]) < 1e-5
    assert float(rows["gradients at the first optimizer step (after clipping)"][1]) < 1e-4
    assert float(rows["weights after the first optimizer step"][1]) < 1e-6
