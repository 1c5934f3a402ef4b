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
