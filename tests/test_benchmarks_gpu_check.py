"""benchmarks/gpu/gpu_check.py and its modules: the budgets add up to the call's 8 minutes and the parts run in issue
46's priority order; a part that fails or overruns is a row saying why and the tables come anyway; each train.py row
asserts its "images made on" line; memory is read from train.py's own per-epoch ``mem``; the goals table; every test
that needs CUDA carries the ``cuda`` marker; the decode-order reproduction counts what it should; YOLOv5's epochs
are timed by its callbacks. ``--cpu-smoke`` runs every part tiny on the CPU (slow tier), so the check cannot rot
between the GPU hosts it waits for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from .benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "gpu_check.py"
# issue 46's order, the first step after the data and the render's two forms after YOLOv5 (issue 50)
ISSUE_50_ORDER = [
    "data", "first_step", "ours", "yolov5", "forms", "loader", "decode_order", "memory", "default_job", "workers",
    "cuda_tests",
]  # fmt: skip


def load(name: str = "gpu_check"):
    check = load_benchmark("gpu_check")  # puts benchmarks/gpu/ on sys.path for the modules beside it
    return check if name == "gpu_check" else __import__(name)


def test_the_budgets_add_up_to_the_call_and_the_parts_run_in_the_issues_order():
    check = load()
    assert check.DEFAULT_PARTS == ISSUE_50_ORDER and [p.key for p in check.PARTS if p.optional] == ["cudnn_on"]
    table = check.budgets()
    assert check.CALL_S == 480 and table["total"] == 480 - check.SETUP_S - check.REPORT_S
    assert table["sum"] == sum(part.budget_s for part in check.PARTS if not part.optional) <= table["total"], table
    smoke = check.budgets(cpu_smoke=True)
    assert smoke["sum"] <= smoke["total"] and smoke["parts"]["ours"] == check.SMOKE_SLOWER * table["parts"]["ours"]
    assert check.FULL["images"] == 2000 and check.FULL["epochs"] == 4 and check.FULL["workers"] == 8


def test_the_docs_table_of_parts_is_the_checks():
    check, table = load(), load().budgets()
    text = (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")
    section = text[text.index("## The GPU check") : text.index("## Measured on an H100")]
    assert [int(b) for b in re.findall(r"^\| [^|]+ \| (\d+) s \|", section, flags=re.M)] == [
        part.budget_s for part in check.PARTS if not part.optional
    ]
    assert f"add up to {table['sum']:.0f} s, within the {table['total']:.0f} s left" in section
    assert f"after {check.SETUP_S} s for the wheels' install and {check.REPORT_S} s for the check's start" in section


def test_a_part_past_its_budget_is_a_row_saying_so_and_the_next_part_still_gets_its_own(tmp_path, monkeypatch):
    check, runs = load(), load("check_runs")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    parts = [
        check.Part("slow", "a part that overruns", 2, lambda ctx, t: runs.run_child(sleeper, t, tmp_path / "s.log")),
        check.Part("bug", "a part with a bug", 5, lambda ctx, t: 1 / 0),
        check.Part("fine", "a part that ends", 5, lambda ctx, t: {"run_s": t}),
    ]
    monkeypatch.setattr(check, "PARTS", parts)
    monkeypatch.setattr(check, "SMOKE_SLOWER", 1.0)
    opt = SimpleNamespace(cpu_smoke=True, parts=None)
    started = time.monotonic()
    rows = check.run_parts(opt, tmp_path)
    assert time.monotonic() - started < 30
    assert [row.key for row in rows] == ["slow", "bug", "fine"]
    assert rows[0].got == {"failed": f"timed out after 2 s, its budget (log: {tmp_path / 's.log'})"}
    assert rows[1].got == {"failed": "ZeroDivisionError: division by zero"}
    assert rows[2].got == {"run_s": 5} and rows[2].ok  # its own budget, not what the first one left
    lines = load("check_report").parts_table(rows, images=2000).splitlines()
    assert lines[2].startswith("| a part that overruns | 2 s | 2 s | failed: timed out after 2 s")
    assert lines[3].startswith("| a part with a bug | 5 s | 0 s | failed: ZeroDivisionError")


def test_a_child_past_its_timeout_is_killed_with_its_workers_and_named(tmp_path):
    runs = load("check_runs")
    started, pid_file = time.monotonic(), tmp_path / "worker.pid"
    worker = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {worker!r}])"
    with pytest.raises(runs.PartFailed, match=r"timed out after 2 s"):
        runs.run_child([sys.executable, "-c", parent], 2, tmp_path / "sleep.log")
    assert time.monotonic() - started < 30
    pid = int(pid_file.read_text())
    for _ in range(100):  # the worker, a grandchild like the loader's, goes with its group
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"worker {pid} outlived the timeout")
    with pytest.raises(runs.PartFailed, match=r"exit 3: bad input"):
        runs.run_child([sys.executable, "-c", "import sys; print('bad input'); sys.exit(3)"], 30, tmp_path / "x.log")
    with pytest.raises(runs.PartFailed, match="no time left"):
        runs.run_child([sys.executable, "-c", "pass"], 0.5, tmp_path / "y.log")


def test_each_train_row_asserts_the_images_made_on_line_it_expects():
    runs = load("check_runs")
    cuda = runs.Context(SimpleNamespace(device="0"), Path("."))
    assert cuda.made_on() == "images made on the device cuda:0"
    assert cuda.made_on("workers") == "images made on the loader workers"
    assert runs.Context(SimpleNamespace(device="cpu"), Path(".")).made_on() == "images made on the loader workers"
    device_line = "INFO images made on the device cuda:0: nvJPEG through TorchCodec 0.17.0\n"
    figures = runs.check_made_on("start\n" + device_line, "images made on the device cuda:0", {"run_s": 1.0})
    assert figures == {"run_s": 1.0, "made_on": "images made on the device cuda:0: nvJPEG through TorchCodec 0.17.0"}
    workers_line = "images made on the loader workers: torchcodec has no CUDA JPEG decoder here\n"
    with pytest.raises(runs.PartFailed, match='expected "images made on the device cuda:0", its log says "images m'):
        runs.check_made_on(workers_line, "images made on the device cuda:0", {"run_s": 1.0})
    with pytest.raises(runs.PartFailed, match="its log says no such line") as failed:
        runs.check_made_on("epoch 1/4: ...\n", "images made on the loader workers", {"run_s": 2.0})
    assert failed.value.figures == {"run_s": 2.0, "made_on": None}  # the figures stay in the JSON line


def progress(epoch: int, mem: str, done: int) -> str:
    return f"{epoch}/4 mem {mem} box 0.0500 obj 0.0200 cls 0.0100 {done}/32 {done * 100 // 32}% 1.0s 30.00 it/s"


def test_memory_is_train_pys_own_mem_at_the_end_of_each_epoch(tmp_path):
    runs = load("check_runs")
    ctx = runs.Context(SimpleNamespace(), tmp_path, logs={"ours": tmp_path / "ours.log"})
    ends = ["3.10G", "3.52G", "3.55G", "3.53G"]
    lines = [line for e, end in enumerate(ends, 1) for line in (progress(e, "2.00G", 16), progress(e, end, 32))]
    (tmp_path / "ours.log").write_text("\n".join(["epoch 1/4: loss", *lines]))
    got = runs.memory(ctx, 1)
    assert got["reserved_gib"] == [3.10, 3.52, 3.55, 3.53] and got["epochs"] == 4
    assert got["spread"] == pytest.approx(0.03 / 3.52) and got["flat"] is True  # the first epoch makes what lives on
    growing = ["3.10G", "3.52G", "4.52G", "5.52G"]
    (tmp_path / "ours.log").write_text("\n".join(progress(e, end, 32) for e, end in enumerate(growing, 1)))
    assert runs.memory(ctx, 1)["flat"] is False
    (tmp_path / "ours.log").write_text("\n".join(progress(e, "-", 32) for e in range(1, 5)))  # the CPU: no CUDA memory
    assert runs.memory(ctx, 1) == dict(epochs=4, reserved_gib=[None] * 4, spread=None, flat=None)
    with pytest.raises(runs.PartFailed, match="left no log"):
        runs.memory(runs.Context(SimpleNamespace(), tmp_path), 1)


def test_goals_print_each_figure_beside_its_goal_pass_fail_or_not_measured():
    report = load("check_report")
    rows = {
        "ours": dict(steady_epoch_s=1.25, first_epoch_s=2.5, run_s=30.0, data_wait=0.08, made_on="images made on the "
                     "device cuda:0"),
        "yolov5": dict(steady_epoch_s=5.0, first_epoch_s=6.0, run_s=50.0),
        "loader": {"failed": "timed out after 40 s, its budget"},
        "decode_order": dict(variants=dict(ours=dict(corrupted=0, iterations=200),
                                           torchvision=dict(corrupted=134, iterations=200))),
        "memory": dict(spread=0.004),
        "workers": {"failed": 'expected "images made on the loader workers", its log says no such line',
                    "made_on": None},
    }  # fmt: skip
    verdicts = {goal["name"]: (goal["figure"], goal["verdict"]) for goal in report.goals(rows, images=2000)}
    assert verdicts["steady img/s at 8 workers (ours, default)"] == (1600.0, "pass")
    assert verdicts["data wait, steady epochs (ours, default)"] == (0.08, "fail")
    assert verdicts["the loader alone, img/s"] == (None, "not measured")
    assert verdicts["first epoch / steady epoch (ours, default)"] == (2.0, "fail")
    assert verdicts["4-epoch run, ours / YOLOv5's (wall, start-up included)"] == (0.6, "pass")
    assert verdicts["reserved memory's spread over epochs 2-4 (ours, default)"] == (0.004, "pass")
    assert verdicts["corrupted sums, decode-order reproduction, our decoder"] == (0, "pass")
    assert verdicts["positive control: the same through torchvision's raw call"] == (134, "pass")
    assert verdicts["train.py rows whose 'images made on' line is the expected one"] == (0.5, "fail")
    assert verdicts["CUDA tests failed (python -m pytest -m cuda)"] == (None, "not measured")
    rows["cuda_tests"] = dict(counts=dict(passed=12, failed=1), failed_tests=["tests/engine/test_cuda.py::test_x"])
    assert [g["verdict"] for g in report.goals(rows, images=2000) if g["name"].startswith("CUDA")] == ["fail"]
    table = report.goals_table(report.goals(rows, images=2000))
    assert "| steady img/s at 8 workers (ours, default) | 1,600.00 | >= 1,400 | pass |" in table
    assert "| data wait, steady epochs (ours, default) | 8.0 % | <= 5 % | fail |" in table


# ---- the CUDA tests: the marker ----


def test_every_test_that_skips_without_cuda_carries_the_cuda_marker():
    marks = load("cuda_marks")
    tests = marks.scan(REPO / "tests")
    assert len(tests) > 500  # the scan sees the suite
    missing = marks.unmarked(tests)
    assert not missing, "add @pytest.mark.cuda (python -m pytest -m cuda runs them on a GPU host):\n" + "\n".join(
        map(str, missing)
    )
    assert sum(test.needs_cuda for test in tests) >= 11


SKIPS = """
import pytest
import torch

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decorated(): ...

