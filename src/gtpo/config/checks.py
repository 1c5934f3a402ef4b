"""What a GTPOConfig does when built (:func:`settle`, its ``__post_init__``) and the checks of
:meth:`gtpo.config.GTPOConfig.validate`: each a function of the config, raising a ValueError whose message starts with
``GTPOConfig.<field>`` (:func:`check` turns it into a :class:`gtpo.errors.ConfigValueError` naming that field).

This module imports nothing from torch or the rest of the package.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from typing import Any

from ..errors import ConfigValueError
from .declarations import field_annotation, type_problem

logger = logging.getLogger("gtpo")


def settle(config: Any) -> None:
    """GTPOConfig's ``__post_init__``: TRL's ``num_generations`` taken as ``group_size``, ``report_to`` and tuples
    stored as lists, :meth:`GTPOConfig.validate`, then an int given for a float field stored as a float."""
    trl_name = config.num_generations is not None
    if trl_name:  # TRL's name of group_size
        default = type(config).__dataclass_fields__["group_size"].default
        if config.group_size not in (default, config.num_generations):
            raise ConfigValueError(
                f"GTPOConfig.num_generations={config.num_generations!r} is TRL's name of group_size, which is "
                f"{config.group_size!r}: set one of them", "num_generations")
        config.group_size, config.num_generations = config.num_generations, None
    if config.generation_batch_size is not None:  # TRL's name of the rollout batch in completions
        default = type(config).__dataclass_fields__["prompts_per_step"].default
        completions, group = config.generation_batch_size, config.group_size
        if isinstance(completions, bool) or not isinstance(completions, int) or completions < 1 or \
                (isinstance(group, int) and group >= 1 and completions % group):
            raise ConfigValueError(
                f"GTPOConfig.generation_batch_size={completions!r} (TRL's name of the rollout batch in completions, "
                f"prompts_per_step x group_size) must be a positive multiple of group_size ({group!r})",
                "generation_batch_size")
        if config.prompts_per_step not in (default, completions // group):
            raise ConfigValueError(
                f"GTPOConfig.generation_batch_size={completions!r} is TRL's name of prompts_per_step x group_size, "
                f"which is {config.prompts_per_step!r} x {group!r}: set one of them", "generation_batch_size")
        config.prompts_per_step, config.generation_batch_size = completions // group, None
    if isinstance(config.report_to, str):
        config.report_to = [config.report_to]
    if isinstance(config.report_to, (list, tuple)):
        config.report_to = [t for t in config.report_to if t not in ("none", "")]
    for name in ("eval_k", "reward_weights"):  # tuples are accepted; stored as lists (JSON round trip)
        if isinstance(getattr(config, name), tuple):
            setattr(config, name, list(getattr(config, name)))
    try:
        config.validate()
    except ConfigValueError as err:
        if trl_name and err.field == "group_size":  # the user wrote TRL's name: say that one
            raise ConfigValueError(f"{err} (given as num_generations, TRL's name of group_size)",
                                   "num_generations") from None
        raise
    epochs_default = type(config).__dataclass_fields__["num_train_epochs"].default
    if config.max_steps > 0 and config.num_train_epochs != epochs_default:
        logger.warning("GTPOConfig: num_train_epochs=%s is not used: max_steps=%d decides the length of the run "
                       "(as in TRL); set max_steps=-1 to train num_train_epochs epochs", config.num_train_epochs,
                       config.max_steps)
    for f in dataclasses.fields(config):  # an int given for a float field is stored as a float
        value = getattr(config, f.name)
        if field_annotation(f) in ("float", "float | None") and isinstance(value, int) and not isinstance(value, bool):
            setattr(config, f.name, float(value))


def check(config: Any) -> None:
    """:func:`check_values`, a ValueError turned into a :class:`ConfigValueError` naming the field its message
    starts with (``GTPOConfig.<field>``)."""
    try:
        check_values(config)
    except ConfigValueError:
        raise
    except ValueError as err:  # every message starts with "GTPOConfig.<field>"
        found = re.match(r"GTPOConfig\.(\w+)", str(err))
        raise ConfigValueError(str(err), found.group(1) if found else None) from None


def check_values(config: Any) -> None:
    """Every check of :meth:`GTPOConfig.validate` (which turns a ValueError into a :class:`ConfigValueError`):
    each value against its annotation, then ranges and choices, then combinations of fields."""
    for f in dataclasses.fields(config):
        problem = type_problem(getattr(config, f.name), field_annotation(f))
        if problem:
            raise ValueError(f"GTPOConfig.{f.name} must be {problem}, got {getattr(config, f.name)!r}")

    def at_least(name: str, low: float, *, allow_none: bool = False, strict: bool = False,
                 allow_inf: bool = False) -> None:
        value = getattr(config, name)
        if value is None and allow_none:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"GTPOConfig.{name} must be a number, got {value!r}")
        if math.isinf(value) and not allow_inf:
            raise ValueError(f"GTPOConfig.{name} must be a finite number, got {value!r}")
        if value < low or (strict and value == low):
            rel = ">" if strict else ">="
            raise ValueError(f"GTPOConfig.{name} must be {rel} {low}, got {value!r}")

    for f in dataclasses.fields(config):  # the choice fields: their values from their declarations (_f(choices=...))
        options, value = f.metadata.get("choices"), getattr(config, f.name)
        if options is None or (value is None and f.default is None):
            continue
        if isinstance(value, list):  # a list field (report_to): each entry
            bad = [v for v in value if v not in options]
            if bad:
                raise ValueError(f"GTPOConfig.{f.name} entries must be in {list(options)}, got {bad!r}")
        elif value not in options:
            note = f" ({f.metadata['choices_note']})" if f.metadata.get("choices_note") else ""
            words = "None or one of" if f.default is None else "one of"
            raise ValueError(f"GTPOConfig.{f.name} must be {words} {list(options)}{note}, got {value!r}")
    if isinstance(config.group_size, bool) or not isinstance(config.group_size, int) or config.group_size < 2:
        raise ValueError(
            f"GTPOConfig.group_size must be an integer >= 2 (advantages are relative to the group), "
            f"got {config.group_size!r}"
        )
    if isinstance(config.max_steps, bool) or not isinstance(config.max_steps, int) or \
            (config.max_steps < 1 and config.max_steps != -1):
        raise ValueError(f"GTPOConfig.max_steps must be an integer >= 1, or -1 (num_train_epochs decides, as in TRL), "
                         f"got {config.max_steps!r}")
    at_least("num_train_epochs", 0.0, strict=True)
    for name in ("prompts_per_step", "num_iterations", "max_prompt_length", "max_completion_length"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"GTPOConfig.{name} must be an integer >= 1, got {value!r}")
    value = config.max_tool_calling_iterations
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"GTPOConfig.max_tool_calling_iterations must be an integer >= 0 or None (no limit), got "
                         f"{value!r}")
    value = config.tool_call_timeout
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ValueError(f"GTPOConfig.tool_call_timeout must be a number of seconds > 0 or None (no limit), got "
                         f"{value!r}")
    if isinstance(config.ddp_timeout, bool) or not isinstance(config.ddp_timeout, int) or config.ddp_timeout < 1:
        raise ValueError(f"GTPOConfig.ddp_timeout must be an integer >= 1 (seconds), got {config.ddp_timeout!r}")
    for name in ("logging_steps", "save_steps", "eval_steps"):  # TRL's fraction of the run, or a count
        value = getattr(config, name)
        if isinstance(value, float) and not value.is_integer() and not 0 < value < 1:
            raise ValueError(f"GTPOConfig.{name} must be an integer or a fraction of the run in (0, 1), got {value!r}")
        if isinstance(value, float) and value.is_integer():
            setattr(config, name, int(value))
    if not (isinstance(config.logging_steps, float) or config.logging_steps >= 1):
        raise ValueError(f"GTPOConfig.logging_steps must be an integer >= 1 or a fraction in (0, 1), got "
                         f"{config.logging_steps!r}")
    for name in ("eval_num_samples", "max_consecutive_skips"):
        if getattr(config, name) < 1:
            raise ValueError(f"GTPOConfig.{name} must be an integer >= 1, got {getattr(config, name)!r}")
    if isinstance(config.save_steps, bool) or (isinstance(config.save_steps, int) and config.save_steps < 0):
        raise ValueError(f"GTPOConfig.save_steps must be an integer >= 0 or a fraction in (0, 1), got "
                         f"{config.save_steps!r}")
    for name in ("log_completions_steps", "overlong_buffer_length", "max_resample_rounds", "top_k"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"GTPOConfig.{name} must be an integer >= 0, got {value!r}")
    if config.num_completions_to_print is not None and config.num_completions_to_print < 0:
        raise ValueError("GTPOConfig.num_completions_to_print must be None (all) or an integer >= 0, got "
                         f"{config.num_completions_to_print!r}")
    if config.eval_steps is not None and (isinstance(config.eval_steps, bool) or config.eval_steps < 0):
        raise ValueError(f"GTPOConfig.eval_steps must be None or an integer >= 0, got {config.eval_steps!r}")
    for name in ("micro_batch_size", "generation_chunk_size", "logprob_chunk_size", "eval_max_new_tokens",
                 "per_device_eval_batch_size"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"GTPOConfig.{name} must be None or an integer >= 1, got {value!r}")
    if config.save_total_limit is not None and config.save_total_limit < 0:
        raise ValueError(f"GTPOConfig.save_total_limit must be None or an integer >= 0, got {config.save_total_limit!r}")
    if config.overlong_buffer_length > config.max_completion_length:
        raise ValueError(
            f"GTPOConfig.overlong_buffer_length ({config.overlong_buffer_length}) must be at most "
            f"max_completion_length ({config.max_completion_length})"
        )
    for name in ("pos_weight", "neg_weight"):
        if not math.isfinite(getattr(config, name)):
            raise ValueError(f"GTPOConfig.{name} must be a finite number, got {getattr(config, name)!r}")
    for name in ("adam_beta1", "adam_beta2"):
        value = getattr(config, name)
        if math.isnan(value) or not 0.0 <= value < 1.0:
            raise ValueError(f"GTPOConfig.{name} must be in [0, 1), got {value!r}")
    at_least("repetition_penalty", 0.0, strict=True)
    at_least("adam_epsilon", 0.0)
    at_least("overlong_penalty_factor", 0.0)
    at_least("eval_temperature", 0.0)
    at_least("temperature", 0.0, strict=True)
    at_least("logprob_temperature", 0.0, strict=True, allow_none=True)
    at_least("learning_rate", 0.0)
    at_least("epsilon", 0.0)
    at_least("epsilon_high", 0.0, allow_none=True)
    at_least("beta", 0.0)
    at_least("gamma", 0.0, allow_none=True)
    at_least("entropy_threshold", 0.0, allow_inf=True)  # inf: the filter never drops anything
    at_least("max_grad_norm", 0.0, allow_inf=True)  # inf (like 0): no clipping
    at_least("weight_decay", 0.0)
    at_least("warmup_ratio", 0.0)
    at_least("warmup_steps", 0.0)
    if not 0.0 < config.top_p <= 1.0:
        raise ValueError(f"GTPOConfig.top_p must be in (0, 1], got {config.top_p!r}")
    if config.warmup_ratio > 1.0:
        raise ValueError(f"GTPOConfig.warmup_ratio must be in [0, 1], got {config.warmup_ratio!r}")
    if config.loss_type == "gtpo" and config.beta > 0:
        raise ValueError(
            "GTPOConfig.beta must be 0 for loss_type='gtpo': GTPO drops the KL term and loads no "
            f"reference model (arXiv 2508.03772), got beta={config.beta!r}"
        )
    check_baseline_purity(config)
    if config.loss_type == "gtpo" and config.loss_aggregation is not None:
        raise ValueError(
            "GTPOConfig.loss_aggregation applies to grpo/dr_grpo/dapo; GTPO uses completion_reduction "
            f"and divide_by_conflict_count instead, got loss_aggregation={config.loss_aggregation!r}"
        )
    check_vllm(config)
    if config.reward_weights is not None and not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in config.reward_weights
    ):
        raise ValueError(f"GTPOConfig.reward_weights must be a list of finite numbers, got {config.reward_weights!r}")
    _check_model_init_kwargs(config.model_init_kwargs)
    _check_checkpointing_kwargs(config.gradient_checkpointing_kwargs)
    kwargs = config.lr_scheduler_kwargs
    if kwargs is not None and (not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs)):
        raise ValueError("GTPOConfig.lr_scheduler_kwargs must be a mapping of the schedule's keyword arguments (e.g. "
                         f"{{min_lr_rate: 0.1}} for cosine_with_min_lr), got {kwargs!r}")
    if config.decode_compile not in (True, False, "auto"):
        raise ValueError(f"GTPOConfig.decode_compile must be 'auto', true or false, got {config.decode_compile!r}")
    check_precision(config)
    if not config.eval_k or any((not isinstance(k, int)) or k < 1 for k in config.eval_k):
        raise ValueError(f"GTPOConfig.eval_k must be a non-empty list of integers >= 1, got {config.eval_k!r}")

def check_gtpo_engine(config: Any) -> None:
    """What gtpo's own trainer refuses of a valid config (TRL's engine takes it): ``save_strategy: best``,
    ``disable_dropout: false``. Raises :class:`ConfigValueError` naming the field, the reason and the alternative;
    called before the model loads."""
    if not config.disable_dropout:
        raise ConfigValueError(
            "GTPOConfig.disable_dropout=False: gtpo's trainer trains without dropout (its forward passes are "
            "deterministic); set disable_dropout: true, or train with dropout on TRL's engine (engine: trl, "
            "--engine trl)", "disable_dropout")
    if config.save_strategy == "best":
        raise ConfigValueError(
            "GTPOConfig.save_strategy='best' saves a checkpoint at each new best value of metric_for_best_model, an "
            "evaluation metric that gtpo's engine does not rank checkpoints by; use save_strategy 'steps' (every "
            "save_steps), 'epoch' or 'no', or train on TRL's engine (engine: trl, --engine trl) with "
            "metric_for_best_model and an eval_strategy", "save_strategy")


def check_baseline_purity(config: Any) -> None:
    """A baseline loss with GTPO's switches on is refused unless ``gtpo_ablation`` says it is meant."""
    on = config.gtpo_switches_on()
    if on and not config.gtpo_ablation:
        raise ValueError(
            f"GTPOConfig.loss_type={config.loss_type!r} is a baseline, but GTPO's {', '.join(on)} would change it "
            f"(a {config.loss_type} run mixed with GTPO). For the pure baseline unset them (null, or "
            "gamma: 0 / entropy_filter: false / conflict_masks: false / completion_sign: all), e.g. start from "
            f"--preset {config.loss_type} without a GTPO YAML; for an ablation that adds them to {config.loss_type}, "
            "set gtpo_ablation: true (--gtpo_ablation true)"
        )

