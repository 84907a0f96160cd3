"""Read, decode and resize single images (the image caches: ``image_cache.py``).

JPEGs are decoded by libjpeg-turbo through ``simplejpeg`` when it is installed, everything
else (and every file without it) by OpenCV; both give OpenCV's upright BGR pixels. A file
decoded with what it holds (damaged), with a decoder's warning (libpng's, libtiff's...), or on
the CPU where the device would have decoded it, is named once in the log by :func:`note_bad_image`,
never by a decoder's raw text on stderr (OpenCV's codecs print theirs from C: ``decoder_text.py``
catches it).

The image caches (``SharedImageCache``, ``DiskImageCache``, ``normalize_cache``) live in
:mod:`ddp_utils.data.image_cache`, which reads through this module.
"""

from __future__ import annotations

import hashlib
import io
import math
import mmap
from pathlib import Path

import cv2
import numpy as np

try:
    import simplejpeg
except ImportError:  # optional: OpenCV decodes everything without it
    simplejpeg = None

from ..log import LOGGER
from .decoder_text import caught_stderr, decoder_summary
from .headers import jpeg_header


def read_image(path: str | Path) -> np.ndarray:
    """Decode an image file to a BGR ``uint8`` array (EXIF orientation applied).

    JPEGs are decoded by libjpeg-turbo through ``simplejpeg`` when it is installed: the
    same pixels as ``cv2.imread``, in about 0.83-0.87 of its time (``benchmarks/readme_figures.py``).
    A damaged JPEG (libjpeg's "Corrupt JPEG data", a cut-off file) decodes as far as it goes, the
    same pixels as ``cv2.imread`` gives, and :func:`note_bad_image` names the file once in the log
    where OpenCV printed libjpeg's own text at every decode. Anything simplejpeg does not take
    (other formats, a JPEG it cannot decode at all) goes to OpenCV, as do all files without it;
    what OpenCV's codecs print (libpng's "iCCP: known incorrect sRGB profile", libtiff's warnings)
    never reaches stderr: a file decoded with a warning is named once by :func:`note_bad_image`
    with the decoder's words, and a file OpenCV cannot decode raises with them.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: OpenCV cannot decode it; the message names the file and what the decoder said.
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
            img = decode_jpeg(data, str(path))
            if img is not None:
                return img
    # imread, not imdecode of the bytes: imread keeps what it can of a cut-off JPEG, imdecode gives up
    with caught_stderr() as decoder:
        img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    said = decoder_summary(decoder.text)
    if img is None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"image not found: {path}")
        raise ValueError(f"cannot decode image {path}: corrupt or unsupported format" + (f" ({said})" if said else ""))
    if said:
        note_bad_image(str(path), f"decoded with a warning ({said})")
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


def decode_jpeg(data: bytes, path: str) -> np.ndarray | None:
    """A JPEG's BGR pixels, turned upright, as ``cv2.imread`` gives them; None when simplejpeg cannot decode it.

    Decoded strictly first: any warning libjpeg-turbo gives fails the call. Where it warned, the
    file is decoded again leniently, which keeps what decodes (libjpeg's own recovery: OpenCV's
    pixels), and named once by :func:`note_bad_image` with libjpeg's message. A file already
    noted goes straight to the lenient decode. Nothing is printed on stderr.

    Args:
        data: the file's bytes.
        path: the file, for the log.

    Returns:
        BGR ``uint8`` [h, w, 3], or None (no simplejpeg, a kind it does not take, data it cannot
        decode at all): the caller decodes with OpenCV.
    """
    if simplejpeg is None:
        return None
    try:
        img = simplejpeg.decode_jpeg(data, colorspace="BGR", strict=not image_noted(path))
    except ValueError as exc:
        try:
            img = simplejpeg.decode_jpeg(data, colorspace="BGR", strict=False)
        except ValueError:  # not a warning: a kind libjpeg-turbo's simple API does not take, or beyond repair
            return None
        note_bad_image(path, f"damaged JPEG data (libjpeg: {exc})")
    header = jpeg_header(io.BytesIO(data))
    turn = _UPRIGHT.get(header[2]) if header is not None else None
    return turn(img) if turn is not None else img


# --- one line per file, for the whole job on this host's process tree -------------------------------------------
# A file is named once per process (_NOTED) and, through a table of path hashes in memory shared with every
# process forked from this one (the loader's workers, started anew each epoch or kept), once for the training
# process and all its workers: the first of them to meet it says it. A slot is one aligned 8-byte word and there
# is no lock: two processes meeting new files at the same instant may write one slot, and a file may then be said
# a second time by another process; never is a file left unsaid.
_NOTED: set[str] = set()
_SLOTS, _PROBES = 8192, 32
_SHARED = mmap.mmap(-1, 8 * _SLOTS)  # anonymous and shared: forked children see the parent's notes and theirs
_TABLE = np.frombuffer(_SHARED, np.uint64)


def _path_key(path: str) -> int:
    digest = hashlib.blake2b(path.encode(errors="surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1  # 0 marks an empty slot


def _shared_note(path: str, add: bool) -> bool:
    """Whether ``path`` is in the shared table (after adding it when ``add``); a full neighbourhood answers False."""
    key = _path_key(path)
    for probe in range(_PROBES):
        slot = (key + probe) % _SLOTS
        held = int(_TABLE[slot])
        if held == key:
            return True
        if held == 0:
            if add:
                _TABLE[slot] = key
            return False
    return False


def image_noted(path: str) -> bool:
    """Whether :func:`note_bad_image` named ``path`` in this process or any process of its forked family."""
    return path in _NOTED or _shared_note(path, add=False)


def mark_noted(path: str) -> None:
    """Count ``path`` as named, without a line: another stage (the label scan) said what is wrong with it.

    :func:`image_noted` then answers True for it here and in the processes forked from here (the loader's
    workers), so the decoders stay quiet about it as about a file :func:`note_bad_image` named.
    """
    path = str(path)
    _NOTED.add(path)
    _shared_note(path, add=True)


def note_bad_image(path: str, why: str) -> None:
    """Say once, in one warning naming the file, why it is decoded on the CPU (with what it holds, if damaged).

    The same line for a damaged JPEG (``read_image``), for a JPEG the device's batched decode
    does not take (``recipes.image_source``) and for one it failed on (the device decoder):
    ``"{path}: {why}; the CPU decoder's pixels are used"``. Idempotent per path: at most once per
    process, and once for a training process and the loader workers forked from it (they share a
    table of noted paths). :func:`image_noted` then answers True for the path.

    Args:
        path: the image file.
        why: what is wrong or unusual with it, e.g. ``"a progressive JPEG"``.
    """
    path = str(path)
    if path in _NOTED:
        return
    _NOTED.add(path)
    if not _shared_note(path, add=True):
        LOGGER.warning(f"{path}: {why}; the CPU decoder's pixels are used")


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
