"""The README and docs/ as a reader meets them: the commands marked runnable run; what the site builds from is whole.

A shell block is marked runnable by an HTML comment, ``<!-- runnable -->``, on the line before its fence
(docs/development.md). Each block runs in the slow tier (every one starts Python with torch: seconds of
CPU before the command does anything), for real, with ``bash -e -o pipefail``, on the CPU and offline,
in a fresh directory holding links to the checkout's scripts and yamls, so what it writes (``runs/``)
stays there; datasets go to a temporary ``DDP_UTILS_DATASETS_DIR`` the blocks share. The site itself is
built by ``mkdocs build --strict`` in CI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import ddp_utils

from .multiproc import REPO_ROOT, collect, free_port, launcher_env

MARKER = "<!-- runnable -->"
BLOCK_TIMEOUT = 600  # seconds; a block that hangs fails instead of stalling CI
LINKED = ("train.py", "examples", "benchmarks", "data", "configs")  # what the blocks' commands name
README_MAX_LINES = 250


@dataclass(frozen=True)
class Block:
    """One fenced shell block marked runnable: where it is, its text."""

    path: Path
    line: int  # of the opening fence, from 1
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT).as_posix()}:{self.line}"


def documents() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def parse(path: Path) -> tuple[list[Block], list[str]]:
    """The runnable blocks of one Markdown file, and a line per marker that does not precede a bash block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, problems = [], []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith("<!-- runnable"):
            continue
        where = f"{path.relative_to(REPO_ROOT)}:{i + 1}"
        if stripped != MARKER:
            problems.append(f"{where}: unknown marker {stripped!r} (the marker is {MARKER})")
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```bash":
            problems.append(f"{where}: {stripped} must stand on the line just before a ```bash fence")
            continue
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            problems.append(f"{where}: the bash block after the marker never closes")
            continue
        blocks.append(Block(path, i + 2, "\n".join(lines[i + 2 : end]) + "\n"))
    return blocks, problems


def runnable_blocks() -> list[Block]:
    return [block for path in documents() for block in parse(path)[0]]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One datasets directory for every block: the first to need shapes.yaml's images makes them."""
    return tmp_path_factory.mktemp("datasets")


def run_block(block: Block, workdir: Path, datasets: Path, timeout: float):
    for name in LINKED:
        (workdir / name).symlink_to(REPO_ROOT / name)
    env = launcher_env(
        {
            "DDP_UTILS_DATASETS_DIR": str(datasets),
            "PET_MASTER_ADDR": "127.0.0.1",  # torchrun's --master-addr and --master-port, when a block names none
            "PET_MASTER_PORT": str(free_port()),
            "MPLBACKEND": "Agg",
        }
    )
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # this python, torchrun
    proc = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=workdir, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    (result,) = collect([proc], time.monotonic(), timeout, block.name)
    shown = f"{block.name}:\n{block.code}\n--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n"
    shown += result.stderr[-6000:]
    assert result.returncode == 0, shown
    assert "Traceback (most recent call last)" not in result.stdout + result.stderr, shown
    return result


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(BLOCK_TIMEOUT + 60)
@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.name)
def test_a_runnable_block_runs(block: Block, tmp_path: Path, datasets: Path) -> None:
    run_block(block, tmp_path, datasets, BLOCK_TIMEOUT)


def test_every_marker_stands_before_a_bash_block_and_each_use_in_the_readme_has_one() -> None:
    problems = [problem for path in documents() for problem in parse(path)[1]]
    assert not problems, "\n".join(problems)
    readme = parse(REPO_ROOT / "README.md")[0]
    assert [b.code.split()[0] for b in readme] == ["python", "torchrun", "python"], [b.code for b in readme]
    assert "examples/ddp_helpers.py" in readme[0].code and "train.py" in readme[1].code
    assert "-m ddp_utils profile" in readme[2].code


def test_the_readme_opens_with_what_ci_and_the_figures_benchmark_read() -> None:
    """.ci/run takes the first bash block's two lines; benchmarks/readme_figures.py runs the main job as typed."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    bash_blocks = re.findall(r"^```bash\n(.*?)^```$", readme, flags=re.S | re.M)
    assert bash_blocks[0].splitlines() == ['pip install -e ".[dev]"', "python -m pytest"]
    assert bash_blocks[1].splitlines() == ["python train.py"]
    assert len(readme.splitlines()) <= README_MAX_LINES, "the README is the first ten minutes: move reference to docs/"


def test_the_readmes_links_lead_to_files_that_exist() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t and not t.startswith("#")]
    assert targets
    missing = [t for t in targets if not (REPO_ROOT / t.split("#")[0]).exists()]
    assert not missing, missing


def test_every_page_is_in_the_sites_navigation_and_every_module_on_an_api_page() -> None:
    mkdocs = (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {p.relative_to(REPO_ROOT / "docs").as_posix() for p in (REPO_ROOT / "docs").rglob("*.md")}
    in_nav = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)$", mkdocs, flags=re.M))
    assert pages == in_nav, (pages - in_nav, in_nav - pages)
    api = "".join(p.read_text(encoding="utf-8") for p in (REPO_ROOT / "docs" / "api").glob("*.md"))
    documented = set(re.findall(r"^::: ([\w.]+)$", api, flags=re.M))
    package = REPO_ROOT / "ddp_utils"
    modules = {
        ".".join(p.relative_to(REPO_ROOT).with_suffix("").parts[: -1 if p.name == "__init__.py" else None])
        for p in package.rglob("*.py")
        if p.name != "__main__.py" and p.parent != package or p.name not in ("__init__.py", "__main__.py")
    }  # the package itself: the table of api/index.md below
    assert not modules - documented, f"modules without a ::: directive on a docs/api page: {modules - documented}"
    index = (REPO_ROOT / "docs" / "api" / "index.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| \[?`(\w+)`", index, flags=re.M))
    assert set(ddp_utils.__all__) <= listed, set(ddp_utils.__all__) - listed


def test_the_changelog_page_is_found_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mkdocs build -f /path/to/mkdocs.yml`` from elsewhere: docs/changelog.md includes CHANGELOG.md (a snippet)
    from beside mkdocs.yml, not from the current directory; rendered here with the site's own Markdown settings."""
    config_module = pytest.importorskip("mkdocs.config", reason="mkdocs is the docs extra")
    import markdown

    monkeypatch.chdir(tmp_path)  # nothing to include here
    config = config_module.load_config(str(REPO_ROOT / "mkdocs.yml"))
    md = markdown.Markdown(extensions=config["markdown_extensions"], extension_configs=config["mdx_configs"])
    html = md.convert((REPO_ROOT / "docs" / "changelog.md").read_text(encoding="utf-8"))
    first_version = re.search(r"^## (.+)$", (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)[1]
    assert "What each version of ddp_utils changed" in html and first_version.split()[0] in html
