"""The device render's compiled kernels: made beside the run, the same images as their uncompiled form bit for bit,
a failure one line and the uncompiled form, gone with the run.

The slow tests compile for real (AOTInductor, C++ on the CPU) into the machine's kernel cache, as a user's run
does: the first to need a kernel compiles it (a minute or two of CPU), the others load it. The tests of a failing
compiler use a cache of their own, so that they do compile (and fail).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ddp_utils.data.dataset import SampleKey, YoloDataset
from ddp_utils.data.device.compiled import CompiledKernels
from ddp_utils.data.device.kernel_cache import KERNEL_NAMES, KernelFailed, kernels_for
from ddp_utils.data.device.recipes import RecipeCollate, plan_sample
from ddp_utils.data.device.render import Renderer, warm_up_batch
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.data.loader import create_dataloader
from ddp_utils.data.synthetic import make_shapes_dataset
from tests.multiproc import REPO_ROOT
from tests.workers.data_scenarios import AUGMENT_HYPS, HYP

CPU = torch.device("cpu")
COMPILE_S = 1800  # every kernel compiled cold on a loaded 2-core host, at most


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_shapes_dataset(tmp_path_factory.mktemp("compiled") / "shapes", 16, 4, size=(48, 200))


@pytest.fixture(scope="module")
def compiled() -> Renderer:
    """A renderer whose kernels, every one of them, are compiled (the machine's cache: compiled once)."""
    renderer = Renderer(CPU)
    assert renderer.kernels.wait(KERNEL_NAMES, COMPILE_S), renderer.kernels.state()
    return renderer


def planned(dataset: YoloDataset, keys: list[SampleKey]):
    return RecipeCollate(dataset)([plan_sample(dataset, key) for key in keys])[0]


def batches_of_every_kind(root: Path) -> list:
    """Batches of each hyp (mosaics, letterboxes, warps, mixups, flips, strong hues), a rect batch wider than high,
    a batch of one image, and the compile's own example (its tiles already their size)."""
    labels = load_labels(find_images(root / "images" / "train"))
    batches = [warm_up_batch(), warm_up_batch(40, 72)]
    for hyp in (*AUGMENT_HYPS.values(), dict(HYP, hsv_h=0.3)):
        dataset = YoloDataset(labels, 96, 4, augment=True, hyp=hyp, seed=7)
        batches.append(planned(dataset, [SampleKey(1, slot, (5 * slot) % len(dataset)) for slot in range(5)]))
    rect = YoloDataset(labels, 96, 2, augment=True, hyp=HYP, rect=True, seed=1)  # 2 a batch: some not square
    wide = next(b for b, (h, w) in enumerate(rect.batch_shapes) if h != w)
    batches.append(planned(rect, [SampleKey(0, 0, int(i)) for i in np.flatnonzero(rect.batch_index == wide)]))
    batches.append(planned(YoloDataset(labels, 64, 4, augment=True, hyp=HYP, seed=2), [SampleKey(0, 0, 3)]))
    return batches


@pytest.mark.slow
@pytest.mark.timeout(COMPILE_S + 600)
def test_the_compiled_kernels_make_the_uncompiled_forms_images_bit_for_bit(root, compiled):
    eager = Renderer(CPU, compiled=False)
    for k, batch in enumerate(batches_of_every_kind(root)):
        for channels_last in (True, False):
            got, want = compiled(batch, channels_last=channels_last), eager(batch, channels_last=channels_last)
            assert torch.equal(got, want), (k, channels_last, int((got != want).sum()))
            assert got.stride() == want.stride()
    assert set(compiled.kernels.state().values()) == {"loaded"}  # no kernel fell back on the way


@pytest.mark.slow
@pytest.mark.timeout(COMPILE_S + 600)
@pytest.mark.parametrize("switch_at", [0, 2, 5])
def test_where_the_switch_to_the_compiled_kernels_falls_changes_no_batch(root, compiled, switch_at):
    # a run's batches rendered uncompiled up to batch `switch_at`, compiled from then on (the compile's end is a
    # matter of time): every batch is the one the uncompiled form makes
    hyp = AUGMENT_HYPS["general_warp_mixup_flips"]
    loader, _ = create_dataloader(root / "images" / "train", 64, 2, 32, hyp=hyp, augment=True, shuffle=True, seed=3,
                                  augment_on="device", workers=0)  # fmt: skip
    loader.set_epoch(1)
    seen = []
    switching = Renderer(CPU, compiled=False)
    switching.kernels = SwitchingAt(compiled.kernels, lambda: len(seen) >= switch_at)
    eager = Renderer(CPU, compiled=False)
    for batch, *_ in loader:
        assert torch.equal(switching(batch), eager(batch)), len(seen)
        seen.append(batch)
    assert len(seen) == len(loader) > switch_at


@pytest.mark.slow
@pytest.mark.timeout(COMPILE_S + 600)
def test_each_compiled_kernel_allocates_its_output_and_nothing_else(compiled):
    # one loop per kernel, nothing stored between its parts (kernel_compile.INDUCTOR_CONFIGS): what a kernel allocates
    # is its output, counted by the profiler as render_ops.py counts a batch
    from torch.profiler import ProfilerActivity, profile

    compiled.calls = {}
    try:
        compiled(warm_up_batch(64, 96), channels_last=True)
        compiled(warm_up_batch(64, 96), channels_last=False)
        calls = dict(compiled.calls)
    finally:
        compiled.calls = None
    assert set(calls) == set(KERNEL_NAMES)
    for name, inputs in calls.items():
        kernel = compiled.kernels.ready(name)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = kernel(*inputs)
        allocated = sum(max(event.cpu_memory_usage, 0) for event in prof.events() if event.name == "[memory]")
        assert allocated == out.untyped_storage().nbytes(), (name, allocated, out.untyped_storage().nbytes())


class SwitchingAt:
    """Compiled kernels that are ready only once ``now()`` says so: where a compile's end falls in a run."""

    def __init__(self, kernels: CompiledKernels, now) -> None:
        self.kernels, self.now = kernels, now

    def ready(self, name: str):
        return self.kernels.ready(name) if self.now() else None

    def failed(self, name: str, error) -> None:
        self.kernels.failed(name, error)


@pytest.mark.slow
@pytest.mark.timeout(COMPILE_S + 600)
def test_a_kernel_that_fails_while_running_is_one_line_and_the_same_images(compiled, caplog, monkeypatch):
    batch = warm_up_batch(48, 64)
    kernel = compiled.kernels.ready("render_cl")
    tables = (torch.zeros(2, 256, dtype=torch.int32), torch.zeros(256), torch.zeros(2, 48), torch.zeros(2, 64))
    rows = torch.zeros(3, 64, dtype=torch.int64), torch.zeros(3, 38)
    for wrong in (
        (batch.data[:0], *rows, *tables),  # no pixels at all
        (batch.data, torch.zeros(1, 64, dtype=torch.int64), torch.zeros(1, 38), *tables),  # a table of one row
        (batch.data, rows[0], torch.zeros(2, 38), *tables),  # tables of 3 and 2 rows
        (batch.data, rows[0].int(), rows[1], *tables),  # int32 where the kernel takes int64
        (batch.data, rows[0], rows[1].t().contiguous().t(), *tables),  # another memory layout
        (batch.data, *rows, *tables[:3]),  # an input short
    ):
        with pytest.raises(KernelFailed, match="compiled"):  # refused before the library reads out of bounds
            kernel(*wrong)
    renderer = Renderer(CPU)
    renderer.kernels = CompiledKernels(CPU)
    renderer.kernels.start(["render_cl"])
    assert renderer.kernels.wait(["render_cl"], COMPILE_S)

    def failing(*inputs):
        raise KernelFailed("the compiled kernel failed (error 1): out of memory")

    monkeypatch.setitem(renderer.kernels._loaded, "render_cl", failing)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        first, second = renderer(batch), renderer(batch)
    want = Renderer(CPU, compiled=False)(batch)
    assert torch.equal(first, want) and torch.equal(second, want)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [
        "device render: the compiled kernel render_cl failed while running (KernelFailed: the compiled kernel failed "
        "(error 1): out of memory); the uncompiled form renders the same images from here"
    ]
    assert renderer.kernels.ready("render_cl") is None  # and it is not tried again


FAILING_CXX = """#!/bin/sh
# a C++ compiler that answers to --version and fails every compile: the kernels' own compile fails
case "$1" in --version) exec g++ --version ;; esac
echo "cc1plus: out of memory allocating 1048576 bytes" >&2
exit 1
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("compiler", ["failing", "none"])
def test_a_compiler_that_fails_on_the_real_kernels_is_one_line_and_the_same_images(
    tmp_path, caplog, monkeypatch, compiler
):
    # a compiler that fails on the kernels themselves (their export and Inductor's code done: the C++ compile
    # fails), or none at all (CXX=/bin/false: said before any tracing); the run renders uncompiled, the same images
    cxx = tmp_path / "failing-g++"
    cxx.write_text(FAILING_CXX)
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx) if compiler == "failing" else "/bin/false")
    renderer = Renderer(CPU)
    renderer.kernels = CompiledKernels(CPU, tmp_path / "kernels")
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        renderer.kernels.start(kernels_for(channels_last=True, mixup=True))
        assert not renderer.kernels.wait(kernels_for(True, True), 500)
        batch = warm_up_batch()
        assert torch.equal(renderer(batch), Renderer(CPU, compiled=False)(batch))
    said = [r.getMessage() for r in caplog.records if "device render" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(
        "device render: the compiled kernels render_cl, resize, render_mixup_cl did not compile ("
    )
    assert "log: " in said[0] and said[0].endswith("the uncompiled form renders the same images from here")
    assert "\n" not in said[0] and "Traceback" not in said[0]
    why = "InvalidCxxCompiler: No working C++ compiler" if compiler == "none" else "out of memory allocating"
    assert why in said[0], said[0]
    log = Path(said[0].split("log: ")[1].split(")")[0])
    assert "Traceback" in log.read_text()  # the whole story is in the log, for whoever wants it
    assert set(renderer.kernels.state().values()) == {renderer.kernels.state()["render_cl"]}
    assert not list((tmp_path / "kernels").glob("render*-cpu-*")) and not list(
        (tmp_path / "kernels").glob(".compile-*")
    )


def test_with_the_cache_off_nothing_compiles_and_the_render_is_the_uncompiled_one(monkeypatch, caplog):
    monkeypatch.setenv("DDP_UTILS_KERNEL_CACHE", "off")
    renderer = Renderer(CPU)
    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        renderer.prepare(channels_last=True, mixup=False)
        batch = warm_up_batch(32)
        assert torch.equal(renderer(batch), Renderer(CPU, compiled=False)(batch))
    assert renderer.kernels._compiling == [] and renderer.kernels.state() == {}
    said = [r.getMessage() for r in caplog.records if "device render" in r.getMessage()]
    assert said == ["device render: the kernels run uncompiled (DDP_UTILS_KERNEL_CACHE=off)"]


def test_a_cache_others_could_write_is_left_for_a_folder_of_the_process(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    kernels = CompiledKernels(CPU, shared)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        private = kernels._cache()
    assert private != shared and private.stat().st_mode & 0o777 == 0o700
    (said,) = [r.getMessage() for r in caplog.records]
    assert f"the kernel cache is not used ({shared} is writable by others (mode 0o777))" in said
    kernels.close()
    assert not private.exists()  # the process's own folder goes with it


ENDS_WITH_A_COMPILE = """
import sys, time
from pathlib import Path
from ddp_utils.data.device.compiled import CompiledKernels
kernels = CompiledKernels("cpu", Path(sys.argv[1]))
kernels.start(["render_cl", "resize"], at_once=True)
while not list(Path(sys.argv[1]).glob(".render_cl-*.lock")):  # the compile holds its kernel's lock: under way
    time.sleep(0.05)
print("compiling", flush=True)
"""


def compiles_into(cache: Path) -> list[int]:
    """The processes compiling into ``cache``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(cache).encode() in command and b"kernel_compile" in command:
            found.append(int(proc.name))
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_compile_never_outlives_its_process_nor_holds_its_end(tmp_path):
    # the process ends while its compile goes on: it exits at once, and the compile (with its compiler's
    # processes) goes with it; and a process killed outright takes its compile along too (its stdin closes)
    for how in ("exits", "killed"):
        cache = tmp_path / how
        # the process holds until the test has seen its compile (a line on its stdin; an exit at once raced the look)
        code = ENDS_WITH_A_COMPILE + ("sys.stdin.readline()\n" if how == "exits" else "time.sleep(600)\n")
        process = subprocess.Popen([sys.executable, "-c", code, str(cache)], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert process.stdout.readline() == "compiling\n", process.stderr.read()
        assert compiles_into(cache)
        start = time.monotonic()
        if how == "killed":
            process.kill()
        _, err = process.communicate("end\n" if how == "exits" else None, timeout=60)
        ended = time.monotonic() - start
        deadline = time.monotonic() + 30
        while compiles_into(cache) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert compiles_into(cache) == [], how
        assert "Traceback" not in err and process.returncode == (0 if how == "exits" else -9), (how, err)
        assert ended < 30, (how, ended)  # not the minute or two the compile would have taken


@pytest.mark.slow
@pytest.mark.timeout(COMPILE_S + 600)
def test_the_compiled_kernel_leaves_the_interpreter_to_other_threads(compiled):
    # on the CPU the render's seconds must not hold the training thread: the library's call releases the GIL
    batch = warm_up_batch(200, 280)
    tiles, layouts = compiled._tiles(batch)
    from ddp_utils.data.device.plan import row_tables, tables_on

    ints, floats = tables_on(CPU, [np.repeat(a, 40, 0) for a in row_tables(batch.plan, layouts)])
    kernel = compiled.kernels.ready("render_cl")
    inputs = (tiles, ints, floats, *compiled._tables, compiled._coordinates(200)[1], compiled._coordinates(280)[1])

    def counted(work) -> tuple[int, float]:
        count, done = [0], threading.Event()

        def count_on():
            while not done.is_set():
                count[0] += 1

        thread = threading.Thread(target=count_on)
        thread.start()
        start = time.perf_counter()
        work()
        took = time.perf_counter() - start
        done.set()
        thread.join()
        return count[0], took

    during, took = counted(lambda: [kernel(*inputs) for _ in range(3)])
    idle, _ = counted(lambda: time.sleep(took))
    assert during > 0.25 * idle, (during, idle)  # held, the counter gets a few % of its idle count


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> list[str]:
    """train.py's options for a 1-epoch run of 16 images at 64 px on the device path (the CPU, the renderer's)."""
    root = tmp_path_factory.mktemp("run")
    make_shapes_dataset(root / "shapes", 16, 4, size=(48, 96), max_objects=3)
    data = root / "shapes.yaml"
    data.write_text(f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
                    "names: {0: circle, 1: square, 2: triangle, 3: star}\n")  # fmt: skip
    return ["train.py", "--data", str(data), "--cfg", "yolov5n.yaml", "--imgsz", "64", "--batch-size", "4",
            "--epochs", "1", "--device", "cpu", "--workers", "1", "--augment-on", "device", "--noplots"]  # fmt: skip


def _train(args: list[str], cache: str, project: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "DDP_UTILS_KERNEL_CACHE": cache, "DDP_UTILS_PROGRESS": "off"}
    return subprocess.run([sys.executable, *args, "--project", str(project), "--name", "run"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_that_ends_while_its_compile_goes_on_ends_as_the_workers_path_does(tiny_run, tmp_path):
    # a cold cache: the compile (a minute or more) outlasts the run (seconds); the run renders uncompiled, exits 0,
    # prints no thread's traceback, and takes its compile along
    cache = tmp_path / "kernels"
    done = _train(tiny_run, str(cache), tmp_path / "runs")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout and "InductorError" not in done.stderr, done.stderr[-3000:]
    assert "train: images made on the device cpu (--augment-on device)" in done.stderr
    assert "compiled kernels ready" not in done.stderr and not list(cache.glob("render_cl-*"))  # still compiling
    assert list((cache / "logs").glob("compile-*.log"))  # it had begun (at the second batch)
    assert compiles_into(cache) == []  # and went with the run
    assert (tmp_path / "runs" / "run" / "weights" / "last.pt").is_file()


@pytest.mark.slow
@pytest.mark.timeout(COMPILE_S + 900)
def test_a_run_is_the_same_bit_for_bit_rendered_uncompiled_or_compiled(tiny_run, compiled, tmp_path):
    # the machine's cache holds the kernels (the fixture made them): one run renders compiled from its first batch,
    # the other never; their weights are equal to the bit
    from ddp_utils.run import load_checkpoint

    weights = {}
    for cache in ("off", str(compiled.kernels._root)):
        done = _train(tiny_run, cache, tmp_path / ("uncompiled" if cache == "off" else "compiled"))
        assert done.returncode == 0, done.stderr[-3000:]
        said = "the kernels run uncompiled" if cache == "off" else "compiled kernels ready"
        assert said in done.stderr, done.stderr[-3000:]
        run = tmp_path / ("uncompiled" if cache == "off" else "compiled") / "run"
        weights[cache] = load_checkpoint(run / "weights" / "last.pt")["train_model"]
    off, on = weights.values()
    assert off.keys() == on.keys() and all(torch.equal(off[k], on[k]) for k in off)
