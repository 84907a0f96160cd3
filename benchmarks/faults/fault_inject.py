"""Run train.py with a fault that a signal cannot inject: a non-finite loss at one training step.

    torchrun --nproc_per_node 2 benchmarks/faults/fault_inject.py --nan-at 13 --nan-rank 1 \
        -- --data ... (train.py's options)

The loss that ``TrainStep`` computes at its ``--nan-at``-th training forward (counted from 0 in this
process, validation's forwards not counted) on rank ``--nan-rank`` is multiplied by NaN; everything else
is train.py as a user runs it (``runpy``, as ``__main__``). A benchmark's tool, never imported by the package.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from ddp_utils.yolo import loss as loss_module  # noqa: E402


def inject_nan(at: int, rank: int) -> None:
    """Make the ``at``-th training loss of rank ``rank`` NaN (a forward with gradients: training, not validation)."""
    if int(os.environ.get("RANK", "0")) != rank:
        return
    original = loss_module.ComputeLoss.__call__
    calls = [0]

    def call(self, pred, targets):  # noqa: ANN001
        loss, items = original(self, pred, targets)
        if torch.is_grad_enabled():
            if calls[0] == at:
                loss = loss * float("nan")
            calls[0] += 1
        return loss, items

    loss_module.ComputeLoss.__call__ = call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nan-at", type=int, required=True, help="the training forward (from 0) whose loss is NaN")
    parser.add_argument("--nan-rank", type=int, default=0, help="the rank it happens on")
    split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    opt = parser.parse_args(sys.argv[1:split])
    inject_nan(opt.nan_at, opt.nan_rank)
    sys.argv = [str(REPO_ROOT / "train.py"), *sys.argv[split + 1 :]]
    runpy.run_path(str(REPO_ROOT / "train.py"), run_name="__main__")


if __name__ == "__main__":
    main()
