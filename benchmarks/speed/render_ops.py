"""The device path's floor: kernel launches and bytes allocated to render one training batch, counted on the CPU.

With ``--augment-on device`` the training process decodes and augments each batch on the GPU
(``ddp_utils/data/device/render.py``). What that costs a card can be read from the CPU: each
non-view aten op is a kernel launch on the GPU (about 10 us of host time each), each compiled
kernel is one launch, and on a memory-bound card the bytes the render allocates are its cost (each
intermediate is written once and read at least once). ``torch.profiler`` sees eager ops and
compiled kernels alike (memory profiling on, Inductor's kernel profiling on); a dispatch mode would
send compiled code back to eager, so it cannot count a compiled render.

A batch of recipes is planned from a synthetic dataset of at least 4x the batch (so it decodes as
many distinct images as a real epoch's batch does), at mixup 0 and 0.1, and rendered by the
compiled kernels (made ready before counting: loaded from the machine's kernel cache, or compiled
into it; ``DDP_UTILS_KERNEL_CACHE``). Printed per mixup rate:

- launches: the top-level non-view aten ops plus the compiled kernels (goal: at most 64; each compiled kernel is
  a profiler event of its own, ``kernel_compile.py`` builds them so);
- bytes allocated: torch's allocations while rendering, plus the decoded images (on a GPU nvJPEG's
  outputs, ``3 h w`` bytes each; on the CPU the decoder's arrays live outside torch's allocator), as a
  multiple of the batch's uint8 output (goal: at most 12x; the float32 batch the step takes is 4x);
- host waits: ops that would make the host wait for the device (goal: 0);
- the CPU seconds of the render and of the OpenCV path for the same samples (for this CPU only).

Run:  python benchmarks/speed/render_ops.py                       (yolov5s's setting: 640 px, batch 64)
      python benchmarks/speed/render_ops.py --imgsz 64 --batch 4  (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ddp_utils.data import find_images, load_hyp, load_labels, make_shapes_dataset  # noqa: E402
from ddp_utils.data.dataset import SampleKey, YoloDataset  # noqa: E402
from ddp_utils.data.device.kernel_cache import kernels_for  # noqa: E402
from ddp_utils.data.device.recipes import RecipeCollate, plan_sample  # noqa: E402
from ddp_utils.data.device.render import Renderer  # noqa: E402

LAUNCH_GOAL, BYTES_GOAL = 64, 12.0
# aten ops whose result the host must read (a host wait on a GPU)
WAITS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique")
# aten ops that launch nothing: views and metadata
VIEWS = {"aten::view", "aten::reshape", "aten::permute", "aten::slice", "aten::select", "aten::as_strided",
         "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::alias", "aten::lift_fresh", "aten::detach",
         "aten::_reshape_alias", "aten::t", "aten::transpose", "aten::unbind", "aten::split", "aten::chunk",
         "aten::from_file", "aten::empty", "aten::empty_strided", "aten::resize_", "aten::set_", "aten::is_pinned",
         "aten::_unsafe_view", "aten::view_as", "aten::narrow", "aten::result_type", "aten::to", "aten::lift",
         "aten::resolve_conj", "aten::resolve_neg", "[memory]"}  # fmt: skip


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--images", type=int, default=None, help="dataset size (default 4x the batch)")
    parser.add_argument("--hyp", default="hyp.scratch-low.yaml")
    parser.add_argument("--mixups", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--sides", type=int, nargs=2, default=None, help="image sides (default 0.75-1x imgsz)")
    parser.add_argument(
        "--eager", action="store_true", help="the kernels uncompiled (what a host without a compiler runs)"
    )
    parser.add_argument("--compile-timeout", type=float, default=1800, help="seconds to wait for the compiled kernels")
    return parser.parse_args(argv)


def count(renderer: Renderer, batch) -> dict:
    """One render of ``batch`` under the profiler: launches, bytes allocated, host waits, and what launched."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        renderer(batch, to_float=True, channels_last=True)
    launched, allocated, waits = {}, 0, []
    for event in prof.events():
        # what each op allocated for itself (its outputs; a compiled graph's, its kernels' outputs), and what was
        # allocated outside any op
        allocated += max(event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage, 0)
        name = event.name
        if name in WAITS:
            waits.append(name)
        nested_in_aten = event.cpu_parent is not None and event.cpu_parent.name.startswith("aten::")
        if name.startswith("aten::") and name not in VIEWS and not nested_in_aten:
            launched[name] = launched.get(name, 0) + 1
        elif "cpp_fused" in name or "triton_" in name:  # a compiled kernel (Inductor's kernel profiling)
            launched["compiled kernel"] = launched.get("compiled kernel", 0) + 1
    return dict(launches=sum(launched.values()), by_op=launched, allocated=allocated, waits=waits)


