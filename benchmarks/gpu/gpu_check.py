"""One GPU check that ends within 8 minutes on one H100 or H200 (16 cores, no network): issue 40's figures, each
beside its goal, in one table and one ``GPU_CHECK {json}`` line.

Its parts run in priority order, each bounded by its own budget (:data:`PARTS`), so a part that overruns costs
only itself: the budgets add up to at most the call's 480 s less the wheels' install and the report. A part that
fails, or runs out of its time, is a row that says so, and the tables are printed anyway. Each row is printed the
moment its part ends, as one line ``GPU_CHECK_ROW {json}``: a kill, a Ctrl-C or an exit later keeps every figure
taken (and on a Ctrl-C or an exit the tables of the rows so far are printed before the check ends).

1. data: 2,000 + 250 synthetic images of 480-640 px, made by one process per core;
2. the first step: the first finished batch and the exit, the device path with an empty kernel cache, then with the
   kernels compiled (the compile timed: cold, on this machine; the later parts find them made, in the check's own
   cache), beside the loader workers' path (``speed/device_start.py``, on 256 of the images, 1 epoch);
3. ours, default: train.py, yolov5s at 640 px, batch 64, ``--workers 8``, 4 epochs, ``--noval --nosave``: the
   steady epoch (the median of epochs 2-4), the first, the whole run (start-up included), the data wait; its log's
   "images made on" line must name the device (``--augment-on auto`` on CUDA);
4. YOLOv5 v7.0's train.py at the same settings (``--yolov5 DIR``), its epochs timed by its own callback hooks
   (``yolov5_timed.py``), its whole run by the clock, its first batch from its start;
5. the two forms of the render: the compiled kernels against the uncompiled form over 50 training batches, the
   values that differ (must be 0: ``forms_equal.py``);
6. the loader alone: ``create_dataloader(..., augment_on="device")`` in ``DevicePrefetcher`` (``loader_alone.py``):
   img/s over an epoch after a warm one, the render's device memory;
7. the decode-order reproduction (``decode_order.py``): corrupted sums through our guarded decoder (must be 0) and
   through torchvision's raw call (the positive control);
8. memory: the reserved memory train.py's own progress line (``mem``) shows at the end of each of the default row's
   4 epochs (flat: within 2 % over epochs 2-4);
9. the default job, ``python train.py --device 0``: its mAP;
10. ours with ``--augment-on workers`` (whose line must name the workers);
11. the CUDA tests: ``python -m pytest -m cuda`` (slow ones included).

``--parts cudnn_on`` adds ours with ``--cudnn-benchmark on`` (outside the default call's budget).

The whole check, on the GPU host, from the repo root, in one call (the wheels fetched beforehand into .whl/ by
``shared/tools/gpu-wheels.sh``; YOLOv5 v7.0 checked out at DIR with its own imports, e.g. pandas, seaborn, IPython,
psutil, scipy, gitpython, on the path):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
    export PYTHONPATH=/tmp/site:$PWD && python benchmarks/gpu/gpu_check.py --yolov5 DIR

On the CPU, ``--cpu-smoke`` runs every part tiny (CI's slow tier does), so the check cannot rot between GPU hosts:
    python benchmarks/gpu/gpu_check.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # check_runs, check_report, cuda_marks, yolov5_timed beside it
import check_runs  # noqa: E402
from check_report import Row, goals, goals_table, parts_table  # noqa: E402
from check_runs import Context, PartFailed  # noqa: E402

CALL_S = 480  # one call of the device tool: 8 minutes, all of it
SETUP_S = 15  # the wheels' install before the check starts
REPORT_S = 10  # the check's own start and its report
PartRun = Callable[[Context, float], dict]


class Part(NamedTuple):
    """One part: its key (the JSON's), its row's title, its budget in seconds on the GPU, what runs; an optional
    part runs only when ``--parts`` names it (its budget outside the default call's)."""

    key: str
    title: str
    budget_s: float
    run: PartRun
    optional: bool = False


def _train_row(key: str, extra: list[str]) -> PartRun:
    return lambda ctx, timeout: check_runs.ours(ctx, key, extra, timeout)


# the priority order of issue 46; each budget bounds its part, and they add up to at most the call's time
PARTS = [
    Part("data", "data: the synthetic images", 20, check_runs.data),
    Part("first_step", "the first step: device path cold, warm, and the workers' (1 epoch, 256 images)", 110,
         check_runs.first_step),
    Part("ours", "ours: default (images made on the device, cuDNN heuristics)", 65, _train_row("ours", [])),
    Part("yolov5", "YOLOv5 v7.0 train.py", 60, check_runs.yolov5),
    Part("forms", "the render's two forms, compiled and not, over 50 batches", 25, check_runs.forms),
    Part("loader", "the loader alone (device path, DevicePrefetcher)", 30, check_runs.loader),
    Part("decode_order", "decode-order reproduction", 25, check_runs.decode_order),
    Part("memory", "memory: the default row's per-epoch mem", 1, check_runs.memory),
    Part("default_job", "the default job: python train.py --device 0", 40, check_runs.default_job),
    Part("cudnn_on", "ours: cuDNN autotuned (--cudnn-benchmark on)", 65,
         _train_row("cudnn_on", ["--cudnn-benchmark", "on"]), optional=True),
    Part("workers", "ours: images made on the loader workers (--augment-on workers)", 40,
         _train_row("workers", ["--augment-on", "workers"])),
    Part("cuda_tests", "the CUDA tests: python -m pytest -m cuda", 39, check_runs.cuda_tests),
]  # fmt: skip
DEFAULT_PARTS = [part.key for part in PARTS if not part.optional]
FULL = dict(cfg="yolov5s.yaml", imgsz=640, batch=64, workers=8, epochs=4, images=2000, device="0")
SMOKE = dict(cfg="yolov5n.yaml", imgsz=64, batch=4, workers=0, epochs=4, images=8, device="cpu")
SMOKE_SLOWER = 3.0  # the smoke's budgets: a shared 2-core CI host, tiny sizes


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--yolov5", type=Path, help="a YOLOv5 v7.0 checkout: time it beside ours at the same settings")
    add("--yolov5-python", help="the interpreter for YOLOv5 (default: this one)")
    add("--cpu-smoke", action="store_true", help="every part at tiny sizes on the CPU: checks the check runs")
    add("--parts", nargs="+", choices=[p.key for p in PARTS], help="only these parts, still in priority order")
    add("--dir", type=Path, help="work directory (default: a temporary one, removed after)")
    for key, value in FULL.items():
        add(f"--{key}", type=type(value), default=None, help=f"default {value} (smoke: {SMOKE[key]})")
    opt = parser.parse_args(argv)
    for key, value in (SMOKE if opt.cpu_smoke else FULL).items():
        if getattr(opt, key) is None:
            setattr(opt, key, value)
    return opt


def budgets(cpu_smoke: bool = False) -> dict:
    """The budget table: each part's seconds, their sum, and the total they must fit in (the call less the wheels'
    install and the report); on the CPU smoke all of it :data:`SMOKE_SLOWER` times."""
    scale = SMOKE_SLOWER if cpu_smoke else 1.0
    parts = {part.key: part.budget_s * scale for part in PARTS if not part.optional}
    return dict(parts=parts, sum=sum(parts.values()), total=(CALL_S - SETUP_S - REPORT_S) * scale, scale=scale)


def measure(part: Part, ctx: Context, timeout: float) -> dict:
    """The part's figures, or ``{"failed": reason, ...}`` / ``{"skipped": reason}``: nothing a part raises
    stops the check."""
    try:
        return part.run(ctx, timeout)
    except PartFailed as exc:
        reason = str(exc)
        return {"skipped": reason} if reason.startswith("skipped") else {"failed": reason, **exc.figures}
    except Exception as exc:  # a bug in a part must not cost the others their rows
        return {"failed": f"{type(exc).__name__}: {exc}"}


def run_parts(opt: argparse.Namespace, work: Path, rows: list[Row] | None = None) -> list[Row]:
    """The chosen parts in priority order, each within its budget and the check's deadline; each row appended to
    ``rows`` and printed (``GPU_CHECK_ROW {json}``) the moment its part ends."""
    table, ctx, rows = budgets(opt.cpu_smoke), Context(opt, work), [] if rows is None else rows
    deadline = time.monotonic() + (CALL_S - SETUP_S) * table["scale"]
    for part in PARTS:
        if (opt.parts and part.key not in opt.parts) or (part.optional and not opt.parts):
            continue
        budget = part.budget_s * table["scale"]
        start = time.monotonic()
        got = measure(part, ctx, min(budget, deadline - REPORT_S * table["scale"] - start))
        took = time.monotonic() - start
        rows.append(Row(part.key, part.title, budget, took, got))
        row = dict(key=part.key, budget_s=budget, took_s=round(took, 1), got=got)
        print("GPU_CHECK_ROW " + json.dumps(row, default=str), flush=True)
        print(f"gpu_check: {part.key}: {'done' if rows[-1].ok else 'no figures'} in {took:.0f} s", file=sys.stderr)
    return rows


def describe_device(opt: argparse.Namespace) -> str:
    import torch

    if opt.cpu_smoke or not torch.cuda.is_available():
        return f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"
    name = torch.cuda.get_device_name(int(opt.device) if opt.device.isdigit() else 0)
    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> dict:
    opt = parse_opt(argv)
    work = (opt.dir or Path(tempfile.mkdtemp(prefix="gpu_check_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ["DDP_UTILS_KERNEL_CACHE"] = str(work / "kernels")  # the check's own: cold, made by the first step
    rows: list[Row] = []
    try:
        run_parts(opt, work, rows)
    except (KeyboardInterrupt, SystemExit):  # the rows so far are printed, then the check ends as asked
        report(opt, rows)
        raise
    finally:
        if opt.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return report(opt, rows)


def report(opt: argparse.Namespace, rows: list[Row]) -> dict:
    """The two tables and the ``GPU_CHECK {json}`` line for the rows taken."""
    device = describe_device(opt)
    setting = f"{opt.cfg} {opt.imgsz} px, batch {opt.batch}, --workers {opt.workers}, {opt.epochs} epochs"
    print(f"\ngpu_check on {device}: {setting}, {opt.images} images of {opt.imgsz * 3 // 4}-{opt.imgsz} px\n")
    print(parts_table(rows, opt.images) + "\n")
    by_key = {row.key: row.got for row in rows}
    found = goals(by_key, opt.images)
    print(goals_table(found) + "\n")
    result = dict(
        device=device, setting=setting, images=opt.images, budget=budgets(opt.cpu_smoke),
        order=[row.key for row in rows], took={row.key: round(row.took_s, 1) for row in rows}, rows=by_key,
        goals=found,
    )  # fmt: skip
    print("GPU_CHECK " + json.dumps(result, default=str))
    return result


if __name__ == "__main__":
    main()
