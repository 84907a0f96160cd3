"""``python -m ddp_utils <command> [options]``: the library's commands, each also a console script.

    python -m ddp_utils val --weights runs/train/exp/weights/best.pt --data shapes.yaml   # ddp-val
    python -m ddp_utils convert yolov5s.pt                                                # ddp-convert
    python -m ddp_utils profile --cfg yolov5s.yaml --imgsz 640 --device cpu               # ddp-profile
    torchrun --nproc_per_node 2 -m ddp_utils val --weights best.pt --data shapes.yaml     # val and profile, per rank

Training is the reference script ``train.py`` at the top of the repository.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

# command -> (module with main(argv, prog), one line of what it does)
COMMANDS = {
    "val": ("ddp_utils.cli.val", "score a checkpoint on a dataset: YOLOv5 val's table, speed and COCO json"),
    "convert": ("ddp_utils.cli.convert", "convert a YOLOv5 checkpoint to ddp_utils' plain-data format, unpickled"),
    "profile": ("ddp_utils.cli.profile", "a model's summary, FLOPs and forward/backward time per device"),
}


def usage() -> str:
    """The ``--help`` text: the form and one line per command."""
    lines = ["usage: python -m ddp_utils <command> [options]   (python -m ddp_utils <command> --help)", "", "commands:"]
    lines += [f"  {name:<8} {what} (also: ddp-{name})" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def run(command: str, argv: Sequence[str], prog: str) -> int:
    """Run ``command`` with its arguments; an unknown command is one line and exit code 2."""
    if command not in COMMANDS:
        print(f"{prog}: error: unknown command {command!r} (choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return module.main(list(argv), prog=prog)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ddp_utils <command> ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    return run(argv[0], argv[1:], prog=f"python -m ddp_utils {argv[0]}")


def script() -> int:
    """The console scripts ``ddp-val``, ``ddp-convert``, ``ddp-profile``: the command is in the script's name."""
    name = Path(sys.argv[0]).name
    return run(name.removeprefix("ddp-"), sys.argv[1:], prog=name)


if __name__ == "__main__":
    sys.exit(main())
