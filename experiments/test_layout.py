"""The layout of ``experiments/`` as tests (issue 40 item 7), read from the source with ``ast`` (nothing is imported):
no import cycle, lazy imports inside functions included; the protocol runs training through gtpo's application
layer (``gtpo.app``), never through its CLI (the legacy suite too); no protocol module grows past the project's ~700-line yardstick."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
PROTOCOL = EXPERIMENTS / "protocol"


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in EXPERIMENTS.rglob("*.py")}


def _imported(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, anywhere in the file: ``from X import a`` counts as X and X.a, relative
    imports resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


MODULES = _modules()
IMPORTS = {name: _imported(name, path) for name, path in MODULES.items()}
GRAPH = {name: sorted(m for m in targets if m in MODULES and m != name) for name, targets in IMPORTS.items()}


def _reachable(start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(GRAPH[start])
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo += GRAPH[v]
    return seen


def test_the_graph_sees_lazy_imports():
    # report.document imports its sections at the top; claim2's runner imports tinyruns inside functions
    assert "experiments.protocol.report.claim7_attribution" in GRAPH["experiments.protocol.report.document"]
    assert "experiments.protocol.tinyruns" in GRAPH["experiments.protocol.claim1"]


def test_no_import_cycle_in_experiments():
    assert sorted(m for m in GRAPH if m in _reachable(m)) == []


def test_the_experiments_train_through_the_application_layer():
    assert [m for m in MODULES if "gtpo.cli" in IMPORTS[m] or "gtpo.cli.train_main" in IMPORTS[m]] == []
    assert "gtpo.app" in IMPORTS["experiments.protocol.tinyruns"]


def test_no_protocol_module_over_700_lines():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in PROTOCOL.rglob("*.py")}
    assert {f: n for f, n in sizes.items() if n > 700} == {}
