"""The device render said slowly, in other tensor operations: the oracle the fused kernels are tested against.

The same numbers as ``kernels.py`` (``render.py`` says which and why), in the plain form
this project first wrote them in: tiles resized by ``F.interpolate``, stacked in one padded array, each
placement drawn by ``grid_sample`` over the whole output with a fourth channel for its crop, the mixup
over the whole chunk, the HSV round trip in int64 by table lookups, the flips by ``flip``. Every step
allocates full-size float32 temporaries (hundreds of times the output's bytes): it is for the tests
(``tests/data/device/test_render.py``) on small batches, never for training.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)

from ..warp import PAD_COLOR
from .decode import jpeg_decoder
from .recipes import RecipeBatch, decode_on_host

_GRID = 32.0  # OpenCV's remap: source coordinates on a 1/32-pixel grid (INTER_BITS = 5)


def reference_render(batch: RecipeBatch, device: torch.device | str = "cpu") -> torch.Tensor:
    """The batch's images, uint8 RGB ``[B, 3, H, W]``, made the slow way (module docstring)."""
    device = torch.device(device)
    tiles = reference_tiles(batch, device)
    side = max(max(size) for size in batch.sizes)
    stack = torch.zeros((len(tiles), 3, side, side), dtype=torch.uint8, device=device)
    for i, tile in enumerate(tiles):
        stack[i, :, : tile.shape[1], : tile.shape[2]] = tile
    return _render(batch.recipes, stack, batch.recipes[0].size, device)


def reference_tiles(batch: RecipeBatch, device: torch.device) -> list[torch.Tensor]:
    """Each source as its tile, uint8 RGB [3, h, w]: decoded one by one, then resized by ``F.interpolate``."""
    decoder, tiles = jpeg_decoder(device), []
    for i in range(len(batch.sizes)):
        image = decoder.decode([batch.source(i)])[0] if batch.jpeg[i] else None
        if image is None:
            source = batch.source(i)
            bgr = source if not batch.jpeg[i] else decode_on_host(bytes(source.numpy()), batch.sizes[i], batch.paths[i])
            image = _on(device, np.ascontiguousarray(bgr[:, :, ::-1].transpose(2, 0, 1)), torch.uint8)
        tiles.append(_resized(image, batch.sizes[i]))
    return tiles


