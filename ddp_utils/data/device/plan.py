"""The tables a batch's render reads, made on the host from its recipes: one array, one copy to the device.

``kernels.py`` takes a batch as a few small tables: where each tile's pixels are and how they
are laid out, and per output row (sample) its layers' inverse transforms, placements, crops, mixup
weights, HSV gains and flips. They are made with NumPy (no device work), packed into one byte array, and
copied to the device in one transfer (:func:`tables_on`), where they are read as views.

They are made in two halves. What a recipe says (:func:`row_plan`: the transforms, which source each quadrant
slot reads at which whole-pixel offset, the crops, the mixup, the gains, the flips) is made by the loader's
workers when they collate the batch, in their own processes; the training process only joins it with where the
tiles lie on the device (:func:`row_tables`, a few array operations whatever the batch size), so its loader thread
holds the interpreter for no Python loop over the samples.

A row table always holds two rows at least (a lone row is repeated): the compiled kernels then
serve every batch size (a compiled kernel's sizes start at 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .kernels import (
    FLIP_LR,
    FLIP_UD,
    GAINS,
    HAS_GAINS,
    INT_COLUMNS,
    LAYER_FLOATS,
    MIX,
    PLACEMENTS,
    ROW_FLOATS,
    TILE_COLUMNS,
)

_Recipe = Any  # a recipes.Recipe: recipes.py imports this module, not the other way round
_Layer = Any  # a recipes.Layer


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
    parts = [np.asarray(part, np.int64).reshape(-1, k) for part, k in ((layouts, 4), (originals, 2), (sizes, 2))]
    return _at_least_two(np.concatenate(parts, 1).reshape(-1, TILE_COLUMNS))


class RowPlan(NamedTuple):
    """What a batch's recipes say to the render, per row (sample), layer (2) and quadrant slot (``PLACEMENTS``),
    without where the tiles lie: made in the loader's workers (:func:`row_plan`).

    Attributes:
        floats: float32 ``[n, ROW_FLOATS]``: the render's float table, whole.
        sources: int64 ``[n, 2, PLACEMENTS]``: the source each slot reads, -1 for a slot no placement takes.
        offsets: int64 ``[n, 2, PLACEMENTS, 2]``: the slot's tile pixel (0, 0) on its layer's grid, (x, y).
        rects: int64 ``[n, 2, PLACEMENTS, 4]``: the slot's rect on the grid (x0, y0, x1, y1), ends excluded.
    """

    floats: np.ndarray
    sources: np.ndarray
    offsets: np.ndarray
    rects: np.ndarray

    def rows(self, index: Sequence[int]) -> RowPlan:
        """These rows alone (the mixups' render)."""
        index = np.asarray(index, np.int64)
        return RowPlan(*(array[index] for array in self))


def row_plan(recipes: Sequence[_Recipe]) -> RowPlan:
    """The recipes' half of the render's tables (module docstring); a lone row is not repeated here.

    Raises:
        ValueError: a layer of several placements that is not a mosaic (tiles on the canvas at whole-pixel
            offsets, one in each quadrant around its centre: ``recipes.py`` makes them so).
    """
    n = len(recipes)
    floats = np.zeros((n, ROW_FLOATS), np.float32)
    sources = np.full((n, 2, PLACEMENTS), -1, np.int64)
    offsets = np.zeros((n, 2, PLACEMENTS, 2), np.int64)
    rects = np.zeros((n, 2, PLACEMENTS, 4), np.int64)
    for i, recipe in enumerate(recipes):
        for layer_index, layer in enumerate(recipe.layers[:2]):
            f0 = layer_index * LAYER_FLOATS
            floats[i, f0 : f0 + 9] = np.asarray(layer.inverse, np.float64).reshape(9)  # float64 -> float32
            grid, centre, slots = _on_one_grid(layer)
            floats[i, f0 + 9 : f0 + 15] = (*grid, *centre)
            for slot, source, offset, rect in slots:
                sources[i, layer_index, slot] = source
                offsets[i, layer_index, slot] = offset
                rects[i, layer_index, slot] = rect
        if recipe.mix is not None:  # mixup's float32 weights, as NumPy's float32 blend has them
            floats[i, MIX : MIX + 2] = np.float32(recipe.mix), np.float32(1.0 - recipe.mix)
        if recipe.gains is not None:
            floats[i, GAINS : GAINS + 3] = recipe.gains  # cv2.transform's float32 gains
            floats[i, HAS_GAINS] = 1.0
        floats[i, FLIP_UD], floats[i, FLIP_LR] = recipe.flip_ud, recipe.flip_lr
    return RowPlan(floats, sources, offsets, rects)


def row_tables(plan: RowPlan, tiles: Sequence[Layout]) -> tuple[np.ndarray, np.ndarray]:
    """``render_rows``' tables: the plan joined with where each source's tile lies (``tiles``, by source index).

    Returns:
        (int64 [n, 2 * LAYER_INTS], float32 [n, ROW_FLOATS]); per slot its start (the tile's pixel (0, 0) of the
        layer's grid in the flat buffer), channel, row and column strides, and rect; a slot no placement takes is
        all zeros, an empty rect, which holds no pixel.

    Examples:
        >>> plan = RowPlan(np.zeros((1, 38), np.float32), np.array([[[0, -1, -1, -1], [-1] * 4]]),
        ...                np.array([[[[2, 1]] + [[0, 0]] * 3, [[0, 0]] * 4]]), np.zeros((1, 2, 4, 4), np.int64))
        >>> ints, floats = row_tables(plan, [Layout(100, 1, 10, 3)])
        >>> ints.shape, ints[0, :4].tolist(), len(floats)
        ((2, 64), [116, 1, 10, 3], 2)
    """
    layouts = np.asarray(tiles, np.int64).reshape(-1, 4)
    used = plan.sources >= 0
    lay = layouts[np.where(used, plan.sources, 0)]  # [n, 2, slots, (start, cs, ys, xs)]
    start = lay[..., 0] + plan.offsets[..., 1] * lay[..., 2] + plan.offsets[..., 0] * lay[..., 3]
    ints = np.concatenate((start[..., None], lay[..., 1:], plan.rects), -1) * used[..., None]
    return _at_least_two(ints.reshape(len(ints), 2 * PLACEMENTS * INT_COLUMNS)), _at_least_two(plan.floats)


_FAR = 2.0**30  # a letterbox's centre: every pixel in its first quadrant


def _on_one_grid(layer: _Layer) -> tuple[tuple, tuple[float, float], list[tuple]]:
    # a layer's grid (canvas to grid: sx, ox, sy, oy), its centre on it, and its quadrant slots taken:
    # (slot, source, its tile's offset on the grid (x, y), its rect on the grid)
    if len(layer.placements) == 1 and layer.centre is None:  # a letterbox: its tile's own pixels
        p = layer.placements[0]
        return p.affine, (_FAR, _FAR), [(0, p.image, (0, 0), p.crop)]
    if layer.centre is None:
        raise ValueError(f"a layer of {len(layer.placements)} placements without a mosaic's centre")
    xc, yc = layer.centre
    slots = []
    for p in layer.placements:  # a mosaic: the canvas, each tile at a whole-pixel offset (tile = canvas + (ox, oy))
        sx, ox, sy, oy = p.affine
        if sx != 1 or sy != 1 or ox != int(ox) or oy != int(oy):
            raise ValueError(f"a mosaic's tiles must sit on the canvas at whole pixels: {p.affine}")
        ox, oy = int(ox), int(oy)
        u0, v0, u1, v1 = p.crop
        slot = int(p.rect[0] >= xc) + 2 * int(p.rect[1] >= yc)
        slots.append((slot, p.image, (ox, oy), (u0 - ox, v0 - oy, u1 - ox, v1 - oy)))
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


__all__ = [
    "Layout",
    "RowPlan",
    "bgr_layout",
    "chw_layout",
    "pack",
    "padded_layouts",
    "row_plan",
    "row_tables",
    "tables_on",
    "tile_table",
]
