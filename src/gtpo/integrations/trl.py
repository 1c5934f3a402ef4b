"""GTPO on TRL's engine: ``TRLGTPOConfig`` and ``TRLGTPOTrainer``, a drop-in ``trl.GRPOTrainer``.

GTPO (Simoni et al., TACL 2026, arXiv 2508.03772) needs more than a per-token loss slot: its
conflict weights are computed on whole groups before TRL shuffles and splits the rollout batch,
its entropy filter and gamma shift act on each completion's mean entropy, and its loss reduces
per completion. This module adds exactly that to TRL's ``GRPOTrainer`` and keeps everything else
TRL's: generation (transformers or vLLM), reward functions, DDP / DeepSpeed / FSDP, PEFT,
gradient checkpointing, logging, checkpoints and the Hub::

    from gtpo.integrations.trl import TRLGTPOConfig, TRLGTPOTrainer

    args = TRLGTPOConfig.from_preset("official", output_dir="runs/x", use_vllm=True)   # a trl.GRPOConfig
    trainer = TRLGTPOTrainer(model="Qwen/Qwen2.5-3B-Instruct", reward_funcs=[...], args=args,
                             train_dataset=ds, peft_config=lora)   # trl.GRPOTrainer's constructor
    trainer.train()

The method is this package's, never a copy: the composition of :mod:`gtpo.maths.method` that gtpo's own
trainer calls too (:func:`~gtpo.maths.method.group_inputs`: lambda and ``n_conflict`` from the UNSHAPED
advantage signs on the loss mask, the gamma-shift and sign rows; :func:`~gtpo.maths.method.effective_advantages`:
filter, ``<H>_ini`` rule, gamma shift; :func:`~gtpo.maths.method.initial_entropy_sums`), and the loss
``gtpo.maths.losses.POLICY_LOSSES["gtpo"]`` with the one signature of every loss. Any other ``loss_type`` ("grpo", "dapo", "dr_grpo", "bnpo", "cispo",
"sapo", "luspo", "vespo") is TRL's own code, unchanged.

Where each step happens (trl 1.16):

1. ``_generate_and_score_completions`` (TRL's, then GTPO's inputs on the local rows): advantages of
   zero-variance groups are made exactly 0 (TRL's float mean can leave a +-1e-8 residue that would
   make such a group "active"); the conflict weights ``gtpo_token_weights (N, T)`` and counts
   ``gtpo_n_conflict (N,)`` are computed on WHOLE groups -- locally when this process holds whole
   groups, otherwise on the gathered batch of all processes (completions padded to the longest)
   and sliced back; the rows the gamma shift reaches (``gamma_groups="varying"``) and the
   ``completion_sign`` rows likewise; ``<H>_ini`` is measured once. These per-row tensors are added
   to TRL's batch dict, so ``shuffle_sequence_dict`` / ``split_tensor_dict`` carry them with their
   rows into the micro-batches.
2. The completions' mean token entropies ``<H>_i`` are the ROLLOUT policy's, frozen over the
   ``num_iterations`` passes as in gtpo's own trainer: when TRL computes rollout log-probs at
   generation time (the policy changes within a generation batch, or vLLM's importance sampling),
   the entropies of that same forward are kept (no extra cost); otherwise the policy of every
   micro-batch is the rollout policy and the entropies of the loss forward are used (and kept for
   the later passes).
3. ``_compute_loss`` (``loss_type="gtpo"``): one forward (TRL's fused log-prob/entropy head),
   :func:`~gtpo.maths.method.effective_advantages` with ``<H>_i``, then ``POLICY_LOSSES["gtpo"]``
   with TRL's normalisation (below). TRL's per-token multipliers that combine with GTPO -- the
   top-entropy token mask (``top_entropy_quantile``), vLLM's importance-sampling ratio and the
   off-policy sequence mask -- multiply lambda in the loss; ``gtpo/weighted_token_frac`` is still
   computed from lambda alone.

Normalisation. TRL scales each micro-batch loss for gradient accumulation itself
(``loss_is_scaled_for_ga``) and DDP / DeepSpeed / FSDP average gradients over processes. With
``c_i`` the token mean of completion i's weighted surrogate (divided by ``max(n_conflict_i, 1)``
when ``divide_by_conflict_count``), the loss of a micro-batch of ``B`` completions is::

    (G if completion_reduction == "sum" else 1) * sum_{i in micro-batch} c_i / (B * GA)

(``GA = current_gradient_accumulation_steps``, 1 in evaluation): the optimizer step's gradient is
that of ``(G or 1) * mean_i c_i`` over all its completions, i.e. GTPO's ``sum over each group,
mean over groups`` [C] or the paper's ``1/G`` mean [P] -- independently of how groups were split
over micro-batches and processes (each ``c_i`` needs only its own row). It is
``POLICY_LOSSES["gtpo"]`` with ``completion_reduction="mean"`` and ``num_sequences=B * GA``, times G for "sum".

Config: :class:`TRLGTPOConfig` is ``trl.GRPOConfig`` plus GTPO's method fields, declared here with
the defaults and documentation of :class:`gtpo.GTPOConfig` (read from its dataclass fields:
:data:`GTPO_METHOD_FIELDS`). Names map as follows:

* ``group_size`` -> ``num_generations``;
* ``prompts_per_step`` P -> ``generation_batch_size`` = P * G (TRL counts completions, over all processes);
* ``micro_batch_size`` -> ``per_device_train_batch_size``;
* ``loss_type`` "gtpo" -> ``loss_type`` "gtpo" (this class's default); gtpo's "grpo" / "dr_grpo" / "dapo"
  (and ``loss_aggregation`` seq_mean_token_mean / constant / token_mean) -> TRL's "grpo" / "dr_grpo" / "dapo";
* ``scale_rewards`` None -> GTPOConfig's rule (:func:`gtpo.config.resolved`, on both engines): "none" for gtpo and
  dr_grpo, "group" otherwise (TRL's default);
* ``max_steps`` (rollout steps, each with ``num_iterations`` updates) -> ``max_steps * num_iterations``
  (TRL counts optimizer steps); ``warmup_steps`` and ``warmup_ratio`` -> ``warmup_steps`` (optimizer steps);
* ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``max_completion_length``, ``num_iterations``,
  ``epsilon``, ``epsilon_high``, ``beta``, ``mask_truncated_completions``, ``reward_weights`` and the optimiser
  and logging fields -> the same names, the same meaning;
* GTPO's method fields (:data:`GTPO_METHOD_FIELDS`: conflict weights, entropy control, ``completion_sign``,
  ``logprob_temperature``, DAPO's ``overlong_buffer_length`` / ``overlong_penalty_factor``) -> the same names,
  defaults and documentation; the overlong penalty is a reward function appended with weight 1;
* ``use_vllm`` and the vLLM fields TRL shares (:data:`SHARED_VLLM_FIELDS`: ``vllm_gpu_memory_utilization``,
  ``vllm_max_model_length``, ``vllm_importance_sampling_*``) -> TRL's fields of the same names, when set (TRL's
  defaults otherwise); gtpo's ``vllm_kv_cache_memory_bytes``, ``vllm_dtype`` and ``vllm_enforce_eager`` have no
  TRL counterpart (:data:`ENGINE_ONLY`);
* ``dynamic_sampling`` (the dapo preset) -> not available: TRL's GRPOTrainer has no dynamic sampling;
* gtpo's ``generation_batch_size`` (completions per generate() call) -> no equivalent (TRL's field of that name
  is the whole rollout batch); the settings of gtpo's own trainer (:data:`ENGINE_ONLY`) have no effect here.

``gtpo train --engine trl`` (``engine: trl`` in the YAML) trains a gtpo YAML on this engine through
:func:`gtpo.app.trl_run.run_trl_training`, with :meth:`TRLGTPOConfig.from_gtpo_config` doing the mapping above; fields
of ``trl.GRPOConfig`` (``use_vllm``, ``vllm_mode``, ``deepspeed``, ``bf16``, ``push_to_hub``, ...)
pass through.

With ``loss_type="gtpo"`` these TRL options are refused with an error, because GTPO does not
define them: ``beta != 0`` (GTPO drops KL and the reference model), ``importance_sampling_level=
"sequence"``, ``delta`` (two-sided clipping), ``multi_objective_aggregation="normalize_then_sum"``
(not group-relative), TRL's entropy bonus (``entropy_coef`` / ``use_adaptive_entropy``; GTPO's
gamma is an entropy penalty) and tool calling (``tools`` / ``environment_factory``: tool outputs
inside a completion break the contiguous masks of the conflict runs). GTPO's ablation switches
(``conflict_masks``, ``entropy_filter``, ``gamma``, ``completion_sign`` on a baseline) need gtpo's
own trainer and are refused for TRL's loss types.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
except ImportError as _err:  # pragma: no cover - exercised only without TRL
    raise ImportError(
        "gtpo.integrations.trl needs TRL (trl.GRPOTrainer): install it with `pip install trl` "
        f"(tested with trl 1.16); importing it failed: {_err}"
    ) from _err

from ..config import (DEFAULT_AGGREGATION, SHARED_VLLM_FIELDS, GTPOConfig, field_default, fields_where,
                      resolved)
from ..errors import ConfigError, ConfigValueError
from ..maths import method
from ..maths.losses import POLICY_LOSSES, LossExtras
from ..rewards.scoring import overlong_penalty

__all__ = ["ENGINE_ONLY", "GTPO_METHOD_FIELDS", "OverlongPenalty", "RENAMED", "SHARED_VLLM_FIELDS", "TESTED_TRL",
           "TRLGTPOConfig", "TRLGTPOTrainer", "UNAVAILABLE", "check_trl_options", "drop_long_prompts",
           "metrics_file_callback", "missing_trl_api", "trl_precision"]

logger = logging.getLogger("gtpo")

# What this module uses of TRL beyond its public trainer and config (private API of trl 1.x): checked at import,
# so that a TRL that renamed or changed one fails with a clear error instead of a silently unpatched trainer or an
# error in the middle of construction. TESTED_TRL is the range the pyproject's extras declare.
TESTED_TRL = ("1.16", "1.17")
_OVERRIDDEN = ("_generate_and_score_completions", "_calculate_rewards", "_compute_loss",
               "_get_per_token_logps_and_entropies", "_save_checkpoint", "_load_optimizer_and_scheduler")
_USED_FUNCTIONS = {"trl.trainer.utils.add_fused_lm_head": ("temperature", "cast_lm_head_to_fp32", "outputs"),
                   "trl.models.utils.disable_gradient_checkpointing": ()}
_USED_CONFIG_FIELDS = ("num_generations", "generation_batch_size", "steps_per_generation", "cast_lm_head_to_fp32",
                       "gradient_checkpointing_kwargs", "model_init_kwargs", "optim", "vllm_enable_sleep_mode",
                       "top_entropy_quantile", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode")


def missing_trl_api(trainer_cls=GRPOTrainer, config_cls=GRPOConfig, modules: dict | None = None) -> list[str]:
    """The names this module needs that the installed TRL lacks: ``GRPOTrainer`` methods it overrides, the
    functions it calls (with the keyword arguments it passes) and the ``GRPOConfig`` fields it sets;
    ``modules`` maps module names to modules (default: imported)."""
    import importlib
    import inspect

    missing = [f"GRPOTrainer.{name}" for name in _OVERRIDDEN if not hasattr(trainer_cls, name)]
    for path, params in _USED_FUNCTIONS.items():
        module_name, name = path.rsplit(".", 1)
        try:
            module = (modules or {}).get(module_name) or importlib.import_module(module_name)
        except ImportError:
            missing.append(path)
            continue
        func = getattr(module, name, None)
        if func is None:
            missing.append(path)
            continue
        accepted = inspect.signature(func).parameters
        missing += [f"{path}({p}=)" for p in params if p not in accepted]
    fields_ = {f.name for f in dataclasses.fields(config_cls)}
    missing += [f"GRPOConfig.{name}" for name in _USED_CONFIG_FIELDS if name not in fields_]
    return missing


_missing = missing_trl_api()
if _missing:  # pragma: no cover - depends on the installed TRL
    raise ImportError(f"gtpo.integrations.trl supports trl >= {TESTED_TRL[0]}, < {TESTED_TRL[1]} (pip install "
                      f"'trl>={TESTED_TRL[0]},<{TESTED_TRL[1]}'); trl {trl.__version__} lacks {_missing}")

# ----------------------------------------------------------------------------------------- fields
_GTPO_FIELDS = {f.name: f for f in dataclasses.fields(GTPOConfig)}
_TRL_FIELDS = {f.name: f for f in dataclasses.fields(GRPOConfig)}

# Each GTPOConfig field declares what it is on this engine (its ``trl`` role, gtpo.config.TRL_ROLES); these lists are
# read from the declarations.
#: GTPOConfig fields that TRL names differently (GTPOConfig name -> what it is on TRL's engine).
RENAMED = {name: _GTPO_FIELDS[name].metadata["trl_name"] for name in fields_where("trl", "renamed")}
#: GTPOConfig fields of gtpo's own trainer (its sampler, evaluation, safeguards, logs): no effect on
#: what TRL's engine trains, and no counterpart there.
ENGINE_ONLY = fields_where("trl", "gtpo_engine")
#: GTPOConfig fields of features TRL's GRPOTrainer does not have.
UNAVAILABLE = fields_where("trl", "unavailable")
#: GTPOConfig fields that are trl.GRPOConfig fields of the same name and meaning: passed on as they are.
SAME_FIELDS = fields_where("trl", "same")
#: GTPO's method fields that ``trl.GRPOConfig`` lacks, with GTPOConfig's names, defaults and help.
GTPO_METHOD_FIELDS = fields_where("trl", "method")


def _with_gtpo_method_fields(cls: type) -> type:
    """``cls`` (before ``@dataclass``) with a field for each of :data:`GTPO_METHOD_FIELDS`: GTPOConfig's annotation,
    default and help (one source of truth)."""
    for name in GTPO_METHOD_FIELDS:
        f = _GTPO_FIELDS[name]
        cls.__annotations__[name] = f.type
        if f.default_factory is not dataclasses.MISSING:  # pragma: no cover - no method field has one today
            setattr(cls, name, field(default_factory=f.default_factory, metadata={"help": f.metadata["help"]}))
        else:
            setattr(cls, name, field(default=f.default, metadata={"help": f.metadata["help"]}))
    return cls


def _trl_default(name: str) -> Any:
    f = _TRL_FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


# ----------------------------------------------------------------------------------------- config
@dataclass
@_with_gtpo_method_fields
class TRLGTPOConfig(GRPOConfig):
    r"""
    Configuration class of [`TRLGTPOTrainer`]: ``trl.GRPOConfig`` plus the fields of GTPO (Simoni et al.,
    TACL 2026, [arXiv 2508.03772](https://arxiv.org/abs/2508.03772)).

    Every field of ``trl.GRPOConfig`` keeps its name, default and meaning (see its documentation); the GTPO
    fields below have the names, defaults and documentation of ``gtpo.GTPOConfig`` (read from it), and
    [`~TRLGTPOConfig.from_preset`] applies its presets (``official``, ``paper``, ``grpo``, ``dr_grpo``,
    ``dapo``). The mapping of the two configs' names is in the module documentation of
    ``gtpo.integrations.trl`` (``group_size`` is ``num_generations``, ...).

    Parameters that differ from ``trl.GRPOConfig``:

        loss_type (`str`, *optional*, defaults to `"gtpo"`):
            `"gtpo"` (conflict-token weights, entropy filter and gamma shaping, no KL, arXiv 2508.03772) or
            any of TRL's loss types, which run TRL's own code.
        scale_rewards (`str` or `None`, *optional*, defaults to `None`):
            `"group"`, `"batch"` or `"none"`. `None`: `gtpo.GTPOConfig`'s rule, as on gtpo's engine: `"none"` for
            `loss_type="gtpo"` (the reference code's `R - mean`) and `"dr_grpo"` (Dr. GRPO drops the std),
            TRL's `"group"` otherwise.
        vllm_importance_sampling_correction (`bool` or `None`, *optional*, defaults to `None`):
            TRL's vLLM importance-sampling correction. `None`: on (TRL's default), except when
            `logprob_temperature` differs from `temperature` (the official preset: sampling at 0.9,
            log-probs at 1.0), where the ratio would correct the temperature change rather than vLLM's
            numerical mismatch; `True` is then refused.

    > Parameters of GTPO (from ``gtpo.GTPOConfig``)

        {gtpo_fields}
    """

    loss_type: str = field(
        default="gtpo",
        metadata={"help": "'gtpo' (conflict-token weights, entropy filter and gamma shaping, no KL; arXiv "
                          "2508.03772) or any TRL loss type ('grpo', 'dapo', 'dr_grpo', 'bnpo', 'cispo', 'sapo', "
                          "'luspo', 'vespo'), which runs TRL's own code."},
    )
    scale_rewards: str | None = field(
        default=None,
        metadata={"help": "'group', 'batch' or 'none'. None: gtpo.GTPOConfig's rule, as on gtpo's engine: 'none' "
                          "for loss_type='gtpo' (GTPO's reference code) and 'dr_grpo' (Dr. GRPO drops the std), TRL's "
                          "'group' otherwise."},
    )
    vllm_importance_sampling_correction: bool | None = field(
        default=None,
        metadata={"help": "TRL's vLLM importance-sampling correction. None: on (TRL's default) unless "
                          "logprob_temperature differs from temperature, where the ratio would correct the "
                          "temperature change instead of vLLM's mismatch (true is then refused)."},
    )

    # GTPO's method fields (GTPO_METHOD_FIELDS) are added by _with_gtpo_method_fields from GTPOConfig's declarations
    group_size: int | None = field(
        default=None,
        metadata={"help": "gtpo's name of num_generations, accepted as an alias (gtpo.GTPOConfig keywords work "
                          "unchanged): when set, num_generations takes its value and it reads None afterwards. "
                          "Setting both to different values is refused."},
    )

    def __post_init__(self):
        if self.group_size is not None:  # gtpo's name of num_generations
            trl_default = _TRL_FIELDS["num_generations"].default
            if self.num_generations not in (trl_default, self.group_size):
                raise ConfigValueError(f"TRLGTPOConfig.group_size={self.group_size!r} is gtpo's name of num_generations, "
                                       f"which is {self.num_generations!r}: set one of them", "group_size")
            self.num_generations, self.group_size = self.group_size, None
        if self.scale_rewards is None:  # GTPOConfig's rule, so that a YAML means the same on both engines
            self.scale_rewards = resolved(self, "scale_rewards")
        mismatch = self.logprob_temperature is not None and self.logprob_temperature != self.temperature
        if self.vllm_importance_sampling_correction is None:
            self.vllm_importance_sampling_correction = not mismatch
        elif self.vllm_importance_sampling_correction and mismatch and self.use_vllm:
            raise ConfigValueError(
                f"TRLGTPOConfig.vllm_importance_sampling_correction=True needs log-probs at the sampling "
                f"temperature, but logprob_temperature={self.logprob_temperature} differs from temperature="
                f"{self.temperature}: the ratio would correct the temperature change, not vLLM's mismatch. "
                "Leave it None (off for this case) or set logprob_temperature=None",
                "vllm_importance_sampling_correction",
            )
        super().__post_init__()
        self._check()

    # ------------------------------------------------------------------------------ validation
    def _check(self) -> None:
        """GTPO's fields (GTPOConfig's validation, errors renamed to this class) and the TRL options that do
        not combine with them."""
        try:
            self.to_gtpo_config()
        except ConfigValueError as err:
            name = err.field
            message = str(err)
            for gtpo_name, trl_name in (("group_size", "num_generations"),):
                message = message.replace(f"GTPOConfig.{gtpo_name}", f"TRLGTPOConfig.{trl_name}")
                name = trl_name if name == gtpo_name else name
            raise ConfigValueError(message.replace("GTPOConfig.", "TRLGTPOConfig."), name) from None

        def refuse(name: str, why: str) -> None:
            raise ConfigValueError(f"TRLGTPOConfig.{name}={getattr(self, name)!r}: {why}", name)

        if self.loss_type != "gtpo":
            # GTPO's switches on a baseline are ablations of gtpo's own trainer (TRL's loss has no slot for them)
            for name, off in GTPOConfig.GTPO_SWITCHES.items():
                if getattr(self, name) not in off:
                    refuse(name, f"GTPO's {name} applies to loss_type='gtpo' on TRL's engine; on TRL's loss "
                                 f"type {self.loss_type!r} it is an ablation of gtpo's own trainer (gtpo.GTPOTrainer, "
                                 "`engine: gtpo`)")
            return
        if self.beta != 0.0:
            refuse("beta", "GTPO drops the KL term and loads no reference model (arXiv 2508.03772); set beta=0.0")
        if self.importance_sampling_level != "token":
            refuse("importance_sampling_level", "GTPO's ratio is per token; set importance_sampling_level='token'")
        if self.delta is not None:
            refuse("delta", "GTPO uses the PPO clip (epsilon, epsilon_high) without two-sided clipping; set delta=None")
        if self.multi_objective_aggregation != "sum_then_normalize":
            refuse("multi_objective_aggregation", "GTPO's conflict tokens need group-relative advantages; set "
                                                  "multi_objective_aggregation='sum_then_normalize'")
        if self.entropy_coef != 0.0:
            refuse("entropy_coef", "GTPO controls entropy with its filter and gamma shift (an entropy penalty); "
                                   "TRL's entropy bonus does not combine with it: set entropy_coef=0.0")
        if self.use_adaptive_entropy:
            refuse("use_adaptive_entropy", "GTPO controls entropy with its filter and gamma shift; set "
                                           "use_adaptive_entropy=False")

    def to_gtpo_config(self) -> GTPOConfig:
        """The ``gtpo.GTPOConfig`` with this config's GTPO fields (validated by it); for a TRL loss type,
        only the GTPO fields are meaningful."""
        values: dict[str, Any] = {name: getattr(self, name) for name in GTPO_METHOD_FIELDS}
        if isinstance(self.max_completion_length, int):
            values["max_completion_length"] = self.max_completion_length
        values["temperature"] = self.temperature
        if self.loss_type == "gtpo":
            values.update(
                loss_type="gtpo", group_size=self.num_generations, scale_rewards=self.scale_rewards,
                num_iterations=self.num_iterations, epsilon=self.epsilon, epsilon_high=self.epsilon_high,
                beta=self.beta, mask_truncated_completions=self.mask_truncated_completions,
            )
        return GTPOConfig(**values)

    @property
    def resolved_logprob_temperature(self) -> float:
        """The temperature that divides the logits of the training forward (log-probs and entropies)."""
        return resolved(self, "logprob_temperature")

    # ------------------------------------------------------------------------------ constructors
    @classmethod
    def from_preset(cls, name: str, **kwargs: Any) -> "TRLGTPOConfig":
        """A config from one of ``gtpo.GTPOConfig``'s presets (``official``, ``paper``, ``grpo``, ``dr_grpo``,
        ``dapo``) with keyword overrides (``trl.GRPOConfig`` / GTPO field names):
        ``TRLGTPOConfig.from_preset("official", output_dir="runs/x", use_vllm=True)``.

        The preset's values reach TRL unchanged. ``dapo`` sets DAPO's dynamic sampling, which TRL's
        GRPOTrainer does not have: pass ``dynamic_sampling=False`` to take the rest of the recipe.
        """
        values = dict(kwargs)
        if name == "dapo" and "max_completion_length" not in values:
            values["max_completion_length"] = _trl_default("max_completion_length")  # the overlong buffer's base
        try:
            merged = GTPOConfig.apply_preset(name, values)
        except ValueError as err:
            raise ConfigValueError(f"TRLGTPOConfig.from_preset: {err}") from None
        if merged.pop("dynamic_sampling", None):
            raise ConfigValueError(
                f"TRLGTPOConfig.from_preset({name!r}): the preset turns on DAPO's dynamic sampling (resampling "
                "zero-variance groups), which TRL's GRPOTrainer does not have; pass dynamic_sampling=False to take "
                "the rest of the preset, or train with gtpo's own trainer (gtpo.GTPOTrainer)", "dynamic_sampling")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in merged:
            if key not in known:
                hint = f" (TRL's name: {RENAMED[key]})" if key in RENAMED else ""
                raise ConfigValueError(f"TRLGTPOConfig.from_preset: unknown field {key!r}{hint}", key)
        return cls(**merged)

    @classmethod
    def from_gtpo_config(cls, config: GTPOConfig, *, num_processes: int = 1, set_fields: set[str] | None = None,
                         adapter: bool | None = None, **trl_options: Any) -> "TRLGTPOConfig":
        """The TRL config that trains ``config`` (a ``gtpo.GTPOConfig``) on TRL's engine.

        Every GTPOConfig field is mapped (module documentation): the same names, ``group_size`` ->
        ``num_generations``, ``prompts_per_step`` and ``micro_batch_size`` -> one rollout batch of
        ``prompts_per_step * group_size`` completions per optimizer step (``per_device_train_batch_size`` =
        ``micro_batch_size`` or this process's share, ``gradient_accumulation_steps = steps_per_generation``),
        ``max_steps`` (rollout steps) -> optimizer steps (``* num_iterations``), gtpo's loss types and
        aggregations -> TRL's. ``trl_options`` (any ``trl.GRPOConfig`` field: ``use_vllm``, ``deepspeed``,
        ``per_device_train_batch_size``, ...) are passed on and win; setting TRL's batch fields together with
        ``prompts_per_step`` / ``micro_batch_size`` given explicitly (``set_fields``: the fields the user set;
        default: those that differ from GTPOConfig's defaults) is refused. The precision follows gtpo's rule
        (:func:`trl_precision`): ``model_init_kwargs`` (which TRL loads the model with) gets the dtype of the
        weights, ``bf16`` whether the run computes in bfloat16; ``adapter``: whether a peft adapter trains
        (None: only with a quantized base). ``optim`` is passed as it is. GTPOConfig fields of gtpo's own trainer (:data:`ENGINE_ONLY`) are ignored with a warning when
        not at their default; DAPO's dynamic sampling is refused.
        """
        c = config

        # the fields given explicitly; without set_fields, those that differ from GTPOConfig's defaults
        given = {n for n in _GTPO_FIELDS if getattr(c, n) != field_default(n)} if set_fields is None else set(set_fields)

        def error(name: str, message: str) -> ConfigValueError:
            return ConfigValueError(f"{name}: {message}", name)

        unknown = [k for k in trl_options if k not in {f.name for f in dataclasses.fields(cls)}]
        if unknown:
            raise error(unknown[0], "not a field of trl.GRPOConfig (TRL's engine)")
        if c.resolved_dynamic_sampling:
            raise error("dynamic_sampling", "DAPO's dynamic sampling (resampling zero-variance groups) is not "
                        "available on TRL's engine: set dynamic_sampling: false, or use `engine: gtpo`")
        for name in ENGINE_ONLY:
            if name in given and getattr(c, name) != field_default(name):
                logger.warning("%s=%r is a setting of gtpo's own trainer; TRL's engine ignores it", name,
                               getattr(c, name))
        mu = c.num_iterations
        out: dict[str, Any] = {name: getattr(c, name) for name in GTPO_METHOD_FIELDS}
        if c.loss_type == "gtpo":
            loss_type = "gtpo"
        else:  # TRL's loss type of the same aggregation (TRL's grpo / dr_grpo / dapo differ only there)
            loss_type = {agg: name for name, agg in DEFAULT_AGGREGATION.items()}[c.resolved_loss_aggregation]
            for name, off in GTPOConfig.GTPO_SWITCHES.items():  # on: an ablation of gtpo's trainer
                out[name] = off[0] if getattr(c, name) in off else getattr(c, name)
        out.update(
            {name: getattr(c, name) for name in SAME_FIELDS},
            loss_type=loss_type, num_generations=c.group_size, scale_rewards=c.resolved_scale_rewards,
            **trl_precision(c, adapter=adapter, cpu=bool(trl_options.get("use_cpu"))),
            max_steps=c.max_steps * mu, warmup_steps=c.num_warmup_steps(mu),
            report_to=list(c.report_to) or "none",
            save_strategy="steps" if c.save_steps > 0 else "no", save_steps=max(c.save_steps, 1) * mu,
            eval_strategy="steps" if c.eval_steps > 0 else "no", eval_steps=max(c.eval_steps, 1) * mu,
        )
        batch_keys = {"per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                      "generation_batch_size"}
        if batch_keys & set(trl_options):
            both = sorted({"prompts_per_step", "micro_batch_size"} & given)
            if both:
                raise error(both[0], f"set either gtpo's batch ({', '.join(both)}) or TRL's "
                            f"({', '.join(sorted(batch_keys & set(trl_options)))}), not both")
        else:
            rollout = c.prompts_per_step * c.group_size
            if rollout % num_processes:
                raise error("prompts_per_step", f"the rollout batch of prompts_per_step * group_size = {rollout} "
                            f"completions must be divisible by the number of processes ({num_processes})")
            local = rollout // num_processes
            micro = c.micro_batch_size or local
            if local % micro:
                raise error("micro_batch_size", f"{micro} must divide each process's {local} completions "
                            f"(prompts_per_step * group_size / processes)")
            out.update(per_device_train_batch_size=micro, gradient_accumulation_steps=local // micro,
                       steps_per_generation=local // micro)
        out.update({name: getattr(c, name) for name in SHARED_VLLM_FIELDS if name in given})
        out.update(trl_options)
        return cls(**out)


def trl_precision(config: GTPOConfig, *, adapter: bool | None = None, cpu: bool = False) -> dict[str, Any]:
    """``model_init_kwargs`` and ``bf16`` of TRL's engine for ``config``, by gtpo's dtype rule
    (:mod:`gtpo.run.build`): the run's dtype (``dtype``; ``auto`` against this machine's GPU, or its CPU with
    ``cpu``), weights loaded in it under an adapter (``adapter``; None: only a quantized base is taken to
    train one) and in float32 for full fine-tuning (float32 master weights under bf16 autocast: TRL's
    ``bf16``), a 4-bit base computing in it unless ``bnb_4bit_compute_dtype`` is set. The values stay
    JSON (dtype names, the quantization mapping), as TRL logs its config. bf16 on a CPU sets ``use_cpu``."""
    from ..run.build import precision_for, resolve_dtype

    kwargs = dict(config.model_init_kwargs or {})
    quant = kwargs.get("quantization_config")
    device = torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")
    compute = resolve_dtype(config.requested_dtype, device) if config.requested_dtype != "float16" else torch.float16
    if compute == torch.float16:  # TRL's own fp16 path (loss scaling): as asked
        kwargs["dtype"] = "float16"
        return {"model_init_kwargs": kwargs, "bf16": False, "fp16": True}
    precision = precision_for(compute, adapter=bool(quant) if adapter is None else adapter)
    name = str(precision.load).removeprefix("torch.")
    kwargs["dtype"] = name
    if isinstance(quant, dict) and quant.get("load_in_4bit") and "bnb_4bit_compute_dtype" not in quant:
        kwargs["quantization_config"] = {**quant, "bnb_4bit_compute_dtype": str(compute).removeprefix("torch.")}
    out = {"model_init_kwargs": kwargs, "bf16": compute == torch.bfloat16}
    if out["bf16"] and device.type == "cpu":
        out["use_cpu"] = True  # transformers refuses bf16 on a machine without a GPU unless told it trains on CPU
    return out


def _document_fields() -> None:
    """TRL-style entries of the GTPO fields in :class:`TRLGTPOConfig`'s docstring, from GTPOConfig's help."""
    entries = []
    hints = {f.name: f.type for f in dataclasses.fields(GTPOConfig)}
    for name in GTPO_METHOD_FIELDS:
        f = _GTPO_FIELDS[name]
        kind = str(hints[name]).replace(" | None", "` or `None")
        entries.append(f"        {name} (`{kind}`, *optional*, defaults to `{f.default!r}`):\n"
                       f"            {f.metadata['help']}")
    TRLGTPOConfig.__doc__ = TRLGTPOConfig.__doc__.replace("        {gtpo_fields}", "\n".join(entries))


_document_fields()


# ----------------------------------------------------------------------------------------- rewards
class OverlongPenalty:
    """DAPO's soft overlong punishment (Yu et al. 2025) as a TRL reward function:
    :func:`gtpo.rewards.scoring.overlong_penalty` of each completion's length (``len(completion_ids[i])``, the
    first EOS included, as gtpo's trainer counts it). Appended to the reward functions with weight 1
    when ``overlong_buffer_length > 0``."""

    __name__ = "overlong_penalty"

    def __init__(self, max_completion_length: int, buffer_length: int, penalty_factor: float):
        self.max_completion_length = max_completion_length
        self.buffer_length = buffer_length
        self.penalty_factor = penalty_factor

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        lengths = torch.tensor([len(ids) for ids in completion_ids], dtype=torch.float32)
        return overlong_penalty(lengths, max_completion_length=self.max_completion_length,
                                buffer_length=self.buffer_length, penalty_factor=self.penalty_factor).tolist()


# ----------------------------------------------------------------------------------------- trainer
_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                    "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def _loss_mask(batch: dict) -> torch.Tensor:
    """``(N, T)`` TRL's loss mask: the completion mask (truncated rows zeroed with
    ``mask_truncated_completions``) times the tool mask when present."""
    mask = batch["completion_mask"]
    return mask if batch.get("tool_mask") is None else mask * batch["tool_mask"]


class TRLGTPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` that trains GTPO (arXiv 2508.03772) when ``args.loss_type == "gtpo"``.

    The constructor is ``trl.GRPOTrainer``'s (``model``, ``reward_funcs``, ``args``, ``train_dataset``,
    ``eval_dataset``, ``processing_class``, ``peft_config``, ``rollout_func``, ...); ``args`` is a
    :class:`TRLGTPOConfig` (default: ``TRLGTPOConfig("<model>-GTPO")``). With another ``loss_type`` the
    trainer is TRL's, plus ``logprob_temperature`` and ``overlong_buffer_length`` when they are set.

    Logged (``self._metrics``, TRL's logging): ``gtpo/conflict_frac`` (tokens in a conflict run / loss
    tokens), ``gtpo/n_conflict_mean``, ``gtpo/weighted_token_frac`` (loss tokens with lambda != 1),
    ``gtpo/filtered_frac`` (completions the entropy filter dropped), ``gtpo/adv_shaped_mean``,
    ``gtpo/adv_shift_mean`` (mean gamma shift of the kept completions), ``entropy`` (token mean),
    ``clip_ratio/region_mean`` and ``gtpo/initial_entropy`` (``<H>_ini``, the paper's rule; saved in
    each checkpoint as ``gtpo_state.json`` and restored on resume).
    """

    _tag_names = ["trl", "grpo", "gtpo"]
    _name = "GTPO"
    _paper = {
        "title": "GTPO: Stabilizing Group Relative Policy Optimization via Gradient and Entropy Control",
        "id": "2508.03772",
        "citation": (
            "@article{simoni2026gtpo,\n"
            "    title   = {{GTPO: Stabilizing Group Relative Policy Optimization via Gradient and Entropy Control}},\n"
            "    author  = {M. Simoni and A. Fontana and G. Rossolini and A. Saracino and P. Mori},\n"
            "    journal = {Transactions of the Association for Computational Linguistics},\n"
            "    year    = 2026,\n"
            "    eprint  = {arXiv:2508.03772},\n"
            "}"
        ),
    }

    def __init__(self, model, reward_funcs=None, args: TRLGTPOConfig | None = None, *rest, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", type(model).__name__)
            args = TRLGTPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-GTPO")
        elif not isinstance(args, TRLGTPOConfig):
            raise TypeError(f"args must be a gtpo.integrations.trl.TRLGTPOConfig (trl.GRPOConfig plus GTPO's "
                            f"fields), got {type(args).__name__}; build it with TRLGTPOConfig(...) or "
                            "TRLGTPOConfig.from_preset(...)")
        if args.loss_type == "gtpo" and (kwargs.get("tools") or kwargs.get("environment_factory")):
            raise ValueError("tools / environment_factory: tool outputs inside a completion are masked out of the "
                             "loss, which breaks the contiguous completion masks of GTPO's conflict runs; "
                             "loss_type='gtpo' does not support tool calling")
        if args.overlong_buffer_length > 0:
            funcs = [] if reward_funcs is None else list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) \
                else [reward_funcs]
            reward_funcs = funcs + [OverlongPenalty(args.max_completion_length, args.overlong_buffer_length,
                                                    args.overlong_penalty_factor)]
            if args.reward_weights is not None:
                args = copy.copy(args)
                args.reward_weights = [*args.reward_weights, 1.0]
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        self.gtpo_config: GTPOConfig | None = args.to_gtpo_config() if args.loss_type == "gtpo" else None
        # the loss of a micro-batch under TRL's normalisation (module documentation): the mean over B * GA
        # completions (times G for completion_reduction="sum"), with TRL's clip range
        self._gtpo_loss_config = None if self.gtpo_config is None else self.gtpo_config.replace(
            completion_reduction="mean", epsilon=self.epsilon_low, epsilon_high=self.epsilon_high)
        self.gtpo_initial_entropy: float | None = None  # <H>_ini (entropy_rule="initial")
        self._gtpo_rewards: torch.Tensor | None = None  # (N_global, n_funcs) of the last _calculate_rewards
        self._gtpo_capture = False  # keep the entropies of the next policy forward (rollout log-probs)
        self._gtpo_captured: torch.Tensor | None = None
        if args.resolved_logprob_temperature != args.temperature:
            self._patch_logprob_temperature(args.resolved_logprob_temperature)

    def _patch_logprob_temperature(self, temperature: float) -> None:
        """TRL's fused head divides the logits by the sampling temperature; gtpo's ``logprob_temperature``
        (the reference code samples at 0.9 and trains on the raw logits) replaces it for the training
        forwards (generation keeps ``temperature``)."""
        from trl.trainer.utils import add_fused_lm_head

        def base(m):  # as TRL: the head is patched on the model inside a PEFT wrapper
            try:
                from peft import PeftModel
            except ImportError:  # pragma: no cover - peft is a dependency of gtpo
                return m
            return m.get_base_model() if isinstance(m, PeftModel) else m

        add_fused_lm_head(base(self.model), temperature=temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                          outputs=("log_probs", "entropy"))
        if self.ref_model is not None:
            add_fused_lm_head(self.ref_model, temperature=temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)

    # ---------------------------------------------------------------------------- rollout side
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gtpo_rewards = rewards_per_func  # gathered over processes: (N_global, n_funcs), global row order
        return rewards_per_func

    def _get_per_token_logps_and_entropies(self, model, *args, compute_entropy=False, **kwargs):
        if not self._gtpo_capture or model is not self.model:
            return super()._get_per_token_logps_and_entropies(model, *args, compute_entropy=compute_entropy, **kwargs)
        # the rollout log-probs forward: the fused head computes the entropies anyway; keep them
        self._gtpo_capture = False
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(model, *args, compute_entropy=True,
                                                                           **kwargs)
        self._gtpo_captured = entropies
        return logps, entropies if compute_entropy else None, aux

    def _generate_and_score_completions(self, inputs):
        if self.gtpo_config is None:
            return super()._generate_and_score_completions(inputs)
        self._gtpo_capture, self._gtpo_captured = self.gtpo_config.entropy_control, None
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._gtpo_capture = False
        output.update(self._gtpo_inputs(output))
        self._gtpo_captured = None
        return output

    def _gtpo_inputs(self, batch: dict) -> dict[str, torch.Tensor]:
        """GTPO's per-row inputs of this process's ``N`` rows of ``batch`` (TRL's generation output), from whole
        groups: ``advantages (N,)`` with exact zeros for zero-variance groups, ``gtpo_token_weights (N, T)`` and
        ``gtpo_n_conflict (N,)`` (conflict masks on), ``gtpo_shift_mask (N,)`` (``gamma_groups="varying"``),
        ``gtpo_rows (N,)`` (``completion_sign``), ``gtpo_seq_entropy (N,)`` (rollout entropies, when TRL's
        rollout forward ran). Logs ``gtpo/conflict_frac``, ``gtpo/n_conflict_mean``, ``gtpo/initial_entropy``."""
        cfg, acc = self.gtpo_config, self.accelerator
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        ids, mask = batch["completion_ids"], _loss_mask(batch)
        n, t = ids.shape
        rank = acc.process_index
        local = slice(rank * n, (rank + 1) * n)
        out: dict[str, torch.Tensor] = {}

        # 1. exact zeros for zero-variance groups (as gtpo.maths.advantages.group_advantages)
        rpf = self._gtpo_rewards
        rewards = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)  # (N_global,)
        rewards[torch.isnan(rpf).all(dim=1)] = torch.nan
        constant = method.constant_groups(rewards, G)[local].to(batch["advantages"].device)  # (N,)
        advantages = torch.where(constant, torch.zeros_like(batch["advantages"]), batch["advantages"])
        out["advantages"] = advantages

        # 2. per-group inputs on whole groups (gtpo.maths.method.group_inputs): locally when this process holds whole
        #    groups (its rows are the contiguous slice `local` of the global batch), else on the gathered batch
        if cfg.resolved_conflict_masks or cfg.gamma_groups == "varying" or cfg.completion_sign != "all":
            whole = n % G == 0
            if whole:
                g_ids, g_mask, g_adv, rows = ids, mask, advantages, slice(0, n)
            else:
                g_ids = acc.gather(acc.pad_across_processes(ids, dim=1, pad_index=0))
                g_mask = acc.gather(acc.pad_across_processes(mask, dim=1, pad_index=0))
                g_adv = acc.gather(advantages)
                rows = local
            group = method.group_inputs(g_ids, g_mask, g_adv, cfg).rows(rows)
            if group.token_weights is not None:  # this process's columns (the gathered batch was padded)
                group = group._replace(token_weights=group.token_weights[:, :t], conflict_run=group.conflict_run[:, :t])
                stats = method.conflict_stats(group, mask)
                stats = acc.reduce(stats, reduction="sum")
                self._metrics[mode]["gtpo/conflict_frac"].append(float(stats[0] / stats[1].clamp(min=1)))
                self._metrics[mode]["gtpo/n_conflict_mean"].append(float(stats[2] / stats[3].clamp(min=1)))
                out["gtpo_token_weights"] = group.token_weights
                out["gtpo_n_conflict"] = group.n_conflict
            if group.shift_mask is not None:
                out["gtpo_shift_mask"] = group.shift_mask
            if group.sign_mask is not None:
                out["gtpo_rows"] = group.sign_mask

        # 3. the rollout policy's completion entropies, when TRL's rollout log-probs forward ran
        if self._gtpo_captured is not None:
            out["gtpo_seq_entropy"] = method.completion_entropy(self._gtpo_captured, mask)

        # 4. <H>_ini: the policy's mean completion entropy on the first batch (the paper's rule)
        if method.uses_initial_entropy(cfg):
            if self.gtpo_initial_entropy is None:
                self.gtpo_initial_entropy = self._measure_initial_entropy(batch, mask, out.get("gtpo_seq_entropy"))
            if self.gtpo_initial_entropy is not None:
                self._metrics[mode]["gtpo/initial_entropy"].append(self.gtpo_initial_entropy)
        return out

    @torch.no_grad()
    def _measure_initial_entropy(self, batch: dict, mask: torch.Tensor, seq_entropy: torch.Tensor | None) -> float | None:
        """``<H>_ini``: the mean over the completions with loss tokens (all processes) of their mean token entropy
        under the current policy (at ``logprob_temperature``); one extra forward unless ``seq_entropy (N,)`` is
        given. None (measured again on the next batch) when no completion has tokens or it is not finite."""
        if seq_entropy is None:
            from trl.models.utils import disable_gradient_checkpointing

            input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                _, entropies, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, batch["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size, compute_entropy=True,
                    **{k: batch.get(k) for k in _MULTIMODAL_KEYS},
                )
            seq_entropy = method.completion_entropy(entropies, mask)
        total = self.accelerator.reduce(method.initial_entropy_sums(seq_entropy, mask), reduction="sum")
        return method.initial_entropy_value(total)

    # ------------------------------------------------------------------------------- loss side
    def _compute_loss(self, model, inputs):
        if self.gtpo_config is None:
            return super()._compute_loss(model, inputs)
        cfg, acc = self.gtpo_config, self.accelerator
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = _loss_mask(inputs)  # (B, T)
        logp, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled, **{k: inputs.get(k) for k in _MULTIMODAL_KEYS},
        )  # (B, T) each
        B = completion_ids.size(0)

        # <H>_i of the rollout policy: from generation time, or this forward's (the policy has not changed
        # since the rollout), kept in the micro-batch for the later passes (num_iterations)
        seq_entropy = inputs.get("gtpo_seq_entropy")
        if seq_entropy is None and cfg.entropy_control:
            seq_entropy = method.completion_entropy(entropies, mask)
            inputs["gtpo_seq_entropy"] = seq_entropy
        advantages = inputs["advantages"]  # (B,) unshaped
        initial = self.gtpo_initial_entropy if method.uses_initial_entropy(cfg) else None
        effective, dropped, _ = method.effective_advantages(advantages, seq_entropy, cfg, initial_entropy=initial,
                                                            shift_mask=inputs.get("gtpo_shift_mask"),
                                                            sign_rows=inputs.get("gtpo_rows"))

        # lambda, times TRL's per-token multipliers that combine with GTPO
        lam = inputs.get("gtpo_token_weights")  # (B, T) or None
        extra = None
        if self.top_entropy_quantile < 1.0:
            extra = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            ratio = inputs["importance_sampling_ratio"]  # (B, T) or (B, 1)
            extra = ratio if extra is None else extra * ratio
        if self.off_policy_mask_threshold is not None:
            old = inputs.get("old_per_token_logps")
            sampling = inputs.get("sampling_per_token_logps", old if old is not None else logp.detach())
            off = self.get_off_policy_mask(advantages.unsqueeze(1), logp, sampling, mask, self.off_policy_mask_threshold)
            extra = off if extra is None else extra * off
        token_weights = lam
        if extra is not None:
            base = lam if lam is not None else torch.ones_like(logp)
            token_weights = base * extra.to(base.dtype)
        n_conflict = inputs.get("gtpo_n_conflict")

        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        extras = LossExtras(token_weights=token_weights, n_conflict=n_conflict, num_sequences=B * accumulation)
        out = POLICY_LOSSES["gtpo"](logp, inputs.get("old_per_token_logps"), effective, mask, extras,
                                    self._gtpo_loss_config)
        loss = out.loss * G if cfg.completion_reduction == "sum" else out.loss

        if self.aux_loss_enabled:  # as TRL: scaled for gradient accumulation
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(acc.gather_for_metrics(aux_loss).mean().item())
        self._log_loss_metrics(mode, mask, entropies, advantages, effective, dropped, lam, out.metrics)
        return loss

    def _log_loss_metrics(self, mode: str, mask, entropies, advantages, effective, dropped, lam, metrics) -> None:
        """The loss metrics of a micro-batch, reduced over processes in one call (one host sync)."""
        maskf = mask.float()
        tokens = maskf.sum()
        kept = (~dropped).float()
        weighted = ((lam != 1).float() * maskf).sum() if lam is not None else torch.zeros((), device=maskf.device)
        local = torch.stack([
            (entropies.detach().float() * maskf).sum(), tokens,
            dropped.float().sum(), torch.tensor(float(mask.shape[0]), device=maskf.device),
            effective.detach().float().sum(),
            ((effective - advantages).detach().float() * kept).sum(), kept.sum(),
            weighted, metrics["clipfrac"].float() * tokens,
        ])
        total = self.accelerator.reduce(local, reduction="sum").tolist()
        m = self._metrics[mode]
        m["entropy"].append(total[0] / max(total[1], 1.0))
        m["gtpo/filtered_frac"].append(total[2] / total[3])
        m["gtpo/adv_shaped_mean"].append(total[4] / total[3])
        m["gtpo/adv_shift_mean"].append(total[5] / max(total[6], 1.0))
        m["gtpo/weighted_token_frac"].append(total[7] / max(total[1], 1.0))
        m["clip_ratio/region_mean"].append(total[8] / max(total[1], 1.0))

    # --------------------------------------------------------------------------- checkpoints
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.gtpo_config is not None and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            with open(os.path.join(folder, "gtpo_state.json"), "w") as fh:
                json.dump({"initial_entropy": self.gtpo_initial_entropy}, fh)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = None if checkpoint is None else os.path.join(checkpoint, "gtpo_state.json")
        if self.gtpo_config is not None and path is not None and os.path.exists(path):
            with open(path) as fh:
                self.gtpo_initial_entropy = json.load(fh)["initial_entropy"]


