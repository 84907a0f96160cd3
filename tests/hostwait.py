"""Count, on the CPU, the aten ops that would make the host wait for a GPU, and the kernels a step launches.

``with HostWaitCounter() as counter: step()`` records every dispatched aten op. Those that
make CUDA wait for the device (their output's size or value is needed on the host) are kept
in ``counter.waits`` with the Python source line that caused them (the first frame outside
torch and this file), so a failing test names the line to fix. ``counter.ops`` counts the
non-view aten ops: on a GPU each is (at least) one kernel launch.

What the dispatcher shows on the CPU, and therefore what is counted:

- ``_local_scalar_dense`` (behind ``.item()``, ``float()``, ``int()``, ``bool()`` of a tensor),
  ``is_nonzero``; ``nonzero``, ``masked_select``, ``unique*``, ``repeat_interleave`` without
  ``output_size``; ``index``/``index_put_`` with a boolean mask (their result's size is data);
- ``equal`` and ``allclose`` (they answer a Python bool), ``bincount`` (CUDA reads the input's
  maximum to size the output), ``histc`` without a range (CUDA reads the minimum and maximum);
- copies to the CPU from another device (``_to_copy``/``copy_``): on a CPU-only host every tensor
  is on the CPU, so these can only show up where a test runs on a real device;
- ``Tensor.tolist()``, ``Tensor.numpy()`` (``np.asarray(t)`` too), ``Tensor.cpu()`` and a blocking
  ``Tensor.to("cpu")`` (the device spelled as the string) do not dispatch an aten op for a CPU
  tensor, so the counter wraps them while it is active and records each call as a wait (on a GPU
  they copy to the host). This over-counts reads of tensors that really live on the host (none in
  a training step's steady state, which is why they count). ``non_blocking=True`` copies are not waits.

It counts the thread that entered it, as a dispatch mode does: the reads above are recorded on that thread
only (a loader thread's reads of its own host data are not the training thread's waits).

What it cannot see (tests/test_hostwait.py shows each; the GPU test under
``torch.cuda.set_sync_debug_mode("error")`` in tests/engine/test_hostwait_step.py covers them on a GPU host):

- ``torch.cuda.synchronize()``, ``Event.synchronize()``/``elapsed_time()``, ``Stream.synchronize()``:
  no aten op, and on a CPU-only host they fail before waiting for anything;
- ``Tensor.to(device)`` with a ``torch.device`` that is the CPU: here it is the training device, so
  ``t.to(torch.device("cpu"))`` (a copy to the host on a GPU) and ``t.to(device)`` (no copy) are the same call;
- host-to-device copies made by a tensor constructor (``torch.tensor(data, device=d)``,
  ``torch.as_tensor(array, device=d)``): no ``Tensor.to`` call, and on the CPU no copy op at all;
- a copy between two devices that both are the CPU here (``dst.copy_(src)``, ``torch.empty(...).copy_``):
  on a GPU host it may cross PCIe and wait; on the CPU it looks like any copy;
- waits inside C++ outside the dispatcher (e.g. a CUDA caching allocator's ``empty_cache``).

On a GPU host, :func:`cuda_sync_errors` runs code with torch's sync debug mode at "error" everywhere but
in torch's autograd engine, where :class:`CudaSyncOps` checks each aten op of the backward pass instead:
on an H100 (torch 2.11, CUDA 13) the engine itself made a synchronising call in every ``backward()`` of
the loss, with none of the backward's aten ops synchronising (this per-op check, run there), so the
whole-call mode would only ever report torch's own call.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_TORCH_DIR = os.path.dirname(torch.__file__)
_SKIP_FILES = (os.path.abspath(__file__), os.sep + "contextlib.py", os.sep + "tqdm" + os.sep)
_ALWAYS_WAIT = {
    "_local_scalar_dense",
    "is_nonzero",
    "nonzero",
    "nonzero_static",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "equal",
    "allclose",
    "bincount",
}
_BOOL_INDEX = {"index", "index_put", "index_put_", "_index_put_impl_"}
_HOST_READS = ("tolist", "numpy", "cpu")


@dataclass(frozen=True)
class HostWait:
    """One op that makes the host wait for the device, the source line that ran it, and the calling frames.

    ``frames`` holds the code objects of the Python stack outside torch, this file, contextlib and
    tqdm, innermost first: :meth:`within` tells which function a wait came from without matching text.
    """

    op: str
    where: str
    frames: tuple[types.CodeType, ...] = field(default=(), compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.op} at {self.where}"

    def within(self, function: Callable) -> bool:
        """Whether ``function`` (a plain function, not a builtin) was on the stack when the wait happened."""
        return function.__code__ in self.frames  # type: ignore[attr-defined]


def _caller_frames() -> tuple[str, tuple[types.CodeType, ...]]:
    """``file:line (function)`` of the innermost frame outside torch, this file, contextlib and tqdm;
    and the code objects of all such frames, innermost first."""
    where, codes = "<torch internals>", []
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and not any(s in name for s in _SKIP_FILES):
            if not codes:
                where = f"{os.path.relpath(name)}:{frame.f_lineno} ({frame.f_code.co_name})"
            codes.append(frame.f_code)
        frame = frame.f_back
    return where, tuple(codes)


def _wait(op: str) -> HostWait:
    where, frames = _caller_frames()
    return HostWait(op, where, frames)


def _has_bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def _wait_reason(func, args: tuple, kwargs: dict) -> str | None:
    name = func._schema.name.split("::")[-1]
    if name in _ALWAYS_WAIT:
        return name
    if name in _BOOL_INDEX and _has_bool_index(args):
        return f"{name} with a boolean mask"
    if name == "histc" and _histc_range(args, kwargs) == (0, 0):
        return "histc without a range"
    if name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 4:
        return "repeat_interleave without output_size"
    if name in ("_to_copy", "copy_", "to"):
        src = args[1] if name == "copy_" else args[0]
        dst = args[0].device if name == "copy_" else kwargs.get("device")
        on_device = isinstance(src, torch.Tensor) and src.device.type != "cpu"
        if on_device and dst is not None and torch.device(dst).type == "cpu":
            return f"{name} to the CPU"
    return None


def _histc_range(args: tuple, kwargs: dict) -> tuple[float, float]:
    low = args[2] if len(args) > 2 else kwargs.get("min", 0)
    high = args[3] if len(args) > 3 else kwargs.get("max", 0)
    return low, high


def _blocking_to_cpu(args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names the host as the string ``"cpu"`` and does not ask non_blocking.

    Only the string: on a CPU-only host the training device is the CPU too, and ``t.to(device)``
    with ``device = torch.device("cpu")`` is the same call as a copy to the host. Code moving a
    tensor to the device passes the device; code that means the host writes ``"cpu"``.
    """
    device = args[0] if args else kwargs.get("device")
    if not (isinstance(device, str) and device.split(":")[0] == "cpu"):
        return False
    _device, _dtype, non_blocking, _format = torch._C._nn._parse_to(*args, **kwargs)
    return not non_blocking


