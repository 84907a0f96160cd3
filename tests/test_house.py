"""The house rules the code can check itself (docs/design.md writes them down for a newcomer): no import circle
between files, every import pointing down the floors (the step in engine/, the run above it in run/, evolve/ on the
run, cli/ on top), only distributed/ reading the launcher's variables and nothing reading the environment at import,
train.py in labelled stages of short functions, no module ``__getattr__``, nothing below cli/ importing it.

train.py stays a story a reader holds at once (at most 280 lines), each function of it and of the package on a
screen (60 lines) and a module at most 450 lines: when a cap is near, the code is telling that a piece wants a
module of its own (the options left train.py for run/options.py, the saves for run/saves.py, the build order for
run/training.py), not that lines want squeezing."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ddp_utils"
TRAIN = PACKAGE.parent / "train.py"
DESIGN = PACKAGE.parent / "docs" / "design.md"  # the house as a newcomer reads it: the floors, the rules
MAX_FUNCTION_LINES = 60  # a function on a screen, in train.py and the package
MAX_TRAIN_LINES = 280
MAX_MODULE_LINES = 450

# The rooms of the package (a top-level module or folder), floor by floor: a room imports only rooms on lower
# floors. "ddp_utils" is the package's face (its __init__.py, which re-exports the public names).
FLOORS = {
    1: {"log", "files", "yamls", "boxes", "host", "progress", "version"},  # the bottom: imports nothing of the package
    2: {"distributed", "hyp", "downloads"},
    3: {"seed", "device"},
    4: {"data", "yolo", "profiling"},  # data/ never imports yolo/ (the same floor)
    5: {"engine"},  # the step
    6: {"run"},  # the run around the step
    7: {"evolve"},  # many runs
    8: {"ddp_utils"},
    9: {"cli"},  # the commands, over the face
    10: {"__main__"},  # python -m ddp_utils: names the commands
}


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its __init__.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, at the top or inside a function (a lazy import still binds)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                bases = [".".join([*anchor, node.module] if node.module else anchor)]
            else:
                bases = [node.module or ""]
            names = [alias.name for alias in node.names]
        else:
            continue
        for base in bases:
            if base in known:
                targets.add(base)
            for imported in names:  # `from . import foo` and `from .pkg import submodule` import a file
                if f"{base}.{imported}" in known:
                    targets.add(f"{base}.{imported}")
    targets.discard(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_imports_it_should():
    graph = import_graph()
    assert "ddp_utils.data.dataset" in graph["ddp_utils.data.loader"]  # from .dataset import ...
    assert "ddp_utils.distributed" in graph["ddp_utils.data.loader"]  # from ..distributed import ...
    assert "ddp_utils.yolo.model" in graph["ddp_utils.yolo"]  # a package imports its modules
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_between_files():
    assert cycles(import_graph()) == []


def room_of(module: str) -> str:
    """``ddp_utils.run.checkpoint.disk`` -> ``run``; the package's face is ``ddp_utils``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_import_points_down_the_floors():
    floor = {room: number for number, rooms in FLOORS.items() for room in rooms}
    graph = import_graph()
    assert {room_of(name) for name in graph} == set(floor), "a room without a floor: add it to FLOORS"
    upward = sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if room_of(name) != room_of(target) and floor[room_of(target)] >= floor[room_of(name)]
    )
    assert upward == [], f"imports that point up or across a floor: {upward}"


def test_the_step_knows_nothing_of_the_run():
    """engine/ computes a step: no file, signal or option of the run reaches it (docs/design.md)."""
    step_modules = {name: path for name, path in modules().items() if room_of(name) == "engine"}
    run_modules = r"(?:signal|argparse|os|pathlib|shutil|tempfile)"  # signals, options, files, the environment
    imports = re.compile(rf"^\s*(?:import {run_modules}\b|from {run_modules} import)", re.M)
    reads_or_writes = re.compile(r"\bopen\(|torch\.(?:save|load)\(|environ")
    offenders = [
        name
        for name, path in step_modules.items()
        if imports.search(code := path.read_text()) or reads_or_writes.search(code)
    ]
    assert offenders == []


