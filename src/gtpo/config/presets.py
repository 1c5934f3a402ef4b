"""The presets of GTPOConfig (:meth:`gtpo.config.GTPOConfig.from_preset`; described in :mod:`gtpo.config`): the field
values each sets.

This module imports nothing from torch or the rest of the package.
"""

from __future__ import annotations

from typing import Any

from .declarations import GTPO_GAMMA, LN2

#: the names of the presets
PRESETS = ("official", "paper", "grpo", "dr_grpo", "dapo")


def preset_values(name: str) -> dict[str, Any]:
    """Field values of a named preset (see :mod:`gtpo.config`)."""
    presets: dict[str, dict[str, Any]] = {
        "official": dict(
            loss_type="gtpo", scale_rewards="none", pos_weight=2.0, neg_weight=0.0,
            conflict_combine="product", conflict_count="max_run", divide_by_conflict_count=True,
            completion_reduction="sum", entropy_filter=True, entropy_threshold=0.7,
            entropy_rule="fixed", entropy_filter_scope="all", gamma=GTPO_GAMMA, beta=0.0, num_iterations=1,
            temperature=0.9, logprob_temperature=1.0,
        ),
        "paper": dict(
            loss_type="gtpo", scale_rewards="none", pos_weight=2.0, neg_weight=0.0,
            conflict_combine="product", conflict_count="max_run", divide_by_conflict_count=False,
            completion_reduction="mean", entropy_filter=True, entropy_threshold=LN2,
            entropy_rule="initial", entropy_filter_scope="all", gamma=GTPO_GAMMA, beta=0.0, num_iterations=1,
        ),
        "grpo": dict(loss_type="grpo", scale_rewards="group", epsilon=0.2, epsilon_high=None, beta=0.0),
        "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none", epsilon=0.2, epsilon_high=None, beta=0.0),
        "dapo": dict(
            loss_type="dapo", scale_rewards="group", epsilon=0.2, epsilon_high=0.28, beta=0.0,
            dynamic_sampling=True, mask_truncated_completions=True, overlong_penalty_factor=1.0,
        ),
    }
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; known presets: {list(presets)}")
    return dict(presets[name])


def apply_preset(name: str, values: dict[str, Any], default_length: int) -> dict[str, Any]:
    """``values`` on top of preset ``name``, plus what the preset derives from them.

    ``dapo``: DAPO's soft overlong punishment (Yu et al. 2025) with its buffer scaled to the
    length budget as in the paper's recipe (4,096 of 20,480 tokens): ``overlong_buffer_length =
    max_completion_length // 5`` unless ``values`` sets it. Keys that are not config fields
    (the CLI's ``model``, ``dataset``, ...) pass through unchanged.
    """
    merged = {**preset_values(name), **values}
    if name == "dapo" and "overlong_buffer_length" not in values:
        length = merged.get("max_completion_length", default_length)
        if isinstance(length, int) and not isinstance(length, bool) and length >= 1:
            merged["overlong_buffer_length"] = max(1, length // 5)
    return merged
