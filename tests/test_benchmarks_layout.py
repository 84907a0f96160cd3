"""benchmarks/ grouped by what each script measures: every path to a script that the docs, the README, the
benchmarks' own docstrings, the package, train.py and the tests name exists, each script is listed in
benchmarks/README.md, and a script's name is unique across the groups (tests/benchmark_scripts.load_benchmark
finds a script by its name)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
SCRIPT_PATH = re.compile(r"benchmarks/[a-z0-9_/]+\.py\b")  # placeholders (benchmarks/<group>/...) left out


def scripts() -> list[Path]:
    return sorted(BENCHMARKS.rglob("*.py"))


def test_every_script_path_named_in_the_docs_the_readme_the_benchmarks_and_the_tests_exists():
    # CHANGELOG.md and benchmarks/results/*.json are history: they name the paths as they were
    sources = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), BENCHMARKS / "README.md"]
    sources += scripts() + sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "ddp_utils").rglob("*.py"))
    sources.append(REPO / "train.py")
    missing = [
        f"{source.relative_to(REPO)}: {path}"
        for source in sources
        for path in SCRIPT_PATH.findall(source.read_text(encoding="utf-8"))
        if not (REPO / path).is_file()
    ]
    assert not missing, "\n".join(missing)


def test_each_script_is_in_a_group_or_a_named_top_level_one_and_listed_in_the_readme():
    readme = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    top = {path.name for path in BENCHMARKS.glob("*.py")}
    assert top == {"child_env.py", "readme_figures.py"}, top
    groups = {path.parent.name for path in BENCHMARKS.glob("*/*.py")}
    assert groups == {"parity", "reproducibility", "speed", "faults", "evolve", "gpu"}, groups
    assert all(f"## `{group}/`" in readme for group in groups)
    unlisted = [path.name for path in scripts() if f"- `{path.name}`" not in readme]
    assert not unlisted, unlisted


def test_a_scripts_name_is_unique_across_the_groups():
    repeated = [name for name, count in Counter(path.name for path in scripts()).items() if count > 1]
    assert not repeated, repeated