@needs_cuda
def test_by_a_name(): ...

@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus(): ...

@pytest.mark.skipif(not some_helper(), reason="needs a GPU with nvJPEG")
def test_unjudged_but_named(): ...

def test_skips_in_its_body():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")

@pytest.mark.slow
@pytest.mark.cuda
@needs_cuda
def test_marked_and_slow(): ...

@needs_no_gpu
def test_cpu_only(): ...

@pytest.mark.parametrize("case", [1])
def test_skip_on_its_own_value(case):
    if case == 1 and torch.cuda.device_count() > 3:
        pytest.skip("this host has a device 3")

@pytest.mark.skipif(CUDA, reason="checks the CPU-only behaviour")
class TestCpu:
    def test_in_a_class(self): ...
"""


def test_the_marker_scan_sees_each_way_a_test_skips_without_cuda(tmp_path):
    marks = load("cuda_marks")
    (tmp_path / "test_skips.py").write_text(SKIPS)
    (tmp_path / "test_module.py").write_text(
        "import pytest, torch\n"
        "pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')]\n"
        "def test_whole_module(): ...\n"
    )
    tests = {test.name: test for path in sorted(tmp_path.glob("test_*.py")) for test in marks.scan_file(path)}
    assert {test.name for test in marks.unmarked(list(tests.values()))} == {
        "test_decorated", "test_by_a_name", "test_two_gpus", "test_unjudged_but_named", "test_skips_in_its_body",
        "test_whole_module",
    }  # fmt: skip
    assert tests["test_marked_and_slow"].marked and tests["test_marked_and_slow"].needs_cuda
    for name in ("test_cpu_only", "test_skip_on_its_own_value", "test_in_a_class"):
        assert not tests[name].needs_cuda, name


def test_the_cuda_tests_command_overrides_the_fast_tiers_not_slow():
    command = load("check_runs").cuda_tests_command(collect_only=False)
    assert command[command.index("-m", 3) + 1] == "cuda" and "not slow" not in " ".join(command)
    assert command[command.index("-o") + 1] == "addopts=" and "--collect-only" not in command
    assert load("check_runs").cuda_tests_command(collect_only=True)[-1] == "--collect-only"


# ---- the decode-order reproduction ----


class QueuedUntilRead:
    """A queue whose reads run only when their results are read: the CPU's stand-in for a stream with work queued,
    so that a decode can run between the free and the reads."""

    def __init__(self, order) -> None:
        self.device, self.pending, self.order = torch.device("cpu"), [], order

    def read_later(self, tensors):
        self.pending = list(tensors)  # the blocks the queued reads will read (the allocator's view of the free)
        return [lambda t=t: t.sum() for t in tensors]

    def wait(self) -> None:
        self.order.append("wait")

    def results(self, sums):
        self.order.append("read")
        return [int(read()) for read in sums]


def test_the_reproduction_counts_a_decode_that_writes_into_blocks_still_queued_for_reading():
    order = load("decode_order")
    datas, sizes = [torch.zeros(4, dtype=torch.uint8)] * 3, [100, 200, 300]
    seen = []
    queue = QueuedUntilRead(seen)

    def careless(batch):  # handed two of the freed blocks, it writes before the queued reads ran
        seen.append("decode")
        return [queue.pending[0].zero_(), queue.pending[2].fill_(7)]

    assert order.corrupted_in_one(careless, datas, sizes, queue, seed=0) == 2
    assert seen == ["wait", "decode", "wait", "read"]  # filled and settled, freed, decoded, waited, compared
    assert order.corrupted_in_one(lambda batch: [torch.zeros(300, dtype=torch.uint8)], datas, sizes, queue, 1) == 0
    assert order.corrupted_in_one(None, datas, sizes, queue, seed=2) == 0


def test_on_the_cpu_every_decoder_counts_nothing_corrupted(tmp_path):
    from PIL import Image

    order = load("decode_order")
    for k in range(3):
        Image.new("RGB", (40 + 8 * k, 32), (40 * k, 90, 200)).save(tmp_path / f"{k}.jpg")
    datas, sizes = order.read_batch(tmp_path, 2)
    assert sizes == [3 * 32 * 40, 3 * 32 * 48]
    got = order.reproduce(datas, sizes, torch.device("cpu"), iterations=3, seconds=60)
    variants = got["variants"]
    assert variants["none"] == dict(decoder="no decode (the harness's control)", corrupted=0, iterations=3)
    assert variants["torchvision"]["corrupted"] == 0 and variants["torchvision"]["iterations"] == 3
    assert "error" not in variants["ours"] and variants["ours"]["corrupted"] == 0  # the guarded decoder


# ---- YOLOv5's epochs by its own callbacks ----


def test_yolov5s_epochs_are_timed_from_its_epoch_start_to_its_epoch_end(tmp_path):
    timed = load("yolov5_timed")
    timer = timed.EpochTimer(tmp_path / "epochs.jsonl")
    for epoch, pause in ((0, 0.05), (1, 0.01)):
        timer.start()
        time.sleep(pause)
        timer.end(epoch=epoch)
    timer.start()  # an epoch cut short: never ended, never written
    seconds = timed.read_times(tmp_path / "epochs.jsonl")
    assert len(seconds) == 2 and seconds[0] >= 0.05 and 0.01 <= seconds[1] < seconds[0]
    assert timed.read_times(tmp_path / "none.jsonl") == []
    with pytest.raises(SystemExit, match="is no YOLOv5 checkout"):
        timed.run_yolov5(tmp_path, tmp_path / "t.jsonl", [])


YOLOV5_TRAIN = """
import argparse
import time


