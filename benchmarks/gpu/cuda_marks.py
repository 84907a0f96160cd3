"""Which tests need CUDA, read from the test files' source: no import, no collection (collecting the suite takes
20 s on a loaded 2-core host; this takes well under one).

A test needs CUDA when a ``skipif`` on it (its own decorator, its class's, the module's ``pytestmark``, or a module
name bound to such a mark) skips it on a host without CUDA and runs it on a host with one, or when a
``if <condition>: pytest.skip(...)`` at the top of its body does. A condition is judged by evaluating it twice
with a stand-in ``torch`` whose ``cuda.is_available()`` / ``cuda.device_count()`` answer as a CPU-only host
(False, 0) and as a host with GPUs (True, 8); module-level names it reads (``CUDA = torch.cuda.is_available()``)
are evaluated the same way. A ``skipif`` whose condition reads anything else cannot be judged: it counts as
needing CUDA when its source or reason names CUDA or a GPU (the safe side: the marker costs nothing).

The GPU check runs the tests that carry ``@pytest.mark.cuda`` (``python -m pytest -m cuda``); a fast test
(``tests/test_benchmarks_gpu_check.py``) fails on any test that needs CUDA and lacks the marker.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NAMES_CUDA = re.compile(r"cuda|gpu", re.IGNORECASE)


@dataclass(frozen=True)
class ScannedTest:
    """One test function: where it is, whether it carries ``pytest.mark.cuda``, whether it needs CUDA."""

    path: str
    name: str
    line: int
    marked: bool
    needs_cuda: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}"


class _Unjudged(Exception):
    """A condition that reads more than torch.cuda and module names."""


def _stand_in_torch(cuda: bool) -> SimpleNamespace:
    devices = 8 if cuda else 0
    return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: cuda, device_count=lambda: devices))


def _evaluate(expr: ast.expr, module: dict[str, ast.expr], cuda: bool, depth: int = 0) -> Any:
    """``expr``'s value on a host with (``cuda``) or without CUDA; :class:`_Unjudged` when it reads anything else."""
    if depth > 8:
        raise _Unjudged("too deep")
    names: dict[str, Any] = {"torch": _stand_in_torch(cuda)}
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id not in names and node.id in module:
            names[node.id] = _evaluate(module[node.id], module, cuda, depth + 1)
    try:
        code = compile(ast.Expression(body=expr), "<condition>", "eval")
        return eval(code, {"__builtins__": {}}, names)  # our own test files, no builtins
    except Exception as exc:
        raise _Unjudged(str(exc)) from None


def _skips_without_cuda_only(condition: ast.expr, module: dict[str, ast.expr]) -> bool:
    return bool(_evaluate(condition, module, cuda=False)) and not _evaluate(condition, module, cuda=True)


def _is_mark(node: ast.expr, name: str) -> bool:
    """``pytest.mark.<name>``, called or not."""
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target) == f"pytest.mark.{name}"


def _flatten(node: ast.expr, module: dict[str, ast.expr], depth: int = 0) -> list[ast.expr]:
    """The marks an expression stands for: a mark, a list or tuple of them, or a module name bound to either."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [mark for element in node.elts for mark in _flatten(element, module, depth)]
    if isinstance(node, ast.Name) and node.id in module and depth < 8:
        return _flatten(module[node.id], module, depth + 1)
    return [node]


def _mark_needs_cuda(mark: ast.expr, module: dict[str, ast.expr]) -> bool:
    if not (_is_mark(mark, "skipif") and isinstance(mark, ast.Call)):
        return False
    condition = mark.args[0] if mark.args else next((k.value for k in mark.keywords if k.arg == "condition"), None)
    if condition is None:
        return False
    try:
        return _skips_without_cuda_only(condition, module)
    except _Unjudged:
        return bool(NAMES_CUDA.search(ast.unparse(mark)))


def _body_skips_without_cuda(function: ast.FunctionDef, module: dict[str, ast.expr]) -> bool:
    """``if <condition>: pytest.skip(...)`` at the top of the body, whose condition holds only without CUDA."""
    for statement in function.body:
        if not isinstance(statement, ast.If):
            continue
        skips = any(isinstance(s, ast.Expr) and ast.unparse(s.value).startswith("pytest.skip(") for s in statement.body)
        if skips:
            try:
                if _skips_without_cuda_only(statement.test, module):
                    return True
            except _Unjudged:
                continue  # reads the test's own values (a parameter): not a host condition
    return False


def _module_names(tree: ast.Module) -> dict[str, ast.expr]:
    names: dict[str, ast.expr] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Name):
                names[target.id] = statement.value
    return names


def _tests_in(tree: ast.Module) -> list[tuple[ast.FunctionDef, list[ast.expr]]]:
    """Each test function with its class's decorators (module level: none)."""
    found: list[tuple[ast.FunctionDef, list[ast.expr]]] = []
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef) and statement.name.startswith("test"):
            found.append((statement, []))
        elif isinstance(statement, ast.ClassDef) and statement.name.startswith("Test"):
            for item in statement.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    found.append((item, list(statement.decorator_list)))
    return found


def scan_file(path: Path, root: Path | None = None) -> list[ScannedTest]:
    """Every test function of one test file, with its marker and whether it needs CUDA."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = _module_names(tree)
    module_marks = _flatten(module["pytestmark"], module) if "pytestmark" in module else []
    shown = str(path.relative_to(root)) if root else str(path)
    results = []
    for function, class_marks in _tests_in(tree):
        marks = [m for node in [*function.decorator_list, *class_marks] for m in _flatten(node, module)]
        marks += module_marks
        needs = any(_mark_needs_cuda(mark, module) for mark in marks) or _body_skips_without_cuda(function, module)
        marked = any(_is_mark(mark, "cuda") for mark in marks)
        results.append(ScannedTest(shown, function.name, function.lineno, marked, needs))
    return results


def scan(tests_dir: Path) -> list[ScannedTest]:
    """Every test function of ``tests_dir/**/test_*.py``."""
    root = tests_dir.parent
    return [test for path in sorted(tests_dir.rglob("test_*.py")) for test in scan_file(path, root)]


def unmarked(tests: list[ScannedTest]) -> list[ScannedTest]:
    """The tests that need CUDA and lack ``@pytest.mark.cuda``: ``python -m pytest -m cuda`` would miss them."""
    return [test for test in tests if test.needs_cuda and not test.marked]
