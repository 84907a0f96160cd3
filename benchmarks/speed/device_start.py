"""The device path's first step and its last: how soon a run's first batch is done, how soon it exits after its
last line, and what the render's compiled kernels cost to make, cold and warm; the loader workers' path beside.

    python benchmarks/speed/device_start.py                         # both parts on this host (the issue's setting)
    python benchmarks/speed/device_start.py --parts compile --before ../before   # the compile beside another checkout's
    python benchmarks/speed/device_start.py --load 2                # the same with 2 CPU-bound processes beside

``runs``: train.py for 1 epoch, yolov5n, ``--imgsz 160``, batch 16, on a set of 64 and a set of 16 synthetic
shapes images (256-384 px), same seed, once per mode, in this order:

- ``workers``: ``--augment-on workers`` (OpenCV in the loader workers), the reference;
- ``device-cold``: ``--augment-on device`` with an empty kernel cache (``DDP_UTILS_KERNEL_CACHE`` a new folder):
  the compile runs beside the run, which renders uncompiled meanwhile;
- ``device-warm``: the same with the kernels the run uses already in the cache (compiled before, not timed);
- ``device-nocxx``: cold, with ``CXX=/bin/false``: the compile fails, one line, the run goes on uncompiled.

Every output line is stamped as it arrives (``DDP_UTILS_PROGRESS_SECONDS=0``: a progress line per batch). Per run:
the first finished batch (the first progress line of the epoch that counts a batch done), the last line, the
exit (the process's end after it), the exit code, any traceback in the output, the lines the device render said
(``device render: ...``), and whether a compile process outlived the run.

``compile``: the time to the compiled kernels of a run (``render_cl`` and ``resize``: mixup 0), in a fresh process,
with an empty cache (cold) and again with the one that left (warm): ``CompiledKernels.wait``, the process's own
start (Python, torch) not counted. ``--before DIR``: the same for a checkout of the code before this round (its
``Renderer.warm_up`` thread compiled the kernels in the process, Inductor's cache in a new folder for cold).

A machine's figures, not a test's: the tests run the parts small (``tests/test_benchmarks_device_start.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from child_env import with_pythonpath  # noqa: E402

MODES = ("workers", "device-cold", "device-warm", "device-nocxx")
PROGRESS = re.compile(r"\b(\d+)/(\d+) +\d+%")  # a progress line's "done/total  pct%"
KERNELS = ["render_cl", "resize"]  # a run's kernels at mixup 0 (channels_last: train.py's default on the CPU)


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=["runs", "compile"], default=["runs", "compile"])
    parser.add_argument("--sets", type=int, nargs="+", default=[64, 16], help="images per set")
    parser.add_argument("--data", type=Path, help="a data yaml to train on instead of the sets (the GPU check's)")
    parser.add_argument("--cfg", default="yolov5n.yaml")
    parser.add_argument("--warm-cache", type=Path, help="the kernel cache the warm runs use (default: a new one)")
    parser.add_argument("--prime-mixup", action="store_true", help="compile the mixups' kernel too, for later use")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sides", type=int, nargs=2, default=[256, 384], help="the images' smallest, largest side")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--load", type=int, default=0, help="CPU-bound processes running beside every measurement")
    parser.add_argument("--before", type=Path, help="a checkout of the code before: its compile, cold and warm")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run at most")
    parser.add_argument("--dir", type=Path, help="work folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    return parser.parse_args(argv)


def make_sets(work: Path, sizes: list[int], sides: list[int]) -> dict[int, Path]:
    """A data yaml per set size, its images made once (shapes.yaml's generator)."""
    from ddp_utils.data import make_shapes_dataset

    yamls = {}
    for n in sizes:
        root = work / f"shapes{n}"
        if not (root / "images").is_dir():
            make_shapes_dataset(root, n, 4, size=tuple(sides))
        yaml = work / f"shapes{n}.yaml"
        names = "{0: circle, 1: square, 2: triangle, 3: star}"
        yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {names}\n")
        yamls[n] = yaml
    return yamls


def stamped_run(command: list[str], env: dict, timeout: float, cwd: Path) -> dict:
    """Run ``command``, stamping each output line as it arrives: the lines with their times (s from the start),
    the exit's time and code; killed (with its session) after ``timeout``."""
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1, start_new_session=True)  # fmt: skip
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in process.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        code = process.wait()
    ended = time.monotonic() - start
    reader.join(5)
    return dict(lines=lines, exit_s=ended, code=code)


