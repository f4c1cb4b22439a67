"""The arrows of docs/architecture.md that must never exist, checked on every import statement of the tree
(module level and inside functions alike): the library, the service and the benchmarks; the lab (experiments/)
may import any of them, nothing of them imports the lab."""

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
    ("server.api", "server.store", "routes talk to the runtime's services, never to the store"),
    ("server.api", "server.db", "routes talk to the runtime's services, never to tables, engines or migrations"),
    ("server.api", "sqlalchemy", "no SQL above the store"),
    ("server.runtime", "server.api", "the services know nothing of HTTP"),
    ("server.store", "server.runtime", "the store keeps records; it does not call the services built on it"),
    ("server.store", "server.api", "the store knows nothing of HTTP"),
    ("server.db", "server.runtime", "tables and migrations do not call the services built on them"),
    ("server.db", "server.api", "tables and migrations know nothing of HTTP"),
    ("sia", "experiments", "the library never imports the lab's probes"),
    ("server", "experiments", "the service never imports the lab's probes"),
    ("benchmarks", "experiments", "benchmarks measure what ships, never a probe of the lab"),
]
CHECKED = ("sia", "server", "benchmarks", "experiments")  # the parts whose imports are read

ROUTES = "server.api.routes"
# the one aggregator: /admin (routes/admin.py) includes the admin routers, the modules named routes/admin_*.py
ROUTE_AGGREGATORS = {f"{ROUTES}.admin": f"{ROUTES}.admin_"}


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
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from sia import commands` names sia.commands
    return names


def inside(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for top in CHECKED for p in (root / top).rglob("*.py"))


def crossings(root: Path = ROOT) -> list[str]:
    found = []
    for path in sources(root):
        importer = module_name(path, root)
        for target in sorted(imported(path, root)):
            for part, never, why in FORBIDDEN:
                if inside(importer, part) and inside(target, never):
                    found.append(f"{importer} imports {target}: {why}")
    return found


def route_crossings(root: Path = ROOT) -> list[str]:
    """Routes that import another route (shared helpers belong in server/api/, not in a route file)."""
    found = []
    for path in sources(root):
        importer = module_name(path, root)
        if not inside(importer, ROUTES) or importer == ROUTES:
            continue
        for target in sorted(imported(path, root)):
            if target == ROUTES or not inside(target, ROUTES) or inside(target, importer):
                continue  # the routes package itself names no route; a module may name its own members
            allowed = ROUTE_AGGREGATORS.get(importer)
            if allowed is not None and target.startswith(allowed):
                continue
            found.append(f"{importer} imports {target}: a route imports no other route")
    return found


def test_the_tree_is_read() -> None:
    # the check sees the arrows that do exist: a walk that found nothing would pass vacuously
    assert len(sources()) > 40
    assert "sia.model.config" in imported(ROOT / "sia" / "identity" / "state.py")
    assert "sia.commands" in imported(ROOT / "server" / "cli.py")
    assert "server.launcher.serving" in imported(ROOT / "benchmarks" / "http.py")
    assert any(inside(module_name(p), "experiments.probes") for p in sources())


def test_no_import_crosses_a_forbidden_arrow() -> None:
    assert crossings() == []


def test_no_route_imports_another_route() -> None:
    assert route_crossings() == []
    # the aggregator's includes are seen (and allowed), so the check is not vacuous
    assert f"{ROUTES}.admin_personas" in imported(ROOT / "server" / "api" / "routes" / "admin.py")


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


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("server/api/routes/probe.py", "from server.store import Store\n", "server.api.routes.probe imports server.store"),
        ("server/api/probe.py", "def f():\n    from sqlalchemy import text\n", "server.api.probe imports sqlalchemy"),
        ("server/api/probe.py", "from ..db import tables\n", "server.api.probe imports server.db.tables"),
        ("server/runtime/probe.py", "from server.api.errors import ApiError\n", "server.runtime.probe imports server.api"),
        ("server/store.py", "from server.runtime.turns import TurnRunner\n", "server.store imports server.runtime.turns"),
        ("server/db/probe.py", "import server.api.deps\n", "server.db.probe imports server.api.deps"),
    ],
)
def test_a_server_crossing_is_caught(tmp_path: Path, where: str, source: str, expected: str) -> None:
    (tmp_path / where).parent.mkdir(parents=True)
    (tmp_path / where).write_text(source)
    (tmp_path / "server" / "fine.py").write_text("from server.store import Store\nfrom server.api.deps import AdminDep\n")
    assert [line for line in crossings(tmp_path) if expected in line] != []
    assert all("fine" not in line for line in crossings(tmp_path))


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("sia/model/probe.py", "import experiments.probes.deformation\n", "sia.model.probe imports experiments.probes"),
        ("server/runtime/probe.py", "from experiments.probes import recall_misses\n", "server.runtime.probe imports experiments"),
        ("benchmarks/probe.py", "def f():\n    from experiments import probes\n", "benchmarks.probe imports experiments.probes"),
        ("benchmarks/sub/probe.py", "from ...experiments import probes\n", "benchmarks.sub.probe imports experiments"),
    ],
)
def test_an_import_of_the_lab_is_caught(tmp_path: Path, where: str, source: str, expected: str) -> None:
    # the library, the service and the benchmarks never import experiments/; experiments/ imports any of them
    (tmp_path / where).parent.mkdir(parents=True)
    (tmp_path / where).write_text(source)
    (tmp_path / "experiments" / "probes").mkdir(parents=True)
    (tmp_path / "experiments" / "probes" / "fine.py").write_text(
        "from sia.checkpoint import load_model\nfrom benchmarks.machine import machine_info\nimport server.launcher\n"
    )
    assert [line for line in crossings(tmp_path) if expected in line] != []
    assert all("fine" not in line for line in crossings(tmp_path))


def test_a_route_importing_a_route_is_caught(tmp_path: Path) -> None:
    routes = tmp_path / "server" / "api" / "routes"
    routes.mkdir(parents=True)
    (routes / "chat.py").write_text("from server.api.routes.admin_personas import OCTET_STREAM_BODY\n")
    (routes / "openai.py").write_text("from .chat import check_limits\n")
    (routes / "admin.py").write_text("from server.api.routes import admin_identities, admin_personas\n")
    (routes / "admin_personas.py").write_text("from server.api.bodies import OCTET_STREAM_BODY\n")
    (routes / "admin_identities.py").write_text("from server.api.routes import health\n")
    assert sorted(route_crossings(tmp_path)) == [
        "server.api.routes.admin_identities imports server.api.routes.health: a route imports no other route",
        "server.api.routes.chat imports server.api.routes.admin_personas.OCTET_STREAM_BODY: a route imports no other route",
        "server.api.routes.chat imports server.api.routes.admin_personas: a route imports no other route",
        "server.api.routes.openai imports server.api.routes.chat.check_limits: a route imports no other route",
        "server.api.routes.openai imports server.api.routes.chat: a route imports no other route",
    ]
