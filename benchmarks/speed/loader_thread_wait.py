"""Does the device path's loader thread hold the training thread? A training step timed alone and beside the loader
thread preparing the next batches (the interpreter's lock included), paired, on this CPU.

On a GPU the training thread only launches the step; the loader thread beside it decodes and renders the next
batches (``ddp_utils/data/device/prefetch.py``). Whatever Python the loader thread runs holds the interpreter's lock,
and the training thread's launches wait for it: that wait is what this measures, on the CPU, where it shows as a
longer step. Each thread has one core (``OMP_NUM_THREADS=1``, set by this script before torch loads: the step on one,
the loader thread's render on the other), so what the step loses beside the loader thread is the lock and the memory
they share, not a core.

The step: yolov5n at ``--imgsz`` (320), batch 16, forward, loss, backward and SGD, on a fixed batch (the same work
each time). Beside it: ``DevicePrefetcher`` over ``create_dataloader(..., augment_on="device")`` (1 worker making
recipes, the loader thread decoding and rendering with the compiled kernels, made ready first), each step taking its
next batch as train.py does. Rounds alternate a block of steps alone, a block beside the loader thread, and a block
beside its kernels alone (a thread calling the compiled kernels on one batch, the lock released, as busy as the loader
thread was: what two cores' work shares anyway, memory and caches, without the lock). Printed: the median step of
each, the waits (beside / alone - 1, the medians of the rounds' ratios), the interpreter's share (the loader thread's
wait less its kernels' alone; goal: at most 2 %), and the CPU of the loader thread per batch.

Run:  python benchmarks/speed/loader_thread_wait.py                  (yolov5n at 320, batch 16, 10 rounds of 6 steps)
      python benchmarks/speed/loader_thread_wait.py --imgsz 64 --rounds 1 --steps 2   (a smoke run)
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # one core a thread (module docstring), before torch loads
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

WAIT_GOAL = 0.02


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--images", type=int, default=128, help="training images the loader cycles through")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--steps", type=int, default=6, help="steps per block (each round: one block alone, one beside)"
    )
    parser.add_argument("--compile-timeout", type=float, default=1800)
    return parser.parse_args(argv)


def make_step(imgsz: int, batch: int):
    """One training step of yolov5n on a fixed batch: forward, loss, backward, SGD."""
    from ddp_utils.data import load_hyp
    from ddp_utils.yolo import ComputeLoss, Model, scale_loss_gains

    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=4).to(memory_format=torch.channels_last)
    hyp = load_hyp("hyp.scratch-low.yaml")
    loss_fn = ComputeLoss(model, scale_loss_gains(hyp, model.model[-1].nl, 4, imgsz))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    images = torch.rand(batch, 3, imgsz, imgsz).contiguous(memory_format=torch.channels_last)
    targets = torch.tensor([[i, i % 4, 0.5, 0.5, 0.3, 0.2] for i in range(batch)], dtype=torch.float32)

    def step() -> None:
        loss, _ = loss_fn(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def timed_block(step, steps: int, batches=None) -> list[float]:
    """Each step's seconds; with ``batches``, the next batch taken before each step (as train.py takes it)."""
    seconds = []
    for _ in range(steps):
        if batches is not None:
            next(batches)
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return seconds


def endless(prefetcher, loader):
    """The prefetcher's batches, epoch after epoch (its loader thread always preparing the next)."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from prefetcher
        epoch += 1


class KernelsAlone:
    """The loader thread's C work without its Python: a thread calling the compiled kernels on one batch's inputs
    (the interpreter's lock released for each call), busy ``duty`` of the time: the control that tells the lock's
    share from what two cores' work shares anyway (memory, caches)."""

    def __init__(self, calls: dict, duty: float) -> None:
        from ddp_utils.data import renderer_for

        kernels = renderer_for("cpu").kernels
        self.work = [(kernels.ready(name), inputs) for name, inputs in calls.items()]
        self.duty, self.done = max(min(duty, 1.0), 0.05), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            start = time.perf_counter()
            for kernel, inputs in self.work:
                kernel(*inputs)
            self.done.wait((time.perf_counter() - start) * (1 / self.duty - 1))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


def main(argv: list[str] | None = None) -> dict:
    opt = parse_opt(argv)
    torch.set_num_threads(1)
    from ddp_utils.data import DevicePrefetcher, create_dataloader, load_hyp, make_shapes_dataset, renderer_for
    from ddp_utils.data.device.kernel_cache import kernels_for

    ready = renderer_for("cpu").kernels.wait(kernels_for(channels_last=True, mixup=False), opt.compile_timeout)
    renderer_for("cpu").calls = {}  # the first batch's kernel inputs, for the control
    step = make_step(opt.imgsz, opt.batch)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_shapes_dataset(Path(tmp) / "shapes", opt.images, 0, size=(opt.imgsz * 3 // 4, opt.imgsz))
        loader, _ = create_dataloader(root / "images" / "train", opt.imgsz, opt.batch, 32, augment=True, shuffle=True,
                                      hyp=load_hyp("hyp.scratch-low.yaml"), workers=1, augment_on="device")  # fmt: skip
        prefetcher = DevicePrefetcher(loader, "cpu", channels_last=True)
        batches = endless(prefetcher, loader)
        next(batches)  # the loader thread started, the workers up
        timed_block(step, 2)  # the step's own first runs (allocations, oneDNN's primitives)
        rows = {"alone": [], "beside": [], "control": []}
        ratios, controls, cpu_per_batch = [], [], []
        for _ in range(opt.rounds):
            a = timed_block(step, opt.steps)
            others = time.process_time() - time.thread_time()  # the CPU of this process's other threads
            b = timed_block(step, opt.steps, batches)
            cpu_per_batch.append((time.process_time() - time.thread_time() - others) / opt.steps)
            with KernelsAlone(renderer_for("cpu").calls, cpu_per_batch[-1] / statistics.median(b)):
                c = timed_block(step, opt.steps)
            for key, block in zip(rows, (a, b, c)):
                rows[key] += block
            ratios.append(statistics.median(b) / statistics.median(a))
            controls.append(statistics.median(c) / statistics.median(a))
        batches.close()
        loader.close()
    wait, control = statistics.median(ratios) - 1, statistics.median(controls) - 1
    medians = {key: statistics.median(block) for key, block in rows.items()}
    out = dict(imgsz=opt.imgsz, batch=opt.batch, compiled=ready, step_alone_s=medians["alone"],
               step_beside_s=medians["beside"], step_beside_kernels_s=medians["control"],
               wait=wait, wait_range=[min(ratios) - 1, max(ratios) - 1], kernels_alone_wait=control,
               interpreter_wait=wait - control, loader_thread_cpu_s_per_batch=statistics.median(cpu_per_batch),
               goal=WAIT_GOAL, cpu_threads=os.environ.get("OMP_NUM_THREADS"))  # fmt: skip
    print(f"a yolov5n step at {opt.imgsz} px, batch {opt.batch}: alone {out['step_alone_s']:.3f} s; beside the "
          f"loader thread {out['step_beside_s']:.3f} s ({wait:+.1%}; rounds {out['wait_range'][0]:+.1%} to "
          f"{out['wait_range'][1]:+.1%}); beside its kernels alone, as busy, {out['step_beside_kernels_s']:.3f} s "
          f"({control:+.1%}): the interpreter's share {wait - control:+.1%} of a step (goal <= {WAIT_GOAL:.0%}); "
          f"compiled kernels: {ready}")  # fmt: skip
    print("RESULT " + json.dumps(out))
    return out


if __name__ == "__main__":
    main()
