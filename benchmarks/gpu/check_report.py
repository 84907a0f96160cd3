"""The GPU check's report: one table of its parts (budget, time taken, figures; a part that failed says why) and
one of issue 40's goals, each figure beside its goal, pass or fail ("not measured" where its part gave none).

A row's figures are a dict; a failed row's dict has ``failed`` (the reason, and whatever it did measure), a
skipped one ``skipped``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TRAIN_ROWS = ("ours", "yolov5", "cudnn_on", "workers")  # the rows with epoch figures
TIMED = ("steady_epoch_s", "first_epoch_s", "run_s", "data_wait", "epochs_s")


@dataclass
class Row:
    """One part as it ran: its key and title, its budget and the seconds it took, what it gave."""

    key: str
    title: str
    budget_s: float
    took_s: float
    got: dict

    @property
    def ok(self) -> bool:
        return "failed" not in self.got and "skipped" not in self.got


def cell(value: Any, unit: str = "", scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{1 if unit != '%' else 0}f}{unit}"


def status(got: dict) -> str | None:
    """The row's reason when it gave no figures of its own: ``failed: ...`` or ``skipped: ...``."""
    if "failed" in got:
        return f"failed: {got['failed']}"
    return got.get("skipped")


def parts_table(rows: list[Row], images: int) -> str:
    lines = [
        "| part | budget | took | steady epoch | img/s | first epoch | whole run | data wait | more |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        head = f"| {row.title} | {row.budget_s:.0f} s | {row.took_s:.0f} s |"
        reason = status(row.got)
        if reason:
            lines.append(f"{head} {reason} | | | | | |")
            continue
        got = row.got
        steady = got.get("steady_epoch_s")
        rate = images / steady if steady and row.key in TRAIN_ROWS else None
        more = ", ".join(f"{k} {json.dumps(_rounded(v))}" for k, v in got.items() if k not in TIMED)
        cells = [cell(steady, " s"), cell(rate), cell(got.get("first_epoch_s"), " s"), cell(got.get("run_s"), " s")]
        lines.append(f"{head} {' | '.join(cells)} | {cell(got.get('data_wait'), '%', 100)} | {more} |")
    return "\n".join(lines)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@dataclass(frozen=True)
class Goal:
    """A figure of issue 40's goals: how to read it from the rows, the goal in words, the test it must pass."""

    name: str
    goal: str
    read: Callable[[dict[str, dict], int], float | None]
    passes: Callable[[float], bool]
    unit: str = ""


def _figure(rows: dict[str, dict], key: str, name: str) -> Any:
    got = rows.get(key, {})
    return None if "failed" in got or "skipped" in got else got.get(name)


def _ratio(top: Any, bottom: Any) -> float | None:
    return top / bottom if top is not None and bottom else None


def _decoded(rows: dict[str, dict], variant: str) -> int | None:
    found = (_figure(rows, "decode_order", "variants") or {}).get(variant, {})
    return found.get("corrupted") if found.get("iterations") else None


def _made_on_ok(rows: dict[str, dict], images: int) -> float | None:
    """The share of train.py rows that ran and logged the "images made on" line they expect."""
    ran = [rows[key] for key in ("ours", "cudnn_on", "workers", "default_job") if "made_on" in rows.get(key, {})]
    return sum(not str(got.get("failed", "")).startswith("expected") for got in ran) / len(ran) if ran else None


def _first_batch_later(mode: str) -> Callable[[dict[str, dict], int], float | None]:
    """The first step's first finished batch of ``mode`` (device-cold, device-warm) less the workers path's."""

    def later(rows: dict[str, dict], images: int) -> float | None:
        first = rows.get("first_step", {})
        ours, workers = (first.get(key, {}).get("first_batch_s") for key in (mode, "workers"))
        return None if ours is None or workers is None else ours - workers

    return later


def _exit_later(rows: dict[str, dict], images: int) -> float | None:
    """The longest wait from the last line to the exit of the first step's device runs, less the workers path's."""
    first = rows.get("first_step", {})
    waits = [first.get(mode, {}).get("exit_after_last_line_s") for mode in ("device-cold", "device-warm", "workers")]
    return None if None in waits else max(waits[:2]) - waits[2]


def _ended_clean(rows: dict[str, dict], images: int) -> float | None:
    """The share of the first step's runs that ended with code 0 and no traceback in their output."""
    first = rows.get("first_step", {})
    ran = [first[mode] for mode in ("device-cold", "device-warm", "workers") if mode in first]
    return sum(run.get("code") == 0 and run.get("traceback") is False for run in ran) / len(ran) if ran else None


def _tests_failed(rows: dict[str, dict], images: int) -> int | None:
    """The CUDA tests that failed or erred, once they ran (on the CPU they are only collected: None)."""
    counts = _figure(rows, "cuda_tests", "counts") or {}
    ran = any(key in counts for key in ("passed", "failed", "error", "errors"))
    return sum(counts.get(key, 0) for key in ("failed", "error", "errors")) if ran else None


GOALS = [
    Goal("steady img/s at 8 workers (ours, default)", ">= 1,400",
         lambda r, n: _ratio(n, _figure(r, "ours", "steady_epoch_s")), lambda v: v >= 1400),
    Goal("data wait, steady epochs (ours, default)", "<= 5 %",
         lambda r, n: _figure(r, "ours", "data_wait"), lambda v: v <= 0.05, "%"),
    Goal("the loader alone, img/s", ">= 3,000", lambda r, n: _figure(r, "loader", "img_s"), lambda v: v >= 3000),
    Goal("first epoch / steady epoch (ours, default)", "<= 1.5",
         lambda r, n: _ratio(_figure(r, "ours", "first_epoch_s"), _figure(r, "ours", "steady_epoch_s")),
         lambda v: v <= 1.5),
    Goal("4-epoch run, ours / YOLOv5's (wall, start-up included)", "<= 0.7",
         lambda r, n: _ratio(_figure(r, "ours", "run_s"), _figure(r, "yolov5", "run_s")), lambda v: v <= 0.7),
    Goal("reserved memory's spread over epochs 2-4 (ours, default)", "<= 2 %",
         lambda r, n: _figure(r, "memory", "spread"), lambda v: v <= 0.02, "%"),
    Goal("corrupted sums, decode-order reproduction, our decoder", "0",
         lambda r, n: _decoded(r, "ours"), lambda v: v == 0),
    Goal("positive control: the same through torchvision's raw call", "> 0",
         lambda r, n: _decoded(r, "torchvision"), lambda v: v > 0),
    Goal("train.py rows whose 'images made on' line is the expected one", "all", _made_on_ok, lambda v: v == 1, "%"),
    Goal("CUDA tests failed (python -m pytest -m cuda)", "0", _tests_failed, lambda v: v == 0),
    Goal("first finished batch, device path cold - workers path (s)", "<= 5", _first_batch_later("device-cold"),
         lambda v: v <= 5),
    Goal("first finished batch, device path warm - workers path (s)", "<= 2", _first_batch_later("device-warm"),
         lambda v: v <= 2),
    Goal("last line to exit, device path - workers path (s)", "<= 2", _exit_later, lambda v: v <= 2),
    Goal("first-step runs ending 0 with no traceback", "all", _ended_clean, lambda v: v == 1, "%"),
    Goal("values that differ between the render's compiled and uncompiled forms", "0",
         lambda r, n: _figure(r, "forms", "differing"), lambda v: v == 0),
]  # fmt: skip


def goals(rows: dict[str, dict], images: int) -> list[dict]:
    """Each goal's figure and verdict: ``pass``, ``fail`` or ``not measured``."""
    found = []
    for goal in GOALS:
        value = goal.read(rows, images)
        verdict = "not measured" if value is None else ("pass" if goal.passes(value) else "fail")
        found.append(dict(name=goal.name, figure=value, goal=goal.goal, verdict=verdict, unit=goal.unit))
    return found


def goals_table(found: list[dict]) -> str:
    lines = ["| issue 40's goal (one H100 or H200, 16 cores) | figure | goal | verdict |", "|---|---|---|---|"]
    for goal in found:
        value = goal["figure"]
        figure = "-" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"
        if value is not None and goal["unit"] == "%":
            figure = f"{value * 100:.1f} %"
        lines.append(f"| {goal['name']} | {figure} | {goal['goal']} | {goal['verdict']} |")
    return "\n".join(lines)
