"""A decoder's own words caught around the call: C code's stderr, PIL's Python warnings.

The file maker here (``write_decoder_kinds``) is shared with the image, label and loader tests: real PNG,
TIFF and WebP files, damaged as a tool, a disk or a download damages them, whose decoders speak on stderr.
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import threading
import warnings
import zlib
from pathlib import Path

import cv2
import pytest
from PIL import Image, TiffImagePlugin

from ddp_utils.data.decoder_text import caught_stderr, caught_warnings, decoder_summary
from tests.data.test_headers import smooth_bgr

# kind -> (file name, what its decoders say: OpenCV's words at the decode, PIL's at the label scan)
DECODER_KINDS = {
    "iccp": ("iccp.png", "libpng warning: iCCP: too short", None),  # a colour profile libpng rejects
    "text_crc": ("text_crc.png", "libpng warning: tEXt: CRC error", None),  # a comment chunk with a bad CRC
    "tiff_tag": ("tiff_tag.tif", "Unknown field with tag 65000 (0xfde8) encountered", None),  # a private tag
    "tiff_exif": ("tiff_exif.tif", 'IO error during reading of "Tag 65000"', "Truncated File Read"),  # past EOF
}
# kind -> (file name, what OpenCV says when it cannot decode it; "" for nothing)
UNDECODABLE = {
    "no_iend": ("no_iend.png", "libpng error: Read Error"),  # cut just before its end chunk: PIL still reads it
    "cut_webp": ("cut_webp.webp", ""),  # libwebp says nothing
    "cut_tiff": ("cut_tiff.tif", "TIFF_Error TIFFFillStrip: Read error on strip 0"),
}


def _chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc & 0xFFFFFFFF)


def _tiff_with_tag(path: Path, img, value: str, tag_past_the_end: bool = False) -> bytes:
    """A TIFF (Pillow's) holding private tag 65000; its value's offset moved past the file's end if asked."""
    info = TiffImagePlugin.ImageFileDirectory_v2()
    info[65000] = value
    Image.fromarray(img[:, :, ::-1].copy()).save(path, tiffinfo=info)
    data = bytearray(path.read_bytes())
    (entries,) = struct.unpack("<H", data[8:10])  # Pillow writes the first directory at offset 8
    for k in range(entries if tag_past_the_end else 0):
        entry = 10 + 12 * k
        if struct.unpack("<H", data[entry : entry + 2])[0] == 65000:
            data[entry + 8 : entry + 12] = struct.pack("<I", len(data) - 5)
    return bytes(data)


def write_decoder_kinds(directory: Path, size: tuple[int, int] = (48, 64)) -> dict[str, Path]:
    """One file of each kind in :data:`DECODER_KINDS` and :data:`UNDECODABLE`, and sound ones ("plain_png",
    "plain_tif", "plain_webp", "plain_bmp") of the same pixels."""
    directory.mkdir(parents=True, exist_ok=True)
    img = smooth_bgr(*size)
    paths = {f"plain_{ext}": directory / f"plain.{ext}" for ext in ("png", "tif", "webp", "bmp")}
    for path in paths.values():
        cv2.imwrite(str(path), img)
    png, header_end = paths["plain_png"].read_bytes(), 8 + 25  # the signature and IHDR
    tiff = _tiff_with_tag(directory / "tag.tif", img, "x" * 40)
    made = {
        "iccp": png[:header_end] + _chunk(b"iCCP", b"sRGB\x00\x00" + zlib.compress(bytes(200))) + png[header_end:],
        "text_crc": png[:header_end] + _chunk(b"tEXt", b"Comment\x00made by a tool", crc=1) + png[header_end:],
        "tiff_tag": tiff,
        "tiff_exif": _tiff_with_tag(directory / "tag.tif", img, "a value stored past the end", True),
        "no_iend": png[:-12],
        "cut_webp": paths["plain_webp"].read_bytes()[:60],
        "cut_tiff": tiff[: len(tiff) * 2 // 3],
    }
    (directory / "tag.tif").unlink()
    for kind, data in made.items():
        paths[kind] = directory / {**DECODER_KINDS, **UNDECODABLE}[kind][0]
        paths[kind].write_bytes(data)
    return paths


def test_the_files_make_their_decoders_speak_as_the_table_says(tmp_path, capfd):
    # the premise of every test that uses them: OpenCV, left alone, prints these words raw
    paths = write_decoder_kinds(tmp_path)
    capfd.readouterr()
    for kind, (_, words, _) in DECODER_KINDS.items():
        assert cv2.imread(str(paths[kind])) is not None, kind
        assert words in capfd.readouterr().err, kind
    for kind, (_, words) in UNDECODABLE.items():
        assert cv2.imread(str(paths[kind])) is None, kind
        assert words in capfd.readouterr().err, kind
    for kind in ("plain_png", "plain_tif", "plain_webp", "plain_bmp"):
        assert cv2.imread(str(paths[kind])) is not None and capfd.readouterr().err == "", kind


def test_caught_stderr_takes_what_c_code_writes_and_puts_stderr_back(capfd):
    capfd.readouterr()
    with caught_stderr() as caught:
        os.write(2, b"libpng warning: iCCP: too short\n")
        os.write(2, b"libpng warning: iCCP: too short\n")
    os.write(2, b"after the window\n")
    with caught_stderr() as quiet:
        pass
    assert caught.text == "libpng warning: iCCP: too short\n" * 2 and quiet.text == ""
    assert capfd.readouterr().err == "after the window\n"


def test_caught_stderr_puts_stderr_back_when_the_call_raises(capfd):
    capfd.readouterr()
    with pytest.raises(RuntimeError), caught_stderr() as caught:
        os.write(2, b"said before the error\n")
        raise RuntimeError("decoder failed")
    os.write(2, b"after\n")
    assert caught.text == "said before the error\n" and capfd.readouterr().err == "after\n"


@pytest.mark.timeout(60)
def test_threads_decoding_at_once_each_catch_their_own_words_and_stderr_ends_where_it_was(capfd):
    capfd.readouterr()
    texts: dict[int, list[str]] = {}

    def decode(thread: int) -> None:
        texts[thread] = []
        for i in range(200):
            with caught_stderr() as caught:
                os.write(2, f"thread {thread} decode {i}\n".encode())
            texts[thread].append(caught.text)

    threads = [threading.Thread(target=decode, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
    for thread, caught in texts.items():
        assert caught == [f"thread {thread} decode {i}\n" for i in range(200)], thread


def _decode_in_child(results) -> None:
    with caught_stderr() as caught:
        os.write(2, b"the child's decoder\n")
    os.write(2, b"the child's own line\n")
    results.put(caught.text)


@pytest.mark.timeout(60)
def test_a_forked_worker_catches_in_a_scratch_file_of_its_own(capfd):
    with caught_stderr():  # the parent's scratch file exists before the fork
        os.write(2, b"the parent's decoder\n")
    capfd.readouterr()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_decode_in_child, args=(results,))
    child.start()
    text = results.get(timeout=30)
    child.join(30)
    with caught_stderr() as parent:
        os.write(2, b"the parent again\n")
    assert child.exitcode == 0 and text == "the child's decoder\n" and parent.text == "the parent again\n"
    assert capfd.readouterr().err == "the child's own line\n"


def test_caught_warnings_keeps_the_sources_warnings_each_time_and_shows_the_others(tmp_path):
    source = tmp_path / "decoder"
    source.mkdir()
    inside = str(source / "plugin.py")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")  # as Python shows warnings: a place's first only
        for _ in range(2):
            with caught_warnings(str(source)) as caught:
                warnings.warn_explicit("Truncated File Read", UserWarning, inside, 982)
                warnings.warn_explicit("the caller's own", UserWarning, str(tmp_path / "caller.py"), 7)
            assert caught.text == "Truncated File Read"  # the second file's too, not only the first's
    assert [str(w.message) for w in shown] == ["the caller's own"] * 2


def test_decoder_summary_is_one_line_without_opencvs_preamble():
    text = (
        "[ WARN:0@0.012] global grfmt_tiff.cpp:123 TIFF_Warning TIFFReadDirectory: Unknown field\n"
        "[ WARN:0@0.012] global grfmt_tiff.cpp:123 TIFF_Warning TIFFReadDirectory: Unknown field\n"
        "libpng error: Read Error\n\n"
    )
    assert decoder_summary(text) == "TIFF_Warning TIFFReadDirectory: Unknown field; libpng error: Read Error"
    assert decoder_summary("") == "" and len(decoder_summary("x" * 1000)) == 300
