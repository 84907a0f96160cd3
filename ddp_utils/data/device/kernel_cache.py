"""The compiled kernels on disk: where they are kept, what names them, who may have written them, how they run.

A kernel (``kernels.py``'s resize or render, at one output layout) is compiled ahead of time by Inductor
(``kernel_compile.py``) into a shared library, once per machine: every later process loads it in milliseconds.
Its entry in the cache is named by a key that changes with anything that could make a stale library wrong or
unsafe to load: the kernel and its options, the source of the kernels and of the compile (their bytes), the
torch version and, for the device's kind, the CPU's instruction set (the C++ is built for the host's CPU) or the
GPU's compute capability with the CUDA and Triton versions. An upgrade or another card compiles anew.

A library that is loaded is code that runs. The cache lives where only the user can write
(``$DDP_UTILS_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/ddp_utils/kernels``, else ``~/.cache/ddp_utils/kernels``),
made ``0700``; before loading, the folder and each file are checked to be the user's own and writable by no one
else. A cache that fails the check is not used: the kernels are compiled into a private folder for the process,
and the log says why, once. ``DDP_UTILS_KERNEL_CACHE=off`` compiles nothing (the kernels run uncompiled).

A loaded kernel runs through the library's C interface (ctypes), which releases the GIL for the call: on the
CPU the render's seconds never hold the training thread; on CUDA the call is its launch, on the caller's stream.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

CACHE_ENV = "DDP_UTILS_KERNEL_CACHE"
OFF = "off"
# every kernel the device render may run: the resize, then the render of one layer and of two (the mixups), each at
# the step's layout (``_cl``: channels_last) or the plain one
KERNEL_NAMES = ("resize", "render", "render_cl", "render_mixup", "render_mixup_cl")
_SOURCES = ("kernels.py", "kernel_compile.py")  # what a kernel is made from: a change compiles it anew
_META = "kernel.json"


class KernelFailed(RuntimeError):
    """A compiled kernel that could not be loaded or did not run: the render goes on uncompiled."""


def kernels_for(channels_last: bool, mixup: bool) -> list[str]:
    """The kernels a run renders with, the most used first: the render at its layout, the resize, and the mixups'
    render only where the hyp draws mixups.

    Examples:
        >>> kernels_for(channels_last=True, mixup=False)
        ['render_cl', 'resize']
        >>> kernels_for(channels_last=False, mixup=True)
        ['render', 'resize', 'render_mixup']
    """
    layout = "_cl" if channels_last else ""
    return [f"render{layout}", "resize", *([f"render_mixup{layout}"] if mixup else [])]


def cache_root(environ: dict | None = None) -> Path | None:
    """Where compiled kernels are kept (module docstring); None when ``$DDP_UTILS_KERNEL_CACHE`` is ``off``.

    Examples:
        >>> str(cache_root({"DDP_UTILS_KERNEL_CACHE": "/tmp/kernels"}))
        '/tmp/kernels'
        >>> cache_root({"DDP_UTILS_KERNEL_CACHE": "off"}) is None
        True
    """
    environ = os.environ if environ is None else environ
    chosen = environ.get(CACHE_ENV, "").strip()
    if chosen.lower() == OFF:
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "ddp_utils" / "kernels"


def device_kind(device: torch.device) -> str:
    """What a compiled kernel is built for: the CPU's instruction set (its flags: the C++ is built for the host's
    CPU) or the GPU's compute capability with the CUDA and Triton versions."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = "none"
        return f"cuda-sm{major}{minor}-cuda{torch.version.cuda}-triton{triton_version}"
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line.partition(":")[2]
                break
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12]
    return f"{device.type}-{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}-{digest}"


def kernel_key(name: str, device: torch.device) -> str:
    """The cache entry's name for kernel ``name`` on ``device``: readable, then a hash of everything that makes it.

    Examples:
        >>> kernel_key("render_cl", torch.device("cpu")).startswith("render_cl-cpu-")
        True
    """
    if name not in KERNEL_NAMES:
        raise ValueError(f"no kernel named {name!r}: one of {', '.join(KERNEL_NAMES)}")
    kind = device_kind(device)
    digest = hashlib.sha256(sources() + f"|{name}|{torch.__version__}|{kind}".encode()).hexdigest()
    return f"{name}-{kind.split('-')[0]}-{digest[:20]}"


def sources() -> bytes:
    """What every kernel is made from: the kernels' and the compile's source files, their bytes."""
    here = Path(__file__).resolve().parent
    return b"".join((here / source).read_bytes() for source in _SOURCES)


def private_folder(root: Path) -> str | None:
    """Make ``root`` if needed (``0700``) and say why it may not hold code that runs: None when it is the user's own
    and writable by no one else, else the reason.

    Examples:
        >>> folder = Path(tempfile.mkdtemp())
        >>> private_folder(folder / "kernels") is None
        True
        >>> os.chmod(folder / "kernels", 0o777)
        >>> private_folder(folder / "kernels").endswith("is writable by others (mode 0o777)")
        True
    """
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        return _not_own(root)
    except OSError as exc:
        return f"{root} cannot be made ({exc.strerror or exc})"