@dataclass
class HostWaitCounter(TorchDispatchMode):
    """A dispatch mode that records host waits (:class:`HostWait`) and counts non-view aten ops."""

    waits: list[HostWait] = field(default_factory=list)
    ops: int = 0
    by_op: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        super().__init__()
        self._saved: dict[str, object] = {}
        self._thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = _wait_reason(func, args, kwargs)
        if reason is not None:
            self.waits.append(_wait(reason))
        if not func.is_view:
            self.ops += 1
            self.by_op[func._schema.name.split("::")[-1]] += 1
        return func(*args, **kwargs)

    def __enter__(self) -> HostWaitCounter:
        self._thread = threading.get_ident()  # a dispatch mode sees its own thread's ops: the reads too
        for name in _HOST_READS:
            original = self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._recording(name, original))
        original_to = self._saved["to"] = torch.Tensor.to
        torch.Tensor.to = self._recording("to", original_to, when=_blocking_to_cpu)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()

    def _recording(self, name: str, original, when: Callable[[tuple, dict], bool] | None = None):
        counter = self
        op = "Tensor.to(cpu)" if name == "to" else f"Tensor.{name}()"

        def read(tensor: torch.Tensor, *args, **kwargs):
            if threading.get_ident() == counter._thread and (when is None or when(args, kwargs)):
                counter.waits.append(_wait(op))
            return original(tensor, *args, **kwargs)

        return read

    def within(self, function: Callable) -> list[HostWait]:
        """The waits that ``function`` was on the stack for (e.g. the progress display's reads)."""
        return [w for w in self.waits if w.within(function)]

    def lines(self) -> Counter:
        """How many waits each source line caused."""
        return Counter(str(w) for w in self.waits)

    def reset(self) -> None:
        """Forget what was recorded so far (e.g. the warm-up steps)."""
        self.waits.clear()
        self.ops = 0
        self.by_op.clear()


class CudaSyncOps(TorchDispatchMode):
    """On a GPU host: each aten op runs with torch's sync debug mode at "error"; those that synchronise are kept.

    ``ops`` maps each synchronising op to the source line that called it; the op is then run again with
    the mode off, so the code goes on and every such op of a pass is found, not only the first.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:
            if "synchronizing" not in str(exc):
                raise
            self.ops.setdefault(str(func), _caller_frames()[0])
            torch.cuda.set_sync_debug_mode(0)
            return func(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(previous)


@contextlib.contextmanager
def cuda_sync_errors() -> Iterator[CudaSyncOps]:
    """Any synchronising CUDA call raises, but in ``Tensor.backward``, whose aten ops the yielded
    :class:`CudaSyncOps` checks one by one (torch's autograd engine makes a synchronising call of its own)."""
    found, original = CudaSyncOps(), torch.Tensor.backward

    def backward(tensor: torch.Tensor, *args, **kwargs):
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            with found:
                return original(tensor, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(previous)

    torch.Tensor.backward = backward
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield found
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.Tensor.backward = original
