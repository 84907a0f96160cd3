"""Functions that tests/test_profiling.py runs in real worker processes (see tests/multiproc.py)."""

from __future__ import annotations

import json
import sys

import torch
import torch.nn as nn

import ddp_utils as du
from ddp_utils.profiling import gather_rows, profile


def gathered_rows() -> None:
    """Each rank profiles its own op; every rank gets all rows; rank 0 alone prints them."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    width = 4 * (info.rank + 1)  # a different op per rank, so the rows show whose they are
    rows = gather_rows(profile(torch.rand(2, 8), nn.Linear(8, width), n=2, device="cpu"))
    assert [r["rank"] for r in rows] == list(range(info.world_size)), rows
    if info.rank == 0:
        print(json.dumps(rows))
    du.cleanup()


def cli(*argv: str) -> None:
    """Run the profile CLI in this rank and exit with its code."""
    from ddp_utils.cli.profile import main

    torch.set_num_threads(1)
    sys.exit(main(list(argv)))
