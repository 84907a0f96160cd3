"""A batch of training images made on the device from its recipes: decode, resize, then one fused render.

The loader's workers send a :class:`~ddp_utils.data.device.recipes.RecipeBatch` (the random draws and the
labels made as ever, the JPEG files' bytes in one shared-memory tensor); a :class:`Renderer` makes the
``[B, 3, H, W]`` batch that ``YoloDataset`` would have made, in a handful of launches whatever the
batch size, the number of image sizes or the mixup rate:

1. the JPEGs decoded in one batched call (``decode.py``: nvJPEG through TorchCodec on CUDA,
   guarded against writing into memory queued work still reads); a file the decoder refuses is
   decoded on the host (the CPU path's decoder), said once in the log;
2. the decoded images and the workers' pixels (other formats, EXIF-rotated JPEGs, cached images) in
   one flat buffer (one copy), then every tile resized in ONE kernel where a source is not its tile's
   size (``kernels.resize_tiles``);
3. the batch's tables (``plan.py``) copied in one transfer, then ONE kernel renders every
   sample (``kernels.render_rows``): warps with OpenCV's transparent border on its 1/32-pixel
   grid, the HSV round trip in 32-bit integers, the flips, the float32 ``0-1`` output the step takes
   (``channels_last``); the samples with a mixup, and only those, are rendered again with both layers
   by a second kernel and put in their places.

Both kernels are compiled ahead of time, once per machine, by a process of their own
(``compiled.py``, ``kernel_cache.py``, ``kernel_compile.py``), for exactly the kernels the run renders with
(:meth:`Renderer.prepare`); until they are ready, and wherever one fails, the same functions run uncompiled, in
chunks of bounded memory, and make the same images bit for bit. Sources larger than a budget (12-megapixel
photos) are decoded and resized a group at a time, so each original is freed once its tile exists. On the CPU
``tests/data/device/test_render.py`` compares the images with the CPU path's for the same draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import cv2
import numpy as np
import torch

from ..images import image_noted, note_bad_image
from .compiled import CompiledKernels
from .decode import jpeg_decoder
from .kernel_cache import kernels_for
from .kernels import H_TABLE, S_TABLE, coordinates, float_levels, render_rows, resize_tiles
from .plan import Layout, bgr_layout, chw_layout, padded_layouts, row_tables, tables_on, tile_table
from .recipes import Layer, Placement, Recipe, RecipeBatch, decode_on_host, pack_sources

DECODE_GROUP_BYTES = 2**30  # most decoded pixels alive at once: larger batches are decoded and resized in groups
_EAGER_PIXELS = 2**20  # eager fallback: output pixels rendered together (bounds its per-pixel temporaries)


class Renderer:
    """Renders :class:`RecipeBatch` es on one device (module docstring).

    Args:
        device: where to decode and render.
        compiled: run the compiled kernels once they are ready (default), or never (False: the uncompiled form).

    Examples:
        >>> renderer = Renderer("cpu", compiled=False)
        >>> tuple(renderer(warm_up_batch(48), to_float=False).shape)
        (3, 3, 48, 48)
    """

    def __init__(self, device: torch.device | str, compiled: bool = True) -> None:
        self.device = torch.device(device)
        self.decoder = jpeg_decoder(self.device)
        self.compiled = compiled
        self.kernels = CompiledKernels(self.device) if compiled else None
        self.calls: dict[str, tuple] | None = None  # a dict: each kernel's first inputs kept (the compile's examples)
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None  # the HSV tables and the float levels
        self._spans: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch: RecipeBatch, to_float: bool = True, channels_last: bool = True) -> torch.Tensor:
        """The batch's images: float32 0-1 (``channels_last`` or not) or uint8 0-255, ``[B, 3, H, W]``."""
        h, w = batch.recipes[0].size
        if any(recipe.size != (h, w) for recipe in batch.recipes):  # the loader's batches share one shape
            raise ValueError(f"a batch's images differ in size: {sorted({r.size for r in batch.recipes})}")
        tiles, layouts = self._tiles(batch)
        n, plan = len(batch), batch.plan
        mixed = np.array([i for i, recipe in enumerate(batch.recipes) if recipe.mix is not None], np.int64)
        arrays = [*row_tables(plan, layouts)]
        if len(mixed):
            arrays += [*row_tables(plan.rows(mixed), layouts), mixed]
        tables = tables_on(self.device, arrays)
        if len(mixed) == n:  # every sample mixes: its second kernel alone
            out = self._render(tiles, *tables[2:4], (h, w), 2, channels_last)[:n]
        else:
            out = self._render(tiles, *tables[:2], (h, w), 1, channels_last)[:n]
            if len(mixed):  # the samples with a mixup, and only those, with both layers
                out[tables[4]] = self._render(tiles, *tables[2:4], (h, w), 2, channels_last)[: len(mixed)]
        return out if to_float else out.mul_(255).round_().to(torch.uint8)

    def prepare(self, channels_last: bool = True, mixup: bool = True) -> None:
        """Have the kernels a run renders with made ready beside it: loaded where this machine compiled them before,
        else compiled in a process of their own (``compiled.py``); returns at once. ``mixup``: the hyp draws mixups
        (without, the mixups' kernel is never compiled). A kernel not prepared is asked for at its first use."""
        if self.kernels is not None:
            self.kernels.start(kernels_for(channels_last, mixup))

    # ---- the tiles ----
    def _tiles(self, batch: RecipeBatch) -> tuple[torch.Tensor, list[Layout]]:
        # every source in one flat buffer; resized (into squares) where a source is not its tile's size, a group at a
        # time: a group's decoded originals are freed once its tiles exist
        groups = _groups(batch)
        side, tiles = max(max(size) for size in batch.sizes), []
        for group in groups:
            flat, layouts, sizes = self._sources(batch, group)
            if len(groups) == 1 and all(size == batch.sizes[i] for size, i in zip(sizes, group)):
                return flat, _in_order(groups, [layouts])  # every source is its tile already
            (table,) = tables_on(self.device, [tile_table(layouts, sizes, [batch.sizes[i] for i in group])])
            tiles.append(self._resize(flat, table, side)[: len(group)].reshape(-1))
            del flat  # the group's originals
        flat = tiles[0] if len(tiles) == 1 else torch.cat(tiles)
        return flat, _in_order(groups, [padded_layouts(len(batch.sizes), side)])

    def _sources(self, batch: RecipeBatch, group: list[int]) -> tuple[torch.Tensor, list[Layout], list[tuple]]:
        # a group's sources decoded (JPEGs) or copied (pixels) to the device, in one flat buffer: (buffer, their
        # layouts in it, their (h, w) there)
        jpegs = [i for i in group if batch.jpeg[i] and not image_noted(batch.paths[i])]
        if jpegs and self.decoder is not None:
            decoded = self.decoder.decode([batch.source(i) for i in jpegs], [batch.paths[i] for i in jpegs])
        else:
            decoded = []
        images = dict(zip(jpegs, decoded))
        host = []  # sources decoded on the host: files the decoder refused, or with no decoder at all
        for i in group:
            image = images.get(i)
            if batch.jpeg[i] and (image is None or tuple(image.shape[1:]) != batch.originals[i]):
                images.pop(i, None)
                host.append(i)
                self._refused(batch.paths[i])
        parts, layouts, sizes, start = [], {}, {}, 0
        for i, image in images.items():
            flat, strides = _flat_in_memory_order(image)
            parts.append(flat)
            layouts[i], sizes[i] = chw_layout(start, strides), batch.originals[i]
            start += flat.numel()
        pixels = [i for i in group if not batch.jpeg[i]] + host
        if pixels:
            block = _pixel_block(batch, pixels)
            parts.append(block.to(self.device, non_blocking=True) if self.device.type == "cuda" else block)
            for i in pixels:  # the workers' tiles, and the host's
                layouts[i], sizes[i] = bgr_layout(start, batch.sizes[i][1]), batch.sizes[i]
                start += 3 * batch.sizes[i][0] * batch.sizes[i][1]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        return flat, [layouts[i] for i in group], [sizes[i] for i in group]

    def _refused(self, path: str) -> None:
        # said once for the job's processes on this host; the workers send the file as pixels from now on
        if self.decoder is not None:
            note_bad_image(path, f"{self.decoder.name} cannot decode it")

    # ---- the kernels ----
    def _resize(self, flat: torch.Tensor, table: torch.Tensor, side: int) -> torch.Tensor:
        span = self._coordinates(side)[0]

        def uncompiled() -> torch.Tensor:
            step = max(_EAGER_PIXELS // side**2, 1)
            return torch.cat([resize_tiles(flat, table[k : k + step], span) for k in range(0, len(table), step)])

        return self._run("resize", (flat, table, span), uncompiled)

    def _render(self, tiles, ints, floats, size, layers, channels_last) -> torch.Tensor:
        if self._tables is None:
            (hsv,) = tables_on(self.device, [np.stack((S_TABLE, H_TABLE))])
            self._tables = hsv, float_levels(self.device)
        ys, xs = self._coordinates(size[0])[1], self._coordinates(size[1])[1]
        inputs = (tiles, ints, floats, *self._tables, ys, xs)
        name = ("render_mixup" if layers == 2 else "render") + ("_cl" if channels_last else "")

        def uncompiled() -> torch.Tensor:
            step = max(_EAGER_PIXELS // (size[0] * size[1]), 1)
            parts = [
                render_rows(tiles, ints[k : k + step], floats[k : k + step], *inputs[3:], layers, True, channels_last)
                for k in range(0, len(ints), step)
            ]
            return parts[0] if len(parts) == 1 else torch.cat(parts)

        return self._run(name, inputs, uncompiled)

    def _run(self, name: str, inputs: tuple, uncompiled: Callable[[], torch.Tensor]) -> torch.Tensor:
        # the compiled kernel where it is ready, else its uncompiled form: the same numbers (kernels.py)
        if self.calls is not None:
            self.calls.setdefault(name, inputs)
        kernel = self.kernels.ready(name) if self.kernels is not None else None
        if kernel is not None:
            try:
                return kernel(*inputs)
            except Exception as exc:  # noqa: BLE001 (any failure of a compiled kernel: one line, then uncompiled)
                self.kernels.failed(name, exc)
        return uncompiled()

    def _coordinates(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        # made once per size on the device (no launch per batch)
        if size not in self._spans:
            self._spans[size] = coordinates(size, self.device)
        return self._spans[size]


_RENDERERS: dict[torch.device, Renderer] = {}


def renderer_for(device: torch.device | str, compiled: bool | None = None) -> Renderer:
    """The process's :class:`Renderer` for ``device`` (its compiled kernels and decoder made once), the one the
    prefetcher renders with; ``compiled`` (True or False) replaces it by one that runs compiled kernels, or not."""
    device = torch.device(device)
    if device not in _RENDERERS or compiled not in (None, _RENDERERS[device].compiled):
        _RENDERERS[device] = Renderer(device, True if compiled is None else compiled)
    return _RENDERERS[device]


def render_batch(
    batch: RecipeBatch,
    device: torch.device | str,
    to_float: bool = False,
    channels_last: bool = False,
    compiled: bool | None = None,
) -> torch.Tensor:
    """The batch's images on ``device``: uint8 RGB ``[B, 3, H, W]`` as ``YoloDataset`` makes them (to
    interpolation rounding), or with ``to_float`` float32 0-1, as the step takes them; ``compiled`` as
    :func:`renderer_for` takes it.

    Examples:
        >>> images = render_batch(warm_up_batch(32), "cpu", compiled=False)
        >>> images.dtype, tuple(images.shape)
        (torch.uint8, (3, 3, 32, 32))
    """
    return renderer_for(device, compiled)(batch, to_float=to_float, channels_last=channels_last)


def augment_place(choice: str, device: torch.device | str, quad: bool = False, cache: str | None = None) -> str:
    """Where train.py's training images are made: ``"device"`` or ``"workers"`` (``--augment-on``).

    Examples:
        >>> augment_place("auto", "cpu"), augment_place("device", "cpu")
        ('workers', 'device')
    """
    return augment_choice(choice, device, quad, cache)[0]


def augment_choice(
    choice: str, device: torch.device | str, quad: bool = False, cache: str | None = None
) -> tuple[str, str]:
    """Where the training images are made and the log line that says so, and why.

    ``"auto"`` is the device on CUDA, where the workers would keep the card waiting (a worker spends
    about 29 ms on a 640 px mosaic), if a JPEG decoder loads there (``decode.py``), unless the quad
    loader (its collate makes the batch) or an image cache (its decoded pixels would travel from the
    workers) says otherwise; the workers everywhere else (the CPU path, bit-identical).

    Args:
        choice: "auto", "workers" or "device".
        device: the training device.
        quad: the quad loader is on.
        cache: the image cache ("ram", "disk" or None).

    Returns:
        ("device" or "workers", the line: ``images made on the device cuda:0 (...)`` or ``images made on the
        loader workers (...)``).

    Examples:
        >>> augment_choice("auto", "cpu")[1]
        'images made on the loader workers (OpenCV): --augment-on auto on cpu (the device path is for CUDA)'
    """
    device = torch.device(device)
    option = f"--augment-on {choice}"
    if choice == "workers":
        return "workers", f"images made on the loader workers (OpenCV): {option}"
    reason = None
    if choice == "auto" and device.type != "cuda":
        reason = f"{option} on {device} (the device path is for CUDA)"
    elif choice == "auto" and quad:
        reason = f"{option} with --quad (its collate makes the batch in the workers)"
    elif choice == "auto" and cache:
        reason = f"{option} with --cache {cache} (the cached pixels are in the workers)"
    if reason is None:
        decoder = jpeg_decoder(device)
        if decoder is None and choice == "auto":
            reason = f"{option}: no JPEG decoder loads on {device} (neither TorchCodec nor torchvision decodes there)"
        elif decoder is None:  # asked for: the workers' pixels still reach the device render
            return (
                "device",
                f"images made on the device {device} ({option}): no JPEG decoder loads there, the "
                "workers decode them (OpenCV) and the device renders",
            )
        else:
            return (
                "device",
                f"images made on the device {device} ({option}): decoded by {decoder.name}, "
                "augmented by the fused render",
            )
    return "workers", f"images made on the loader workers (OpenCV): {reason}"


def _groups(batch: RecipeBatch) -> list[list[int]]:
    # sources in groups whose decoded JPEG pixels stay within DECODE_GROUP_BYTES; the workers' pixels in the last
    groups, current, size = [], [], 0
    for i in range(len(batch.sizes)):
        if not batch.jpeg[i]:
            continue
        need = 3 * batch.originals[i][0] * batch.originals[i][1]
        if current and size + need > DECODE_GROUP_BYTES:
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += need
    current += [i for i in range(len(batch.sizes)) if not batch.jpeg[i]]
    return [*groups, current] if current else groups


def _in_order(groups: Sequence[list[int]], layouts: Sequence[Sequence[Layout]]) -> list[Layout]:
    # the layouts by source index (each group's in its order; padded tiles numbered across the groups)
    order = [i for group in groups for i in group]
    flat = [layout for group_layouts in layouts for layout in group_layouts]
    by_source = [None] * len(order)
    for position, i in enumerate(order):
        by_source[i] = flat[position]
    return by_source


def _flat_in_memory_order(image: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    # a decoded [3, h, w] image as its memory, flat, and its strides (a CPU decoder gives HWC memory)
    if image.storage_offset() == 0 and image.untyped_storage().nbytes() == image.numel():
        order = sorted(range(3), key=lambda d: -image.stride(d))
        flat = image.permute(order)
        if flat.is_contiguous():
            return flat.view(-1), image.stride()
    image = image.contiguous()
    return image.view(-1), image.stride()


def _pixel_block(batch: RecipeBatch, sources: list[int]) -> torch.Tensor:
    # the pixels of these sources, back to back (BGR HWC tiles): a view of batch.data where the workers put them so
    spans = [batch.spans[i] for i in sources]
    if all(not batch.jpeg[i] for i in sources) and all(a[1] == b[0] for a, b in zip(spans, spans[1:])):
        return batch.data[spans[0][0] : spans[-1][1]]
    arrays = [batch.source(i) if not batch.jpeg[i] else _host_tile(batch, i) for i in sources]
    return torch.from_numpy(np.concatenate([np.ascontiguousarray(a).reshape(-1) for a in arrays]))


def _host_tile(batch: RecipeBatch, i: int) -> np.ndarray:
    source = batch.source(i)
    return decode_on_host(bytes(source.numpy()) if isinstance(source, torch.Tensor) else source, batch.sizes[i],
                          batch.paths[i])  # fmt: skip


def warm_up_batch(side: int = 56, width: int | None = None) -> RecipeBatch:
    """A small batch of every kind the kernels take (a resize, a mixup, HSV, flips), its output ``side`` high and
    ``width`` (default ``side``) wide, its tiles' long side ``side``: the examples the kernels are compiled from
    (``kernel_compile.py``)."""
    rng = np.random.default_rng(0)
    h, w = side, side * 2 // 3  # the tiles: portrait, as a mosaic's four would fit a canvas of 2 side
    jpegs = [cv2.imencode(".jpg", rng.integers(0, 256, (h // 2, w // 2, 3), dtype=np.uint8))[1].tobytes()] * 2
    pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    # a mosaic of three tiles around its centre on a 2w x 2h canvas (the fourth quadrant empty), and a letterbox
    placements = [
        Placement(k, (x, y, x + w, y + h), (1.0, -float(x), 1.0, -float(y)), (0, 0, w, h))
        for k, (x, y) in enumerate([(0, 0), (w, 0), (w, h)])
    ]
    mosaic = Layer(np.diag([2 * w / side, 2 * h / side, 1.0]), placements, (w, h))
    letterbox = Layer(np.eye(3), [Placement(1, (0, 0, w, h), (0.5, 0.25, 0.5, 0.25), (0, 0, w, h))])
    gains = np.array([1.01, 0.7, 1.3])
    size = (side, width or side)
    recipes = [
        Recipe(size, [mosaic], None, gains, False, True),
        Recipe(size, [mosaic, letterbox], 0.4, gains, True, False),
        Recipe(size, [letterbox], None, None, False, False),
    ]
    originals = [(h // 2, w // 2)] * 2 + [(h, w)]
    return pack_sources(recipes, [*jpegs, pixels], [(h, w)] * 3, originals, ["a", "b", "c"])


__all__ = [
    "DECODE_GROUP_BYTES",
    "Renderer",
    "augment_choice",
    "augment_place",
    "render_batch",
    "renderer_for",
    "warm_up_batch",
]
