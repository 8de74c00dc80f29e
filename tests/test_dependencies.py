"""What headwater imports is what pyproject.toml declares.

``pip install headwater`` installs the core dependencies only. A module that imports a
package it does not declare works in a development environment, where something else
brought that package in, and fails for users: typer stopped depending on click, and the
CLI, which imported click, no longer started after a plain install. So: every package the
code imports is declared (in the core or in an extra), and what the core loads
(``import headwater``, the CLI, the broker) needs nothing beyond the core dependencies and
what they depend on themselves.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: what ``import headwater``, the CLI and ``headwater serve`` load
CORE_ENTRY_POINTS = ["headwater", "headwater.cli.main", "headwater.broker.run", "headwater.broker.server"]


def _name(requirement: str) -> str:
    return _normal(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(extras: bool) -> set[str]:
    names = {_name(r) for r in PYPROJECT["dependencies"]}
    if extras:
        for extra, requirements in PYPROJECT["optional-dependencies"].items():
            if extra != "dev":
                names |= {_name(r) for r in requirements}
    return names


def _with_their_dependencies(names: set[str]) -> set[str]:
    """``names`` and everything they require when installed without extras."""
    from packaging.requirements import Requirement

    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_normal(req.name))
    return seen


def _distributions(module: str) -> set[str]:
    """The distributions that provide top-level module ``module`` (its own name when none
    installed does)."""
    return {_normal(d) for d in metadata.packages_distributions().get(module, [module])}


def _third_party(modules) -> set[str]:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    return {m for m in modules if m not in stdlib and m != "headwater" and not m.startswith("_")}


def _imported_anywhere() -> dict[str, list[str]]:
    """Top-level modules imported by any file of the package: ``{module: [files]}``."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "headwater").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], []).append(str(path.relative_to(ROOT)))
    return found


def test_every_package_the_code_imports_is_declared():
    declared = _declared(extras=True)
    imported = _imported_anywhere()
    missing = {m: imported[m][:3] for m in _third_party(imported) if not _distributions(m) & declared}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_every_extra_brings_packages_the_code_imports():
    imported = {d for m in _third_party(_imported_anywhere()) for d in _distributions(m)}
    for extra, requirements in PYPROJECT["optional-dependencies"].items():
        if extra != "dev":  # the test tools
            unused = {_name(r) for r in requirements} - imported
            assert not unused, f"the extra {extra!r} installs {sorted(unused)}, which nothing in headwater imports"


def test_the_core_loads_only_core_dependencies():
    pytest.importorskip("packaging", reason="reads the installed packages' requirements")
    code = f"import importlib, sys; [importlib.import_module(m) for m in {CORE_ENTRY_POINTS!r}]; print(*sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    allowed = _with_their_dependencies(_declared(extras=False))
    top = _third_party({m.split(".")[0] for m in loaded})
    beyond = {m: sorted(_distributions(m)) for m in top if not _distributions(m) & allowed}
    assert not beyond, f"the core loads packages that only an extra (or nothing) declares: {beyond}"
