"""The old module paths (before the package was grouped by role, issue 40) are aliases of the new modules:
the same module object, so names and patches reach the real module, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from unittest import mock

import pytest

from gtpo import _aliases


@pytest.mark.parametrize("old,new", sorted(_aliases.MOVED.items()))
def test_every_old_path_is_the_new_module(old, new):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert importlib.import_module(old) is importlib.import_module(new)
    assert importlib.import_module(new).__name__ == new  # the real module keeps its name and spec
    assert importlib.import_module(new).__spec__.name == new


def test_old_path_warns_and_from_import_reaches_the_same_function():
    code = ("import warnings, sys; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    from gtpo.rollout import generate\nexcept DeprecationWarning as w:\n    print(w)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "gtpo.rollout moved to gtpo.sampling.rollout" in out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from gtpo.rollout import generate
    from gtpo.sampling import rollout
    assert generate is rollout.generate


def test_patching_an_old_path_patches_the_real_module():
    from gtpo.sampling import rollout

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with mock.patch("gtpo.rollout.generate") as patched:
            assert rollout.generate is patched
    assert rollout.generate is not patched


def test_no_module_of_the_package_or_its_tests_uses_an_old_path():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for path in [*(root / "src").rglob("*.py"), *(root / "tests").rglob("*.py")]:
        if path.name in ("_aliases.py", Path(__file__).name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            found += [(str(path), n) for n in names if n in _aliases.MOVED]
    assert found == []


def test_an_unknown_module_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("gtpo.no_such_module")
