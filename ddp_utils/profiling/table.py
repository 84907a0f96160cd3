"""Profile rows as an aligned text table, with the conventions behind its numbers."""

from __future__ import annotations

from typing import Any

from .flop_counters import THOP_CONVENTION, TORCH_CONVENTION

CPU_MEMORY_NOTE = "memory: peak CUDA memory allocated (GB); not measured on cpu/mps (torch has no peak counter there)"


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, fmt)
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`profile` (or :func:`gather_rows`) as an aligned text table with notes.

    Examples:
        >>> import torch, torch.nn as nn
        >>> from ddp_utils.profiling import profile
        >>> rows = profile(torch.rand(1, 4), nn.Linear(4, 2), n=1, device="cpu")
        >>> format_table(rows).splitlines()[0].split()[:3]
        ['op', 'device', 'params']
    """
    columns = [
        ("rank", "rank", ""),
        ("op", "op", ""),
        ("device", "device", ""),
        ("parameters", "params", ""),
        ("gflops", "GFLOPs", ".4g"),
        ("memory_gb", "mem(GB)", ".3f"),
        ("forward_ms", "forward(ms)", ".3f"),
        ("backward_ms", "backward(ms)", ".3f"),
        ("input_shape", "input", ""),
        ("output_shape", "output", ""),
    ]
    columns = [c for c in columns if any(c[0] in row for row in rows)]
    cells = [[title for _, title, _ in columns]]
    cells += [[_cell(row.get(key), fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    conventions = {"thop": THOP_CONVENTION, "FlopCounterMode": TORCH_CONVENTION}
    counters = sorted({row.get("flops_counter") for row in rows} & set(conventions))
    if counters:
        lines.append("GFLOPs per forward pass by " + "; ".join(conventions[c] for c in counters))
    if any(row.get("memory_gb") is None and not str(row.get("device", "")).startswith("cuda") for row in rows):
        lines.append(CPU_MEMORY_NOTE)
    lines += [f"error: {row['op']} on {row['device']}: {row['error']}" for row in rows if row.get("error")]
    return "\n".join(lines)
