"""Functions that tests/data/ runs in real worker processes (see tests/multiproc.py): yamls and label caches."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

import ddp_utils as du
from ddp_utils.data.config import check_dataset
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.data.synthetic import make_shapes_dataset


def counting_generator(data: dict) -> None:
    """A ``download`` generator that records each call, takes a while, and may fail on purpose."""
    with open(data["counter"], "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)  # the other ranks must be waiting while this runs
    if data.get("fail"):
        raise RuntimeError("generator failed on purpose")
    make_shapes_dataset(Path(data["path"]), n_train=2, n_val=1, size=(64, 64))


def check_dataset_once(yaml_file: str) -> None:
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo")
    start = time.monotonic()
    try:
        data = check_dataset(yaml_file)
        record = {"rank": info.rank, "train": data["train"], "found": sorted(os.listdir(data["train"]))}
    except Exception as exc:
        record = {"rank": info.rank, "error": f"{type(exc).__name__}: {exc}"}
    record["seconds"] = time.monotonic() - start
    print(json.dumps(record))
    du.cleanup()


def labels_once_per_node(image_dir: str) -> None:
    """The node's first process scans and writes the cache; the others read it."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo")
    with du.torch_distributed_zero_first(info.local_rank):
        result = load_labels(find_images(image_dir))
    record = {"rank": info.rank, "loaded": result.cache_loaded, "written": result.cache_written}
    record["n"] = len(result.im_files)
    print(json.dumps(record))
    du.cleanup()
