"""The device render's compiled kernels, made ready beside the run: no step waits for a compiler.

:class:`CompiledKernels` hands the renderer a kernel only once it is ready, and None until then, when the
renderer runs the same functions uncompiled (``kernels.py`` says why the images are the same bit for bit). So
the first batch is rendered at once, and the compiled kernels take over from the first batch after they are
ready, wherever that falls.

What it does for a run (:meth:`CompiledKernels.start`, with the kernels the run renders with:
``kernel_cache.kernels_for``): a kernel already in the machine's cache (``kernel_cache.py``) is loaded at once,
in milliseconds; the others are compiled by ONE process of their own (``kernel_compile.py``), in the order asked,
each installed in the cache as it is done and loaded by the renderer at its next batch. Several processes of a
job on one machine compile each kernel once: the others wait for it, uncompiled meanwhile.

The compile never outlives the run, never holds its end and never ends it. Its process is killed with its own
children when the run's process exits, at once, whatever it is doing, and it ends itself if the run's process
dies without a word (its stdin closes); its output goes to a log file, never to the run's terminal. A compile
that fails, a library that does not load and a kernel that fails while running are each one line naming the
kernel and why; the uncompiled form renders from then on, the same images.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import torch

from ...log import LOGGER
from .kernel_cache import CACHE_ENV, KERNEL_NAMES, KernelFailed, LoadedKernel, cache_root, entry_path, private_folder

_PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the folder that holds ddp_utils/: the compile's import path


class CompiledKernels:
    """The compiled kernels of one device, made ready in the background (module docstring).

    Args:
        device: where the kernels run.
        root: the cache (default :func:`~ddp_utils.data.device.kernel_cache.cache_root`: the machine's, or None:
            compile nothing).
    """

    def __init__(self, device: torch.device | str, root: Path | None | str = "default") -> None:
        self.device = torch.device(device)
        self._root_choice = root
        self._root: Path | None = None
        self._decided = False  # where the cache is: decided at the first start
        self._private: str | None = None  # a folder of this process's own, removed at its exit
        self._loaded: dict[str, LoadedKernel] = {}
        self._failed: dict[str, str] = {}
        self._asked: dict[str, float] = {}  # kernel -> when it was asked for
        self._compiling: list[_Compile] = []
        self._pending: list[str] = []  # to compile, once the run's first batch is rendered
        self._used: set[str] = set()  # the kernels the renderer asked for
        self._said_ready = False
        self._lock = threading.RLock()  # the loader thread asks, the main thread starts and closes

    # ---- what the renderer asks ----
    def ready(self, name: str) -> LoadedKernel | None:
        """Kernel ``name`` if it is ready to run, else None (never waits); one never asked for is asked for now."""
        loaded = self._loaded.get(name)
        if loaded is not None or name in self._failed:
            return loaded
        with self._lock:
            if name not in self._asked:
                self.start([name])
            if name in self._used and self._pending:  # a batch was rendered: the compile may start
                self._spawn(self._pending)
                self._pending = []
            self._used.add(name)
            self._poll()
            return self._loaded.get(name)

    def failed(self, name: str, error: BaseException | str) -> None:
        """Kernel ``name`` failed while running: one line, and the uncompiled form from now on."""
        with self._lock:
            self._loaded.pop(name, None)
            self._fail([name], f"failed while running ({_one_line(error)})")

    # ---- what the run asks ----
    def start(self, names: Iterable[str], at_once: bool = False) -> None:
        """Make kernels ``names`` ready: those in the cache loaded now, the others compiled in the background, from
        the run's second batch (the compile's start, a second Python importing torch, would slow the first by seconds
        on a small host), or ``at_once``."""
        with self._lock:
            names = [name for name in dict.fromkeys(names) if name not in self._asked]
            if self._cache() is None:
                for name in names:
                    self._failed.setdefault(name, "no compile")
                return
            for name in names:
                if name not in KERNEL_NAMES:
                    raise ValueError(f"no kernel named {name!r}: one of {', '.join(KERNEL_NAMES)}")
                self._asked[name] = time.monotonic()
            self._pending += [name for name in names if not self._load(name)]
            if at_once and self._pending:
                self._spawn(self._pending)
                self._pending = []

    def wait(self, names: Iterable[str], timeout: float) -> bool:
        """Wait up to ``timeout`` s until kernels ``names`` are each loaded or failed (benchmarks and tests: a run
        never waits); True if all are loaded."""
        names = list(names)
        self.start(names, at_once=True)
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                self._poll()
                if all(name in self._loaded or name in self._failed for name in names):
                    return all(name in self._loaded for name in names)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def state(self) -> dict[str, str]:
        """Each kernel asked for: ``loaded``, ``compiling``, ``to compile`` (from the run's second batch) or
        ``failed: why``."""
        with self._lock:
            self._poll()
            return {name: self._state(name) for name in self._asked}

    def _state(self, name: str) -> str:
        if name in self._loaded:
            return "loaded"
        if name in self._failed:
            return f"failed: {self._failed[name]}"
        return "to compile" if name in self._pending else "compiling"

    def close(self) -> None:
        """Stop any compile now, with its children (nothing is waited for), and remove a private folder."""
        with self._lock:
            for compile_ in self._compiling:
                _kill(compile_.process)
            self._compiling.clear()
            if self._private is not None:
                shutil.rmtree(self._private, ignore_errors=True)
                self._private = None

    # ---- inside ----
    def _cache(self) -> Path | None:
        # the cache folder, decided once: the machine's, a private one if that is not the user's own, or None
        if self._decided:
            return self._root
        self._decided = True
        root = cache_root() if self._root_choice == "default" else self._root_choice
        if root is None:
            LOGGER.info(f"device render: the kernels run uncompiled ({CACHE_ENV}=off)")
            return None
        reason = private_folder(Path(root))
        if reason is not None:
            self._private = tempfile.mkdtemp(prefix="ddp_utils-kernels-")
            LOGGER.warning(
                f"device render: the kernel cache is not used ({reason}); the kernels are compiled for this process "
                f"alone in {self._private} (set {CACHE_ENV} to a folder of your own)"
            )
            root = Path(self._private)
        self._root = Path(root)
        _ENDED_AT_EXIT.add(self)
        return self._root

    def _load(self, name: str) -> bool:
        entry = entry_path(self._root, name, self.device)
        if not entry.is_dir():
            return False
        try:
            self._loaded[name] = LoadedKernel(entry, self.device)
        except KernelFailed as exc:
            self._fail([name], str(exc))
        self._say_ready()
        return True

    def _spawn(self, names: list[str]) -> None:
        number = next(_SPAWNED)
        status = self._root / f".status-{os.getpid()}-{number}.jsonl"
        log = self._root / "logs" / f"compile-{os.getpid()}-{number}.log"
        log.parent.mkdir(mode=0o700, exist_ok=True)
        for old in log.parent.glob("compile-*.log"):  # the logs of compiles a day old and more
            with contextlib.suppress(OSError):
                if time.time() - old.stat().st_mtime > 86400:
                    old.unlink()
        command = [sys.executable, "-m", "ddp_utils.data.device.kernel_compile", "--device", str(self.device),
                   "--root", str(self._root), "--status", str(status), "--end-with-stdin", *names]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self._root / "inductor"))
        try:
            with log.open("w") as out:
                process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                           cwd=self._root, env=env, start_new_session=True)  # fmt: skip
        except OSError as exc:
            self._fail(names, f"did not compile: the compiler's process did not start ({_one_line(exc)})")
            return
        self._compiling.append(_Compile(process, status, names, log))

    def _poll(self) -> None:
        # what the compiles finished since the last look: their kernels loaded, their failures said
        for compile_ in list(self._compiling):
            ended = compile_.process.poll()
            for line in _read_lines(compile_.status):
                report = json.loads(line)
                name = report["kernel"]
                if name in self._loaded or name in self._failed:
                    continue
                if report.get("ok"):
                    self._load(name)
                else:  # the compile stops at its first failure: the kernels after it are not compiled either
                    error = report.get("error", "no reason given")
                    self._fail(self._waiting(compile_), f"did not compile ({error}; log: {compile_.log})")
            if ended is not None:
                self._compiling.remove(compile_)
                compile_.status.unlink(missing_ok=True)
                _OFFSETS.pop(compile_.status, None)
                self._fail(self._waiting(compile_), f"did not compile: its process ended with exit code {ended}")

    def _waiting(self, compile_: _Compile) -> list[str]:
        return [name for name in compile_.names if name not in self._loaded and name not in self._failed]

    def _fail(self, names: list[str], reason: str) -> None:
        # one line for the kernels that failed together; the uncompiled form from now on
        names = [name for name in names if name not in self._failed]
        if not names:
            return
        for name in names:
            self._failed[name] = reason
        which = f"kernel {names[0]}" if len(names) == 1 else f"kernels {', '.join(names)}"
        LOGGER.warning(f"device render: the compiled {which} {reason}; the uncompiled form renders the same images "
                       "from here")  # fmt: skip

    def _say_ready(self) -> None:
        if self._said_ready or not self._asked or any(name not in self._loaded for name in self._asked):
            return
        self._said_ready = True
        took = time.monotonic() - min(self._asked.values())
        LOGGER.info(f"device render: compiled kernels ready after {took:.1f} s ({', '.join(self._asked)}; "
                    f"kept in {self._root})")  # fmt: skip


class _Compile(NamedTuple):
    process: subprocess.Popen
    status: Path  # one JSON line per kernel, as each is done
    names: list[str]
    log: Path


def _read_lines(path: Path) -> list[str]:
    # the complete lines the compile appended since the last read (it appends whole lines, flushed)
    try:
        with path.open() as file:
            file.seek(_OFFSETS.get(path, 0))
            text = file.read()
    except OSError:
        return []
    complete = text[: text.rfind("\n") + 1]
    _OFFSETS[path] = _OFFSETS.get(path, 0) + len(complete)
    return [line for line in complete.splitlines() if line.strip()]


_OFFSETS: dict[Path, int] = {}  # how far each compile's status file was read
_SPAWNED = itertools.count()  # the compiles this process started: each its own status file


def _one_line(error: BaseException | str) -> str:
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first[:300]


def _kill(process: subprocess.Popen) -> None:
    # the compile and the compiler processes it started (its own session): at once, nothing to keep
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    if process.stdin is not None:
        process.stdin.close()


class _Ended(set):
    """The kernels' owners this process made: their compiles killed when it exits."""

    def close_all(self) -> None:
        for kernels in list(self):
            kernels.close()


_ENDED_AT_EXIT = _Ended()
atexit.register(_ENDED_AT_EXIT.close_all)

__all__ = ["CompiledKernels"]
