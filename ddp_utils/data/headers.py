"""Image sizes, EXIF orientation and JPEG frame kinds read from file headers, without decoding the image.

Used by the label scan (is the file complete, what size is it), by the decoder (which
way to turn a JPEG) and by the device path (which JPEGs a batched hardware decode takes:
:func:`batch_decode_unfit`). Only JPEG and PNG are read here; other formats go to a decoder.
"""

from __future__ import annotations

import io
import os
from typing import NamedTuple

ORIENTATION_TAG = 0x0112
TRANSPOSED_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that swap width and height
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers: they carry the size
_JPEG_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # markers without a length field
_SOF_KINDS = {  # frame kinds other than baseline (0xC0) and extended sequential (0xC1), Huffman-coded
    0xC2: "a progressive JPEG",
    0xC3: "a lossless JPEG",
    **dict.fromkeys((0xC5, 0xC6, 0xC7, 0xCD, 0xCE, 0xCF), "a hierarchical JPEG"),
    **dict.fromkeys((0xC9, 0xCA, 0xCB), "an arithmetic-coded JPEG"),
}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_TRAILER = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # an empty IEND chunk and its CRC


def exif_orientation(app1: bytes) -> int:
    """The orientation tag of an APP1 Exif segment (1 when absent or unreadable)."""
    if not app1.startswith(b"Exif\x00\x00") or len(app1) < 16:
        return 1
    tiff = app1[6:]
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None:
        return 1
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return 1
    for i in range(int.from_bytes(tiff[ifd : ifd + 2], order)):
        entry = tiff[ifd + 2 + 12 * i : ifd + 14 + 12 * i]
        if len(entry) < 12:
            break
        if int.from_bytes(entry[:2], order) == ORIENTATION_TAG:
            return int.from_bytes(entry[8:10], order)
    return 1


class JpegFrame(NamedTuple):
    """What a JPEG's markers up to its frame header say about it.

    Attributes:
        width: pixels per row, as stored (before the EXIF turn).
        height: rows, as stored.
        orientation: the EXIF orientation (1 when absent).
        sof: the start-of-frame marker's code: 0xC0 baseline, 0xC1 extended sequential, 0xC2 progressive,
            0xC3 lossless, 0xC9-0xCB arithmetic-coded, 0xC5-0xC7 and 0xCD-0xCF hierarchical.
        precision: bits per sample (8, or 12 and 16 in the rarer kinds).
        components: 1 for grey, 3 for colour, 4 for CMYK or YCCK.
        rgb: three components stored as R, G, B rather than as YCbCr (no JFIF marker, and an Adobe marker
            saying so or, without one, the component ids ``R G B``: libjpeg's reading).
    """

    width: int
    height: int
    orientation: int
    sof: int
    precision: int
    components: int
    rgb: bool


def jpeg_frame(f: io.BufferedReader) -> JpegFrame | None:
    """A JPEG's :class:`JpegFrame` from the markers before the image data; None when they do not parse.

    ``f`` is the open file (or its bytes in a ``BytesIO``); it is read from byte 2, past the SOI marker.
    """
    f.seek(2)
    orientation, jfif, adobe_transform = 1, False, None
    while True:
        marker = f.read(2)
        if len(marker) < 2 or marker[0] != 0xFF:
            return None
        code = marker[1]
        if code == 0xFF:  # fill byte
            f.seek(-1, os.SEEK_CUR)
            continue
        if code in _JPEG_STANDALONE:
            continue
        if code in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        length = int.from_bytes(f.read(2), "big")
        if length < 2:
            return None
        if code in _JPEG_SOF:
            frame = f.read(length - 2)
            if len(frame) < 6:
                return None
            components = frame[5]
            ids = bytes(frame[6 + 3 * k] for k in range(components) if 6 + 3 * k < len(frame))
            # libjpeg's guess: a JFIF marker means YCbCr, else an Adobe marker's transform, else the ids
            rgb = components == 3 and not jfif and (adobe_transform == 0 or (adobe_transform is None and ids == b"RGB"))
            width, height = int.from_bytes(frame[3:5], "big"), int.from_bytes(frame[1:3], "big")
            return JpegFrame(width, height, orientation, code, frame[0], components, rgb)
        if code not in (0xE0, 0xE1, 0xEE):
            f.seek(length - 2, os.SEEK_CUR)
            continue
        segment = f.read(length - 2)  # JFIF, Exif, Adobe: which way up, which colours
        if code == 0xE0 and segment.startswith(b"JFIF\x00"):
            jfif = True
        elif code == 0xE1 and orientation == 1:
            orientation = exif_orientation(segment)
        elif code == 0xEE and segment.startswith(b"Adobe") and len(segment) >= 12:
            adobe_transform = segment[11]


def jpeg_header(f: io.BufferedReader) -> tuple[int, int, int] | None:
    """(width, height, orientation) from the markers before the image data; None when they do not parse."""
    frame = jpeg_frame(f)
    return None if frame is None else (frame.width, frame.height, frame.orientation)


def batch_decode_unfit(frame: JpegFrame) -> str | None:
    """Why a batched hardware JPEG decode (nvJPEG's) should not take this JPEG; None when it should.

    The batch takes 8-bit, Huffman-coded, sequential (baseline or extended) JPEGs of three YCbCr
    components. nvJPEG's documentation gives its hardware decoder baseline JPEGs only and decodes
    progressive ones in a hybrid path with the entropy decode on the host; lossless, arithmetic-coded,
    hierarchical and 12-bit ones it does not decode; grey, CMYK and RGB-coded ones are not the colour
    images the batch expects (the CPU decoder makes their colours as OpenCV does).

    Examples:
        >>> batch_decode_unfit(JpegFrame(640, 480, 1, 0xC0, 8, 3, False)) is None
        True
        >>> batch_decode_unfit(JpegFrame(640, 480, 1, 0xC2, 8, 3, False))
        'a progressive JPEG'
        >>> batch_decode_unfit(JpegFrame(640, 480, 1, 0xC0, 8, 4, False))
        'a CMYK (4-component) JPEG'
    """
    kind = _SOF_KINDS.get(frame.sof)
    if kind is not None:
        return kind
    if frame.precision != 8:
        return f"a {frame.precision}-bit JPEG"
    if frame.components == 1:
        return "a greyscale JPEG"
    if frame.components == 4:
        return "a CMYK (4-component) JPEG"
    if frame.components != 3:
        return f"a {frame.components}-component JPEG"
    return "an RGB-coded (not YCbCr) JPEG" if frame.rgb else None


def fast_image_size(im_file: str) -> tuple[int, int, int] | None:
    """Size and orientation of a complete JPEG or PNG from its header and last bytes, without decoding.

    A cut-off file lacks the JPEG end-of-image marker (or PNG's IEND trailer) at its end.
    None sends the file to the full decode: other formats, and files whose end holds other
    bytes (a complete image followed by junk is still a good image).
    """
    with open(im_file, "rb") as f:
        head = f.read(24)
        if head[:2] == b"\xff\xd8":
            f.seek(-2, os.SEEK_END)
            if f.read(2) != b"\xff\xd9":
                return None
            return jpeg_header(f)
        if head[:8] == _PNG_SIGNATURE and head[12:16] == b"IHDR":
            f.seek(-12, os.SEEK_END)
            if f.read(12) != _PNG_TRAILER:
                return None
            return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big"), 1
    return None
