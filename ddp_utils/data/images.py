"""Read, decode and resize single images (the image caches: ``image_cache.py``).

JPEGs are decoded by libjpeg-turbo through ``simplejpeg`` when it is installed, everything
else (and every file without it) by OpenCV; both give OpenCV's upright BGR pixels.

The image caches (``SharedImageCache``, ``DiskImageCache``, ``normalize_cache``) live in
:mod:`ddp_utils.data.image_cache`, which reads through this module.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import cv2
import numpy as np

try:
    import simplejpeg
except ImportError:  # optional: OpenCV decodes everything without it
    simplejpeg = None

from .headers import jpeg_header


def read_image(path: str | Path) -> np.ndarray:
    """Decode an image file to a BGR ``uint8`` array (EXIF orientation applied).

    JPEGs are decoded by libjpeg-turbo through ``simplejpeg`` when it is installed: the
    same pixels as ``cv2.imread``, in about 0.83-0.87 of its time (``benchmarks/readme_figures.py``).
    Anything it does not take (other formats, a damaged JPEG) goes to OpenCV, as do all files without it.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: OpenCV cannot decode it; the message names the file.
    """
    if simplejpeg is not None:
        try:
            with open(path, "rb") as f:
                data = b""
                if f.read(2) == b"\xff\xd8":  # the whole file only for a JPEG: OpenCV reads the rest itself
                    f.seek(0)
                    data = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"image not found: {path}") from None
        if data:
            img = _decode_jpeg(data)
            if img is not None:
                return img
    # imread, not imdecode of the bytes: imread keeps what it can of a cut-off JPEG, imdecode gives up
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"image not found: {path}")
        raise ValueError(f"cannot decode image {path}: corrupt or unsupported format")
    return img


# EXIF orientation -> how to turn the stored pixels upright (as cv2.imread does)
_UPRIGHT = {
    2: lambda im: cv2.flip(im, 1),
    3: lambda im: cv2.rotate(im, cv2.ROTATE_180),
    4: lambda im: cv2.flip(im, 0),
    5: lambda im: cv2.transpose(im),
    6: lambda im: cv2.rotate(im, cv2.ROTATE_90_CLOCKWISE),
    7: lambda im: cv2.rotate(cv2.transpose(im), cv2.ROTATE_180),
    8: lambda im: cv2.rotate(im, cv2.ROTATE_90_COUNTERCLOCKWISE),
}


def _decode_jpeg(data: bytes) -> np.ndarray | None:
    """A JPEG's BGR pixels, turned upright; None when simplejpeg cannot decode it."""
    try:
        img = simplejpeg.decode_jpeg(data, colorspace="BGR")
    except ValueError:  # damaged, or a kind libjpeg-turbo's simple API does not take
        return None
    header = jpeg_header(io.BytesIO(data))
    turn = _UPRIGHT.get(header[2]) if header is not None else None
    return turn(img) if turn is not None else img


def resized_shape(h0: int, w0: int, imgsz: int) -> tuple[int, int]:
    """The (h, w) an image of (h0, w0) gets when its long side is resized to ``imgsz``.

    Examples:
        >>> resized_shape(480, 640, 320)
        (240, 320)
        >>> resized_shape(300, 200, 640)
        (640, 427)
    """
    r = imgsz / max(h0, w0)
    if r == 1:
        return h0, w0
    return min(math.ceil(h0 * r), imgsz), min(math.ceil(w0 * r), imgsz)


def resize_long_side(img: np.ndarray, imgsz: int, augment: bool = False) -> np.ndarray:
    """Resize so the long side is ``imgsz``: INTER_AREA when shrinking for eval, else INTER_LINEAR.

    Examples:
        >>> resize_long_side(np.zeros((480, 640, 3), np.uint8), 320).shape
        (240, 320, 3)
    """
    h0, w0 = img.shape[:2]
    h, w = resized_shape(h0, w0, imgsz)
    if (h, w) == (h0, w0):
        return img
    shrink = imgsz < max(h0, w0)
    interp = cv2.INTER_AREA if shrink and not augment else cv2.INTER_LINEAR
    return cv2.resize(img, (w, h), interpolation=interp)


def load_image(
    path: str | Path, imgsz: int, augment: bool = False
) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """Read an image and resize its long side to ``imgsz``.

    Returns:
        (img BGR uint8 [h, w, 3], (h0, w0) as decoded, (h, w) after resizing).
    """
    img = read_image(path)
    h0, w0 = img.shape[:2]
    img = resize_long_side(img, imgsz, augment)
    return img, (h0, w0), img.shape[:2]


# The caches read images through this module, so they cannot be imported at its top: found on first use.