def test_nothing_below_cli_imports_it():
    graph = import_graph()
    importers = {
        name
        for name, targets in graph.items()
        if any(t == "ddp_utils.cli" or t.startswith("ddp_utils.cli.") for t in targets)
        and not (name.startswith("ddp_utils.cli") or name == "ddp_utils.__main__")
    }
    assert importers == set()
    by_name = [
        n for n, p in modules().items() if '"ddp_utils.cli.' in p.read_text() and not n.startswith("ddp_utils.cli")
    ]
    assert by_name == ["ddp_utils.__main__"]  # the dispatcher names the command modules, by string


def test_no_module_getattr():
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("__getattr__", "__dir__")
    ]
    assert offenders == []


def test_train_py_is_a_story_and_no_module_is_too_long():
    assert len(TRAIN.read_text().splitlines()) <= MAX_TRAIN_LINES
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def long_functions(path: Path) -> dict[str, int]:
    """The functions (methods, nested ones) of a file over the cap, by name, with their lines (docstring included)."""
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }


def test_no_function_of_the_package_is_over_a_screen():
    found = {name: long for name, path in modules().items() if (long := long_functions(path))}
    assert found == {}, f"functions over {MAX_FUNCTION_LINES} lines: let a helper be born ({found})"


def test_the_function_cap_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path / "long.py") == {"long": MAX_FUNCTION_LINES + 1}


def test_train_py_functions_are_short():
    source = TRAIN.read_text()
    assert long_functions(TRAIN) == {}
    assert "# fmt: skip" not in source and "SimpleNamespace" not in source


def test_train_py_main_reads_as_labelled_stages():
    """main (the launch, the process group's lifetime), then train_run (one run in it: --evolve calls it per trial)."""
    tree = ast.parse(TRAIN.read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    lines = [
        line
        for name in ("main", "train_run")
        for line in TRAIN.read_text().splitlines()[functions[name].lineno - 1 : functions[name].end_lineno]
    ]
    stages = [re.search(r"# ---- (\w+)", line).group(1) for line in lines if "# ---- " in line]
    assert stages == ["launch", "resume", "data", "model", "optimizer", "epochs"], stages
    assert any(isinstance(node, (ast.For, ast.While)) for node in ast.walk(tree)), "the epoch loop is written out"


def test_every_package_of_the_house_ships_in_the_wheel():
    """pyproject.toml lists the packages a wheel holds by name: a new room missing there installs without its code."""
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    listed = set(re.findall(r'^\s+"(ddp_utils[\w.]*)",$', pyproject.split("packages = [", 1)[1].split("]", 1)[0], re.M))
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert packages - listed == set(), (
        f"packages missing from pyproject.toml's [tool.setuptools] packages: {packages - listed}"
    )


# Modules renamed or moved so that a name says the one job of its module: the public names they hold still import
# from where they were public (the package's face, a room's __init__), as the same objects.
MOVED = {
    # was run/checkpoint/files.py, a name it shared with files.py (the bottom's temporary files)
    "ddp_utils.run.checkpoint.disk": (
        ("ddp_utils.run.checkpoint", "ddp_utils.run"),
        ("BackgroundWriter", "atomic_torch_save", "atomic_write_bytes", "load_checkpoint", "save_checkpoint"),
    ),
    # increment_path (YOLOv5's name) was in run/loggers.py: the run directory's name now has a module of its own
    "ddp_utils.run.run_dir": (("ddp_utils", "ddp_utils.run"), ("increment_path",)),
}


def test_moved_modules_keep_their_public_names_where_they_were_public():
    for name, (faces, public) in MOVED.items():
        module = importlib.import_module(name)
        for face in map(importlib.import_module, faces):
            assert {n: getattr(face, n, None) for n in public} == {n: getattr(module, n) for n in public}, face
            assert set(public) <= set(face.__all__), face
    assert not (PACKAGE / "run" / "checkpoint" / "files.py").exists()


# The launcher's variables (torchrun's, SLURM's, torchelastic's): only distributed/ reads them (DistInfo carries them)
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK"}
LAUNCHER_VARIABLES |= {"MASTER_ADDR", "MASTER_PORT"}
LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_")


def launcher_names(path: Path) -> set[str]:
    """The launcher variables a file names as a string of its own (a key it reads or sets)."""
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in LAUNCHER_VARIABLES or node.value.startswith(LAUNCHER_PREFIXES))
    }


