"""benchmarks/child_env.py: a benchmark's child keeps the caller's PYTHONPATH (a GPU host's wheels), never loses it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


def load_child_env():
    return load_benchmark("child_env")


def test_our_children_get_the_checkout_first_and_keep_the_callers_entries(tmp_path):
    child_env = load_child_env()
    site = tmp_path / "site"  # a GPU host's wheels, unpacked where PYTHONPATH points
    (site / "wheel_only_module").mkdir(parents=True)
    (site / "wheel_only_module" / "__init__.py").write_text("WHERE = 'site'\n")
    env = child_env.with_pythonpath({**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), str(site)]  # the checkout once, first
    probe = "import ddp_utils, wheel_only_module; print(ddp_utils.__file__, wheel_only_module.WHERE)"
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    where, found = done.stdout.split()
    assert Path(where).is_relative_to(REPO) and found == "site"


def test_yolov5s_children_keep_the_callers_entries_but_not_the_checkout(tmp_path):
    child_env = load_child_env()
    caller = {"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path), str(REPO) + os.sep])}
    assert child_env.without_checkout(caller)["PYTHONPATH"] == str(tmp_path)
    assert "PYTHONPATH" not in child_env.without_checkout({"PYTHONPATH": str(REPO)})


def test_no_benchmark_replaces_or_drops_the_callers_pythonpath():
    replacing = re.compile(
        r"""["']PYTHONPATH["']\s*:\s*str\(|pop\(\s*["']PYTHONPATH["']|!=\s*["']PYTHONPATH["']|\[["']PYTHONPATH["']\]\s*="""
    )
    offenders = [
        f"{path.relative_to(BENCHMARKS)}:{number}: {line.strip()}"
        for path in sorted(BENCHMARKS.rglob("*.py"))
        if path.name != "child_env.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if replacing.search(line)
    ]
    assert not offenders, "use child_env.with_pythonpath / without_checkout:\n" + "\n".join(offenders)
