"""TRL's engine, its config: :class:`TRLGTPOConfig` (``trl.GRPOConfig`` plus GTPO's method fields, read from
:class:`gtpo.GTPOConfig`'s declarations), the field lists by role on this engine (``RENAMED``, ``ENGINE_ONLY``,
``UNAVAILABLE``, ``SAME_FIELDS``, ``GTPO_METHOD_FIELDS``), the precision rule (:func:`trl_precision`), the check of a
YAML's TRL options (:func:`check_trl_options`) and of the installed TRL (:func:`missing_trl_api`, at import).
The engine itself is :mod:`gtpo.integrations.trl.trainer`; the package's documentation: :mod:`gtpo.integrations.trl`.
"""

from __future__ import annotations

import dataclasses
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

from ...config import (DEFAULT_AGGREGATION, SHARED_VLLM_FIELDS, GTPOConfig, field_default, fields_where,
                       resolved)
from ...errors import ConfigError, ConfigValueError

__all__ = ["ENGINE_ONLY", "GTPO_METHOD_FIELDS", "RENAMED", "SAME_FIELDS", "SHARED_VLLM_FIELDS", "TESTED_TRL",
           "TRLGTPOConfig", "UNAVAILABLE", "check_trl_options", "missing_trl_api", "trl_precision"]

logger = logging.getLogger("gtpo")

# What this package uses of TRL beyond its public trainer and config (private API of trl 1.x): checked at import,
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
    """The names this package needs that the installed TRL lacks: ``GRPOTrainer`` methods it overrides, the
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
            max_steps=c.max_steps * mu if c.max_steps > 0 else -1, warmup_steps=_warmup_steps(c, mu),
            report_to=list(c.report_to) or "none",
            # save_steps 0 under 'steps' is gtpo's "no checkpoints" (transformers needs save_steps > 0 there)
            save_strategy="no" if c.save_strategy == "steps" and c.save_steps == 0 else c.save_strategy,
            save_steps=_optimizer_steps(c.save_steps, mu, minimum=1),
            eval_strategy=c.resolved_eval_strategy, eval_steps=_optimizer_steps(c.resolved_eval_steps, mu),
        )
        if c.per_device_eval_batch_size is not None:
            out["per_device_eval_batch_size"] = c.per_device_eval_batch_size
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
        args = cls(**out)
        # a float32 run: transformers took ACCELERATE_MIXED_PRECISION (the launcher's) for TRL's Accelerator
        # when neither bf16 nor fp16 is set; the run's dtype decides, as on gtpo's engine (DeepSpeed: its config).
        # transformers 5 keeps it in args.mixed_precision; transformers 4 writes it back to the variable, which
        # its Accelerator reads (so the variable is set to "no" there, as transformers 4 itself sets it)
        v5 = hasattr(args, "mixed_precision")
        launcher = args.mixed_precision if v5 else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        if not (args.bf16 or args.fp16 or args.deepspeed) and launcher != "no":
            from ...run.build import launcher_mixed_precision

            launcher_mixed_precision(torch.float32, where="TRL's engine")
            if v5:
                args.mixed_precision = "no"
            else:
                os.environ["ACCELERATE_MIXED_PRECISION"] = "no"
        return args


def _warmup_steps(config: GTPOConfig, mu: int) -> float:
    """TRL's ``warmup_steps`` (in its optimizer steps, ``mu`` per gtpo step) for ``config``: with ``max_steps`` -1 the
    step count is TRL's to compute (from ``num_train_epochs``), so a fraction (``warmup_steps`` < 1, else
    ``warmup_ratio``) is passed as a fraction, which transformers applies to its step count, rounded up as gtpo does."""
    if config.max_steps > 0 or config.warmup_steps >= 1:
        return config.num_warmup_steps(mu)
    return config.warmup_steps if config.warmup_steps > 0 else config.warmup_ratio


def _optimizer_steps(every: int | float, mu: int, *, minimum: int = 0) -> int | float:
    """An interval of gtpo's rollout steps in TRL's optimizer steps (``mu`` = ``num_iterations`` per rollout); a
    fraction of the run (TRL's float in (0, 1)) is the same fraction of TRL's."""
    if isinstance(every, float) and 0 < every < 1:
        return every
    return max(int(every), minimum) * mu


def trl_precision(config: GTPOConfig, *, adapter: bool | None = None, cpu: bool = False) -> dict[str, Any]:
    """``model_init_kwargs`` and ``bf16`` of TRL's engine for ``config``, by gtpo's dtype rule
    (:mod:`gtpo.run.build`): the run's dtype (``dtype``; ``auto`` against this machine's GPU, or its CPU with
    ``cpu``), weights loaded in it under an adapter (``adapter``; None: only a quantized base is taken to
    train one) and in float32 for full fine-tuning (float32 master weights under bf16 autocast: TRL's
    ``bf16``), a 4-bit base computing in it unless ``bnb_4bit_compute_dtype`` is set. The values stay
    JSON (dtype names, the quantization mapping), as TRL logs its config. bf16 on a CPU sets ``use_cpu``."""
    from ...run.build import precision_for, resolve_dtype

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
