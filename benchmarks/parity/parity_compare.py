"""Our side of two parity results side by side: does one compute mode learn as another does, over the same seeds?

    python benchmarks/parity/parity_compare.py benchmarks/results/parity-yolov5n-shapes-bf16.json \\
        benchmarks/results/parity-yolov5n-shapes-channels-last.json

``parity.py --ours-only --ours-amp bf16 --dir A`` and ``parity.py --ours-only --dir B`` (fp32, the CPU's default) train
our side alone in parity's regime, one results.json each. This prints, for the seeds both hold, each mode's held-out
mAP@0.5:0.95 and mAP@0.5 (``python -m ddp_utils val`` on each last.pt), epochs' and whole runs' seconds, the mean and
sample standard deviation of each column, and the verdict ``ddp_utils.engine.amp.Bf16Learning`` applies: the first
file's mean mAP@0.5:0.95 at least the second's mean minus its standard deviation (within one seed spread), over 5 seeds
or more. Both files must hold the same regime.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

MIN_SEEDS = 5


def mode_name(results: dict[str, Any]) -> str:
    """The compute mode of a results' runs, from their keys: e.g. ``"bf16, channels_last"``, ``"fp32,
    channels_last, augment on device"`` (``--ours-augment-on device``; the OpenCV path names nothing)."""
    keys = {
        (run["ours"]["key"].get("amp"), run["ours"]["key"].get("layout"), run["ours"]["key"].get("augment_on"))
        for run in results["runs"].values()
    }
    return " / ".join(
        f"{'fp32' if amp == 'off' else amp}, {layout}" + (f", augment on {place}" if place else "")
        for amp, layout, place in sorted(keys, key=str)
    )


def summary(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def figures(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Per seed both hold, each side's scores and seconds; and (mean, std) of each side's mAP@0.5:0.95."""
    if first["setup"]["description"] != second["setup"]["description"]:
        raise ValueError("the two results hold different regimes: compare runs of one regime")
    seeds = sorted(set(first["runs"]) & set(second["runs"]), key=int)
    seeds = [s for s in seeds if "ours" in first["runs"][s] and "ours" in second["runs"][s]]
    rows = []
    for seed in seeds:
        a, b = first["runs"][seed]["ours"], second["runs"][seed]["ours"]
        rows.append(
            dict(seed=int(seed), map=(a["scores"]["map"], b["scores"]["map"]),
                 map50=(a["scores"]["map50"], b["scores"]["map50"]),
                 epochs_s=(sum(a.get("epoch_s") or [float("nan")]), sum(b.get("epoch_s") or [float("nan")])),
                 wall_s=(a["wall_s"], b["wall_s"]), commit=(a.get("commit"), b.get("commit")))
        )  # fmt: skip
    stats = {
        side: summary([row["map"][k] for row in rows]) if rows else (float("nan"), float("nan"))
        for k, side in enumerate(("first", "second"))
    }
    return dict(seeds=len(rows), rows=rows, first=stats["first"], second=stats["second"])


def verdict(found: dict[str, Any], min_seeds: int = MIN_SEEDS) -> tuple[bool, str]:
    """Whether the first mode learns within one seed spread of the second (over ``min_seeds`` seeds or more), in
    words."""
    (mean, _), (their_mean, spread) = found["first"], found["second"]
    if found["seeds"] < min_seeds:
        return False, f"not judged: {found['seeds']} seed(s), fewer than {min_seeds}"
    met = mean >= their_mean - spread
    return met, (
        f"mean mAP@0.5:0.95 {mean:.3f} >= {their_mean:.3f} - {spread:.3f} = {their_mean - spread:.3f} "
        f"over {found['seeds']} seeds: {'learns within one seed spread' if met else 'learns LESS (NOT met)'}"
    )


def report(first: dict[str, Any], second: dict[str, Any], min_seeds: int = MIN_SEEDS) -> str:
    """The markdown table and the verdict."""
    found = figures(first, second)
    names = mode_name(first), mode_name(second)
    header = ["seed"] + [f"{name} {col}" for col in ("mAP@0.5:0.95", "mAP@0.5", "epochs s", "wall s") for name in names]
    lines = [
        f"setup: {first['setup']['description']}",
        "",
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
    ]
    columns: list[list[float]] = [[] for _ in header[1:]]
    for row in found["rows"]:
        cells = [*row["map"], *row["map50"], *row["epochs_s"], *row["wall_s"]]
        for column, value in zip(columns, cells):
            column.append(value)
        lines.append(f"| {row['seed']} | " + " | ".join(_cell(h, v) for h, v in zip(header[1:], cells)) + " |")
    if found["rows"]:
        for label, pick in (("mean", 0), ("std", 1)):
            valid = [[v for v in column if v == v] for column in columns]  # NaN: a run without that figure
            cells = [summary(v)[pick] if v else float("nan") for v in valid]
            lines.append(f"| {label} | " + " | ".join(_cell(h, v) for h, v in zip(header[1:], cells)) + " |")
    commits = sorted({c for row in found["rows"] for c in row["commit"] if c})
    lines += [
        "",
        f"commits: {', '.join(commits) or 'not recorded'}",
        f"{names[0]} against {names[1]}: {verdict(found, min_seeds)[1]}",
    ]
    return "\n".join(lines)


def _cell(header: str, value: float) -> str:
    if value != value:
        return "-"
    return f"{value:.0f}" if header.endswith(" s") else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="results.json of the mode judged (e.g. --ours-amp bf16)")
    parser.add_argument("second", type=Path, help="results.json of the reference mode (e.g. fp32)")
    parser.add_argument("--min-seeds", type=int, default=MIN_SEEDS,
                        help=f"seeds the verdict needs (default {MIN_SEEDS}, issue 47's for bf16; issue 46 asked 3 "
                             "for the device path)")  # fmt: skip
    args = parser.parse_args(argv)
    missing = [str(path) for path in (args.first, args.second) if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    try:
        print(report(json.loads(args.first.read_text()), json.loads(args.second.read_text()), args.min_seeds))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
