"""Data-pipeline functions that tests run in real gloo worker processes (see tests/multiproc.py).

Each joins a gloo group, builds loaders the way train.py does, prints one JSON line
that the test reads back, and leaves the group.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import torch

import ddp_utils as du
from ddp_utils.data import load_hyp
from ddp_utils.data.loader import create_dataloader, create_val_dataloader

HYP = load_hyp("hyp.scratch-low.yaml")  # YOLOv5's augmentation: all-mosaic, no mixup
# every hyp key the augmentation reads, for the device path's tests against the CPU path (test_recipes.py,
# test_device_augment.py): the usual hyp, the general warp with mixup and both flips, letterboxed samples, no HSV
AUGMENT_HYPS = {
    "usual": HYP,
    "general_warp_mixup_flips": dict(HYP, degrees=12.0, shear=4.0, perspective=0.0008, mixup=0.5, flipud=0.5),
    "some_letterboxed": dict(HYP, mosaic=0.5, degrees=5.0, scale=0.9, translate=0.3),
    "no_hsv": dict(HYP, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0),
}


def _epoch(loader, epoch: int) -> tuple[list[str], float]:
    """The paths this rank sees in one epoch, and a checksum of its targets (the augmentation)."""
    loader.set_epoch(epoch)
    paths, checksum = [], 0.0
    for _imgs, targets, batch_paths, _shapes in loader:
        paths.extend(batch_paths)
        checksum += float(targets[:, 1:].double().sum())
    return paths, checksum


def shards(root: str, workers: str = "1") -> None:
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo")
    kwargs = dict(hyp=HYP, augment=True, shuffle=True, rank=info.local_rank, workers=int(workers), seed=3)
    loader, dataset = create_dataloader(f"{root}/images/train", 64, 4, 32, **kwargs)
    epoch0, sum0 = _epoch(loader, 0)
    epoch1, sum1 = _epoch(loader, 1)
    fresh, _ = create_dataloader(f"{root}/images/train", 64, 4, 32, **kwargs)
    fresh1, fresh_sum1 = _epoch(fresh, 1)
    val_loader, _ = create_val_dataloader(f"{root}/images/val", 64, 4, 32, rank=info.local_rank, workers=0)
    val = [p for _, _, paths, _ in val_loader for p in paths]
    # rect training batches on padded shards: every batch must stack (one shape per batch)
    rect_loader, _ = create_dataloader(f"{root}/images/val", 64, 4, 32, rect=True, rank=info.local_rank, workers=0)
    rect = [p for _, _, paths, _ in rect_loader for p in paths]
    record = {
        "rank": info.rank,
        "cache_written": bool(dataset.label_cache_written),
        "cache_loaded": bool(dataset.label_cache_loaded),
        "batches": len(loader),
        "epoch0": epoch0,
        "epoch1": epoch1,
        "fresh1": fresh1,
        "sums": [sum0, sum1, fresh_sum1],
        "val": val,
        "rect": rect,
        "n": len(dataset),
    }
    print(json.dumps(record))
    du.cleanup()


def _rollup_kib(field: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def _mapping_pss_kib(path: str) -> int:
    """Pss of this process's mappings of one file (all its VMAs), from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Pss:"):
                total += int(line.split()[1])
    return total


def ram_cache_pss(root: str, imgsz: str = "640") -> None:
    """Build the RAM cache through create_dataloader, read every image, report this process's memory.

    ``anon_delta_kib``: growth of private anonymous memory (``Anonymous`` in smaps_rollup),
    where any private copy of the images would land: a decode buffer malloc keeps, a file
    read or ``np.load``/``np.fromfile`` into memory, a copy-on-write page, ``torch.from_numpy``
    of a private array. Unlike Pss it does not move when other processes on the host map or
    unmap the same libraries. ``mapping_pss_kib``: this process's share of the cache file's
    pages; over the node's processes they sum to the one copy.
    """
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo")
    before_anon, before_pss = _rollup_kib("Anonymous"), _rollup_kib("Pss")
    _, dataset = create_dataloader(f"{root}/images/train", int(imgsz), 4, 32, cache="ram", rank=info.local_rank)
    cache = dataset.cache
    checksum = sum(int(cache[i][::7, ::7].sum()) for i in range(len(cache)))
    touched = sum(int(np.asarray(cache[i]).sum(dtype=np.int64) > 0) for i in range(len(cache)))
    du.barrier()  # both processes have every page mapped before either measures
    anon, pss = _rollup_kib("Anonymous"), _rollup_kib("Pss")
    mapping = _mapping_pss_kib(cache.path)
    du.barrier()
    record = {
        "rank": info.rank,
        "path": cache.path,
        "nbytes": cache.nbytes,
        "anon_delta_kib": anon - before_anon,
        "pss_delta_kib": pss - before_pss,
        "mapping_pss_kib": mapping,
        "touched": touched,
        "checksum": checksum,
        "pid": os.getpid(),
    }
    print(json.dumps(record))
    du.cleanup()


def ram_cache_builder(root: str, imgsz: str = "640", threads: str = "16") -> None:
    """The node's first process alone, decoding with ``threads`` threads (a many-core host's count)."""
    from ddp_utils.data.image_cache import SharedImageCache
    from ddp_utils.data.images import resized_shape
    from ddp_utils.data.labels import find_images, label_cache_path, load_labels

    files = find_images(f"{root}/images/train")
    label_set = load_labels(files, label_cache_path(files))
    shapes = np.array([resized_shape(int(h), int(w), int(imgsz)) for w, h in label_set.shapes])
    before = _rollup_kib("Anonymous")
    cache = SharedImageCache.build(label_set.im_files, shapes, int(imgsz), threads=int(threads))
    after = _rollup_kib("Anonymous")
    print(json.dumps({"nbytes": cache.nbytes, "anon_delta_kib": after - before, "path": cache.path}))