def parse_opt(known=False):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    return parser.parse_known_args()[0]


def main(opt, callbacks):  # as YOLOv5 v7.0's: each epoch between its two hooks, validation after the end hook
    for epoch in range(opt.epochs):
        callbacks.run("on_train_epoch_start")
        for ni in range(2):  # v7.0's batch hook: (model, ni, imgs, targets, paths, mloss)
            time.sleep(0.025)
            callbacks.run("on_train_batch_end", None, epoch * 2 + ni, None, None, [], [0.0, 0.0, 0.0])
        callbacks.run("on_train_epoch_end", epoch=epoch)
        time.sleep(0.02)
"""
YOLOV5_CALLBACKS = """
class Callbacks:
    def __init__(self):
        self._callbacks = {"on_train_epoch_start": [], "on_train_batch_end": [], "on_train_epoch_end": []}

    def register_action(self, hook, name="", callback=None):
        assert hook in self._callbacks, hook
        self._callbacks[hook].append({"name": name, "callback": callback})

    def run(self, hook, *args, **kwargs):
        for action in self._callbacks[hook]:
            action["callback"](*args, **kwargs)
"""


def yolov5_stand_in(root: Path) -> Path:
    """A directory with YOLOv5 v7.0's two entry points the wrapper uses (``train.parse_opt``/``main(opt,
    callbacks)``, ``utils.callbacks.Callbacks``), written here from their documented behaviour."""
    (root / "utils").mkdir(parents=True)
    (root / "train.py").write_text(YOLOV5_TRAIN)
    (root / "utils" / "__init__.py").write_text("")
    (root / "utils" / "callbacks.py").write_text(YOLOV5_CALLBACKS)
    return root


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_cpu_smoke_runs_every_part_in_order_within_its_budget_and_prints_the_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    yolov5 = yolov5_stand_in(tmp_path / "yolov5")
    command = [sys.executable, str(SCRIPT), "--cpu-smoke", "--dir", str(tmp_path / "work"), "--yolov5", str(yolov5)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=1450)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("| part | budget | took |") for line in lines)
    assert any(line.startswith("| issue 40's goal") for line in lines)
    result = json.loads(lines[-1].removeprefix("GPU_CHECK "))
    assert result["order"] == ISSUE_50_ORDER and list(result["rows"]) == ISSUE_50_ORDER
    budget = result["budget"]
    assert budget["sum"] <= budget["total"]
    assert all(result["took"][key] <= budget["parts"][key] + 5 for key in ISSUE_50_ORDER), result["took"]
    rows = result["rows"]
    assert_smoke_rows(rows)


def assert_smoke_rows(rows: dict) -> None:
    assert rows["data"]["train_images"] == 8
    for key in ("ours", "workers", "default_job"):  # the CPU: the workers make the images
        assert "failed" not in rows[key] and rows[key]["made_on"].startswith("images made on the loader workers")
    first = rows["first_step"]  # asked for the device path, the device makes them (the CPU too)
    for mode in ("device-cold", "device-warm", "workers"):
        assert first[mode]["code"] == 0 and first[mode]["traceback"] is False and first[mode]["first_batch_s"] > 0
    assert first["device-cold"]["made_on"].startswith("images made on the device cpu") and first["compile_cold_s"] > 0
    forms = rows["forms"]
    assert forms["batches"] == 4 and forms["values"] > 0 and forms["differing"] == 0 and forms["fell_back"] == []
    ours = rows["ours"]
    assert len(ours["epochs_s"]) == 4 and ours["steady_epoch_s"] > 0 and ours["run_s"] > 0, ours
    assert len(rows["yolov5"]["epochs_s"]) == 4 and 0.05 <= rows["yolov5"]["steady_epoch_s"] < 1, rows["yolov5"]
    assert 0.025 <= rows["yolov5"]["first_batch_s"] < rows["yolov5"]["run_s"], rows["yolov5"]
    assert rows["loader"]["img_s"] > 0 and rows["loader"]["images"] == 8 and rows["loader"]["render_peak_bytes"] is None
    variants = rows["decode_order"]["variants"]
    assert variants["none"]["corrupted"] == 0 and variants["torchvision"]["corrupted"] == 0
    assert variants["torchvision"]["iterations"] == 3
    assert "error" not in variants["ours"] and variants["ours"]["corrupted"] == 0  # the guarded decoder
    assert rows["memory"] == dict(epochs=4, reserved_gib=[None] * 4, spread=None, flat=None)  # the CPU: "mem -"
    assert 0 <= rows["default_job"]["map"] <= rows["default_job"]["map50"] <= 1
    cuda = rows["cuda_tests"]
    assert cuda["counts"]["collected"] == cuda["marked"] >= 13 and cuda["unmarked"] == [], cuda
