"""The device render's kernels compiled ahead of time, in a process of their own, into the machine's cache.

    python -m ddp_utils.data.device.kernel_compile --device cpu --root ~/.cache/ddp_utils/kernels render_cl resize

``compiled.py`` starts it beside a run with the kernels that run renders with, in the order it wants them.
Each kernel is exported (``torch.export``, its sizes symbols: one compile serves every batch and image size,
``--rect`` batches included) and compiled by AOTInductor into a shared library (C++ on the CPU, Triton on CUDA),
then installed in the cache (``kernel_cache.py``), one after the other; one JSON line per kernel, as each is done,
goes to ``--status``. Processes of one machine compile each kernel once: a lock per kernel, and one that finds it
installed by another loads it.

Inductor is told to keep eager's numerics: no fused multiply-adds and division rounded to nearest on CUDA, no fast
math on the CPU (``ffp-contract=off``, its default), so the library computes what the uncompiled form computes,
bit for bit (``kernels.py``). The CPU kernels are compiled scalar: vectorisation buys nothing for kernels of
gathers (the same time for a 640 px batch of 64) and costs most of the compile.

It ends itself, and the compiler processes it started, when the process that started it ends (its stdin closes),
and it runs at the lowest priority (``nice 19``, its compiler processes too): on a busy CPU the run's own threads
come first (on 2 cores a compile at the run's priority made the run's first batch 8x slower), and the compile takes
what they leave.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch

from .kernel_cache import KERNEL_NAMES, entry_path, install
from .kernels import render_rows, resize_tiles

# Inductor's settings for the kernels (those this torch knows): eager's numerics, scalar C++, kernels in the library
INDUCTOR_CONFIGS = {
    "cpp.vec_isa_ok": False,
    "emulate_precision_casts": True,  # on CUDA: Triton's fp fusion off (no fused multiply-adds)
    "eager_numerics.division_rounding": True,  # on CUDA: div_rn, as eager's division
    "eager_numerics.disable_ftz": True,  # on CUDA: subnormals kept, as eager's kernels keep them
    "aot_inductor.embed_kernel_binary": True,  # on CUDA: the kernels' binaries inside the library
    "cpp.enable_kernel_profile": True,  # on the CPU: each kernel a torch.profiler event, by name (render_ops.py)
    # one loop nest, nothing stored between its parts: Inductor stores a value as soon as it has read more than a
    # few inputs (the taps' gathers, the tables), which cost the render 16 float and int64 buffers the size of the
    # batch (42x its uint8 output, where the floor is 12x). The values it still stores (a layer's coordinates: their
    # reads) stay in registers where every node shares one loop: the pixels as one flat dimension (kernels.py) and
    # no cap on the nodes fused into one (at 64, the mixups' kernel was three loops with 15 planes between them)
    "realize_acc_reads_threshold": 1000,
    "realize_cpu_acc_reads_threshold": 1000,
    "max_fusion_size": 1000,
}


_NICE = 19  # the lowest priority: the compile takes what the run leaves of the CPU


class ResizeKernel(torch.nn.Module):
    """``resize_tiles`` as a module ``torch.export`` takes."""

    def forward(self, sources: torch.Tensor, table: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
        return resize_tiles(sources, table, span)


class RenderKernel(torch.nn.Module):
    """``render_rows`` as a module ``torch.export`` takes, its options bound (float32 output)."""

    def __init__(self, layers: int, channels_last: bool) -> None:
        super().__init__()
        self.layers, self.channels_last = layers, channels_last

    def forward(self, tiles, ints, floats, tables, levels, ys, xs) -> torch.Tensor:
        return render_rows(tiles, ints, floats, tables, levels, ys, xs, self.layers, True, self.channels_last)


def kernel_module(name: str) -> torch.nn.Module:
    """Kernel ``name`` (``kernel_cache.KERNEL_NAMES``) as the module that is exported."""
    if name not in KERNEL_NAMES:
        raise ValueError(f"no kernel named {name!r}: one of {', '.join(KERNEL_NAMES)}")
    if name == "resize":
        return ResizeKernel()
    return RenderKernel(2 if name.startswith("render_mixup") else 1, name.endswith("_cl"))


def example_inputs(device: torch.device) -> dict[str, tuple]:
    """Each kernel's inputs as the renderer makes them for a small batch of every kind (a resize, a mixup, HSV,
    flips): the examples it is exported from."""
    from .render import Renderer, warm_up_batch  # the renderer's own tables: what the library will be given

    renderer = Renderer(device, compiled=False)
    renderer.calls = {}
    batch = warm_up_batch(64, 80)  # every size a symbol stands for differs from the others (export's duck sizing)
    for channels_last in (True, False):
        renderer(batch, channels_last=channels_last)
    return renderer.calls


def dynamic_shapes(name: str, inputs: tuple) -> tuple:
    """Which sizes of the kernel's inputs are symbols: the rows, the sources' and tiles' lengths, the image size."""
    dim = torch.export.Dim
    if name == "resize":  # sources, the tile table's rows, the tiles' side
        return ({0: dim("pixels", min=2)}, {0: dim("tiles", min=2)}, {0: dim("side", min=2)})
    rows = dim("rows", min=2)  # a row table holds two rows at least (plan.py)
    return ({0: dim("pixels", min=2)}, {0: rows}, {0: rows}, None, None, {1: dim("h", min=2)}, {1: dim("w", min=2)})