def check_vllm(config: Any) -> None:
    """The vLLM fields: ranges and what ``use_vllm`` needs (their choices: :func:`check_values`)."""
    util = config.vllm_gpu_memory_utilization
    if math.isnan(util) or not 0.0 < util <= 1.0:
        raise ValueError(f"GTPOConfig.vllm_gpu_memory_utilization must be in (0, 1], got {util!r}")
    for name in ("vllm_kv_cache_memory_bytes", "vllm_max_model_length"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"GTPOConfig.{name} must be None or an integer >= 1, got {value!r}")
    low, high = config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max
    for name, value in (("vllm_importance_sampling_clip_min", low), ("vllm_importance_sampling_clip_max", high)):
        if value is not None and (math.isnan(value) or value < 0):
            raise ValueError(f"GTPOConfig.{name} must be None or a number >= 0, got {value!r}")
    if high is not None and high <= 0:
        raise ValueError(f"GTPOConfig.vllm_importance_sampling_clip_max must be None or > 0, got {high!r}")
    if low is not None and high is not None and low > high:
        raise ValueError(f"GTPOConfig.vllm_importance_sampling_clip_min ({low}) must be at most "
                         f"vllm_importance_sampling_clip_max ({high})")
    if not config.use_vllm:
        return
    need = config.max_prompt_length + config.max_completion_length
    if config.vllm_max_model_length is not None and config.vllm_max_model_length < need:
        raise ValueError(
            f"GTPOConfig.vllm_max_model_length ({config.vllm_max_model_length}) must hold max_prompt_length + "
            f"max_completion_length = {need} tokens; raise it or leave it None")
    if config.vllm_importance_sampling_correction and config.vllm_logprobs_mode is None:
        raise ValueError(
            "GTPOConfig.vllm_importance_sampling_correction=True needs vLLM's log-probs at logprob_temperature "
            f"({config.logprob_temperature}), but vLLM gives them only at the sampling temperature "
            f"({config.temperature}) or at 1.0: the ratio would correct the temperature change, not the sampler's "
            "mismatch. Leave it None (off here), or set logprob_temperature to null, the temperature or 1.0")

