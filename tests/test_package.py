"""Package-level contracts: public names resolve; the maths modules stay free of transformers."""

import subprocess
import sys

import gtpo


def test_every_public_name_resolves():
    for name in gtpo.__all__:
        assert getattr(gtpo, name) is not None, name


def test_maths_modules_import_no_transformers_or_package_orchestration():
    code = (
        "import sys; import gtpo.maths.ops, gtpo.maths.advantages, gtpo.maths.conflict, gtpo.maths.losses, gtpo.config; "
        "bad = [m for m in ('transformers', 'accelerate', 'peft', 'datasets', 'gtpo.trainer', 'gtpo.cli') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"maths modules pulled in: {out}"


def test_config_imports_no_torch():
    code = "import sys, gtpo.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_evaluation_imports_no_torch_or_transformers():
    code = ("import sys, gtpo.evaluation; "
            "print(','.join(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"gtpo.evaluation pulled in: {out}"


def test_one_way_dependencies_between_modules():
    """config and errors import nothing of the package (config's modules only errors and each other); the maths
    imports only config, ops and errors;
    the sampling and forward modules never import the trainer, the CLI or the scoring. Keys and values are
    module paths under ``gtpo`` (``maths.ops`` is ``src/gtpo/maths/ops.py``); lazy imports count."""
    import ast
    import os

    root = os.path.dirname(gtpo.__file__)

    def package_imports(name):
        path = os.path.join(root, *name.split(".")) + ".py"
        package = ["gtpo"] + name.split(".")[:-1]
        if not os.path.exists(path):  # a package: its __init__.py
            path = os.path.join(root, *name.split("."), "__init__.py")
            package = ["gtpo"] + name.split(".")
        found = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                module = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module != "gtpo" and not module.startswith("gtpo."):
                continue
            for alias in node.names:  # a submodule imported by name (``from ..maths import method``) counts as it
                sub = f"{module}.{alias.name}"
                where = os.path.join(root, *sub.split(".")[1:])
                is_module = os.path.exists(where + ".py") or os.path.exists(os.path.join(where, "__init__.py"))
                found.add((sub if is_module else module).removeprefix("gtpo").removeprefix("."))
        return found - {""}

    allowed = {
        "errors": set(), "config": {"errors", "config.declarations", "config.checks", "config.gtpo_config"},
        "config.declarations": set(), "config.presets": {"config.declarations"},
        "config.checks": {"errors", "config.declarations"},
        "config.gtpo_config": {"config.declarations", "config.checks", "config.presets"}, "maths.ops": {"config"},
        "maths.advantages": {"config", "maths.ops"}, "maths.conflict": {"config", "maths.ops"},
        "maths.losses": {"config", "maths.ops"}, "sampling.padding": set(), "sampling.shared_prefix": set(),
        "sampling.decode": {"run.models", "sampling.padding", "sampling.shared_prefix"},
        "sampling.policy": {"maths.ops", "run.models", "sampling.padding", "sampling.shared_prefix"},
        "sampling.rollout": {"sampling.decode", "sampling.lora_merge", "sampling.padding", "sampling.shared_prefix"},
        "rewards.scoring": {"errors", "sampling.rollout"}, "run.diagnostics": set(), "run.checkpoint": {"errors", "run.lock"},
        "run.lock": set(),
        "sampling.lora_merge": set(), "run.update": {"config", "maths.losses"}, "run.signals": set(),
        "run.step_metrics": {"run.metric_names", "run.update"},
    }
    for module, deps in allowed.items():
        assert package_imports(module) <= deps, (module, package_imports(module) - deps)


def test_option_tuples_have_one_home():
    import gtpo.maths.advantages
    import gtpo.config
    import gtpo.maths.conflict
    import gtpo.maths.losses
    import gtpo.maths.ops

    assert gtpo.maths.losses.LOSS_TYPES is gtpo.config.LOSS_TYPES
    assert gtpo.maths.ops.AGGREGATIONS is gtpo.config.AGGREGATIONS
    assert gtpo.maths.advantages.SCALE_REWARDS is gtpo.config.SCALE_REWARDS
    assert gtpo.maths.advantages.FILTER_SCOPES is gtpo.config.FILTER_SCOPES
    assert gtpo.maths.conflict.CONFLICT_COMBINE is gtpo.config.CONFLICT_COMBINE
    assert set(gtpo.maths.losses.POLICY_LOSSES) == set(gtpo.config.LOSS_TYPES)
    assert set(gtpo.config.DEFAULT_AGGREGATION) == set(gtpo.config.LOSS_TYPES) - {"gtpo"}
