"""Names of the logged metrics: TRL's where TRL logs the same quantity, GTPO's own under ``gtpo/``.

Both engines write these names to ``metrics.jsonl`` and to the trackers (docs/metrics.md has the
table with what each metric means). Runs written before the names followed TRL's (``reward/mean``,
``entropy/mean``, ``truncated_frac``, ``lr``, ...) are still read: :func:`canonical_record` gives
any record, old or new, the current names; :func:`legacy_record` the earlier names, for data sets
kept in that form (the committed data of ``experiments/``). No torch import here.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["RENAMED", "TOOL_METRICS", "canonical_name", "canonical_record", "legacy_name", "legacy_record"]

#: earlier gtpo name -> current name (TRL's, or GTPO's own under ``gtpo/``)
RENAMED: dict[str, str] = {
    "reward/mean": "reward",
    "reward/std": "reward_std",
    "entropy/mean": "entropy",
    "completion_length/mean": "completions/mean_length",
    "completion_length/max": "completions/max_length",
    "truncated_frac": "completions/clipped_ratio",
    "frac_zero_std_groups": "frac_reward_zero_std",
    "lr": "learning_rate",
    "clipfrac": "clip_ratio/region_mean",
    "step_time_s": "step_time",
    "approx_kl": "gtpo/approx_kl",
    "ratio/mean": "gtpo/ratio_mean",
    "update_norm": "gtpo/update_norm",
    "kl/new_old": "gtpo/kl_new_old",
    "kl/old_new": "gtpo/kl_old_new",
    "skipped_steps": "gtpo/skipped_steps",
    "skipped_updates": "gtpo/skipped_updates",
    "no_signal": "gtpo/no_signal",
    "no_signal_steps": "gtpo/no_signal_steps",
    "generation_time_s": "gtpo/generation_time",
    "update_time_s": "gtpo/update_time",
    "tokens_per_s": "gtpo/tokens_per_s",
    "dynamic_sampling/rounds": "gtpo/dynamic_sampling_rounds",
}

#: the metrics of multi-turn (tool-calling) rollouts, both engines (gtpo.run.step_metrics.agent_metrics; TRL's names
#: where TRL logs them): name -> what it is (docs/metrics.md, docs/agents.md)
TOOL_METRICS: dict[str, str] = {
    "tools/call_frequency": "tool calls per completion (TRL's)",
    "tools/failure_frequency": "tool calls that raised, timed out or named no tool, over all calls (TRL's)",
    "tools/turns_mean": "model turns per completion (runs of model tokens between tool results)",
    "tools/env_token_frac": "share of the completion tokens that are tool / environment tokens (not trained)",
}


def canonical_name(key: str) -> str:
    """The current name of a metric: ``RENAMED[key]``; ``reward/<f>/mean`` -> ``rewards/<f>/mean`` (TRL's
    per-function reward); ``no_signal/<reason>`` -> ``gtpo/no_signal/<reason>``; any other key as it is."""
    if key in RENAMED:
        return RENAMED[key]
    if key.startswith("reward/") and key.count("/") >= 2:
        return "rewards/" + key[len("reward/"):]
    if key.startswith("no_signal/"):
        return "gtpo/" + key
    return key


def canonical_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` (one ``metrics.jsonl`` line, old or current names) with the current names, in the same order;
    where a line holds a metric under both names, the current name's value is kept."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = canonical_name(key)
        if name != key and name in record:
            continue
        out[name] = value
    return out


_LEGACY = {new: old for old, new in RENAMED.items()}


def legacy_name(key: str) -> str:
    """The earlier name of a metric (the inverse of :func:`canonical_name`); a key without one as it is."""
    if key in _LEGACY:
        return _LEGACY[key]
    if key.startswith("rewards/") and key.count("/") >= 2:
        return "reward/" + key[len("rewards/"):]
    if key.startswith("gtpo/no_signal/"):
        return key[len("gtpo/"):]
    return key


def legacy_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` (old or current names) with the earlier names, in the same order; where a line holds a metric
    under both names, the earlier name's value is kept."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = legacy_name(key)
        if name != key and name in record:
            continue
        out[name] = value
    return out