def run_figures(run: dict, cache: Path | None) -> dict:
    """What a stamped train.py run says: its first finished batch, its last line, its exit after it, and the rest."""
    lines = run["lines"]
    first = next((t for t, line in lines if (m := PROGRESS.search(line)) and int(m.group(1)) >= 1 and
                  not line.lstrip().startswith(("train:", "val:", "val "))), None)  # fmt: skip
    last = lines[-1][0] if lines else None
    text = "\n".join(line for _, line in lines)
    said = [line.split("device render: ", 1)[1] for _, line in lines if "device render: " in line]
    ready = next((t for t, line in lines if "compiled kernels ready" in line), None)
    return dict(
        code=run["code"], first_batch_s=first, last_line_s=last, exit_s=run["exit_s"],
        exit_after_last_line_s=None if last is None else run["exit_s"] - last,
        traceback="Traceback (most recent call last)" in text, device_render=said, compiled_ready_s=ready,
        compile_left=compiles_alive(cache) if cache is not None else [],
        made_on=next((line.split("train: ", 1)[1] for _, line in lines if "images made on" in line), None),
    )  # fmt: skip


def compiles_alive(cache: Path) -> list[int]:
    """The processes still compiling into ``cache`` (none should outlive its run)."""
    alive = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ddp_utils.data.device.kernel_compile" in command and str(cache).encode() in command:
            alive.append(int(proc.name))
    return alive


def train_command(opt: argparse.Namespace, yaml: Path, project: Path, mode: str) -> list[str]:
    augment_on = "workers" if mode == "workers" else "device"
    return [sys.executable, str(REPO / "train.py"), "--data", str(yaml), "--cfg", opt.cfg, "--imgsz", str(opt.imgsz),
            "--batch", str(opt.batch), "--epochs", "1", "--device", opt.device, "--workers", str(opt.workers),
            "--augment-on", augment_on, "--noval", "--nosave", "--noplots", "--seed", "0", "--project", str(project),
            "--exist-ok", "--progress", "plain"]  # fmt: skip


def prime(cache: Path, device: str, timeout: float, kernels: list[str] = KERNELS) -> dict:
    """Compile ``kernels`` (default: a run's) into ``cache`` (for the warm runs), in a process of its own: its
    figures."""
    code = f"""
import json, time
from pathlib import Path
from ddp_utils.data.device.compiled import CompiledKernels
start = time.monotonic()
kernels = CompiledKernels({torch_device(device)!r}, Path({str(cache)!r}))
ok = kernels.wait({kernels!r}, {timeout})
print("PRIME " + json.dumps(dict(ok=ok, seconds=time.monotonic() - start, state=kernels.state())))
"""
    env = with_pythonpath()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout + 60)
    found = [line for line in out.stdout.splitlines() if line.startswith("PRIME ")]
    if not found:
        raise RuntimeError(f"the compile did not report: {out.stdout[-500:]}{out.stderr[-2000:]}")
    return json.loads(found[0][6:])


def warm_cache(opt: argparse.Namespace, work: Path) -> Path:
    """The kernel cache the warm runs use."""
    return opt.warm_cache or work / "kernels-warm"


def prime_warm(opt: argparse.Namespace, work: Path) -> dict:
    """The warm runs' kernels compiled into their cache (the mixups' too with ``--prime-mixup``): its figures."""
    return prime(warm_cache(opt, work), opt.device, opt.timeout, KERNELS + ["render_mixup_cl"] * opt.prime_mixup)


def torch_device(device: str) -> str:
    """train.py's ``--device`` (``cpu``, ``0``) as torch names it."""
    return device if device == "cpu" or device.startswith("cuda") else f"cuda:{int(device)}"


def runs(opt: argparse.Namespace, work: Path, primed: dict) -> list[dict]:
    """The ``runs`` part: every set and mode, in order (``primed``: the warm cache's compile, when done before)."""
    yamls = {"data": opt.data} if opt.data else make_sets(work, opt.sets, opt.sides)
    warm = warm_cache(opt, work)
    results = [dict(images=0, mode="compile", **primed)] if primed else []
    for n, yaml in yamls.items():
        for mode in opt.modes:
            env = with_pythonpath(dict(os.environ, DDP_UTILS_PROGRESS_SECONDS="0"))
            cache = None
            if mode.startswith("device"):
                cache = warm if mode == "device-warm" else Path(tempfile.mkdtemp(prefix=f"kernels-{mode}-", dir=work))
                env["DDP_UTILS_KERNEL_CACHE"] = str(cache)
                if mode == "device-warm" and not primed:  # the time to the compiled kernels, cold: made here
                    primed.update(prime_warm(opt, work))
                    results.append(dict(images=n, mode="compile", **primed))
                if mode == "device-nocxx":
                    env["CXX"] = "/bin/false"
            command = train_command(opt, yaml, work / "runs", mode)
            figures = run_figures(stamped_run(command, env, opt.timeout, work), cache)
            results.append(dict(images=n, mode=mode, **figures))
            first, after = _s(figures["first_batch_s"]), _s(figures["exit_after_last_line_s"])
            print(f"device_start: {n} images, {mode}: first batch {first}, exit {after} after the last line, "
                  f"code {figures['code']}", flush=True)  # fmt: skip
    return results