def _resized(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    # load_image's resize for training (INTER_LINEAR): bilinear at half-pixel centres, no antialiasing
    if tuple(image.shape[1:]) == tuple(size):
        return image.contiguous()
    resized = F.interpolate(image[None].float(), size=tuple(size), mode="bilinear", align_corners=False)
    return resized[0].round_().clamp_(0, 255).to(torch.uint8)


def _render(recipes, stack, size, device) -> torch.Tensor:
    # one chunk of samples: each layer warped, the mixup, the colours, the flips
    n = len(recipes)
    layers = [_warp_layer([r.layers[0] for r in recipes], stack, size, device)]
    if any(r.mix is not None for r in recipes):  # a sample without a mixup: its first layer stands in, unread
        second = [r.layers[1] if r.mix is not None else r.layers[0] for r in recipes]
        layers.append(_warp_layer(second, stack, size, device))
        ratio = _on(device, [r.mix if r.mix is not None else 1.0 for r in recipes], torch.float32).view(n, 1, 1, 1)
        blend = (layers[0] * ratio + layers[1] * (1 - ratio)).trunc_()  # mixup's float32 sum, cast to uint8
        has_mix = _on(device, [r.mix is not None for r in recipes], torch.bool).view(n, 1, 1, 1)
        img = torch.where(has_mix, blend, layers[0])
    else:
        img = layers[0]
    img = img.to(torch.uint8)
    if any(r.gains is not None for r in recipes):
        gains = _on(device, [r.gains if r.gains is not None else (1.0, 1.0, 1.0) for r in recipes], torch.float32)
        has_gains = _on(device, [r.gains is not None for r in recipes], torch.bool).view(n, 1, 1, 1)
        img = torch.where(has_gains, hsv_jitter(img, gains), img)
    for dim, flags in ((2, [r.flip_ud for r in recipes]), (3, [r.flip_lr for r in recipes])):
        if any(flags):
            img = torch.where(_on(device, flags, torch.bool).view(n, 1, 1, 1), img.flip(dim), img)
    return img


def _on(device: torch.device, values, dtype: torch.dtype) -> torch.Tensor:
    # an array made on the host, copied from pinned memory: a copy from pageable memory would make the host wait
    # for the stream's queued work
    table = torch.as_tensor(np.asarray(values), dtype=dtype)
    if device.type == "cuda":
        return table.pin_memory().to(device, non_blocking=True)
    return table.to(device)


_TABLES: dict[tuple[torch.device, int], torch.Tensor] = {}


def _table(device: torch.device, array: np.ndarray) -> torch.Tensor:
    # one of this module's constant tables on the device, copied there once
    key = (device, id(array))
    if key not in _TABLES:
        _TABLES[key] = _on(device, array, torch.int64)
    return _TABLES[key]


def _warp_layer(layers, stack, size, device) -> torch.Tensor:
    # every output pixel back to its canvas, then drawn from the tiles in turn (float32 [n, 3, h, w] holding uint8
    # values)
    n, (h, w) = len(layers), size
    inverse = _on(device, np.stack([layer.inverse for layer in layers]), torch.float64).float()
    ys = torch.arange(h, device=device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=device, dtype=torch.float32).view(1, 1, w)
    row = [inverse[:, i].view(n, 3, 1, 1) for i in range(3)]
    z = row[2][:, 0] * xs + row[2][:, 1] * ys + row[2][:, 2]
    x = (row[0][:, 0] * xs + row[0][:, 1] * ys + row[0][:, 2]) / z  # [n, h, w] canvas points
    y = (row[1][:, 0] * xs + row[1][:, 1] * ys + row[1][:, 2]) / z
    tiles, crops, affine = _placement_tables(layers)
    tiles, crops = _on(device, tiles, torch.int64), _on(device, crops, torch.int64)
    affine = _on(device, affine, torch.float64).float()
    out = torch.full((n, 3, h, w), float(PAD_COLOR[0]), device=device)
    for k in range(tiles.shape[1]):
        out = _draw_tile(out, stack, tiles[:, k], crops[:, k], affine[:, k], x, y)
    return out


def _placement_tables(layers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # per sample and placement: its tile, its crop (u0, v0, u1, v1) and (sx, ox, sy, oy); a sample with fewer
    # placements has empty crops in their place, which draw no pixel
    count = max(len(layer.placements) for layer in layers)
    tiles, crops, affine = (np.zeros((len(layers), count, k), t) for k, t in ((1, np.int64), (4, np.int64), (4, float)))
    for i, layer in enumerate(layers):
        for k, p in enumerate(layer.placements):
            tiles[i, k], crops[i, k], affine[i, k] = p.image, p.crop, p.affine
    return tiles[..., 0], crops, affine


def _draw_tile(out, stack, tiles, crops, affine, x, y) -> torch.Tensor:
    # OpenCV's warp with BORDER_TRANSPARENT, on its 1/32-pixel grid: a pixel whose source has any of its four
    # neighbours in the tile's crop is written, the neighbours outside the crop reading the pixel's present value.
    # grid_sample reads the crop (zero outside) and, as a fourth channel, its mask: the weight of the neighbours
    # inside; the rest of the weight goes to the present value.
    n, side = len(tiles), stack.shape[-1]
    sx, ox, sy, oy = (a.view(n, 1, 1) for a in affine.unbind(1))
    u = ((sx * x + ox) * _GRID).round_() / _GRID
    v = ((sy * y + oy) * _GRID).round_() / _GRID
    grid = torch.stack((u, v), -1).mul_(2.0 / max(side - 1, 1)).sub_(1.0)  # align_corners=True: pixel i at i
    span = torch.arange(side, device=stack.device)
    u0, v0, u1, v1 = (c.view(n, 1, 1, 1) for c in crops.unbind(1))
    inside = ((span.view(1, 1, 1, -1) >= u0) & (span.view(1, 1, 1, -1) < u1)).float()
    inside = inside * ((span.view(1, 1, -1, 1) >= v0) & (span.view(1, 1, -1, 1) < v1)).float()  # [n, 1, s, s]
    source = torch.cat((stack.index_select(0, tiles).float() * inside, inside), 1)
    sampled = F.grid_sample(source, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    weight = sampled[:, 3:]
    value = (sampled[:, :3] + (1 - weight) * out).round_().clamp_(0, 255)
    return torch.where(weight > 0, value, out)


# OpenCV's 8-bit BGR2HSV: fixed-point divisions by tables rounded from (255 << 12) / v and (180 << 12) / (6 d)
_SHIFT = 12
_S_TABLE = np.concatenate(([0], np.round((255 << _SHIFT) / np.arange(1, 256)))).astype(np.int64)
_H_TABLE = np.concatenate(([0], np.round((180 << _SHIFT) / (6.0 * np.arange(1, 256))))).astype(np.int64)
# HSV2BGR's sectors: which of (v, v(1 - s), v(1 - s f), v(1 - s (1 - f))) each of r, g, b takes
_SECTORS = np.array([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])
_ONE = {c: float(np.float32(c)) for c in (6.0 / 180.0, 1.0 / 255.0)}  # OpenCV's float32 constants


def hsv_jitter(img: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """``augment_hsv``'s colours on a batch: OpenCV's 8-bit HSV round trip with each image's gains.

    Args:
        img: uint8 RGB [n, 3, h, w].
        gains: [n, 3] float32, the (h, s, v) gains.

    Returns:
        uint8 RGB [n, 3, h, w].

    Examples:
        >>> red = torch.tensor([200, 0, 0], dtype=torch.uint8).view(1, 3, 1, 1)
        >>> hsv_jitter(red, torch.tensor([[1.0, 1.0, 0.5]])).flatten().tolist()
        [100, 0, 0]
    """
    device = img.device
    r, g, b = img.long().unbind(1)
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    s_table, h_table = (_table(device, t) for t in (_S_TABLE, _H_TABLE))
    s = (diff * s_table[v] + (1 << (_SHIFT - 1))) >> _SHIFT
    hue = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    hue = (hue * h_table[diff] + (1 << (_SHIFT - 1))) >> _SHIFT
    hue = torch.where(hue < 0, hue + 180, hue)
    # cv2.transform with the diagonal gains: float32 products, rounded and saturated to uint8
    hsv = torch.stack((hue, s, v), 1).float() * gains.view(-1, 3, 1, 1)
    hue, s, v = hsv.round_().clamp_(0, 255).unbind(1)
    # HSV2BGR as OpenCV's vector code computes it: hue in half degrees (6 / 180 per unit, float32), its sector
    # modulo 6, the channels in float32 and truncated to uint8
    hue = hue * _ONE[6.0 / 180.0]
    sector = hue.trunc()
    f = hue - sector
    s, v = s * _ONE[1.0 / 255.0], v * _ONE[1.0 / 255.0]
    tab = torch.stack((v, v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))), 1)
    sectors = _table(device, _SECTORS)[:, sector.long().remainder_(6)]  # [3, n, h, w]
    rgb = tab.gather(1, sectors.permute(1, 0, 2, 3))
    return (rgb * 255).trunc_().clamp_(0, 255).to(torch.uint8)


__all__ = ["hsv_jitter", "reference_render", "reference_tiles"]