def environment_reads_at_import(path: Path) -> list[int]:
    """Lines that touch ``os.environ`` or ``os.getenv`` when the module is imported (outside any function)."""

    def run_at_import(nodes: list[ast.stmt]):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # a function's body runs when called (its defaults at import: rare enough to leave)
            if isinstance(node, ast.ClassDef):
                yield from run_at_import(node.body)
                continue
            for sub in ast.walk(node):
                name = sub.attr if isinstance(sub, ast.Attribute) else sub.id if isinstance(sub, ast.Name) else ""
                if name in ("environ", "getenv"):
                    yield sub.lineno

    return sorted(set(run_at_import(ast.parse(path.read_text()).body)))


def test_only_distributed_reads_the_launchers_variables_and_nothing_reads_the_environment_at_import():
    named = {
        name: found
        for name, path in modules().items()
        if room_of(name) != "distributed" and (found := launcher_names(path))
    }
    assert named == {}, f"launcher variables read outside distributed/ (take a DistInfo instead): {named}"
    at_import = {name: lines for name, path in modules().items() if (lines := environment_reads_at_import(path))}
    assert at_import == {}, f"the environment read at import time (read it when called): {at_import}"
    assert "RANK" in launcher_names(PACKAGE / "distributed" / "env.py")  # the check sees where they are read


def test_the_launcher_and_import_checks_see_what_they_look_for(tmp_path):
    (tmp_path / "m.py").write_text(
        'import os\nLEVEL = os.environ.get("X")\n\n\ndef rank():\n    return int(os.environ["LOCAL_RANK"])\n\n\n'
        'class C:\n    home = os.getenv("HOME")\n'
    )
    assert launcher_names(tmp_path / "m.py") == {"LOCAL_RANK"}
    assert environment_reads_at_import(tmp_path / "m.py") == [2, 10]


def floors_in_the_design() -> dict[int, set[str]]:
    """docs/design.md's table of floors as {floor: rooms}: ``run/`` -> ``run``, ``__init__.py`` -> the face."""
    found = {}
    for floor, rooms in re.findall(r"^\| (\d+) \| ([^|]+) \|", DESIGN.read_text(encoding="utf-8"), re.M):
        names = {name.removesuffix(".py").rstrip("/") for name in re.findall(r"`([^`]+)`", rooms)}
        found[int(floor)] = {"ddp_utils" if name == "__init__" else name for name in names}
    return found


def test_the_house_is_written_where_a_newcomer_finds_it():
    """docs/design.md (in the site, linked from the README) draws the same floors this test enforces, with its caps."""
    assert floors_in_the_design() == FLOORS
    text = " ".join(DESIGN.read_text(encoding="utf-8").split())
    for cap in (f"({MAX_FUNCTION_LINES} lines", f"at most {MAX_MODULE_LINES}", f"at most {MAX_TRAIN_LINES}"):
        assert cap in text, cap
    for where in ("README.md", "docs/development.md", "docs/index.md", "mkdocs.yml"):
        assert "design.md" in (PACKAGE.parent / where).read_text(encoding="utf-8"), where
