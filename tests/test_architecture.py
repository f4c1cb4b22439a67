"""The arrows of docs/architecture.md that must never exist, checked on every import statement of the tree
(module level and inside functions alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (the importing part, the part it must never import, why)
FORBIDDEN: list[tuple[str, str, str]] = [
    ("sia", "server", "the library knows nothing of the service built on it"),
    ("sia.model", "sia.learn", "the model does not depend on how it is taught"),
    ("sia.identity", "sia.learn", "identity dynamics do not depend on how they are taught"),
    ("sia.backbones", "sia.learn", "a backbone does not depend on how its adapter is taught"),
    ("sia.personas", "sia.learn", "personas are the service's data, not the corpus's"),
    ("sia.checkpoint", "sia.learn", "loading a model needs no training code"),
    ("server", "sia.learn", "serving never imports the training corpus or trainers"),
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, root: Path = ROOT) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in the file names (relative imports resolved)."""
    names: set[str] = set()
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from sia import cli` names sia.cli
    return names


def inside(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for top in ("sia", "server") for p in (root / top).rglob("*.py"))


def crossings(root: Path = ROOT) -> list[str]:
    found = []
    for path in sources(root):
        importer = module_name(path, root)
        for target in sorted(imported(path, root)):
            for part, never, why in FORBIDDEN:
                if inside(importer, part) and inside(target, never):
                    found.append(f"{importer} imports {target}: {why}")
    return found


def test_the_tree_is_read() -> None:
    # the check sees the arrows that do exist: a walk that found nothing would pass vacuously
    assert len(sources()) > 40
    assert "sia.model.config" in imported(ROOT / "sia" / "identity" / "state.py")
    assert "sia.cli" in imported(ROOT / "server" / "cli.py")


def test_no_import_crosses_a_forbidden_arrow() -> None:
    assert crossings() == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from sia.learn.adapter import facts\n", "sia.model.probe imports sia.learn.adapter.facts"),
        ("def f():\n    import server.store\n", "sia.model.probe imports server.store"),
        ("from ..learn import corpus\n", "sia.model.probe imports sia.learn.corpus"),
    ],
)
def test_a_crossing_is_caught(tmp_path: Path, source: str, expected: str) -> None:
    # a library module that imports what it must not (at module level, in a function, relatively) is reported
    (tmp_path / "sia" / "model").mkdir(parents=True)
    (tmp_path / "sia" / "model" / "probe.py").write_text(source)
    (tmp_path / "sia" / "model" / "fine.py").write_text("from sia.model.config import ModelConfig\n")
    assert [line for line in crossings(tmp_path) if expected in line] != []
    assert all("fine" not in line for line in crossings(tmp_path))
