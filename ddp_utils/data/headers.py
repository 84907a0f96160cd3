"""Image sizes and EXIF orientation read from file headers, without decoding the image.

Used by the label scan (is the file complete, what size is it) and by the decoder (which
way to turn a JPEG). Only JPEG and PNG are read here; other formats go to a decoder.
"""

from __future__ import annotations

import io
import os

ORIENTATION_TAG = 0x0112
TRANSPOSED_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that swap width and height
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers: they carry the size
_JPEG_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # markers without a length field
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


def jpeg_header(f: io.BufferedReader) -> tuple[int, int, int] | None:
    """(width, height, orientation) from the markers before the image data; None when they do not parse."""
    f.seek(2)
    orientation = 1
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
            frame = f.read(5)
            if len(frame) < 5:
                return None
            return int.from_bytes(frame[3:5], "big"), int.from_bytes(frame[1:3], "big"), orientation
        if code == 0xE1 and orientation == 1:
            orientation = exif_orientation(f.read(length - 2))
        else:
            f.seek(length - 2, os.SEEK_CUR)


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