# ----------------------------------------------------------------------------------------- gtpo train --engine trl
def _metrics_record(logs: dict[str, Any], step: int) -> dict[str, Any]:
    """One ``metrics.jsonl`` line from a TRL log dict: TRL's names as they are (gtpo's trainer writes the same ones,
    :mod:`gtpo.run.metric_names`), ``eval_x`` -> ``eval/x`` as TRL's trackers show them."""
    record: dict[str, Any] = {"step": step}
    for key, value in logs.items():
        record["eval/" + key[len("eval_"):] if key.startswith("eval_") else key] = value
    return record


def metrics_file_callback(output_dir: str):
    """A TrainerCallback appending every log of the main process to ``output_dir/metrics.jsonl``."""
    from transformers import TrainerCallback

    class MetricsFile(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                os.makedirs(output_dir, exist_ok=True)
                with open(os.path.join(output_dir, "metrics.jsonl"), "a") as fh:
                    fh.write(json.dumps(_metrics_record(logs, state.global_step)) + "\n")

    return MetricsFile()


def drop_long_prompts(dataset, tokenizer, limit: int):
    """``dataset`` without the prompts longer than ``limit`` tokens (chat template applied), as gtpo's trainer
    does (TRL's GRPOTrainer has no prompt-length limit)."""
    from ..sampling.rollout import encode_prompts

    lengths = [len(ids) for ids in encode_prompts(tokenizer, list(dataset["prompt"]))]
    keep = [i for i, n in enumerate(lengths) if n <= limit]
    if not keep:
        raise ConfigError(f"max_prompt_length: every prompt of the dataset is longer than {limit} tokens (the "
                          f"shortest has {min(lengths)}); raise max_prompt_length")
    if len(keep) < len(lengths):
        logger.warning("train_dataset: dropped %d of %d prompts longer than max_prompt_length=%d",
                       len(lengths) - len(keep), len(lengths), limit)
        dataset = dataset.select(keep)
    return dataset


#: trl.GRPOConfig fields that a gtpo YAML sets under gtpo's name (so that it trains under both engines)
_GTPO_NAMED = {"num_generations": "group_size"}


def check_trl_options(options: dict[str, Any], gtpo_keys: list[str], where) -> dict[str, Any]:
    """``options`` (YAML keys that are not gtpo's) checked against ``trl.GRPOConfig``'s fields; an unknown key or
    one that gtpo's YAML spells differently raises :class:`~gtpo.errors.ConfigError` naming it (``where(key)``:
    the option or the file)."""
    trl_fields = [f.name for f in dataclasses.fields(GRPOConfig)]
    for key in options:
        if key in _GTPO_NAMED:
            raise ConfigError(f"{where(key)}: {key} is set by gtpo's {_GTPO_NAMED[key]!r} (the same YAML trains under "
                              f"both engines); use {_GTPO_NAMED[key]}")
        if key not in trl_fields:
            import difflib

            close = difflib.get_close_matches(key, gtpo_keys + trl_fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where(key)}: unknown config field {key!r} (neither a gtpo field nor an option of "
                              f"trl.GRPOConfig){hint}")
    return dict(options)
