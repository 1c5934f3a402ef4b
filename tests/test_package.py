"""Package-level contracts: public names resolve; the maths modules stay free of transformers."""

import subprocess
import sys

import gtpo


def test_every_public_name_resolves():
    for name in gtpo.__all__:
        assert getattr(gtpo, name) is not None, name


def test_maths_modules_import_no_transformers_or_package_orchestration():
    code = (
        "import sys; import gtpo.ops, gtpo.advantages, gtpo.conflict, gtpo.losses, gtpo.config; "
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
    """config and errors import nothing of the package; the maths imports only config, ops and errors;
    the sampling and forward modules never import the trainer, the CLI or the scoring."""
    import ast
    import os

    root = os.path.join(os.path.dirname(gtpo.__file__))

    def package_imports(name):
        tree = ast.parse(open(os.path.join(root, name + ".py")).read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gtpo."):
                found.add(node.module.split(".")[1])
        return found

    allowed = {
        "errors": set(), "config": {"errors"}, "ops": {"config"}, "advantages": {"config", "ops"},
        "conflict": {"config", "ops"}, "losses": {"config", "ops"}, "padding": set(), "shared_prefix": set(),
        "decode": {"models", "padding", "shared_prefix"},
        "policy": {"models", "ops", "padding", "shared_prefix"},
        "rollout": {"decode", "lora_merge", "padding", "shared_prefix"}, "scoring": {"errors", "rollout"},
        "diagnostics": set(), "checkpoint": {"errors"}, "lora_merge": set(),
    }
    for module, deps in allowed.items():
        assert package_imports(module) <= deps, (module, package_imports(module) - deps)


def test_option_tuples_have_one_home():
    import gtpo.advantages
    import gtpo.config
    import gtpo.conflict
    import gtpo.losses
    import gtpo.ops

    assert gtpo.losses.LOSS_TYPES is gtpo.config.LOSS_TYPES
    assert gtpo.ops.AGGREGATIONS is gtpo.config.AGGREGATIONS
    assert gtpo.advantages.SCALE_REWARDS is gtpo.config.SCALE_REWARDS
    assert gtpo.advantages.FILTER_SCOPES is gtpo.config.FILTER_SCOPES
    assert gtpo.conflict.CONFLICT_COMBINE is gtpo.config.CONFLICT_COMBINE
    assert set(gtpo.losses.POLICY_LOSSES) == set(gtpo.config.LOSS_TYPES)
    assert set(gtpo.config.DEFAULT_AGGREGATION) == set(gtpo.config.LOSS_TYPES) - {"gtpo"}
