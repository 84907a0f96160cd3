"""Keep the resized images of a dataset: in RAM, one copy per node, or on disk as ``.npy``.

``cache="ram"`` keeps ONE copy of the resized images per node, whatever the number of
local processes: the node's first process decodes every image into one flat ``uint8``
buffer file (under /dev/shm, or a temporary directory on local disk when /dev/shm is too
small), and every process, DataLoader workers included, maps that file read-only. JPEGs
are decoded straight into that buffer (no private copy stays with the builder). The
index (offset and shape of each image) follows from the image sizes, so it needs no file
of its own. ``cache="disk"`` writes one ``.npy`` beside each image, reused while the image
is unchanged.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import mmap
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from ..distributed import launch_key
from ..host import disk_free, mem_available
from ..log import LOGGER
from .headers import jpeg_header
from .images import read_image, resize_long_side, resized_shape, simplejpeg

CACHE_MODES = ("ram", "disk")
_SHM_DIR = Path("/dev/shm")
_BUFFER_PREFIX = "ddp_utils_images_"
_HEADROOM = 1.1  # keep this much more free than the cache needs, for everything else


def normalize_cache(cache: bool | str | None) -> str | None:
    """``True`` and ``"ram"`` mean RAM, ``"disk"`` disk, ``False``/``None``/``""`` no cache.

    Examples:
        >>> normalize_cache(True), normalize_cache("disk"), normalize_cache(False)
        ('ram', 'disk', None)
    """
    if cache is True:
        return "ram"
    if not cache:
        return None
    mode = str(cache).lower()
    if mode not in CACHE_MODES:
        raise ValueError(f"cache={cache!r}: use 'ram' (or True), 'disk', or False")
    return mode


def _job_id() -> str:
    # The same on a node's processes, different for two jobs sharing the node.
    return launch_key()


def _decode_all(count: int, work, threads: int) -> None:
    with ThreadPoolExecutor(max_workers=max(threads, 1)) as pool:
        # list() re-raises the first failure, naming the file through read_image
        list(pool.map(work, range(count)))


@contextlib.contextmanager
def _scratch(nbytes: int):
    """Anonymous memory of its own mapping, handed back to the kernel on exit (not to malloc's pools)."""
    mm = mmap.mmap(-1, max(nbytes, 1))
    try:
        yield mm
    finally:
        with contextlib.suppress(BufferError):  # a view still held: unmapped when it goes
            mm.close()


def _decode_into(path: str, slot: np.ndarray, imgsz: int, augment: bool) -> bool:
    """Decode a JPEG and resize it straight into ``slot`` (its part of the cache buffer).

    Why: the builder decodes in one thread per core, and glibc's malloc gives each thread an
    arena that keeps its freed image-sized blocks resident, ~2.5 MB a thread: on a 16-core
    host a second copy of a small cache, private to the builder. Here the file's bytes and
    the full-size pixels live in anonymous mappings that return to the kernel when the image
    is done, and the pixels land in the shared buffer itself.

    Returns:
        False when this path does not take the file (no simplejpeg, not a JPEG, an EXIF turn,
        a JPEG only OpenCV decodes): the caller decodes it the usual way.
    """
    if simplejpeg is None:
        return False
    with open(path, "rb") as f:
        header = jpeg_header(f) if f.read(2) == b"\xff\xd8" else None
        if header is None or header[2] != 1:
            return False
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        with _scratch(size) as raw:
            f.readinto(raw)
            return _decode_scratch(path, raw, slot, imgsz, augment)


def _decode_scratch(path: str, raw: mmap.mmap, slot: np.ndarray, imgsz: int, augment: bool) -> bool:
    try:
        h0, w0 = simplejpeg.decode_jpeg_header(raw)[:2]
    except ValueError:
        return False
    h, w = slot.shape[:2]
    if resized_shape(h0, w0, imgsz) != (h, w):
        raise ValueError(f"{path}: decoded to {resized_shape(h0, w0, imgsz)}, expected {(h, w)} from its size")
    try:
        if (h0, w0) == (h, w):
            simplejpeg.decode_jpeg(raw, colorspace="BGR", buffer=slot)
            return True
        with _scratch(h0 * w0 * 3) as full:
            img = np.frombuffer(full, np.uint8, h0 * w0 * 3).reshape(h0, w0, 3)
            simplejpeg.decode_jpeg(raw, colorspace="BGR", buffer=img)
            interp = cv2.INTER_AREA if imgsz < max(h0, w0) and not augment else cv2.INTER_LINEAR
            out = cv2.resize(img, (w, h), dst=slot, interpolation=interp)
            if not np.shares_memory(out, slot):
                slot[...] = out
            del img, out
        return True
    except ValueError:  # damaged: OpenCV keeps what it can of it
        return False


class SharedImageCache:
    """Resized images in one flat ``uint8`` buffer file, mapped read-only by every process.

    The object pickles as the path and the index only (``np.memmap`` would pickle its
    data), and each process maps the file on first use, so DataLoader workers started with
    fork or spawn all share the node's one copy through the page cache.
    """

    def __init__(self, path: str | Path, shapes_hw: np.ndarray) -> None:
        self.path = str(path)
        self.shapes = np.asarray(shapes_hw, dtype=np.int64).reshape(-1, 2)
        sizes = self.shapes[:, 0] * self.shapes[:, 1] * 3
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._buffer: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return len(self.shapes)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_buffer"] = None
        return state

    def _map(self) -> np.ndarray:
        if self._buffer is None:
            # a plain ndarray over the map: np.memmap's subclass hooks run on every view taken
            self._buffer = np.memmap(self.path, dtype=np.uint8, mode="r").view(np.ndarray)
            if self._buffer.size != self.nbytes:
                raise RuntimeError(f"image cache {self.path}: {self._buffer.size} bytes, expected {self.nbytes}")
        return self._buffer

    def __getitem__(self, i: int) -> np.ndarray:
        """The cached image ``i`` as a read-only BGR view [h, w, 3] (copy before writing)."""
        h, w = self.shapes[i].tolist()
        start = int(self.offsets[i])
        return self._map()[start : start + h * w * 3].reshape(h, w, 3)

    @classmethod
    def build(
        cls,
        im_files: Sequence[str],
        shapes_hw: np.ndarray,
        imgsz: int,
        augment: bool = False,
        leader: bool = True,
        prefix: str = "",
        threads: int | None = None,
    ) -> SharedImageCache | None:
        """Create (leader) or find (others) the node's buffer; None when it does not fit.

        The leader, the node's first process, runs this first (inside
        ``torch_distributed_zero_first``); the others then find the finished file by name.

        Args:
            im_files: image paths, in dataset order.
            shapes_hw: [N, 2] resized (h, w) of each image (see :func:`resized_shape`).
            imgsz: long side, part of the buffer's name.
            augment: picks the resize interpolation, part of the name.
            leader: True on the node's first process (and a single process).
            prefix: log prefix.
            threads: decoding threads; default the CPU count.
        """
        cache = cls("", shapes_hw)
        key = "\n".join([*map(str, im_files), f"imgsz={imgsz}", f"augment={augment}", _job_id()])
        stem = f"{_BUFFER_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:20]}"
        directories = [_SHM_DIR, Path(tempfile.gettempdir())]
        if not leader:
            found = [p for d in directories for p in d.glob(f"{stem}.*.bin")]
            if found:  # the newest: an older one can only be a dead job's that reused this port
                cache.path = str(max(found, key=lambda p: p.stat().st_mtime_ns))
                return cache
            LOGGER.warning(f"{prefix}no shared image cache from the node's first process; caching nothing")
            return None
        _remove_orphans(directories, prefix)
        need = cache.nbytes
        if not _fits_in_ram(need, prefix):
            return None
        directory = _pick_directory(need, prefix)
        if directory is None:
            return None
        # the creator's pid in the name lets a later job remove the buffer of one that was killed
        path = directory / f"{stem}.{os.getpid()}.bin"
        tmp = path.with_suffix(".tmp")
        try:
            _fill_buffer(tmp, cache, im_files, imgsz, augment, threads or os.cpu_count() or 1)
            os.replace(tmp, path)  # the name appears only once the buffer is complete
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _unlink_at_exit(path)
        cache.path = str(path)
        LOGGER.info(f"{prefix}cached {len(im_files)} images in RAM ({need / 2**30:.2f} GiB, one copy per node)")
        return cache


def _fill_buffer(
    tmp: Path, cache: SharedImageCache, im_files: Sequence[str], imgsz: int, augment: bool, threads: int
) -> None:
    # The writable mapping lives only in this frame: unmapped on return, so the creator
    # then maps the file read-only like everyone else and holds no second mapping.
    buffer = np.memmap(tmp, dtype=np.uint8, mode="w+", shape=(max(cache.nbytes, 1),))

    def work(i: int) -> None:
        h, w = cache.shapes[i]
        slot = buffer[cache.offsets[i] : cache.offsets[i + 1]].reshape(h, w, 3)
        if _decode_into(im_files[i], slot, imgsz, augment):
            return
        img = resize_long_side(read_image(im_files[i]), imgsz, augment)
        if img.shape[:2] != (h, w):
            raise ValueError(f"{im_files[i]}: decoded to {img.shape[:2]}, expected {(h, w)} from its size")
        slot[...] = img

    _decode_all(len(im_files), work, threads)
    buffer.flush()


def _remove_orphans(directories: Sequence[Path], prefix: str) -> None:
    # A job killed with SIGKILL never runs its atexit: its buffer would hold RAM (tmpfs) for good.
    removed = 0
    for directory in directories:
        for path in directory.glob(f"{_BUFFER_PREFIX}*.*.*"):
            pid = path.name.split(".")[1]
            if not pid.isdigit() or path.suffix not in (".bin", ".tmp"):
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed += 1
            except PermissionError:  # alive, another user's
                pass
    if removed:
        LOGGER.info(f"{prefix}removed {removed} image cache buffer(s) left by jobs that are gone")


def _fits_in_ram(need: int, prefix: str) -> bool:
    """Whether RAM holds the buffer with headroom: no cache beats a node pushed into swap or the OOM killer."""
    available = mem_available()
    if available is not None and need * _HEADROOM > available:
        LOGGER.warning(
            f"{prefix}not caching images in RAM: {need / 2**30:.2f} GiB needed, {available / 2**30:.2f} GiB available"
        )
        return False
    return True


def _pick_directory(need: int, prefix: str) -> Path | None:
    if _SHM_DIR.is_dir() and disk_free(_SHM_DIR) >= need * _HEADROOM:
        return _SHM_DIR
    tmp = Path(tempfile.gettempdir())
    if disk_free(tmp) >= need * _HEADROOM:
        LOGGER.info(
            f"{prefix}/dev/shm is too small for the image cache ({need / 2**20:.0f} MiB): "
            f"using a memory-mapped file in {tmp}, shared through the page cache"
        )
        return tmp
    LOGGER.warning(f"{prefix}not caching images: neither /dev/shm nor {tmp} has {need / 2**20:.0f} MiB free")
    return None


def _unlink_at_exit(path: Path) -> None:
    owner = os.getpid()

    def unlink() -> None:
        # forked children inherit atexit handlers; only the creator removes the file
        if os.getpid() == owner:
            with contextlib.suppress(OSError):
                os.unlink(path)

    atexit.register(unlink)


class DiskImageCache:
    """Resized images as ``.npy`` files beside the images, reused while the image is unchanged.

    A ``.npy`` is stale when the image is newer than it or when its shape is not the one
    the image resizes to; stale files are rewritten atomically (temp file, then rename).
    """

    def __init__(self, im_files: Sequence[str], shapes_hw: np.ndarray, imgsz: int, augment: bool = False) -> None:
        self.im_files = list(im_files)
        self.shapes = np.asarray(shapes_hw, dtype=np.int64).reshape(-1, 2)
        self.imgsz = imgsz
        self.augment = augment
        tag = f"{imgsz}{'a' if augment else ''}"
        self.npy_files = [str(Path(f).with_suffix(f".{tag}.npy")) for f in self.im_files]

    def __len__(self) -> int:
        return len(self.im_files)

    def _fresh(self, i: int) -> bool:
        try:
            return os.stat(self.npy_files[i]).st_mtime_ns >= os.stat(self.im_files[i]).st_mtime_ns
        except FileNotFoundError:
            return False

    def write(self, i: int) -> None:
        img = resize_long_side(read_image(self.im_files[i]), self.imgsz, self.augment)
        npy = Path(self.npy_files[i])
        tmp = npy.with_name(f".{npy.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, img)
        os.replace(tmp, npy)

    def build(self, prefix: str = "", threads: int | None = None) -> int:
        """Write the missing or stale ``.npy`` files; returns how many were written."""
        stale = [i for i in range(len(self)) if not self._fresh(i)]
        if stale:
            with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
                list(pool.map(self.write, stale))
        LOGGER.info(f"{prefix}disk image cache: {len(stale)} written, {len(self) - len(stale)} reused")
        return len(stale)

    def __getitem__(self, i: int) -> np.ndarray:
        try:
            img = np.load(self.npy_files[i])
        except (OSError, ValueError):
            img = None
        if img is None or img.shape[:2] != tuple(self.shapes[i]) or not self._fresh(i):
            self.write(i)  # deleted, truncated or outdated since the build: repair it
            img = np.load(self.npy_files[i])
        return img
