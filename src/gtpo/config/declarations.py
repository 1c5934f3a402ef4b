"""How a GTPOConfig field is declared: the option tuples of the package, the roles a field declares on each engine
(:data:`TRL_ROLES`, :data:`VERL_ROLES`), :func:`_f` and :func:`documented_field`, and the check of a field's value
against its annotation (:func:`type_problem`).

This module imports nothing from torch or the rest of the package.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, Callable

LN2 = math.log(2.0)

# The option tuples of the package (the maths modules validate against these).
LOSS_TYPES = ("gtpo", "grpo", "dr_grpo", "dapo")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "constant")
DEFAULT_AGGREGATION = {"grpo": "seq_mean_token_mean", "dr_grpo": "constant", "dapo": "token_mean"}
SCALE_REWARDS = ("none", "group", "batch")
ENTROPY_RULES = ("fixed", "initial")
FILTER_SCOPES = ("all", "negative")
GAMMA_GROUPS = ("all", "varying")
COMPLETION_SIGNS = ("all", "positive", "negative")
CONFLICT_COMBINE = ("product", "union")
CONFLICT_COUNT = ("max_run", "union")
COMPLETION_REDUCTIONS = ("sum", "mean")
REPORT_TARGETS = ("none", "tensorboard", "wandb", "trackio")
VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
RUN_DTYPES = ("auto", "float32", "bfloat16")
SAVE_DTYPES = ("auto", "float32")
SAVE_STRATEGIES = ("no", "steps", "epoch", "best")
HUB_STRATEGIES = ("every_save", "end", "checkpoint", "all_checkpoints")
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_8bit", "paged_adamw_8bit")
#: transformers' SchedulerType names that gtpo's trainer runs (every one but 'reduce_lr_on_plateau' and 'greedy', whose
#: step() takes an evaluation metric; tests/test_trl_schedule_options.py checks this list against transformers')
LR_SCHEDULER_TYPES = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                      "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay")
#: transformers' SchedulerType names refused (their schedule steps on an evaluation metric, not on the step count)
METRIC_LR_SCHEDULERS = ("reduce_lr_on_plateau", "greedy")
EVAL_STRATEGIES = ("no", "steps", "epoch")
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: TRL's vllm_mode values (gtpo's trainer runs "colocate"; "server" is TRL's engine's)
VLLM_MODES = ("colocate", "server")
#: torch.compile's modes (torch_compile_mode)
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: gamma, GTPO's entropy-shaping coefficient [P][C]: the default of loss_type gtpo and of the official / paper presets
GTPO_GAMMA = 0.1

# ----------------------------------------------------------------------------- what each field is to the code around it
# Every field declares, with its default and help (:func:`_f`), what it is on TRL's engine (``trl``) and on verl
# (``verl``), and when it applies: whether a resume may change it (``resumable``), whether it is one of GTPO's switches
# on a baseline (``switch_off``: the values that leave the baseline as it is) and the rule that decides its value when
# it is None (``rule``, applied by :func:`resolved` for every engine). Every list of fields by role (SHARED_VLLM_FIELDS,
# GTPOConfig.GTPO_SWITCHES, the trainer's RESUMABLE_CHANGES, gtpo.integrations.trl's RENAMED / ENGINE_ONLY /
# UNAVAILABLE / GTPO_METHOD_FIELDS, gtpo.integrations.verl's VERL_OWNED / method fields) is read from these
# declarations by :func:`fields_where`; tests/test_config_fields.py fails on a field that declares no role.

#: what a field is on TRL's engine (``_f(trl=...)``; gtpo.integrations.trl reads it)
TRL_ROLES = {
    "same": "a trl.GRPOConfig field of the same name and meaning: TRLGTPOConfig.from_gtpo_config passes it on as it is",
    "when_set": "a trl.GRPOConfig field of the same name and meaning, passed on only when the user set it (TRL keeps "
                "its own default otherwise)",
    "converted": "a trl.GRPOConfig field of the same name whose value TRLGTPOConfig.from_gtpo_config converts (e.g. "
                 "max_steps counts rollouts here, optimizer steps there)",
    "renamed": "TRL has it under another name or form (trl_name says which); from_gtpo_config maps it",
    "method": "one of GTPO's method fields, which trl.GRPOConfig lacks: TRLGTPOConfig declares it with GTPOConfig's "
              "name, default and help",
    "gtpo_engine": "a setting of gtpo's own trainer (its sampler, evaluation, safeguards, logs): no effect on TRL's "
                   "engine",
    "unavailable": "a feature TRL's GRPOTrainer does not have: refused on TRL's engine",
}
#: what a field is on verl (``_f(verl=...)``; gtpo.integrations.verl reads it)
VERL_ROLES = {
    "method": "a method field that algorithm.gtpo may set",
    "owned": "set by verl's own option (verl_option); a preset or algorithm.gtpo may only repeat verl's value",
    "engine": "an engine, optimiser or generation setting that verl configures its own way (refused under "
              "algorithm.gtpo)",
}
_FACTS = ("trl", "trl_name", "verl", "verl_option", "resumable", "switch_off", "rule", "choices")


def _f(default: Any, help: str, *, trl: str, verl: str, trl_name: str | None = None, verl_option: str | None = None,
       resumable: bool = False, switch_off: tuple | None = None, rule: Callable[[Any], Any] | None = None,
       choices: tuple[str, ...] | None = None, choices_note: str | None = None) -> Any:
    """A GTPOConfig field with every fact about it in ``metadata``: ``help`` (read by the CLI and the docs), its role on
    TRL's engine (``trl``, one of :data:`TRL_ROLES`; ``trl_name`` for ``"renamed"``) and on verl (``verl``, one of
    :data:`VERL_ROLES`; ``verl_option`` for ``"owned"``), ``resumable`` (a resume may change it without changing what
    is trained), ``switch_off`` (one of GTPO's switches on a baseline loss: the values that leave the baseline as it
    is), ``rule`` (its value when it is None, from the other fields: ``rule(config) -> value``) and, for a field
    that takes one of a few values, ``choices`` (validated by :func:`gtpo.config.checks.check_values`, listed by
    ``gtpo train --help``; of each entry for a list field) with ``choices_note``, words its error message adds."""
    if trl not in TRL_ROLES or verl not in VERL_ROLES:
        raise ValueError(f"_f: trl must be one of {list(TRL_ROLES)} and verl one of {list(VERL_ROLES)}, got "
                         f"trl={trl!r}, verl={verl!r}")
    if (trl == "renamed") != (trl_name is not None) or (verl == "owned") != (verl_option is not None):
        raise ValueError("_f: trl_name goes with trl='renamed', verl_option with verl='owned'")
    return documented_field(default, help, trl=trl, trl_name=trl_name, verl=verl, verl_option=verl_option,
                            resumable=resumable, switch_off=switch_off, rule=rule, choices=choices,
                            choices_note=choices_note)


def documented_field(default: Any, help: str, **metadata: Any) -> Any:
    """A dataclass field with its documentation in ``metadata['help']`` (read by the CLI and the docs) beside any other
    ``metadata``; a list or dict default is copied for every instance. GTPOConfig's fields go through :func:`_f`, which
    also requires their roles; other settings dataclasses (the run spec) call this directly."""
    metadata = {"help": help, **metadata}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return field(default=default, metadata=metadata)



# ----------------------------------------------------------------------------- type checks
_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "None": "null (None)"}


def field_annotation(f: dataclasses.Field) -> str:
    """A field's annotation as text (this module uses ``from __future__ import annotations``)."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _matches(value: Any, kind: str) -> bool:
    if kind == "None":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind.startswith("list[") and kind.endswith("]"):
        inner = kind[5:-1]
        return isinstance(value, (list, tuple)) and all(_matches(v, inner) for v in value)
    return True  # an annotation this checker does not know: accept


def _describe(kind: str) -> str:
    if kind.startswith("list[") and kind.endswith("]"):
        inner = _TYPE_WORDS.get(kind[5:-1], kind[5:-1]).split(" ", 1)[-1]
        return f"a list of {inner}s" if not inner.endswith("s") else f"a list of {inner}"
    return _TYPE_WORDS.get(kind, kind)


def type_problem(value: Any, annotation: str) -> str | None:
    """None if ``value`` fits ``annotation`` (e.g. ``'int | None'``), else what was expected."""
    kinds = [k.strip() for k in annotation.split("|")]
    if any(_matches(value, k) for k in kinds):
        return None
    return " or ".join(_describe(k) for k in kinds)
