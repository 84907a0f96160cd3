"""``python -m ddp_utils <command>`` and the ``ddp-<command>`` scripts, run as the README and docs/ show them."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ddp_utils.__main__ import COMMANDS
from tests.multiproc import REPO_ROOT

pytestmark = pytest.mark.timeout(300)


def run(*args: str, script: str | None = None) -> subprocess.CompletedProcess:
    if script is None:
        cmd = [sys.executable, "-m", "ddp_utils", *args]
    else:  # what a console script does: its name in argv[0], then ddp_utils.__main__:script
        code = f"import sys; sys.argv[0] = {script!r}; from ddp_utils.__main__ import script; sys.exit(script())"
        cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_help_lists_every_command():
    done = run("--help")
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^  (\w+) ", done.stdout, re.M)
    assert listed == ["val", "convert", "profile"] == list(COMMANDS)


@pytest.mark.slow
def test_no_command_and_an_unknown_one_are_one_line_and_exit_2():
    done = run()
    assert done.returncode == 2 and done.stderr.startswith("usage: python -m ddp_utils <command>")
    done = run("train")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "python -m ddp_utils train: error: unknown command 'train' (choose from val, convert, profile)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_answers_help_under_its_form(command):
    done = run(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m ddp_utils {command} ")
    scripted = run("--help", script=f"/venv/bin/ddp-{command}")
    assert scripted.returncode == 0, scripted.stderr
    assert scripted.stdout.startswith(f"usage: ddp-{command} ")


@pytest.mark.slow
def test_convert_refuses_a_missing_file_in_one_line(tmp_path):
    missing = tmp_path / "nope.pt"
    for done in (run("convert", str(missing)), run(str(missing), script="ddp-convert")):
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert str(missing) in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "args"),
    [("val", ["--weights", "missing.pt"]), ("convert", ["missing.pt"]), ("profile", ["--cfg", "missing.yaml"])],
)
def test_an_error_names_the_command_as_it_was_typed(command, args):
    module_form, script_form = f"python -m ddp_utils {command}", f"ddp-{command}"
    typed = {module_form: run(command, *args), script_form: run(*args, script=script_form)}
    for form, done in typed.items():
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        errors = [line for line in done.stderr.splitlines() if ": error: " in line]
        assert len(errors) == 1 and errors[0].startswith(f"{form}: error: "), done.stderr


@pytest.mark.slow
def test_profile_runs_a_model_on_the_cpu():
    done = run("profile", "--cfg", "yolov5n.yaml", "--imgsz", "64", "--device", "cpu", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    assert "GFLOPs" in done.stdout + done.stderr


def test_the_readme_and_docs_use_the_one_form():
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    readme = "\n".join(page.read_text() for page in pages)
    assert not re.search(r"python -m ddp_utils\.\w", readme), "an old command form is left in the README or docs/"
    assert not re.search(r"-m ddp_utils\.cli", readme)
    used = set(re.findall(r"-m ddp_utils (\w+)", readme))
    assert used and used <= set(COMMANDS), used - set(COMMANDS)
    scripts = re.findall(
        r"^ddp-(\w+) = \"ddp_utils.__main__:script\"$", (REPO_ROOT / "pyproject.toml").read_text(), re.M
    )
    assert scripts == list(COMMANDS)
