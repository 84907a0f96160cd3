"""The run's pictures: results.png, labels.jpg and train_batch*.jpg.

Each function draws and returns the written path, on whichever process calls it: the caller
decides who draws (train.py: the main process), as with YOLOv5's. matplotlib is imported when a
plot is made, and drawn through its Agg canvas directly: the library never changes the
user's pyplot backend. A picture is encoded in memory, then written whole or not at all (a temp
file renamed into place): a full disk leaves no half image, and its OSError says why (ENOSPC).
"""

from __future__ import annotations

import colorsys
import csv
import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from ..files import mkstemp_shared

_RESULT_PANELS = (
    ("train/box_loss", "train/obj_loss", "train/cls_loss", "metrics/precision", "metrics/recall"),
    ("val/box_loss", "val/obj_loss", "val/cls_loss", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95"),
)


def class_color(cls: int) -> tuple[int, int, int]:
    """A bright RGB colour for a class id; neighbouring ids get well separated hues.

    Examples:
        >>> class_color(0), class_color(0) == class_color(1)
        ((255, 56, 56), False)
    """
    hue = (cls * 0.618033988749895) % 1.0  # golden-ratio steps spread the hues evenly
    r, g, b = colorsys.hsv_to_rgb(hue, 0.78, 1.0)
    return int(round(r * 255)), int(round(g * 255)), int(round(b * 255))


def write_image(path: str | Path, data: bytes) -> Path:
    """Write an encoded image to ``path`` whole or not at all: a temp file beside it, renamed into place.

    Raises:
        OSError: the write failed (a full disk: ENOSPC); nothing is left at ``path`` that was not there before.

    Examples:
        >>> import tempfile
        >>> write_image(Path(tempfile.mkdtemp()) / "x.jpg", b"bytes").read_bytes()
        b'bytes'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = mkstemp_shared(path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _save_figure(fig: Any, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".") or "png", dpi=200)
    return write_image(path, buffer.getvalue())


def _figure(rows: int, cols: int, size: tuple[float, float]) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, tight_layout=True)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols)


def plot_results(csv_path: str | Path, out: str | Path | None = None) -> Path:
    """Plot every loss and metric of results.csv against the epoch, to ``results.png`` beside it.

    Args:
        csv_path: a results.csv written by :class:`~ddp_utils.run.loggers.ResultsLogger`.
        out: the image to write; ``csv_path``'s directory / results.png when None.

    Returns:
        The image path.
    """
    csv_path = Path(csv_path)
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = [[cell.strip() for cell in row] for row in csv.reader(f) if row]
    if len(rows) < 2:
        raise ValueError(f"{csv_path} has no epochs to plot")
    header = rows[0]
    complete = [row for row in rows[1:] if len(row) == len(header)]  # skip a half-written last row
    if not complete:
        raise ValueError(f"{csv_path} has no complete epochs to plot")
    data = np.array(complete, dtype=np.float64)
    column = {name: i for i, name in enumerate(header)}
    if "epoch" not in column:
        raise ValueError(f"{csv_path} has no 'epoch' column: {header}")
    epochs = data[:, column["epoch"]]
    fig, axes = _figure(2, 5, (12, 6))
    for r, names in enumerate(_RESULT_PANELS):
        for c, name in enumerate(names):
            ax = axes[r][c]
            if name in column:
                ax.plot(epochs, data[:, column[name]], marker=".", linewidth=2, markersize=8)
            ax.set_title(name, fontsize=11)
            ax.set_xlabel("epoch")
    out = Path(out) if out is not None else csv_path.with_name("results.png")
    return _save_figure(fig, out)


def plot_labels(
    labels: Sequence[np.ndarray] | np.ndarray, names: Mapping[int, str] | Sequence[str] | None, save_dir: str | Path
) -> Path:
    """Draw the label distribution to ``save_dir/labels.jpg``.

    Four panels: instances per class, every box drawn at the image centre (shapes at a glance),
    box centres (x, y) and box sizes (width, height), all in normalised units.

    Args:
        labels: the dataset's labels, per image ``[n, 5]`` (class, xc, yc, w, h) or one stacked array.
        names: class names ({id: name} or a list), or None for ids only.
        save_dir: the run directory.

    Returns:
        The image path.
    """
    arrays = [np.asarray(x, dtype=np.float32).reshape(-1, 5) for x in ([labels] if _is_array(labels) else labels)]
    boxes = np.concatenate(arrays, 0) if arrays else np.zeros((0, 5), np.float32)
    names = dict(enumerate(names)) if isinstance(names, Sequence) and not isinstance(names, str) else (names or {})
    nc = max(int(boxes[:, 0].max()) + 1 if len(boxes) else 0, len(names))
    counts = np.bincount(boxes[:, 0].astype(int), minlength=nc) if len(boxes) else np.zeros(nc, int)

    fig, axes = _figure(2, 2, (8, 8))
    colors = [tuple(v / 255 for v in class_color(i)) for i in range(nc)]
    ax = axes[0][0]
    ax.bar(range(nc), counts, color=colors)
    ax.set_ylabel("instances")
    ax.set_title(f"{len(boxes)} boxes in {len(arrays)} images")
    if 0 < nc <= 30:
        ax.set_xticks(range(nc))
        ax.set_xticklabels([str(names.get(i, i)) for i in range(nc)], rotation=90, fontsize=8)

    sample = boxes[np.random.default_rng(0).permutation(len(boxes))[:1000]]  # a readable, stable subset
    canvas = np.full((500, 500, 3), 255, np.uint8)
    for cls, _, _, w, h in sample:
        x0, y0 = int((0.5 - w / 2) * 500), int((0.5 - h / 2) * 500)
        cv2.rectangle(canvas, (x0, y0), (int(x0 + w * 500), int(y0 + h * 500)), class_color(int(cls)), 1)
    axes[0][1].imshow(canvas)
    axes[0][1].axis("off")

    stride = max(len(boxes) // 50_000, 1)  # scatter plots of millions of points are slow and no clearer
    for ax, (i, j), (xl, yl) in zip((axes[1][0], axes[1][1]), ((1, 2), (3, 4)), (("x", "y"), ("width", "height"))):
        ax.scatter(boxes[::stride, i], boxes[::stride, j], s=4, alpha=0.5, color="tab:blue", linewidths=0)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
    return _save_figure(fig, Path(save_dir) / "labels.jpg")


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.ndim == 2


def _numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def plot_images(
    imgs: torch.Tensor | np.ndarray,
    targets: torch.Tensor | np.ndarray,
    fname: str | Path,
    paths: Sequence[str] | None = None,
    names: Mapping[int, str] | Sequence[str] | None = None,
    max_images: int = 16,
    max_size: int = 1920,
) -> Path:
    """Tile a batch into one image with its boxes and class names drawn (``train_batch0.jpg``).

    Args:
        imgs: the loader's images, uint8 ``[B, 3, H, W]`` RGB (floats in 0-1 are scaled).
        targets: ``[n, 6]`` (image index in batch, class, xc, yc, w, h) normalised to H, W;
            a 7th column, when present, is a confidence and boxes below 0.25 are skipped.
        fname: the image to write.
        paths: the images' file names, written on their tiles.
        names: class names ({id: name} or a list); ids when None.
        max_images: tiles at most (the first images of the batch).
        max_size: the longest side of the mosaic; larger mosaics are scaled down.

    Returns:
        The image path.
    """
    images = _numpy(imgs)
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"plot_images: imgs has shape {images.shape}, expected [B, 3, H, W]")
    if images.dtype != np.uint8:
        scale = 255.0 if images.max(initial=0) <= 1.0 else 1.0
        images = np.clip(images * scale, 0, 255).astype(np.uint8)
    labels = _numpy(targets).reshape(-1, _numpy(targets).shape[-1] if np.size(targets) else 6)
    if isinstance(names, Sequence) and not isinstance(names, str):
        names = dict(enumerate(names))

    bs = min(len(images), max_images)
    _, _, h, w = images.shape
    grid = math.ceil(math.sqrt(bs))
    scale = min(1.0, max_size / (grid * max(h, w)))
    th, tw = math.ceil(h * scale), math.ceil(w * scale)
    mosaic = np.full((grid * th, grid * tw, 3), 255, np.uint8)
    thickness = max(2, round(0.003 * (th + tw) / 2))
    font = max(0.35, 0.0012 * (th + tw) / 2)
    for i in range(bs):
        x0, y0 = (i % grid) * tw, (i // grid) * th
        tile = images[i].transpose(1, 2, 0)
        if tile.shape[2] == 1:
            tile = np.repeat(tile, 3, axis=2)
        if scale < 1.0:
            tile = cv2.resize(tile, (tw, th), interpolation=cv2.INTER_AREA)
        mosaic[y0 : y0 + th, x0 : x0 + tw] = tile
        cv2.rectangle(mosaic, (x0, y0), (x0 + tw - 1, y0 + th - 1), (255, 255, 255), thickness)
        if paths is not None and i < len(paths):
            cv2.putText(mosaic, Path(paths[i]).name[:40], (x0 + 5, y0 + 15), 0, font, (220, 220, 220), 1, cv2.LINE_AA)
        rows = labels[labels[:, 0] == i] if len(labels) else ()
        _draw_labels(mosaic, rows, (x0, y0), (tw, th), names, thickness, font)
    fname = Path(fname)
    encoded, data = cv2.imencode(fname.suffix or ".jpg", cv2.cvtColor(mosaic, cv2.COLOR_RGB2BGR))
    if not encoded:
        raise ValueError(f"plot_images: OpenCV cannot encode {fname.suffix!r} images ({fname})")
    return write_image(fname, data.tobytes())


def _draw_labels(
    mosaic: np.ndarray,
    rows: Any,
    origin: tuple[int, int],
    size: tuple[int, int],
    names: Mapping[int, str] | None,
    thickness: int,
    font: float,
) -> None:
    """Draw one tile's label rows (a box and its class name, and confidence if any) onto the mosaic, in place."""
    x0, y0 = origin
    tw, th = size
    for row in rows:
        if len(row) > 6 and row[6] < 0.25:
            continue
        cls = int(row[1])
        xc, yc, bw, bh = row[2] * tw, row[3] * th, row[4] * tw, row[5] * th
        p1 = (int(x0 + xc - bw / 2), int(y0 + yc - bh / 2))
        p2 = (int(x0 + xc + bw / 2), int(y0 + yc + bh / 2))
        color = class_color(cls)
        cv2.rectangle(mosaic, p1, p2, color, thickness)
        text = str(names.get(cls, cls)) if names else str(cls)
        if len(row) > 6:
            text += f" {row[6]:.2f}"
        cv2.putText(mosaic, text, (p1[0], max(p1[1] - 3, y0 + 10)), 0, font, color, 1, cv2.LINE_AA)
