"""JPEG headers: size, EXIF orientation, and the frame kind that decides which decoder takes a file.

The file makers here (``write_jpeg_kinds``, ``overwritten_jpeg``) are shared with the image and
recipe tests: real files, written by OpenCV and Pillow, damaged as a disk or a download damages them.
"""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg

from ddp_utils.data.headers import JpegFrame, batch_decode_unfit, fast_image_size, jpeg_frame, jpeg_header

EXTRANEOUS = "extraneous bytes before marker 0xd9"


def smooth_bgr(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A photo-like BGR image: smooth colour, as real JPEGs mostly are."""
    noise = np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8)
    return cv2.GaussianBlur(noise, (0, 0), 3)


def overwritten_jpeg(data: bytes, seed: int = 0) -> tuple[bytes, str]:
    """``data`` with 127 bytes overwritten mid-file so that libjpeg warns of extraneous bytes before the end.

    Returns:
        The damaged bytes and libjpeg's message (``Corrupt JPEG data: N extraneous bytes before marker 0xd9``).
    """
    rng = np.random.default_rng(seed)
    for _ in range(500):
        start = int(rng.integers(len(data) // 4, len(data) - 140))
        damaged = bytearray(data)
        damaged[start : start + 127] = rng.integers(0, 256, 127, np.uint8).tobytes()
        try:
            simplejpeg.decode_jpeg(bytes(damaged))
        except ValueError as exc:
            if EXTRANEOUS in str(exc):
                return bytes(damaged), str(exc)
    raise AssertionError("no overwrite gave libjpeg's extraneous-bytes warning")


def write_jpeg_kinds(directory: Path, size: tuple[int, int] = (48, 64)) -> dict[str, Path]:
    """One JPEG of each kind the decoders tell apart, written as encoders write them.

    baseline (OpenCV's default), progressive (``cv2.IMWRITE_JPEG_PROGRESSIVE``), grey, CMYK and
    RGB-coded (Pillow), EXIF-rotated (Pillow, orientation 6), overwritten (127 bytes replaced mid-file)
    and truncated (its last third cut off).
    """
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    img = smooth_bgr(*size)
    paths = {name: directory / f"{name}.jpg" for name in KINDS}
    cv2.imwrite(str(paths["baseline"]), img)
    cv2.imwrite(str(paths["progressive"]), img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    cv2.imwrite(str(paths["grey"]), cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
    rgb = Image.fromarray(np.ascontiguousarray(img[:, :, ::-1]))
    rgb.convert("CMYK").save(paths["cmyk"], "JPEG")
    rgb.save(paths["rgb_coded"], "JPEG", keep_rgb=True)
    exif = Image.Exif()
    exif[0x0112] = 6
    rgb.save(paths["rotated"], "JPEG", exif=exif.tobytes())
    data = paths["baseline"].read_bytes()
    paths["overwritten"].write_bytes(overwritten_jpeg(data)[0])
    paths["truncated"].write_bytes(data[: len(data) * 2 // 3])
    return paths


KINDS = ("baseline", "progressive", "grey", "cmyk", "rgb_coded", "rotated", "overwritten", "truncated")
# kind -> (SOF marker, components, RGB-coded, orientation, why a batched device decode does not take it)
FRAMES = {
    "baseline": (0xC0, 3, False, 1, None),
    "progressive": (0xC2, 3, False, 1, "a progressive JPEG"),
    "grey": (0xC0, 1, False, 1, "a greyscale JPEG"),
    "cmyk": (0xC0, 4, False, 1, "a CMYK (4-component) JPEG"),
    "rgb_coded": (0xC0, 3, True, 1, "an RGB-coded (not YCbCr) JPEG"),
    "rotated": (0xC0, 3, False, 6, None),
    "overwritten": (0xC0, 3, False, 1, None),  # the header is intact: only a decode finds the damage
    "truncated": (0xC0, 3, False, 1, None),
}


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, Path]:
    return write_jpeg_kinds(tmp_path_factory.mktemp("kinds"))


@pytest.mark.parametrize("kind", KINDS)
def test_jpeg_frame_tells_the_kind_components_and_colours(kinds, kind):
    sof, components, rgb, orientation, unfit = FRAMES[kind]
    with open(kinds[kind], "rb") as f:
        frame = jpeg_frame(f)
        assert jpeg_header(f) == (64, 48, orientation)  # the size as stored, before the EXIF turn
    assert frame == JpegFrame(64, 48, orientation, sof, 8, components, rgb)
    assert batch_decode_unfit(frame) == unfit


def test_the_header_agrees_with_libjpeg_on_every_decodable_kind(kinds):
    # simplejpeg reads the header with libjpeg-turbo: its colour space is ours
    spaces = {"baseline": "YCbCr", "progressive": "YCbCr", "grey": "Gray", "cmyk": "CMYK", "rgb_coded": "RGB"}
    for kind, space in spaces.items():
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(kinds[kind].read_bytes())
        assert (h, w, colorspace) == (48, 64, space), kind


@pytest.mark.parametrize(
    ("sof", "precision", "why"),
    [
        (0xC1, 8, None),  # extended sequential, Huffman: the hardware decoder takes it
        (0xC3, 8, "a lossless JPEG"),
        (0xC9, 8, "an arithmetic-coded JPEG"),
        (0xCA, 8, "an arithmetic-coded JPEG"),
        (0xC5, 8, "a hierarchical JPEG"),
        (0xC1, 12, "a 12-bit JPEG"),
    ],
)
def test_other_frame_kinds_are_told_apart(kinds, sof, precision, why):
    data = bytearray(kinds["baseline"].read_bytes())
    at = data.index(b"\xff\xc0")
    data[at + 1], data[at + 4] = sof, precision  # the marker, then the precision after its length
    frame = jpeg_frame(io.BytesIO(bytes(data)))
    assert (frame.sof, frame.precision) == (sof, precision)
    assert batch_decode_unfit(frame) == why


def test_headers_that_do_not_parse_give_none(kinds):
    data = kinds["baseline"].read_bytes()
    at = data.index(b"\xff\xc0")
    for broken in (data[: at + 6], b"\xff\xd8\xff\xda\x00\x02", b"\xff\xd8garbage", b"\xff\xd8\xff\xe0\x00\x01"):
        assert jpeg_frame(io.BytesIO(broken)) is None
        assert jpeg_header(io.BytesIO(broken)) is None


def test_fast_image_size_sends_cut_off_files_to_the_decoder(kinds):
    assert fast_image_size(str(kinds["baseline"])) == (64, 48, 1)
    assert fast_image_size(str(kinds["rotated"])) == (64, 48, 6)
    assert fast_image_size(str(kinds["truncated"])) is None  # no end-of-image marker: the label scan decodes it
