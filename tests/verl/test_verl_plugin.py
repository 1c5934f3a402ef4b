"""The plug-in is discovered by `import verl` itself (its verl.plugins entry point), in a fresh interpreter."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

_PROBE = """
import json, verl
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
print(json.dumps({"adv": core_algos.ADV_ESTIMATOR_REGISTRY.get("gtpo").__module__ if "gtpo" in core_algos.ADV_ESTIMATOR_REGISTRY else None,
                  "loss": core_algos.POLICY_LOSS_REGISTRY["gtpo"].__module__ if "gtpo" in core_algos.POLICY_LOSS_REGISTRY else None,
                  "trainer": TRAINER_REGISTRY["gtpo"].__name__ if "gtpo" in TRAINER_REGISTRY else None}))
"""


def _probe(**env):
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_verl_registers_gtpo_through_the_entry_point():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="verl.plugins") if e.name == "gtpo"]
    assert ep.value == "gtpo.integrations.verl"
    assert _probe() == {"adv": "gtpo.integrations.verl", "loss": "gtpo.integrations.verl", "trainer": "GTPOTrainer"}
    # verl's switch for entry-point loading: off, nothing of gtpo is registered (so it was the entry point)
    assert _probe(VERL_USE_EXTERNAL_PLUGINS="none") == {"adv": None, "loss": None, "trainer": None}
