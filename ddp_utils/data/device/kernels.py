"""The device path's two kernels, written once in tensor operations: the tiles' resize and the batch's render.

Each function below is pointwise over its output: every output element computes its own source
coordinates from a small per-row table and reads the pixels it needs from one flat ``uint8``
buffer by index. Compiled by ``torch.compile`` (Inductor: Triton on CUDA, C++ on the CPU), each
becomes ONE kernel that reads the pixels it samples and the tables, and writes its output once;
nothing in between is materialised. Run eagerly, the same code is the slow form that allocates
a tensor per operation (used where no compiler is available, in bounded chunks).

:func:`resize_tiles` (one launch): reads each source (a decoded JPEG, CHW RGB, or a worker's
tile, HWC BGR) at the bilinear taps of ``load_image``'s resize, writes ``[n, 3, S, S]`` uint8 tiles
(each in the top-left corner of its square; ``S`` the longest tile side).

:func:`render_rows` (one launch): per output pixel and row (sample), maps the pixel through the
row's flip and its layers' inverse transforms to each placement's tile, draws the placements in
order with OpenCV's transparent border on its 1/32-pixel grid, blends the mixup's second layer
(``layers=2``), applies OpenCV's 8-bit HSV round trip in 32-bit integers with the row's gains, and
writes the three channels once, as float32 ``0-1`` (``channels_last`` or not) or uint8.

The same numbers whichever form runs them. Every operation is pointwise and each is IEEE float32 or integer
arithmetic the eager operators and the compiled kernel both round once: Inductor is told to keep eager's numerics
(no fused multiply-adds, round-to-nearest division; ``kernel_compile.py``), and the one division that eager CUDA
turns into a multiplication by the reciprocal, the level over 255, is a lookup in a table of the 256 float levels
(:func:`float_levels`, made by the workers path's own division on the device). So a batch is equal bit for bit
whether the compiled kernels or their eager form made it, and where a run switches from one to the other changes
nothing (``tests/data/device/test_compiled.py``).

The numbers each reproduces, and why, are ``render.py``'s; ``reference.py`` says the
same slowly in another form (``grid_sample``, ``F.interpolate``), the oracle the tests compare with.
"""

from __future__ import annotations

import numpy as np
import torch

# render_rows' table columns. A layer's pixels are addressed on its grid: the canvas (a mosaic's tiles sit on it at
# whole-pixel offsets) or its one tile's (a letterbox). Per layer and quadrant slot, INT_COLUMNS ints: where the
# slot's tile would have its grid pixel (0, 0) in the flat buffer, the tile's channel, row and column strides, and
# its rect on the grid (x0, y0, x1, y1), ends excluded (inside its quadrant; an empty rect for a slot unused)
PLACEMENTS = 4  # most placements of a layer (a mosaic's four tiles; a letterbox has one)
INT_COLUMNS = 8
LAYER_INTS = PLACEMENTS * INT_COLUMNS
# floats per layer: the inverse transform (3x3, output pixel to canvas), (sx, ox, sy, oy) canvas to grid, and the
# centre (xc, yc) on the grid whose quadrants hold the placements 0-3 (a mosaic's; far away for a letterbox's one)
LAYER_FLOATS = 9 + 4 + 2
# floats per row after the two layers: the mixup's two weights, the HSV gains, has_gains, flip_ud, flip_lr
ROW_FLOATS = 2 * LAYER_FLOATS + 8
MIX, GAINS, HAS_GAINS, FLIP_UD, FLIP_LR = (2 * LAYER_FLOATS + k for k in (0, 2, 5, 6, 7))
# resize_tiles' table: per tile, its source's start, channel, row and column strides, its (h0, w0), its (h, w)
TILE_COLUMNS = 8

_GRID = 32.0  # OpenCV's remap: source coordinates on a 1/32-pixel grid (INTER_BITS = 5)
_PAD = 114.0  # the mosaic's and letterbox's border (warp.PAD_COLOR)

# OpenCV's 8-bit BGR2HSV divides by tables of (255 << 12) / v and (180 << 12) / (6 d), rounded
_SHIFT = 12
S_TABLE = np.concatenate(([0], np.round((255 << _SHIFT) / np.arange(1, 256)))).astype(np.int32)
H_TABLE = np.concatenate(([0], np.round((180 << _SHIFT) / (6.0 * np.arange(1, 256))))).astype(np.int32)
_SIX_OVER_180 = float(np.float32(6.0 / 180.0))  # OpenCV's float32 constants of HSV2BGR
_ONE_OVER_255 = float(np.float32(1.0 / 255.0))


