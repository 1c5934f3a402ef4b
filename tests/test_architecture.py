"""The architecture as tests (issue 28): one home for the GTPO composition that every engine calls, an application
layer the CLI calls, no import cycle, no module importing the CLI, one loss signature. Read from the source with
``ast``; nothing is imported but the loss table."""

from __future__ import annotations

import ast
import os
import inspect
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "gtpo"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, modules) -> tuple[set[str], set[tuple[str, str]]]:
    """Modules of the package ``name`` imports (anywhere in the file, lazy imports included) and the
    ``(module, imported name)`` pairs of its ``from X import a`` statements."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets, names = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            candidates = [module] + [f"{module}.{a.name}" for a in node.names]
            names |= {(module, a.name) for a in node.names}
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        targets |= {c for c in candidates if c in modules and c != name}
    return targets, names


MODULES = _modules()
GRAPH = {name: _imports(name, path, MODULES) for name, path in MODULES.items()}


def test_no_import_cycle_in_the_package():
    # Tarjan's strongly connected components over every import, lazy ones included
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v][0]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_module_imports_the_cli():
    assert [m for m, (targets, _) in GRAPH.items() if "gtpo.cli" in targets and m != "gtpo.cli"] == []


@pytest.mark.parametrize("engine", ["gtpo.trainer", "gtpo.integrations.trl"])
def test_engines_call_the_method_module_and_hold_no_copy_of_its_composition(engine):
    # an engine is a module or a package (gtpo.integrations.trl: its config and its trainer): all its modules
    parts = [GRAPH[m] for m in GRAPH if m == engine or m.startswith(engine + ".")]
    targets, names = set().union(*(t for t, _ in parts)), set().union(*(n for _, n in parts))
    assert "gtpo.maths.method" in targets
    composed = {("gtpo.maths.conflict", "conflict_weights"), ("gtpo.maths.conflict", "conflict_runs"),
                ("gtpo.maths.advantages", "entropy_control"), ("gtpo.maths.advantages", "shape_advantages"),
                ("gtpo.maths.advantages", "sign_mask"), ("gtpo.maths.advantages", "varying_groups"),
                ("gtpo.maths.losses", "gtpo_loss")}
    assert names & composed == set()  # the pieces reach the engines only through gtpo.maths.method / POLICY_LOSSES


def test_the_cli_calls_the_application_layer():
    targets, _ = GRAPH["gtpo.cli"]
    assert "gtpo.app.training" in targets or "gtpo.app" in targets
    assert not any(t == e or t.startswith(e + ".") for t in targets for e in ("gtpo.trainer", "gtpo.integrations.trl"))


def test_every_policy_loss_has_the_one_signature():
    from gtpo.maths.losses import POLICY_LOSSES

    for loss_type, fn in POLICY_LOSSES.items():
        params = list(inspect.signature(fn).parameters)
        assert params == ["logp", "old_logp", "advantages", "completion_mask", "extras", "config"], loss_type


#: the package's groups (a subpackage or a top-level module), each importing only groups of a lower rank
LAYERS = {"errors": 0, "_aliases": 0, "config": 1, "maths": 2, "run": 3, "sampling": 4, "rewards": 5, "data": 6,
          "evaluation": 7, "trainer": 8, "sft": 8, "report": 8, "testing": 8, "integrations": 9, "app": 10, "cli": 11}


def _group(module: str) -> str:
    return module.split(".")[1] if "." in module else "gtpo"


def test_the_groups_import_one_way():
    """The layout is the architecture (docs/architecture.md): maths < run < sampling < rewards < data < evaluation
    < the engines < app < cli, lazy imports included; a new top-level module or group gets a rank here."""
    groups = {_group(m) for m in GRAPH} - {"gtpo"}
    assert groups <= set(LAYERS), f"give these groups a rank in LAYERS: {sorted(groups - set(LAYERS))}"
    upward = sorted((m, t) for m, (targets, _) in GRAPH.items() for t in targets
                    if _group(m) != "gtpo" and _group(t) != _group(m) and LAYERS[_group(t)] >= LAYERS[_group(m)])
    assert upward == []


def test_the_longest_first_list_names_test_files_that_exist():
    """tests/conftest.py's scheduling hint names files of the suite (a renamed file would silently fall back)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("suite_conftest", os.path.join(here, "conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    root = os.path.dirname(here)
    assert len(set(mod.LONGEST_FIRST)) == len(mod.LONGEST_FIRST)
    assert [p for p in mod.LONGEST_FIRST if not os.path.isfile(os.path.join(root, p))] == []
