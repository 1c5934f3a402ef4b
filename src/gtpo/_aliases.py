"""Old module paths of the package, before it was grouped by role (issue 40): ``gtpo.rollout`` is
``gtpo.sampling.rollout`` and so on. A meta-path finder maps each old dotted name to the SAME module object, so
``import gtpo.rollout``, ``from gtpo.losses import gtpo_loss``, ``mock.patch("gtpo.rollout.generate")`` and
pickles that name an old path keep working (and patch the real module); each old path warns once with a
``DeprecationWarning`` naming the new one. No module of the package uses an old path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

#: old dotted name -> new dotted name
MOVED = {
    'gtpo.ops': 'gtpo.maths.ops',
    'gtpo.advantages': 'gtpo.maths.advantages',
    'gtpo.conflict': 'gtpo.maths.conflict',
    'gtpo.losses': 'gtpo.maths.losses',
    'gtpo.method': 'gtpo.maths.method',
    'gtpo.policy': 'gtpo.sampling.policy',
    'gtpo.rollout': 'gtpo.sampling.rollout',
    'gtpo.decode': 'gtpo.sampling.decode',
    'gtpo.shared_prefix': 'gtpo.sampling.shared_prefix',
    'gtpo.padding': 'gtpo.sampling.padding',
    'gtpo.lora_merge': 'gtpo.sampling.lora_merge',
    'gtpo.vllm_engine': 'gtpo.sampling.vllm_engine',
    'gtpo.setup': 'gtpo.run.build',
    'gtpo.models': 'gtpo.run.models',
    'gtpo.checkpoint': 'gtpo.run.checkpoint',
    'gtpo.trackers': 'gtpo.run.trackers',
    'gtpo.metric_names': 'gtpo.run.metric_names',
    'gtpo.diagnostics': 'gtpo.run.diagnostics',
    'gtpo.scoring': 'gtpo.rewards.scoring',
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target
        self.spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # the import system set module.__spec__ to the alias's spec: give the real module its own back
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; import it from there (the old path is an alias)",
                      DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Append the finder to ``sys.meta_path`` once (after the path finders: a real module always wins)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())


install()
