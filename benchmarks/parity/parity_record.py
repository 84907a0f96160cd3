"""What a parity.py run records beyond its scores: its epochs' wall time, its host, and the key to reuse it.

The key: a run counts again in a later call (``--reuse``, or its ``--dir``) only when what made it is
the same: the regime (parity.py's ``describe``), and for YOLOv5's side its checkout's commit and the
interpreter that ran it (path, Python and torch versions), for ours the compute mode train.py resolves
on this CPU (:func:`ddp_utils.engine.amp.train_mode`). The host is recorded beside it, not in it: a
run's scores hold on any host, but times are compared only between runs on the same one.

The epochs' wall time, read from the run's log: a whole process also holds YOLOv5's online and
requirements checks at start and its second validation of ``best.pt`` at the end (even with
``--noval``), while the epochs are what a longer run multiplies. Both sides are timed by what their
logs say of each epoch's training (validation and saves between epochs left out on both sides):

- YOLOv5: each epoch's progress bar ends ``100%|##########| 63/63 00:09``; tqdm shows the elapsed
  time truncated to whole seconds, so each epoch counts as that plus half a second (within 0.5 s).
- ours: each epoch line ends ``97.3 img/s, data wait 4.1%``, the epoch's images over its wall time
  (:meth:`ddp_utils.engine.EpochStats.speed`): the epoch took images / rate.

    python benchmarks/parity/parity_record.py yolov5 runs/parity/yolov5/seed0.log
    python benchmarks/parity/parity_record.py ours runs/parity/ours/seed0.log --images 1000

It lives with parity.py, whose runs it records; ``speed/cpu_train_speed.py`` and ``gpu/gpu_check.py`` time their
epochs with it too and put ``benchmarks/parity/`` on ``sys.path`` for it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
from child_env import without_checkout  # noqa: E402  (children keep the caller's PYTHONPATH)

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# "      3/29         0G    0.08  0.03  0.04   121   160: 100%|##########| 63/63 00:09" (h:mm:ss past an hour)
YOLOV5_EPOCH_BAR = re.compile(r"^\s*(\d+)/(\d+)\s+\S+(?:\s+[-\d.e]+){4}\s+\d+:\s+100%\|.*\|\s*(\d+)/\3\s+([\d:]+)\s*$")
TRUNCATION = 0.5  # tqdm's elapsed drops the fraction of a second: its mean


def yolov5_epoch_seconds(log: str) -> list[float]:
    """Each epoch's training time in a YOLOv5 train.py log (its progress bars), in epoch order.

    Examples:
        >>> bar = "      0/1         0G     0.1     0.02    0.04     12     160: 100%|##########| 4/4 00:09"
        >>> yolov5_epoch_seconds(bar + "\\r" + bar + "\\n" + bar.replace(" 0/1", " 1/1").replace("00:09", "1:00:01"))
        [9.5, 3601.5]
    """
    seconds: dict[int, float] = {}
    for line in re.split(r"[\r\n]", log):
        found = YOLOV5_EPOCH_BAR.match(line)
        if found:
            parts = [int(p) for p in found.group(4).split(":")]
            elapsed = sum(p * 60**k for k, p in enumerate(reversed(parts)))
            seconds[int(found.group(1))] = elapsed + TRUNCATION
    return [seconds[e] for e in sorted(seconds)]


def ours_epoch_seconds(log: str, images: int) -> list[float]:
    """Each epoch's training time in our train.py's log: ``images`` (one epoch's, all ranks) over its rate.

    Examples:
        >>> line = "epoch 1/2: loss 0.1 0.2 0.3, P 0 R 0 mAP@0.5 0 mAP@0.5:0.95 0, 50.0 img/s, data wait 2.0%"
        >>> ours_epoch_seconds(line, 1000)
        [20.0]
    """
    from ddp_utils.run.report import parse_epoch_lines

    return [images / epoch["img_s"] for epoch in parse_epoch_lines(log) if epoch["img_s"] > 0]


def finished_run_host() -> str:
    """The machine, as far as speed goes: ``"AMD EPYC, AVX2, 2 cores"`` (runs on different hosts are not timed
    against each other)."""
    import torch

    from ddp_utils.engine.amp import NATIVE_BF16_FLAGS
    from ddp_utils.host import cpu_flags

    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "")
    model = model or platform.processor() or platform.machine()
    bf16 = ", native bf16" if set(NATIVE_BF16_FLAGS) & cpu_flags() else ""
    return f"{model}, {torch.backends.cpu.get_cpu_capability()}{bf16}, {os.cpu_count()} cores"


def _cpuinfo() -> list[str]:
    with contextlib.suppress(OSError):
        return Path("/proc/cpuinfo").read_text().splitlines()
    return []


def side_keys(args: argparse.Namespace, regime: str) -> dict[str, dict[str, str]]:
    """What makes a run of each side reusable: the regime, YOLOv5's commit and interpreter, our compute mode (and
    where our images are made, when not in the workers)."""
    from ddp_utils.engine.amp import train_mode

    mode = train_mode(args.ours_amp, "cpu")
    keys = {"ours": dict(regime=regime, amp=mode.amp, layout="channels_last" if mode.channels_last else "NCHW")}
    if getattr(args, "ours_augment_on", "workers") != "workers":  # the workers' runs keep their older keys
        keys["ours"]["augment_on"] = args.ours_augment_on
    if getattr(args, "ours_bf16_conv", "torch") != "torch":  # bf16_conv.py's convolutions, apart from torch's
        keys["ours"]["bf16_conv"] = args.ours_bf16_conv
    if args.yolov5 is not None:
        git = ["git", "rev-parse", "HEAD"]
        commit = subprocess.run(git, cwd=args.yolov5, capture_output=True, text=True).stdout.strip()
        python = args.yolov5_python or sys.executable
        probe = [python, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"]
        env = without_checkout()
        versions = subprocess.run(probe, capture_output=True, text=True, env=env).stdout.split()
        python_version, torch_version = (versions + ["?", "?"])[:2]
        keys["yolov5"] = dict(
            regime=regime, commit=commit or "unknown (not a git checkout)", python=str(python),
            python_version=python_version, torch=torch_version,
        )  # fmt: skip
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=["yolov5", "ours"])
    parser.add_argument("log", type=Path)
    parser.add_argument("--images", type=int, help="images per epoch (ours)")
    args = parser.parse_args(argv)
    text = args.log.read_text(errors="replace")
    if args.side == "ours" and not args.images:
        parser.error("ours: --images N (one epoch's images) is needed")
    seconds = yolov5_epoch_seconds(text) if args.side == "yolov5" else ours_epoch_seconds(text, args.images)
    print(f"{len(seconds)} epochs, {sum(seconds):.1f} s: " + " ".join(f"{s:.1f}" for s in seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
