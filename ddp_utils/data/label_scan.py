"""The label scan: verify every image and label file, in threads only when the file system keeps it waiting.

:func:`scan` builds what the label cache stores (``label_cache.py``) from a verification
function (``labels._verify``); :func:`verified` decides, from the first files, whether threads pay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from multiprocessing.pool import ThreadPool

import numpy as np

from ..host import runqueue_seconds
from ..log import LOGGER
from ..progress import progress
from .label_cache import CACHE_VERSION

_PROBE = 64  # files verified first in the calling thread, to see whether the scan waits on I/O


def threads_pay(wall: float, cpu: float, queued: float) -> bool:
    """Whether verifying the rest in threads pays, from the first files' wall, CPU and run-queue seconds.

    Verifying a local, cached file is Python work, which threads only slow down (they contend
    for the GIL: 8 threads took 2-3x one thread's time here). Waiting for a network file system
    or a cold disk is what threads overlap: threads when most of the time went to waiting for
    files, not to the CPU nor to waiting for a CPU that other processes keep busy.

    Examples:
        >>> threads_pay(wall=1.0, cpu=0.1, queued=0.0), threads_pay(wall=1.0, cpu=0.1, queued=0.8)
        (True, False)
    """
    return wall - queued > 2 * cpu


def verified(pairs: list[tuple[str, str]], verify: Callable[[tuple[str, str]], tuple], workers: int) -> Iterator[tuple]:
    """``verify`` over ``pairs``, in order: in this thread, or ``workers`` threads when :func:`threads_pay`."""
    wall, cpu, queued = time.perf_counter(), time.thread_time(), runqueue_seconds()
    for pair in pairs[:_PROBE]:
        yield verify(pair)
    wall, cpu, queued = time.perf_counter() - wall, time.thread_time() - cpu, runqueue_seconds() - queued
    rest = pairs[_PROBE:]
    if workers > 1 and rest and threads_pay(wall, cpu, queued):
        with ThreadPool(min(workers, len(rest))) as pool:
            yield from pool.imap(verify, rest, chunksize=16)
    else:
        for pair in rest:
            yield verify(pair)


def scan(im_files: list[str], label_files: list[str], verify: Callable, prefix: str, workers: int, desc: str) -> dict:
    """Verify every (image, label) pair with ``verify`` under a progress bar: the label cache's content."""
    counts = {"found": 0, "missing": 0, "empty": 0, "corrupt": 0, "duplicates": 0}
    kept_images, kept_labels, labels, shapes, segments, messages = [], [], [], [], [], []
    show = LOGGER.isEnabledFor(logging.INFO)
    results = verified(list(zip(im_files, label_files)), verify, workers)
    bar = progress(len(im_files), desc=desc, mode=None if show else "off", leave=True)
    for im_file, lb_file, (status, boxes, polygons, shape, duplicates, message) in zip(im_files, label_files, results):
        counts[status] += 1
        counts["duplicates"] += duplicates
        messages += [prefix + line for line in message.splitlines()]  # a line per problem, of the image or label
        if status != "corrupt":
            kept_images.append(im_file)
            kept_labels.append(lb_file)
            labels.append(boxes)
            shapes.append(shape)
            segments.append(polygons)
        bar.set_description(
            f"{desc} {counts['found']} found, {counts['missing']} missing, "
            f"{counts['empty']} empty, {counts['corrupt']} corrupt",
            refresh=False,
        )
        bar.update(1)  # after the item, so the bar ends at n/n
    bar.close()
    return {
        "version": CACHE_VERSION,
        "im_files": kept_images,
        "label_files": kept_labels,
        "labels": labels,
        "shapes": np.array(shapes, np.int64).reshape(-1, 2),
        "segments": segments,
        "counts": counts,
        "messages": messages,
    }


__all__ = ["scan", "threads_pay", "verified"]