def inductor_configs() -> dict:
    """:data:`INDUCTOR_CONFIGS` less the settings this torch does not have."""
    import torch._inductor.config as config

    known, missing = {}, object()
    for key, value in INDUCTOR_CONFIGS.items():
        node = config
        for part in key.split("."):
            node = getattr(node, part, missing) if node is not missing else missing
        if node is not missing:  # a setting whose default is None is a setting too
            known[key] = value
    return known


def compile_kernel(name: str, inputs: tuple, work: Path) -> tuple[list[Path], dict]:
    """Export and compile kernel ``name`` in ``work``: the library's files (the library, and on CUDA any kernel
    binaries beside it) and what the cache records of it."""
    start = time.monotonic()
    dynamic = dynamic_shapes(name, inputs)
    program = torch.export.export(kernel_module(name), inputs, dynamic_shapes=dynamic, strict=False)
    _check_symbols(program, dynamic)
    package = torch._inductor.aoti_compile_and_package(
        program, package_path=str(work / f"{name}.pt2"), inductor_configs=inductor_configs()
    )
    files = []
    with zipfile.ZipFile(package) as archive:
        for member in archive.namelist():
            parts = member.split("/")
            if "aotinductor" in parts and not member.endswith((".cpp", ".h", ".o", ".json", "/")):
                target = work / parts[-1]
                with archive.open(member) as source, target.open("wb") as out:
                    shutil.copyfileobj(source, out)
                files.append(target)
    libraries = sorted((f for f in files if f.suffix == ".so"), key=lambda f: "wrapper" not in f.name)
    if not libraries:
        raise RuntimeError(f"AOTInductor's package {package} holds no library")
    meta = dict(kernel=name, library=libraries[0].name, outputs=1, inputs=input_specs(program), torch=torch.__version__,
                compile_s=round(time.monotonic() - start, 1), created=time.time())  # fmt: skip
    return files, meta


def input_specs(program: torch.export.ExportedProgram) -> list[dict]:
    """What the library takes, input by input: its dtype and its sizes, a number or the symbol's name (sizes of one
    symbol are equal): ``kernel_cache.LoadedKernel`` checks a call against it, since the library checks nothing."""
    specs = []
    for node in (node for node in program.graph.nodes if node.op == "placeholder"):
        value = node.meta["val"]
        shape = [str(size) if isinstance(size, torch.SymInt) else int(size) for size in value.shape]
        specs.append(dict(dtype=str(value.dtype).removeprefix("torch."), shape=shape))
    return specs


