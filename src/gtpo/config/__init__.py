"""Configuration of a GTPO / GRPO / Dr.GRPO / DAPO run: one dataclass, presets, validation.

Field names follow TRL's ``GRPOConfig`` where one exists (``max_completion_length``,
``num_iterations``, ``beta``, ``epsilon``, ``epsilon_high``, ``scale_rewards``,
``mask_truncated_completions``, ``reward_weights``, ...). Every field documents what it does, its
default, and the paper or code it comes from. Sources are tagged as in ``docs/method.md``:
**[P]** the GTPO paper (Simoni et al., TACL 2026, arXiv 2508.03772), **[C]** its released
reference code (github.com/winstonsmith1897/GTPO), **[D]** a decision of this project.

Presets (:meth:`GTPOConfig.from_preset`):

* ``official`` -- the released code's choices, which produced the published numbers: fixed
  entropy threshold 0.7 applied to every completion, gamma 0.1, conflict weights 2.0 / 0.0
  multiplied across the prefix and suffix runs, each completion's loss divided by its
  conflict count, completions summed; sampling at temperature 0.9, log-probs and entropies
  from the raw logits (``logprob_temperature`` 1.0). It does not set the optimiser: the released
  code's (Adam beta1 = beta2 = 0.999999, weight decay 0.1, ``max_grad_norm`` 0.1, cosine schedule with
  warm-up 0.005, paged 8-bit AdamW) is in the paper configs (``configs/paper/*.yaml``); on the stress
  model GTPO and GRPO collapsed alike under either optimiser (docs/results.md, claim 2).
* ``paper`` -- the printed objective: mean over the G completions, no conflict-count division,
  the <H>_ini rule with threshold ln 2 (filter only if the policy started below ln 2).
* ``grpo``, ``dr_grpo``, ``dapo`` -- the baselines with their usual settings; ``dapo`` is DAPO's
  final recipe: clip-higher (0.28), token-mean loss, dynamic sampling, truncated completions masked
  out of the loss, and soft overlong punishment over the last fifth of ``max_completion_length``
  (penalty up to 1.0).

The package: ``declarations`` (the option tuples, the roles a field declares, :func:`_f`, :func:`documented_field`,
the type check), ``gtpo_config`` (:class:`GTPOConfig` with its fields, :func:`fields_where`, :func:`resolved`),
``checks`` (its validation), ``presets`` (the presets' values). Every name is importable from here.

This package imports nothing from torch or the rest of the package (but :mod:`gtpo.errors`).
"""

from __future__ import annotations

from ..errors import ConfigValueError
from .checks import MODEL_DTYPES, _check_model_init_kwargs, check_gtpo_engine
from .declarations import (_FACTS, _TYPE_WORDS, AGGREGATIONS, COMPLETION_REDUCTIONS, COMPLETION_SIGNS, CONFLICT_COMBINE,
                           CONFLICT_COUNT, DEFAULT_AGGREGATION, ENTROPY_RULES, FILTER_SCOPES,
                           GAMMA_GROUPS, GTPO_GAMMA, HUB_STRATEGIES, LN2, LOSS_TYPES, OPTIMIZERS, REPORT_TARGETS, RUN_DTYPES,
                           SAVE_STRATEGIES, SCALE_REWARDS, TRL_ROLES, VERL_ROLES, VLLM_DTYPES, VLLM_IS_MODES, _describe, _f, _matches,
                           documented_field, field_annotation, type_problem)
from .gtpo_config import _FIELDS, FIELD_CHOICES, SHARED_VLLM_FIELDS, GTPOConfig, _Values, field_default, fields_where, resolved