COMPILE_NOW = """
import json, sys, time
from pathlib import Path
start = time.monotonic()
from ddp_utils.data.device.compiled import CompiledKernels
kernels = CompiledKernels(sys.argv[1], Path(sys.argv[2]))
began = time.monotonic()
ok = kernels.wait(sys.argv[3].split(","), float(sys.argv[4]))
print("COMPILE " + json.dumps(dict(ok=ok, seconds=time.monotonic() - began, import_s=began - start)))
"""
COMPILE_BEFORE = """
import json, sys, time
start = time.monotonic()
from ddp_utils.data.device_augment import Renderer
renderer = Renderer(sys.argv[1], compiled=True)
began = time.monotonic()
renderer.warm_up(int(sys.argv[2])).join()
print("COMPILE " + json.dumps(dict(ok=bool(renderer.compiled), seconds=time.monotonic() - began,
                                   import_s=began - start)))
"""


def compile_times(opt: argparse.Namespace, work: Path) -> dict:
    """The ``compile`` part: the time to a run's compiled kernels, cold then warm, now and (``--before``) before."""
    out = {}
    sides = (
        dict(now=(REPO, COMPILE_NOW), before=(opt.before, COMPILE_BEFORE))
        if opt.before
        else dict(now=(REPO, COMPILE_NOW))
    )
    for name, (checkout, code) in sides.items():
        cache = Path(tempfile.mkdtemp(prefix=f"compile-{name}-", dir=work))
        env = with_pythonpath(dict(os.environ), checkout)
        if name == "now":
            args = [torch_device(opt.device), str(cache), ",".join(KERNELS), str(opt.timeout)]
        else:  # the code before: Inductor's own cache, in a new folder
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
            args = [torch_device(opt.device), str(opt.imgsz)]
        for temperature in ("cold", "warm"):
            run = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                                 timeout=opt.timeout + 60, cwd=checkout)  # fmt: skip
            found = [line for line in run.stdout.splitlines() if line.startswith("COMPILE ")]
            out[f"{name}_{temperature}"] = json.loads(found[0][8:]) if found else dict(error=run.stderr[-1000:])
            print(f"device_start: compile {name} {temperature}: {out[f'{name}_{temperature}']}", flush=True)
    return out


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def report(results: list[dict], compiled: dict) -> None:
    if results:
        print(f"{'images':>6} {'mode':<13} {'first batch':>11} {'vs workers':>10} {'exit after':>10} {'code':>4} "
              f"{'traceback':>9} {'compiled at':>11}  device render said")  # fmt: skip
        workers = {r["images"]: r["first_batch_s"] for r in results if r["mode"] == "workers"}
        for r in results:
            if r["mode"] == "compile":
                print(f"{r['images']:>6} {'(compile)':<13} the warm runs' kernels compiled in {_s(r.get('seconds'))}")
                continue
            ref = workers.get(r["images"])
            later = None if ref is None or r["first_batch_s"] is None else r["first_batch_s"] - ref
            print(f"{r['images']:>6} {r['mode']:<13} {_s(r['first_batch_s']):>11} {_s(later):>10} "
                  f"{_s(r['exit_after_last_line_s']):>10} {r['code']:>4} {str(r['traceback']):>9} "
                  f"{_s(r['compiled_ready_s']):>11}  {' | '.join(r['device_render'])[:160]}")  # fmt: skip
    for key, value in compiled.items():
        print(f"compile {key}: {_s(value.get('seconds'))} to the compiled kernels ({value})")


def main(argv: list[str] | None = None) -> dict:
    opt = parse_opt(argv)
    work = (opt.dir or Path(tempfile.mkdtemp(prefix="device_start_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    primed = {}
    if opt.load and "runs" in opt.parts and "device-warm" in opt.modes:  # the compile at the lowest priority would
        primed = prime_warm(opt, work)  # wait for the load's processes: made before they start
    loads = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(opt.load)]
    try:
        results = runs(opt, work, primed) if "runs" in opt.parts else []
        compiled = compile_times(opt, work) if "compile" in opt.parts else {}
    finally:
        for process in loads:
            process.kill()
    report(results, compiled)
    out = dict(host=f"{platform.machine()}, {os.cpu_count()} cores", load=opt.load, imgsz=opt.imgsz, batch=opt.batch,
               command=" ".join(sys.argv), runs=results, compile=compiled)  # fmt: skip
    print("RESULT " + json.dumps(out))
    if opt.out:
        opt.out.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
