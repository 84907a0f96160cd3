"""Profile a model from the command line: parameters, FLOPs, forward/backward time and memory.

    python -m ddp_utils profile --cfg yolov5s.yaml --imgsz 640 --batch-size 1 --device cpu   # or: ddp-profile ...
    python -m ddp_utils profile --torchvision resnet18 --imgsz 224 --device cpu,0
    torchrun --nproc_per_node 4 -m ddp_utils profile --cfg yolov5s.yaml --device 0,1,2,3 --repeats 20

A single process profiles on every device named in ``--device`` (one row each). Under
torchrun every rank profiles on its own device and rank 0 prints one table with a row per
rank, so a slow or busy device stands out. (Under torchrun spell ``--n`` as ``--repeats``:
torchrun reads ``--n`` as an ambiguous abbreviation of its own options.)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence

import torch
import torch.nn as nn

from ..device import select_device
from ..distributed import DistEnvError, cleanup, dist_info, init_distributed
from ..log import set_logging
from ..profiling import example_input, flops, format_table, gather_rows, model_info, parameter_table, parse_devices
from ..profiling import profile as profile_ops


def parse_opt(argv: Sequence[str] | None = None, prog: str = "python -m ddp_utils profile") -> argparse.Namespace:
    """Parse the command line; argparse exits with a message naming the bad option."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--cfg", help="detector yaml, e.g. yolov5s.yaml (bare names resolve to configs/models/)")
    source.add_argument("--torchvision", metavar="NAME", help="a torchvision model, e.g. resnet18 (no weights)")
    parser.add_argument("--imgsz", type=int, nargs="+", default=[640], help="image size: one int, or height width")
    parser.add_argument("--batch-size", type=int, default=1, help="batch size of the profiled input")
    parser.add_argument("--device", default="", help='"cpu", "0", "0,1" or "cpu,0"; under torchrun, each rank its own')
    # under torchrun, "--n" is an ambiguous prefix of torchrun's own options: use --repeats there
    parser.add_argument("--repeats", "--n", dest="n", type=int, default=10, help="timed repeats (median reported)")
    parser.add_argument("--verbose", action="store_true", help="also print one line per parameter tensor")
    parser.add_argument("--half", action="store_true", help="profile in float16 (CUDA only)")
    opt = parser.parse_args(argv)
    if len(opt.imgsz) not in (1, 2) or min(opt.imgsz) < 1:
        parser.error(f"--imgsz {' '.join(map(str, opt.imgsz))}: give one positive size or height width")
    if opt.batch_size < 1:
        parser.error(f"--batch-size {opt.batch_size}: must be at least 1")
    if opt.n < 1:
        parser.error(f"--repeats/--n {opt.n}: time at least one run")
    opt.imgsz = opt.imgsz[0] if len(opt.imgsz) == 1 else tuple(opt.imgsz)
    return opt


def build_model(cfg: str | None = None, torchvision_name: str | None = None) -> nn.Module:
    """The detector built from ``cfg``, or the torchvision model ``torchvision_name`` without weights."""
    if cfg is not None:
        from ..yolo.model import Model  # the detector is only needed when asked for

        return Model(cfg, ch=3, nc=None)
    import torchvision

    names = torchvision.models.list_models()
    if torchvision_name not in names:
        close = difflib.get_close_matches(str(torchvision_name), names, n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see torchvision.models.list_models()"
        raise ValueError(f"--torchvision {torchvision_name!r} is not a torchvision model{hint}")
    return torchvision.models.get_model(torchvision_name, weights=None)


def _devices(opt: argparse.Namespace, distributed: bool) -> list[torch.device]:
    devices = [select_device(opt.device)] if distributed else parse_devices(opt.device)
    if opt.half and any(d.type != "cuda" for d in devices):
        raise ValueError(f"--half needs CUDA devices, but --device {opt.device!r} gives {[str(d) for d in devices]}")
    return devices


def run(opt: argparse.Namespace) -> list[dict]:
    """Print the model summary and the timing table (rank 0 only); return the gathered rows."""
    info = dist_info()
    devices = _devices(opt, info.distributed)
    if info.distributed:
        # only profile rows travel: gloo serves CPU and GPU ranks alike; the device is bound all the same
        init_distributed(backend="gloo", device=devices[0])
    model = build_model(opt.cfg, opt.torchvision).to(devices[0])
    if opt.half:
        model.half()
    if info.is_main:
        if opt.verbose:
            print(parameter_table(model))
        print(model_info(model, imgsz=opt.imgsz)["summary"])
        print(flops(model, opt.imgsz, opt.batch_size).text())
    x = example_input(model, opt.imgsz, opt.batch_size)
    rows = gather_rows(profile_ops(x, model, n=opt.n, device=devices))
    if info.is_main:
        print(f"\nforward/backward of {type(model).__name__} ({'train' if model.training else 'eval'} mode):")
        print(format_table(rows if info.distributed else [{k: v for k, v in r.items() if k != "rank"} for r in rows]))
    return rows


def main(argv: Sequence[str] | None = None, prog: str = "python -m ddp_utils profile") -> int:
    """``python -m ddp_utils profile`` (``ddp-profile``); exit 2 with one line on bad input."""
    opt = parse_opt(argv, prog)
    set_logging(verbose=False)  # the CLI prints its summary itself; warnings still show
    try:
        run(opt)
    except (ValueError, DistEnvError, FileNotFoundError) as e:
        print(f"ddp-profile: error: {e}", file=sys.stderr)
        return 2
    finally:
        cleanup()
    return 0
