"""The op budget of one training step: how many kernels each part launches, and the host time outside the model.

On a GPU every non-view aten op is (at least) one kernel launch, and the part of the step
outside the model (loss, optimizer, EMA) is launch-bound: its cost is the host's time to
issue the ops, not the GPU's to run them. Both are measured here on the CPU, so the budget
holds in every CI run: the ops are counted with the dispatch mode of ``tests/hostwait.py``
(which also counts host waits), the host time with a tiny input on one CPU thread.

The step is train.py's in its GPU form: the dense loss, an enabled GradScaler with a fused
optimizer (where this ddp_utils has ``smart_optimizer(fused=...)``), clipping, EMA.

Targets: loss forward <= 200 ops, EMA <= 1 ms of host time per update, everything outside
the model <= 40 % of the step's ops.

Run:  python benchmarks/speed/step_ops.py                      (yolov5s, batch 2, 64 px)
      PYTHONPATH=/path/to/other/checkout python benchmarks/speed/step_ops.py   (another version of ddp_utils)
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import inspect
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # appended: a PYTHONPATH checkout of ddp_utils comes first

import ddp_utils  # noqa: E402
from ddp_utils.data import load_hyp  # noqa: E402
from ddp_utils.engine import ModelEMA, smart_optimizer  # noqa: E402
from ddp_utils.yolo import ComputeLoss, Model, scale_loss_gains  # noqa: E402

PARTS = ("model forward", "loss forward", "backward", "optimizer + clip", "EMA")


def _counter_class():
    """tests/hostwait.py of this checkout, loaded by path (the library may come from another checkout)."""
    spec = importlib.util.spec_from_file_location("hostwait", REPO / "tests" / "hostwait.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.HostWaitCounter


def build(model_yaml: str, batch: int, imgsz: int):
    torch.manual_seed(0)
    model = Model(model_yaml, ch=3, nc=80).train()
    hyp = scale_loss_gains(load_hyp("hyp.scratch-low.yaml"), model.model[-1].nl, 80, imgsz)
    fused = "fused" in inspect.signature(smart_optimizer).parameters
    kwargs = {"fused": True} if fused else {}
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"], **kwargs)
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(batch, 3, imgsz, imgsz, generator=gen)
    n = batch * 6
    targets = torch.cat(
        (
            torch.arange(batch).repeat_interleave(6)[:, None].float(),
            torch.randint(0, 80, (n, 1), generator=gen).float(),
            torch.rand(n, 2, generator=gen) * 0.8 + 0.1,
            torch.rand(n, 2, generator=gen) * 0.3 + 0.05,
        ),
        1,
    )
    loss = ComputeLoss(model, hyp, dense=True)
    return model, loss, optimizer, torch.amp.GradScaler("cpu", enabled=True), ModelEMA(model), images, targets, fused


def step_parts(model, compute_loss, optimizer, scaler, ema, images, targets):
    """The step as five callables, run in order (TrainStep's order)."""
    state: dict = {}

    def forward():
        state["pred"] = model(images)

    def loss():
        state["loss"], _ = compute_loss(state["pred"], targets)

    def backward():
        scaler.scale(state["loss"]).backward()

    def optimize():
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()

    def average():
        ema.update(model)

    return [forward, loss, backward, optimize, average]


def skeleton_host_ms(model, repeats: int) -> dict:
    """Host ms of "optimizer + clip" and "EMA" with every tensor shrunk to one element.

    The same number of tensors (so the same Python work, the same ops and multi-tensor lists)
    with next to no arithmetic: the host's share alone, which on a GPU is what these parts cost
    (their kernels are tiny). With full-size tensors a CPU measures its own arithmetic instead.
    """
    skeleton = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in [*skeleton.parameters(), *skeleton.buffers()]:
            tensor.data = tensor.data.flatten()[:1].clone()
    kwargs = {"fused": True} if "fused" in inspect.signature(smart_optimizer).parameters else {}
    optimizer = smart_optimizer(skeleton, "SGD", 0.01, 0.9, 5e-4, **kwargs)
    scaler, ema = torch.amp.GradScaler("cpu", enabled=True), ModelEMA(skeleton)
    scaler.scale(torch.ones(()))  # the scale exists from a step's first scale() on

    def optimize():
        for p in skeleton.parameters():
            p.grad = torch.ones_like(p)
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(skeleton.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()

    timed = {"optimizer + clip": optimize, "EMA": lambda: ema.update(skeleton)}
    result = {}
    for name, part in timed.items():
        part()
        start = time.perf_counter()
        for _ in range(repeats):
            part()
        result[name] = (time.perf_counter() - start) * 1000 / repeats
    return result


def measure(model_yaml: str, batch: int, imgsz: int, repeats: int) -> dict:
    torch.set_num_threads(1)
    model, compute_loss, optimizer, scaler, ema, images, targets, fused = build(model_yaml, batch, imgsz)
    parts = step_parts(model, compute_loss, optimizer, scaler, ema, images, targets)
    for _ in range(2):  # the first steps make constants and optimizer state
        for part in parts:
            part()
    counter_class = _counter_class()
    ops, waits = {}, {}
    for name, part in zip(PARTS, parts):
        with counter_class() as counter:
            part()
        ops[name], waits[name] = counter.ops, [str(w) for w in counter.waits]
    host_ms = dict.fromkeys(PARTS, 0.0)
    for _ in range(repeats):
        for name, part in zip(PARTS, parts):
            start = time.perf_counter()
            part()
            host_ms[name] += (time.perf_counter() - start) * 1000
    host_ms = {k: v / repeats for k, v in host_ms.items()}
    host_only = skeleton_host_ms(model, repeats)
    total = sum(ops.values())
    outside = total - ops["model forward"] - ops["backward"]
    return {
        "ddp_utils": str(Path(ddp_utils.__file__).resolve().parents[1]),
        "model": model_yaml,
        "batch": batch,
        "imgsz": imgsz,
        "fused_optimizer": fused,
        "ops": ops,
        "ops_total": total,
        "ops_outside_model": outside,
        "outside_share": outside / total,
        "host_ms": host_ms,
        "host_ms_outside_model": host_ms["loss forward"] + host_ms["optimizer + clip"] + host_ms["EMA"],
        "host_only_ms": host_only,
        "waits": waits,
    }


def report(result: dict) -> None:
    print(f"\nddp_utils from {result['ddp_utils']}: {result['model']} batch {result['batch']} at {result['imgsz']} px")
    print(f"(GPU form: dense loss, enabled GradScaler, fused optimizer: {result['fused_optimizer']}; one CPU thread)\n")
    print("| part | non-view aten ops | CPU ms (tiny input) | host-only ms | host waits |\n|---|---|---|---|---|")
    for name in PARTS:
        host_only = result["host_only_ms"].get(name)
        print(
            f"| {name} | {result['ops'][name]} | {result['host_ms'][name]:.2f} | "
            f"{'' if host_only is None else f'{host_only:.2f}'} | {len(result['waits'][name])} |"
        )
    print(f"| whole step | {result['ops_total']} | {sum(result['host_ms'].values()):.2f} | | |")
    print("(host-only: every tensor shrunk to one element, so only the Python and dispatch work is left)")
    print(
        f"\noutside the model (loss forward, optimizer + clip, EMA): {result['ops_outside_model']} ops = "
        f"{result['outside_share']:.0%} of the step; {result['host_ms_outside_model']:.2f} ms of host time"
    )
    print(
        f"targets: loss forward <= 200 ops ({result['ops']['loss forward']}), EMA <= 1 ms of host time "
        f"({result['host_only_ms']['EMA']:.2f}), outside <= 40 % ({result['outside_share']:.0%})"
    )
    print("RESULT " + json.dumps(result))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="yolov5s.yaml")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10, help="timed steps for the host milliseconds")
    opt = parser.parse_args(argv)
    result = measure(opt.model, opt.batch, opt.imgsz, opt.repeats)
    report(result)
    return result


if __name__ == "__main__":
    main()
