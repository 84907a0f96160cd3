"""The tables a batch's render reads, made on the host from its recipes: one array, one copy to the device.

``kernels.py`` takes a batch as a few small tables: where each tile's pixels are and how they
are laid out, and per output row (sample) its layers' inverse transforms, placements, crops, mixup
weights, HSV gains and flips. They are made here with NumPy from the
:class:`~ddp_utils.data.device.recipes.RecipeBatch` (no device work), packed into one byte array, and
copied to the device in one transfer (:func:`tables_on`), where they are read as views.

A row table always holds two rows at least (a lone row is repeated): the compiled kernels then
serve every batch size without a second compilation for the size 1 (``torch.compile``
specialises sizes 0 and 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .kernels import (
    FLIP_LR,
    FLIP_UD,
    GAINS,
    HAS_GAINS,
    LAYER_FLOATS,
    LAYER_INTS,
    MIX,
    PLACEMENTS,
    ROW_FLOATS,
    TILE_COLUMNS,
)
from .recipes import Recipe


class Layout(NamedTuple):
    """Where an image's pixel (c, y, x) is in a flat buffer: ``start + c * cs + y * ys + x * xs``."""

    start: int
    cs: int
    ys: int
    xs: int


def chw_layout(start: int, strides: Sequence[int]) -> Layout:
    """A CHW tensor's layout from its strides (a decoder may hand out HWC memory as a CHW view)."""
    return Layout(start, *(int(s) for s in strides))


def bgr_layout(start: int, width: int) -> Layout:
    """A worker's HWC BGR tile, read as RGB: channel c at offset 2 - c."""
    return Layout(start + 2, -1, 3 * width, 3)


def padded_layouts(count: int, side: int) -> list[Layout]:
    """The tiles :func:`~ddp_utils.data.device.kernels.resize_tiles` writes: each in its own ``side``-square."""
    return [Layout(t * 3 * side * side, side * side, side, 1) for t in range(count)]


def tile_table(layouts: Sequence[Layout], originals: Sequence[tuple[int, int]], sizes: Sequence[tuple[int, int]]):
    """``resize_tiles``' table: each source's layout, its (h0, w0) and its tile's (h, w); int64 [n, TILE_COLUMNS]."""
    table = np.array([(*lay, *orig, *size) for lay, orig, size in zip(layouts, originals, sizes)], np.int64)
    return _at_least_two(table.reshape(-1, TILE_COLUMNS))


def row_tables(recipes: Sequence[Recipe], tiles: Sequence[Layout]) -> tuple[np.ndarray, np.ndarray]:
    """``render_rows``' tables for these recipes, their placements read from ``tiles`` (by source index).

    Returns:
        (int64 [n, 2 * LAYER_INTS], float32 [n, ROW_FLOATS]); a quadrant slot no placement takes is an
        empty rect, which holds no pixel.

    Raises:
        ValueError: a layer of several placements that is not a mosaic (tiles on the canvas at whole-pixel
            offsets, one in each quadrant around its centre: ``recipes.py`` makes them so).
    """
    ints = np.zeros((len(recipes), 2 * LAYER_INTS), np.int64)
    floats = np.zeros((len(recipes), ROW_FLOATS), np.float32)
    for i, recipe in enumerate(recipes):
        for layer_index, layer in enumerate(recipe.layers[:2]):
            f0, i0 = layer_index * LAYER_FLOATS, layer_index * LAYER_INTS
            floats[i, f0 : f0 + 9] = np.asarray(layer.inverse, np.float64).reshape(9)  # float64 -> float32
            grid, centre, slots = _on_one_grid(layer, tiles)
            floats[i, f0 + 9 : f0 + 15] = (*grid, *centre)
            ints[i, i0 : i0 + LAYER_INTS] = np.array(slots).reshape(-1)
        if recipe.mix is not None:  # mixup's float32 weights, as NumPy's float32 blend has them
            floats[i, MIX : MIX + 2] = np.float32(recipe.mix), np.float32(1.0 - recipe.mix)
        if recipe.gains is not None:
            floats[i, GAINS : GAINS + 3] = recipe.gains  # cv2.transform's float32 gains
            floats[i, HAS_GAINS] = 1.0
        floats[i, FLIP_UD], floats[i, FLIP_LR] = recipe.flip_ud, recipe.flip_lr
    return _at_least_two(ints), _at_least_two(floats)


_FAR = 2.0**30  # a letterbox's centre: every pixel in its first quadrant


def _on_one_grid(layer, tiles) -> tuple[tuple, tuple[float, float], list[tuple]]:
    # a layer's grid (canvas to grid: sx, ox, sy, oy), its centre on it, and its four quadrant slots: (start, cs,
    # ys, xs, rect), where start addresses the slot's tile by grid coordinates
    empty = [(*tiles[0], 0, 0, 0, 0)] * PLACEMENTS if tiles else [(0, 0, 0, 0, 0, 0, 0, 0)] * PLACEMENTS
    if len(layer.placements) == 1 and layer.centre is None:  # a letterbox: its tile's own pixels
        p = layer.placements[0]
        return p.affine, (_FAR, _FAR), [(*tiles[p.image], *p.crop), *empty[1:]]
    if layer.centre is None:
        raise ValueError(f"a layer of {len(layer.placements)} placements without a mosaic's centre")
    xc, yc = layer.centre
    slots = list(empty)
    for p in layer.placements:  # a mosaic: the canvas, each tile at a whole-pixel offset (tile = canvas + (ox, oy))
        sx, ox, sy, oy = p.affine
        if sx != 1 or sy != 1 or ox != int(ox) or oy != int(oy):
            raise ValueError(f"a mosaic's tiles must sit on the canvas at whole pixels: {p.affine}")
        start, cs, ys, xs = tiles[p.image]
        ox, oy = int(ox), int(oy)
        u0, v0, u1, v1 = p.crop
        slot = int(p.rect[0] >= xc) + 2 * int(p.rect[1] >= yc)
        slots[slot] = (start + oy * ys + ox * xs, cs, ys, xs, u0 - ox, v0 - oy, u1 - ox, v1 - oy)
    return (1.0, 0.0, 1.0, 0.0), (float(xc), float(yc)), slots


def _at_least_two(table: np.ndarray) -> np.ndarray:
    return np.concatenate((table, table[:1])) if len(table) == 1 else table


def pack(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, list[tuple[int, torch.dtype, tuple[int, ...]]]]:
    """The arrays back to back in one byte array (each start aligned to 8 bytes), and where each lies."""
    where, parts, offset = [], [], 0
    for array in arrays:
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        pad = -len(raw) % 8
        parts += [raw, np.zeros(pad, np.uint8)]
        where.append((offset, torch.from_numpy(array[:0]).dtype, array.shape))
        offset += len(raw) + pad
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8), where


def tables_on(device: torch.device, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """The arrays on ``device`` through one transfer (from pinned memory on CUDA, so the host does not wait)."""
    packed, where = pack(arrays)
    host = torch.from_numpy(packed)
    if device.type == "cuda":
        buffer = host.pin_memory().to(device, non_blocking=True)
    else:
        buffer = host
    out = []
    for offset, dtype, shape in where:
        count = int(np.prod(shape))
        size = torch.empty(0, dtype=dtype).element_size()
        out.append(buffer[offset : offset + count * size].view(dtype).view(shape))
    return out


__all__ = ["Layout", "bgr_layout", "chw_layout", "pack", "padded_layouts", "row_tables", "tables_on", "tile_table"]
