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
- copies to the CPU from another device (``_to_copy``/``copy_``): on a CPU-only host every tensor
  is on the CPU, so these can only show up where a test runs on a real device;
- ``Tensor.tolist()``, ``Tensor.numpy()`` and ``Tensor.cpu()`` do not dispatch an aten op for a CPU
  tensor, so the counter wraps them while it is active and records each call as a wait (on a
  GPU they copy to the host). This over-counts reads of tensors that really live on the host
  (none in a training step's steady state, which is why they count).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
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
}
_BOOL_INDEX = {"index", "index_put", "index_put_", "_index_put_impl_"}
_HOST_READS = ("tolist", "numpy", "cpu")


@dataclass(frozen=True)
class HostWait:
    """One op that makes the host wait for the device, and the source line that ran it."""

    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.op} at {self.where}"


def _source_line() -> str:
    """``file:line (function)`` of the innermost frame outside torch, this file, contextlib and tqdm."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and not any(s in name for s in _SKIP_FILES):
            return f"{os.path.relpath(name)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "<torch internals>"


def _has_bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def _wait_reason(func, args: tuple, kwargs: dict) -> str | None:
    name = func._schema.name.split("::")[-1]
    if name in _ALWAYS_WAIT:
        return name
    if name in _BOOL_INDEX and _has_bool_index(args):
        return f"{name} with a boolean mask"
    if name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 4:
        return "repeat_interleave without output_size"
    if name in ("_to_copy", "copy_", "to"):
        src = args[1] if name == "copy_" else args[0]
        dst = args[0].device if name == "copy_" else kwargs.get("device")
        on_device = isinstance(src, torch.Tensor) and src.device.type != "cpu"
        if on_device and dst is not None and torch.device(dst).type == "cpu":
            return f"{name} to the CPU"
    return None


@dataclass
class HostWaitCounter(TorchDispatchMode):
    """A dispatch mode that records host waits (:class:`HostWait`) and counts non-view aten ops."""

    waits: list[HostWait] = field(default_factory=list)
    ops: int = 0
    by_op: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        super().__init__()
        self._saved: dict[str, object] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = _wait_reason(func, args, kwargs)
        if reason is not None:
            self.waits.append(HostWait(reason, _source_line()))
        if not func.is_view:
            self.ops += 1
            self.by_op[func._schema.name.split("::")[-1]] += 1
        return func(*args, **kwargs)

    def __enter__(self) -> HostWaitCounter:
        for name in _HOST_READS:
            original = self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._recording(name, original))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()

    def _recording(self, name: str, original):
        counter = self

        def read(tensor: torch.Tensor, *args, **kwargs):
            counter.waits.append(HostWait(f"Tensor.{name}()", _source_line()))
            return original(tensor, *args, **kwargs)

        return read

    def lines(self) -> Counter:
        """How many waits each source line caused."""
        return Counter(str(w) for w in self.waits)

    def reset(self) -> None:
        """Forget what was recorded so far (e.g. the warm-up steps)."""
        self.waits.clear()
        self.ops = 0
        self.by_op.clear()
