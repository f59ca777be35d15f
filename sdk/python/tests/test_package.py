"""The package's surface: lazy exports, the type information it ships, ``python3 -m monkeytree``."""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

import monkeytree
from monkeytree.__main__ import main

PACKAGE = Path(monkeytree.__file__).parent
ROOT = PACKAGE.parents[2]


def _type_checking_imports() -> dict[str, str]:
    """Name to module of each ``from .module import name as name`` under ``if TYPE_CHECKING:``."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom)
                assert statement.level == 1
                assert statement.module is not None
                for alias in statement.names:
                    assert alias.asname == alias.name, f"{alias.name}: re-export it as `{alias.name} as {alias.name}`"
                    found[alias.name] = statement.module
    return found


def test_type_checkers_see_every_lazy_export_from_its_module() -> None:
    assert _type_checking_imports() == monkeytree._EXPORTS


def test_lazy_exports_resolve_and_unknown_names_do_not() -> None:
    assert monkeytree.__all__ == sorted(monkeytree._EXPORTS)
    for name, module in monkeytree._EXPORTS.items():
        assert getattr(monkeytree, name).__module__ == f"monkeytree.{module}"
    assert set(monkeytree._EXPORTS) <= set(dir(monkeytree))
    with pytest.raises(AttributeError, match="module 'monkeytree' has no attribute 'nothing'"):
        _ = monkeytree.nothing


def test_the_package_ships_py_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["monkeytree"]


def test_the_version_is_package_json_s() -> None:
    assert monkeytree.__version__ == json.loads((ROOT / "package.json").read_text())["version"]


def test_main_prints_the_version_and_help_or_refuses_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"monkeytree {monkeytree.__version__}\n"
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python3 -m monkeytree (--version | --help)\n")
    assert main(["--verbose"]) == 2
    assert capsys.readouterr().err == "python3 -m monkeytree: expected --version or --help, got --verbose\n"
    assert main([]) == 2
    assert capsys.readouterr().err.endswith("got no arguments\n")


def test_the_layout_module_needs_no_torch() -> None:
    # layout.py is the standard-library reader; nothing it imports may pull torch in.
    tree = ast.parse((PACKAGE / "layout.py").read_text())
    imported = {alias.name.split(".")[0]
                for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported - {"typing_extensions"} <= set(sys.stdlib_module_names)