def _check_symbols(program: torch.export.ExportedProgram, dynamic: tuple) -> None:
    # each size the kernel takes as a symbol must have stayed one symbol of its own: a size the export tied to
    # another (two examples of one size) or to a number would be wrong for other batches, and nothing checks it
    # when the library runs
    wanted = {id(dim) for spec in dynamic if spec for dim in spec.values()}
    found = set()
    inputs = [node for node in program.graph.nodes if node.op == "placeholder"]
    for node, spec in zip(inputs, dynamic):
        for axis in spec or {}:
            size = node.meta["val"].shape[axis]
            if not isinstance(size, torch.SymInt) or not size.node.expr.is_Symbol:
                raise RuntimeError(f"the export fixed a size the kernel takes as a symbol: {node.name}[{axis}] {size}")
            found.add(str(size))
    if len(found) != len(wanted):
        raise RuntimeError(f"the export tied sizes the kernel takes apart: {len(found)} symbols for {len(wanted)}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made if missing): one process of the machine at a time."""
    with path.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def compile_all(names: list[str], device: torch.device, root: Path, status: Path) -> int:
    """Each kernel of ``names`` into the cache at ``root``, in order, up to the first that fails; a JSON line per
    kernel to ``status``. Returns how many failed (0 or 1)."""
    examples, failed = None, 0
    for name in names:
        entry = entry_path(root, name, device)
        report = dict(kernel=name, ok=True, entry=str(entry))
        try:
            with locked(root / f".{entry.name}.lock"):
                for stale in root.glob(f".compile-{entry.name}-*"):  # a compile killed with its run: nobody else's now
                    shutil.rmtree(stale, ignore_errors=True)
                if not entry.is_dir():  # another process may have installed it while this one waited
                    if examples is None:
                        _a_cpp_compiler()
                    examples = examples or example_inputs(device)
                    with tempfile.TemporaryDirectory(prefix=f".compile-{entry.name}-", dir=root) as work:
                        files, meta = compile_kernel(name, examples[name], Path(work))
                        install(entry, files, meta)
                        report["compile_s"] = meta["compile_s"]
        except Exception as exc:  # noqa: BLE001 (any failure of the compiler: the run renders uncompiled)
            failed += 1
            report = dict(kernel=name, ok=False, error=_one_line(exc))
            print(f"kernel_compile: {name} failed; the kernels after it are not compiled", file=sys.stderr)
            traceback.print_exc()  # the whole story in the log; the run's line says where the log is
        with status.open("a") as out:
            out.write(json.dumps(report) + "\n")
        if failed:  # a compiler that fails on one kernel fails on the next: the run is told once
            break
    return failed


def _a_cpp_compiler() -> str:
    # the C++ compiler Inductor would take (a library's wrapper is C++ on CUDA too), asked first: without one, the
    # run learns it in a second, not after a minute of tracing (InvalidCxxCompiler)
    from torch._inductor.cpp_builder import get_cpp_compiler

    return get_cpp_compiler()


def _one_line(error: BaseException) -> str:
    # the most telling line of a compiler's long message: the last "SomethingError: ..." line, else the first, and
    # the compiler's own first word where the message quotes its output (a C++ compile error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if line.split(":")[0].endswith(("Error", "Exception"))]
    text = (named[-1] if named else lines[0] if lines else "") or type(error).__name__
    if not text.split(":")[0].endswith(("Error", "Exception")):
        text = f"{type(error).__name__}: {text}"
    if "Output:" in lines:
        said = lines[lines.index("Output:") + 1 :][:1]
        text += f" ({said[0]})" if said else ""
    return text[:300]


def _scalar_cpu_kernels() -> None:
    # the setting in INDUCTOR_CONFIGS reaches the C++ codegen too late where this process's first look at the CPU's
    # vector units was cached: set for the process before anything compiles
    import torch._inductor.config as config
    from torch._inductor import cpu_vec_isa

    config.cpp.vec_isa_ok = False
    cpu_vec_isa.valid_vec_isa_list.cache_clear()


def _lowest_priority() -> None:
    # nice 19 for this process and the compilers it starts; and, where the kernel groups processes by session for
    # the scheduler (autogroup, Linux's default), for this process's session too: its own, so that the compile could
    # be killed with its compilers, where a nice value alone would weigh nothing against the run's session
    with contextlib.suppress(OSError):
        os.nice(_NICE)
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as autogroup:
        autogroup.write(str(_NICE))


def _end_with_the_parent() -> None:
    # the starter holds our stdin open while it lives: at its end (exit, crash, SIGKILL) this process and the
    # compiler processes it started (its session) end too
    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):  # the descriptor itself: no Python lock held while it waits
                pass
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="ddp_utils-compile-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--root", type=Path, required=True, help="the kernel cache (kernel_cache.cache_root)")
    parser.add_argument("--status", type=Path, required=True, help="a JSON line per kernel, as each is done")
    parser.add_argument("--end-with-stdin", action="store_true", help="end when stdin closes (the starter's end)")
    parser.add_argument("names", nargs="+", choices=KERNEL_NAMES)
    opt = parser.parse_args(argv)
    if opt.end_with_stdin:
        _end_with_the_parent()
    _lowest_priority()
    device = torch.device(opt.device)
    _scalar_cpu_kernels()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return 1 if compile_all(opt.names, device, opt.root, opt.status) else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # done: its status is written; nothing of the interpreter's teardown is worth waiting for
