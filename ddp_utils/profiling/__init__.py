"""How big and how fast a model is: parameters, FLOPs, time and memory, per device.

What lives where, one question per module:

- ``info.py``: how big. :func:`model_info` logs YOLOv5's one-line summary ("YOLOv5s summary:
  214 layers, 7235389 parameters, 7235389 gradients, 16.6 GFLOPs"); :func:`parameter_table`.
- ``flop_counters.py``: how much work. :func:`flops` counts one forward pass with thop
  (YOLOv5's 2 x MACs) and with PyTorch's FlopCounterMode, and says what each left out
  (:class:`FlopsReport`, :data:`THOP_CONVENTION`, :data:`TORCH_CONVENTION`).
- ``timing.py``: how fast, per op and per device. :func:`profile` times forward and backward
  and reads peak memory; :func:`gather_rows` collects every rank's rows; :func:`parse_devices`
  reads a device list with :func:`ddp_utils.device.parse_device`.
- ``table.py``: :func:`format_table` prints those rows.
- ``inputs.py``: what a model is fed (:func:`example_input`); :func:`de_parallel` is :mod:`ddp_utils.distributed`'s.

The command line (``python -m ddp_utils profile``, ``ddp-profile``) lives in
``ddp_utils.cli.profile``.
"""

from __future__ import annotations

from ..distributed import de_parallel
from .flop_counters import THOP_CONVENTION, TORCH_CONVENTION, FlopsReport, flops
from .info import count_layers, model_gflops, model_info, parameter_table
from .inputs import example_input
from .table import CPU_MEMORY_NOTE, format_table
from .timing import gather_rows, parse_devices, profile

__all__ = [
    "CPU_MEMORY_NOTE",
    "THOP_CONVENTION",
    "TORCH_CONVENTION",
    "FlopsReport",
    "count_layers",
    "de_parallel",
    "example_input",
    "flops",
    "format_table",
    "gather_rows",
    "model_gflops",
    "model_info",
    "parameter_table",
    "parse_devices",
    "profile",
]