def main(argv: list[str] | None = None) -> dict:
    opt = parse_opt(argv)
    sides = opt.sides or (opt.imgsz * 3 // 4, opt.imgsz)
    n_images = opt.images or 4 * opt.batch
    renderer = Renderer("cpu", compiled=not opt.eager)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_shapes_dataset(Path(tmp) / "shapes", n_images, 0, size=tuple(sides))
        labels = load_labels(find_images(root / "images" / "train"))
        for mixup in opt.mixups:
            hyp = dict(load_hyp(opt.hyp), mixup=mixup)
            dataset = YoloDataset(labels, opt.imgsz, opt.batch, augment=True, hyp=hyp, seed=0)
            keys = [SampleKey(1, slot, (7 * slot) % len(dataset)) for slot in range(opt.batch)]
            start = time.perf_counter()
            dataset.__getitems__(keys)
            cpu_path = time.perf_counter() - start
            batch = RecipeCollate(dataset)([plan_sample(dataset, key) for key in keys])[0]
            if renderer.kernels is not None:  # the compiled kernels ready first (made beside a run, not counted)
                renderer.kernels.wait(kernels_for(channels_last=True, mixup=mixup > 0), opt.compile_timeout)
            renderer(batch)  # the first batch's one-off work (the tables), not counted
            counted = count(renderer, batch)
            start = time.perf_counter()
            renderer(batch)
            render = time.perf_counter() - start
            output = opt.batch * 3 * opt.imgsz * opt.imgsz
            decoded = sum(3 * h * w for (h, w), jpeg in zip(batch.originals, batch.jpeg) if jpeg)
            results.append(dict(
                mixup=mixup, mixed=sum(r.mix is not None for r in batch.recipes), sources=len(batch.sources),
                launches=counted["launches"], by_op=counted["by_op"], host_waits=len(counted["waits"]),
                allocated_x=(counted["allocated"] + decoded) / output, torch_allocated_x=counted["allocated"] / output,
                decoded_x=decoded / output, render_cpu_s=render, opencv_path_cpu_s=cpu_path,
            ))  # fmt: skip
    report(opt, results, n_images)
    state = renderer.kernels.state() if renderer.kernels is not None else {}
    compiled = bool(state) and all(value == "loaded" for value in state.values())
    out = dict(imgsz=opt.imgsz, batch=opt.batch, images=n_images, compiled=compiled, kernels=state, results=results)
    print("RESULT " + json.dumps(out))
    return out


def report(opt: argparse.Namespace, results: list[dict], n_images: int) -> None:
    print(f"render of a batch of {opt.batch} at {opt.imgsz} px, from a set of {n_images} images of sides "
          f"{opt.sides or (opt.imgsz * 3 // 4, opt.imgsz)}; goals: <= {LAUNCH_GOAL} launches, <= {BYTES_GOAL:g}x "
          "the uint8 output allocated, 0 host waits")  # fmt: skip
    print(f"{'mixup':>6} {'mixed':>6} {'sources':>8} {'launches':>9} {'allocated':>10} {'(torch':>7} {'+decoded)':>9} "
          f"{'waits':>6} {'render s':>9} {'OpenCV s':>9}")  # fmt: skip
    for r in results:
        print(f"{r['mixup']:>6g} {r['mixed']:>6} {r['sources']:>8} {r['launches']:>9} {r['allocated_x']:>9.2f}x "
              f"{r['torch_allocated_x']:>6.2f}x {r['decoded_x']:>8.2f}x {r['host_waits']:>6} {r['render_cpu_s']:>9.3f} "
              f"{r['opencv_path_cpu_s']:>9.3f}")  # fmt: skip
        print(f"       launched: {r['by_op']}")


if __name__ == "__main__":
    main()