def resize_tiles(sources: torch.Tensor, table: torch.Tensor, span: torch.Tensor) -> torch.Tensor:
    """Every tile resized from its source, as ``load_image`` resizes for training (bilinear, half-pixel centres).

    One launch reads, per tile pixel, four pixels of each channel of its source (``sources``, flat uint8)
    and its row of ``table``; it writes ``[n, 3, side, side]`` uint8 (the tile's own ``h x w`` in the
    top-left corner, the rest its edge repeated). A source of the tile's size is copied exactly.

    Args:
        sources: every source's pixels, back to back (uint8, 1-D).
        table: int64 ``[n, TILE_COLUMNS]``: start, channel stride, row stride, column stride (negative
            channel strides read BGR as RGB), the source's (h0, w0), the tile's (h, w).
        span: int64 ``[side]``, ``0 .. side - 1``: the tiles' square (a tensor, so that one compilation
            serves every size: see :func:`coordinates`).
    """
    n, side = table.shape[0], span.shape[0]
    start, cs, ys, xs, h0, w0, h, w = (table[:, k].view(n, 1, 1) for k in range(TILE_COLUMNS))
    pixel = torch.arange(side * side, device=table.device)  # the square's pixels as one dimension (render_rows)
    dst_y = torch.minimum(span[pixel // side].view(1, 1, -1), h - 1)
    dst_x = torch.minimum(span[pixel % side].view(1, 1, -1), w - 1)
    channel = torch.arange(3, device=table.device).view(1, 3, 1)
    y0, y1, wy = _taps(dst_y, h0, h)
    x0, x1, wx = _taps(dst_x, w0, w)
    row0, row1 = start + channel * cs + y0 * ys, start + channel * cs + y1 * ys
    top = sources[row0 + x0 * xs].float() * (1 - wx) + sources[row0 + x1 * xs].float() * wx
    bottom = sources[row1 + x0 * xs].float() * (1 - wx) + sources[row1 + x1 * xs].float() * wx
    return (top * (1 - wy) + bottom * wy).round().clamp(0, 255).to(torch.uint8).view(n, 3, side, side)


def coordinates(size: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The index tensors the kernels take for a side of ``size`` pixels: int64 ``0 .. size - 1`` (the tiles' span)
    and float32 ``[2, size]``, forwards and backwards (the output's rows or columns, and the same flipped).

    Sizes reach the kernels as these tensors' shapes, never as Python numbers: one compilation then serves
    every size (a number would be traced as a constant, or as a symbol whose arithmetic with floats makes
    the compiler start over).

    Examples:
        >>> span, both = coordinates(3)
        >>> span.tolist(), both.tolist()
        ([0, 1, 2], [[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    """
    span = torch.arange(size, device=device)
    both = torch.stack((span, span.flip(0))).float()
    return span, both


def _taps(dst: torch.Tensor, src_size: torch.Tensor, dst_size: torch.Tensor) -> tuple:
    # PyTorch's bilinear (align_corners=False) and cv2.resize's INTER_LINEAR: the source point
    # (dst + 0.5) * scale - 0.5, clamped at 0; its two taps and the second one's weight
    scale = src_size.float() / dst_size.float()
    point = ((dst.float() + 0.5) * scale - 0.5).clamp_min(0.0)
    first = point.floor()
    weight = point - first
    first = first.long()
    return first, torch.minimum(first + 1, src_size - 1), weight


def render_rows(
    tiles: torch.Tensor,
    ints: torch.Tensor,
    floats: torch.Tensor,
    tables: torch.Tensor,
    levels: torch.Tensor,
    ys: torch.Tensor,
    xs: torch.Tensor,
    layers: int = 1,
    to_float: bool = True,
    channels_last: bool = True,
) -> torch.Tensor:
    """Each row's image: its layers warped from their tiles, mixed, coloured and flipped.

    One launch reads, per output pixel and layer, the three channels of its four bilinear taps from
    ``tiles`` (each tap from the placement whose rect holds it), the row's tables and the two HSV
    tables; it writes the pixel's three channels once.

    Args:
        tiles: the tiles' pixels (uint8, 1-D), addressed by the placements' starts and strides.
        ints: int64 ``[n, 2 * LAYER_INTS]``, the placements of each row's two layers.
        floats: float32 ``[n, ROW_FLOATS]``, the transforms, the mixup, the gains and the flips.
        tables: int32 ``[2, 256]``: ``S_TABLE`` and ``H_TABLE`` (OpenCV's BGR2HSV divisions).
        levels: float32 ``[256]``: each level's float value (:func:`float_levels`).
        ys: float32 ``[2, h]``: the output's rows, then the same flipped (:func:`coordinates`).
        xs: float32 ``[2, w]``: its columns, then the same flipped.
        layers: 1 (the mixup, if any, left out) or 2 (every row mixes its two layers).
        to_float: float32 in 0-1 (the step's input) or uint8 0-255.
        channels_last: the output's memory layout (with ``to_float``).

    Returns:
        ``[n, 3, h, w]``.
    """
    n, h, w = ints.shape[0], ys.shape[1], xs.shape[1]
    row = [floats[:, k].view(n, 1) for k in range(ROW_FLOATS)]
    # the pixels as one flat dimension, each reading its row and column by index: every value of the kernel then
    # has the output's shape [n, h w], and Inductor makes it one loop that keeps them all in registers (by [n, h, w]
    # coordinates, a row's and column's own loops, it stores the warp's two coordinate planes between two loops)
    pixel = torch.arange(h * w, device=ints.device)
    line, column = (pixel // w).view(1, -1), (pixel % w).view(1, -1)
    ys = torch.where(row[FLIP_UD] > 0, ys[1][line], ys[0][line])  # a flip: where a pixel reads from
    xs = torch.where(row[FLIP_LR] > 0, xs[1][column], xs[0][column])
    rgb = _layer(tiles, ints, row, 0, ys, xs)
    if layers == 2:  # mixup's float32 blend, truncated to uint8
        second = _layer(tiles, ints, row, 1, ys, xs)
        rgb = [(a * row[MIX] + b * row[MIX + 1]).trunc() for a, b in zip(rgb, second)]
    jittered = _hsv_round_trip(rgb, [row[GAINS + k] for k in range(3)], tables)
    rgb = [torch.where(row[HAS_GAINS] > 0, j, c) for j, c in zip(jittered, rgb)]
    if not to_float:
        return torch.stack(rgb, 1).to(torch.uint8).view(n, 3, h, w)
    rgb = [levels[c.long()] for c in rgb]  # each channel's float, looked up where it is made
    if channels_last:
        return torch.stack(rgb, -1).view(n, h, w, 3).permute(0, 3, 1, 2)
    return torch.stack(rgb, 1).view(n, 3, h, w)


def float_levels(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 256 levels as the step's float32 ``0-1`` values, made on ``device`` by the division the workers path's
    batches get there (``images_to_float``): the render looks its output up here, so both forms, and both paths,
    give a level the same float.

    Examples:
        >>> levels = float_levels()
        >>> torch.equal(levels, torch.arange(256).float() / 255), levels.dtype
        (True, torch.float32)
    """
    return torch.arange(256, dtype=torch.float32, device=device).div_(255)


def _layer(tiles, ints, row, layer, ys, xs) -> list[torch.Tensor]:
    # one canvas: every output pixel back to the canvas and onto the layer's grid (OpenCV's 1/32 pixel), its four
    # bilinear taps each read once from the placement of its quadrant, then drawn in OpenCV's order (_draw_taps)
    n = ints.shape[0]
    f0 = layer * LAYER_FLOATS
    inv, (sx, ox, sy, oy), (xc, yc) = row[f0 : f0 + 9], row[f0 + 9 : f0 + 13], row[f0 + 13 : f0 + 15]
    z = inv[6] * xs + inv[7] * ys + inv[8]
    u = ((sx * (inv[0] * xs + inv[1] * ys + inv[2]) / z + ox) * _GRID).round() / _GRID
    v = ((sy * (inv[3] * xs + inv[4] * ys + inv[5]) / z + oy) * _GRID).round() / _GRID
    left, top = u.floor(), v.floor()
    fx, fy = u - left, v - top
    right_of = [left + i >= xc for i in (0, 1)]  # each tap column's side of the centre, each row's
    below = [top + j >= yc for j in (0, 1)]
    left, top = left.long(), top.long()
    first = torch.arange(n, device=ints.device).view(n, 1) * ints.shape[1] + layer * LAYER_INTS
    flat = ints.view(-1)
    taps = {}
    for i, j, weight in ((0, 0, (1 - fx) * (1 - fy)), (1, 0, fx * (1 - fy)), (0, 1, (1 - fx) * fy), (1, 1, fx * fy)):
        slot = first + (right_of[i].long() + 2 * below[j].long()) * INT_COLUMNS
        start, cs, ystride, xstride, x0, y0, x1, y1 = (flat[slot + c] for c in range(INT_COLUMNS))
        col, line = left + i, top + j
        inside = (col >= x0) & (col < x1) & (line >= y0) & (line < y1)
        # a tap outside its placement's rect reads a pixel of it (its weight is 0): in bounds, in the same lines
        at = start + torch.maximum(torch.minimum(line, y1 - 1), y0) * ystride
        at = at + torch.maximum(torch.minimum(col, x1 - 1), x0) * xstride
        taps[i, j] = (torch.where(inside, weight, 0.0), [tiles[at + c * cs].float() for c in range(3)])
    return _draw_taps(taps, right_of[0] == right_of[1], below[0] == below[1])


def _draw_taps(taps: dict, same_x: torch.Tensor, same_y: torch.Tensor) -> list[torch.Tensor]:
    # OpenCV's warp with BORDER_TRANSPARENT, tile after tile: a pixel whose source has any of its four taps in a
    # tile's rect is written, the taps outside reading the pixel's present value. A mosaic's tiles are the four
    # quadrants around its centre, drawn in the order (0, 0), (1, 0), (0, 1), (1, 1) of the taps' quadrants: the
    # taps that share a quadrant are drawn together, at the first of them
    steps = (
        ([(0, 0), (1, 0), (0, 1), (1, 1)], [None, same_x, same_y, same_x & same_y], None),
        ([(1, 0), (1, 1)], [None, same_y], ~same_x),
        ([(0, 1), (1, 1)], [None, same_x], ~same_y),
        ([(1, 1)], [None], ~same_x & ~same_y),
    )
    out = [torch.full_like(taps[0, 0][0], _PAD)] * 3
    for members, shared, active in steps:
        drawn, value = 0.0, [0.0, 0.0, 0.0]
        for tap, with_it in zip(members, shared):
            weight, pixel = taps[tap]
            if with_it is not None:
                weight = torch.where(with_it, weight, 0.0)
            drawn = drawn + weight
            value = [v_c + weight * p_c for v_c, p_c in zip(value, pixel)]
        write = drawn > 0 if active is None else active & (drawn > 0)
        out = [torch.where(write, (v_c + (1 - drawn) * o).round().clamp(0, 255), o) for v_c, o in zip(value, out)]
    return out


def _hsv_round_trip(rgb, gains, tables) -> list[torch.Tensor]:
    # augment_hsv: OpenCV's 8-bit BGR2HSV (fixed-point divisions by its tables), the gains (float32, rounded
    # and saturated), HSV2BGR as OpenCV's vector code computes it (float32, truncated)
    r, g, b = (c.to(torch.int32) for c in rgb)
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    s = (diff * tables[0][v.long()] + (1 << (_SHIFT - 1))) >> _SHIFT
    hue = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    hue = (hue * tables[1][diff.long()] + (1 << (_SHIFT - 1))) >> _SHIFT
    hue = torch.where(hue < 0, hue + 180, hue)
    hue, s, v = ((c.float() * gain).round().clamp(0, 255) for c, gain in zip((hue, s, v), gains))
    hue = hue * _SIX_OVER_180
    sector = hue.trunc()
    f = hue - sector
    s, v = s * _ONE_OVER_255, v * _ONE_OVER_255
    sector = sector.to(torch.int32)
    out = []
    for offset in (5, 3, 1):  # r, g, b: OpenCV's sector table as v (1 - s m), m in {0, f, 1, 1 - f}
        k = (sector + offset) % 6
        m = torch.minimum(k.float() + f, (4 - k).float() - f).clamp(0, 1)
        out.append((v * (1 - s * m) * 255).trunc().clamp(0, 255))
    return out


__all__ = ["H_TABLE", "S_TABLE", "coordinates", "float_levels", "render_rows", "resize_tiles"]
