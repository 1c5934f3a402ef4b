"""gtpo: GTPO (Simoni et al., TACL 2026, arXiv 2508.03772) for Hugging Face causal LMs.

The maths lives in pure tensor functions (``gtpo.maths.advantages``, ``gtpo.maths.conflict``,
``gtpo.maths.losses``, ``gtpo.maths.ops``); ``gtpo.maths.method`` composes them into GTPO once, for every engine (gtpo's
trainer ``gtpo.trainer``, TRL's ``gtpo.integrations.trl``, verl's ``gtpo.integrations.verl``); the
application layer ``gtpo.app`` builds and runs a training job from a spec, and the CLI (``gtpo.cli``) only
parses arguments for it. Public names are imported lazily so that ``import gtpo`` stays cheap and
the maths modules never pull in ``transformers``.
"""

from __future__ import annotations

import importlib

from . import _aliases  # noqa: F401  (the old module paths, e.g. gtpo.rollout, as aliases)

__version__ = "0.1.0"

_EXPORTS = {
    # maths
    "group_advantages": "gtpo.maths.advantages",
    "shape_advantages": "gtpo.maths.advantages",
    "conflict_weights": "gtpo.maths.conflict",
    "conflict_runs": "gtpo.maths.conflict",
    "token_logprobs_and_entropy": "gtpo.maths.ops",
    "masked_mean": "gtpo.maths.ops",
    "masked_sum": "gtpo.maths.ops",
    "aggregate": "gtpo.maths.ops",
    "POLICY_LOSSES": "gtpo.maths.losses",
    "LossExtras": "gtpo.maths.losses",
    "gtpo_loss": "gtpo.maths.losses",
    "grpo_loss": "gtpo.maths.losses",
    "LossOutput": "gtpo.maths.losses",
    "LOSS_TYPES": "gtpo.config",
    # the GTPO composition every engine calls
    "group_inputs": "gtpo.maths.method",
    "effective_advantages": "gtpo.maths.method",
    # configuration and training
    "GTPOConfig": "gtpo.config",
    "GTPOTrainer": "gtpo.trainer",
    "TrainingStopped": "gtpo.errors",
    "RewardFunctionError": "gtpo.errors",
    "CheckpointError": "gtpo.errors",
    # data, rewards, SFT, reports
    "load_task": "gtpo.data",
    "resolve_reward": "gtpo.rewards",
    "run_sft": "gtpo.sft",
    "write_report": "gtpo.report",
    # evaluation
    "pass_at_k": "gtpo.evaluation.estimators",
    "maj_at_k": "gtpo.evaluation.estimators",
    "evaluate": "gtpo.evaluation.api",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gtpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