def _not_own(path: Path) -> str | None:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    if info.st_uid != os.geteuid():
        return f"{path} belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {oct(stat.S_IMODE(info.st_mode))})"
    return None


def entry_path(root: Path, name: str, device: torch.device) -> Path:
    """The folder of kernel ``name``'s compiled library in the cache at ``root``."""
    return root / kernel_key(name, device)


def install(entry: Path, files: Sequence[Path], meta: dict) -> None:
    """Put a compiled kernel's files into the cache as ``entry``, all at once (a folder renamed into place): a
    process that sees the entry sees it whole."""
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    for file in files:
        os.replace(file, staging / file.name)
    (staging / _META).write_text(json.dumps(meta))
    try:
        os.rename(staging, entry)
    except OSError:  # another process installed it first: theirs stands
        for file in staging.iterdir():
            file.unlink()
        staging.rmdir()


class LoadedKernel:
    """A compiled kernel loaded from its cache entry, run through its library's C interface (module docstring).

    Args:
        entry: the cache entry (:func:`entry_path`), checked to be the user's own first.
        device: where it runs.

    Raises:
        KernelFailed: an entry that is not the user's own, incomplete, or a library that does not load.
    """

    def __init__(self, entry: Path, device: torch.device) -> None:
        self.device = device
        for path in (entry, *entry.iterdir()):
            reason = _not_own(path)
            if reason is not None:
                raise KernelFailed(f"not loaded: {reason}")
        try:
            meta = json.loads((entry / _META).read_text())
            self._lib = ctypes.CDLL(str(entry / meta["library"]))
        except (OSError, KeyError, ValueError) as exc:
            raise KernelFailed(f"{entry} does not load ({exc})") from exc
        self.outputs = int(meta["outputs"])
        self.inputs = meta.get("inputs")
        if not self.inputs:
            raise KernelFailed(f"{entry} does not say what it takes (an older compile's entry)")
        self._handle = ctypes.c_void_p()
        where = f"cuda:{device.index or 0}" if device.type == "cuda" else "cpu"
        create = self._lib.AOTInductorModelContainerCreateWithDevice
        self._check(create(ctypes.byref(self._handle), ctypes.c_size_t(1), where.encode(), str(entry).encode()))

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The kernel's output for ``inputs`` (queued on the current stream on CUDA).

        Raises:
            KernelFailed: inputs the library was not compiled for (it checks nothing itself: a size out of its range
                would read out of bounds), or a failure of the library's call.
        """
        self.check(inputs)
        handles = [_capsule_pointer(c) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(inputs))]
        given = (ctypes.c_void_p * len(handles))(*handles)  # the library takes these handles over
        made = (ctypes.c_void_p * self.outputs)()
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else None
        run = self._lib.AOTInductorModelContainerRun
        self._check(run(self._handle, given, ctypes.c_size_t(len(handles)), made, ctypes.c_size_t(self.outputs),
                        ctypes.c_void_p(stream), None))  # fmt: skip
        capsules = [_capsule(pointer) for pointer in made]
        return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(capsules)[0]

    def check(self, inputs: Sequence[torch.Tensor]) -> None:
        """Raise KernelFailed unless ``inputs`` are what the library was compiled for: their number, dtypes, devices
        and sizes (each symbol's sizes equal, 2 at least), each contiguous."""
        if len(inputs) != len(self.inputs):
            raise KernelFailed(f"the compiled kernel takes {len(self.inputs)} inputs, not {len(inputs)}")
        symbols: dict[str, int] = {}
        for k, (tensor, spec) in enumerate(zip(inputs, self.inputs)):
            shape, want = tuple(tensor.shape), spec["shape"]
            fits = (
                str(tensor.dtype).removeprefix("torch.") == spec["dtype"]
                and tensor.device.type == self.device.type
                and len(shape) == len(want)
                and tensor.is_contiguous()
                and all(
                    size == symbols.setdefault(w, size) and size >= 2 if isinstance(w, str) else size == w
                    for size, w in zip(shape, want)
                )  # fmt: skip
            )
            if not fits:
                raise KernelFailed(f"input {k} ({tensor.dtype} {list(shape)}) is not what the kernel was compiled "
                                   f"for ({spec['dtype']} {want})")  # fmt: skip

    def _check(self, code: int) -> None:
        if code != 0:
            last = getattr(self._lib, "AOTInductorGetLastError", None)
            detail = ""
            if last is not None:
                last.restype = ctypes.c_char_p
                detail = (last() or b"").decode(errors="replace").strip().splitlines()[:1]
                detail = f": {detail[0]}" if detail else ""
            raise KernelFailed(f"the compiled kernel failed (error {code}){detail}")


def _capsule_pointer(capsule: object) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, None)


def _capsule(pointer: int) -> object:
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(pointer, None, None)


__all__ = [
    "CACHE_ENV",
    "KERNEL_NAMES",
    "KernelFailed",
    "LoadedKernel",
    "cache_root",
    "device_kind",
    "entry_path",
    "install",
    "kernel_key",
    "kernels_for",
    "private_folder",
    "sources",
]