def check_precision(config: Any) -> None:
    """``dtype`` / ``model_init_kwargs.dtype`` / ``bf16`` agreeing (the choices of ``dtype``, ``save_dtype`` and
    ``optim``: :func:`check_values`)."""
    loaded = (config.model_init_kwargs or {}).get("dtype")
    if config.dtype is not None and loaded is not None and loaded != config.dtype:
        raise ValueError(f"GTPOConfig.dtype ({config.dtype!r}) and model_init_kwargs.dtype ({loaded!r}) disagree: "
                         "set one of them (dtype is the run's precision; docs/gpu.md)")
    if config.bf16 and config.requested_dtype not in ("bfloat16", "auto"):
        where = "dtype" if config.dtype is not None else "model_init_kwargs.dtype"
        raise ValueError(f"GTPOConfig.bf16 is true but {where} is {config.requested_dtype!r}: bf16: true means "
                         "dtype: bfloat16; set one of them")


# ----------------------------------------------------------------------------- model loading options
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32")


def _check_model_init_kwargs(kwargs: Any) -> None:
    """``model_init_kwargs``: a mapping; ``dtype`` one of :data:`MODEL_DTYPES`; ``quantization_config``
    a mapping (of ``transformers.BitsAndBytesConfig`` fields)."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"GTPOConfig.model_init_kwargs must be a mapping of from_pretrained arguments, got {kwargs!r}")
    if "torch_dtype" in kwargs:
        raise ValueError("GTPOConfig.model_init_kwargs: use 'dtype' (transformers >= 4.56), not 'torch_dtype'")
    dtype = kwargs.get("dtype")
    if dtype is not None and dtype not in MODEL_DTYPES:
        raise ValueError(f"GTPOConfig.model_init_kwargs.dtype must be one of {list(MODEL_DTYPES)}, got {dtype!r}")
    quant = kwargs.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise ValueError("GTPOConfig.model_init_kwargs.quantization_config must be a mapping of BitsAndBytesConfig "
                         f"fields (e.g. {{load_in_4bit: true, bnb_4bit_quant_type: nf4}}), got {quant!r}")


def _check_checkpointing_kwargs(kwargs: Any) -> None:
    """``gradient_checkpointing_kwargs``: None or a mapping of keyword names; ``every_n_layers`` an integer >= 1,
    ``offload`` and ``use_reentrant`` true or false (the other keys are torch.utils.checkpoint's, which checks them)."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("GTPOConfig.gradient_checkpointing_kwargs must be a mapping of keyword arguments (e.g. "
                         f"{{use_reentrant: false}}), got {kwargs!r}")
    every = kwargs.get("every_n_layers", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"GTPOConfig.gradient_checkpointing_kwargs.every_n_layers must be an integer >= 1, got "
                         f"{every!r}")
    for key in ("offload", "use_reentrant", "preserve_rng_state"):
        if key in kwargs and not isinstance(kwargs[key], bool):
            raise ValueError(f"GTPOConfig.gradient_checkpointing_kwargs.{key} must be true or false, got "
                             f"{kwargs[key]!r}")
