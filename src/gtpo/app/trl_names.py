"""A YAML written for ``trl grpo --config``, read by ``gtpo train``: TRL's script and model names mapped onto the
spec's keys, the same way for both engines.

``trl grpo`` reads one YAML into four dataclasses: its script arguments (``dataset_name``, ``dataset_config``,
``dataset_train_split``, ``dataset_test_split``, ``reward_funcs``, ``reward_model_name_or_path``), ``ModelConfig``
(``model_name_or_path``, ``use_peft`` and ``lora_*``, ``load_in_4bit`` and ``bnb_*``, ``attn_implementation``,
``model_revision``, ``dtype``), ``GRPOConfig`` and the dataset mixture. :func:`apply_trl_names` rewrites the first
two into gtpo's run keys (``model``, ``dataset``, ``eval_dataset``, ``reward_funcs``, ``peft``,
``model_init_kwargs``), with TRL's meaning (e.g. the LoRA settings apply only with ``use_peft: true``; the test
split is the evaluation set only when ``eval_strategy`` is not ``no``); a spec that sets ``num_train_epochs`` but not
``max_steps`` gets ``max_steps: -1``, TRL's default, so that the epochs decide as in ``trl grpo``. ``num_generations`` is
:class:`gtpo.GTPOConfig`'s own alias of ``group_size``. On gtpo's engine TRL's batch fields
(``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``steps_per_generation``) become the same batch in
gtpo's terms (:func:`_trl_batch_on_gtpo_engine`); the other ``GRPOConfig`` options exist only on TRL's engine
(``engine: trl``) and gtpo's engine refuses them, naming them. TRL's reward names and dotted import paths are
:func:`gtpo.rewards.resolve_reward`'s. No torch here.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from ..errors import ConfigError

logger = logging.getLogger("gtpo")

__all__ = ["TRL_LORA_NAMES", "TRL_MODEL_KEYS", "TRL_SCRIPT_KEYS", "TRL_SPEC_KEYS", "apply_trl_names"]

#: TRL's script arguments (``trl grpo``) this module maps
TRL_SCRIPT_KEYS = ("dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming",
                   "reward_model_name_or_path", "datasets", "ignore_bias_buffers")
#: TRL's ModelConfig fields this module maps (``dtype`` is GTPOConfig's own field, of the same meaning)
TRL_MODEL_KEYS = ("model_name_or_path", "model_revision", "attn_implementation", "use_peft", "lora_r", "lora_alpha",
                  "lora_dropout", "lora_target_modules", "lora_modules_to_save", "lora_task_type", "use_rslora",
                  "use_dora", "load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
                  "bnb_4bit_quant_storage")
#: TRL's batch fields, which gtpo's engine maps onto prompts_per_step / micro_batch_size
TRL_BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation")
#: every TRL key accepted at the top level of a spec on both engines
TRL_SPEC_KEYS = TRL_SCRIPT_KEYS + TRL_MODEL_KEYS + ("trust_remote_code",) + TRL_BATCH_KEYS

#: what each TRL key this module maps becomes on gtpo's engine (the TRL-YAML table of docs/trl-yaml.md)
TRL_MAPPED_TO = {
    "model_name_or_path": "model", "model_revision": "model_init_kwargs.revision",
    "attn_implementation": "model_init_kwargs.attn_implementation",
    "trust_remote_code": "model_init_kwargs.trust_remote_code",
    "dataset_name": "dataset.name (a hub id, a local datasets directory, a file)", "dataset_config": "dataset.config",
    "dataset_train_split": "dataset.split", "dataset_test_split": "eval_dataset (when eval_strategy is not no)",
    "reward_model_name_or_path": "the first entry of reward_funcs (a sequence-classification model as a reward)",
    "use_peft": "peft (the lora_* settings apply only with use_peft: true)", "lora_r": "peft.r",
    "lora_alpha": "peft.lora_alpha", "lora_dropout": "peft.lora_dropout", "lora_target_modules": "peft.target_modules",
    "lora_modules_to_save": "peft.modules_to_save", "lora_task_type": "peft (CAUSAL_LM only)",
    "use_rslora": "peft.use_rslora", "use_dora": "peft.use_dora",
    "load_in_4bit": "model_init_kwargs.quantization_config (compute dtype: dtype)",
    "load_in_8bit": "model_init_kwargs.quantization_config",
    "bnb_4bit_quant_type": "model_init_kwargs.quantization_config", "use_bnb_nested_quant":
    "model_init_kwargs.quantization_config.bnb_4bit_use_double_quant",
    "bnb_4bit_quant_storage": "model_init_kwargs.quantization_config",
    "per_device_train_batch_size": "micro_batch_size; prompts_per_step = per_device_train_batch_size x "
                                   "gradient_accumulation_steps x processes / num_generations",
    "gradient_accumulation_steps": "prompts_per_step (with per_device_train_batch_size)",
    "steps_per_generation": "equal to gradient_accumulation_steps only (one update per generation)",
    "ignore_bias_buffers": "nothing (a DDP setting of TRL's scripts gtpo's trainers do not need)",
}

_LORA = {"lora_r": "r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
         "lora_target_modules": "target_modules", "lora_modules_to_save": "modules_to_save", "use_rslora": "use_rslora",
         "use_dora": "use_dora"}
#: the peft setting of each of TRL's LoRA keys, reversed: peft's name -> TRL's (errors name the key the YAML used)
TRL_LORA_NAMES = {peft_key: trl_key for trl_key, peft_key in _LORA.items()}


def apply_trl_names(spec: dict[str, Any], *, engine: str, where: Callable[[str], str]) -> dict[str, Any]:
    """``spec`` with TRL's script and model keys rewritten to gtpo's (module documentation); ``where(key)`` names the
    option or the file in errors. Keys that are not TRL's are kept as they are.

    Raises:
        ConfigError: a key given under both names with different values, a dataset mixture (``datasets``) or
            streaming, TRL's batch fields on gtpo's engine where they have no exact equivalent.
    """
    if "num_train_epochs" in spec and "max_steps" not in spec:  # TRL's default max_steps -1: the epochs count
        spec = {**spec, "max_steps": -1}
    if not any(key in spec for key in TRL_SPEC_KEYS + ("generation_batch_size",)):
        return spec
    spec = dict(spec)

    def take(key: str, default: Any = None) -> Any:
        return spec.pop(key, default)

    def put(key: str, value: Any, trl_key: str) -> None:
        if key in spec and spec[key] != value:
            raise ConfigError(f"{where(trl_key)}: {trl_key} is TRL's name of {key}, which is also set ({spec[key]!r} "
                              f"vs {value!r}): set one of them")
        spec[key] = value

    if take("datasets") is not None:
        raise ConfigError(f"{where('datasets')}: TRL's dataset mixtures (datasets:) are not supported; give one dataset "
                          "as dataset_name (a hub id, a local datasets directory or a file)")
    if take("dataset_streaming"):
        raise ConfigError(f"{where('dataset_streaming')}: streaming datasets are not supported; the dataset is "
                          "loaded whole (a local copy: datasets.load_dataset(...).save_to_disk(DIR))")
    take("ignore_bias_buffers")  # a DDP setting of TRL's scripts that gtpo's trainers do not need
    if "model_name_or_path" in spec:
        put("model", take("model_name_or_path"), "model_name_or_path")
    _model_init(spec, take, engine)
    _peft(spec, take, put, where)
    _datasets(spec, take, put, engine)
    reward_model = take("reward_model_name_or_path")
    if reward_model:  # first, as `trl grpo` puts it
        funcs = spec.get("reward_funcs") or []
        spec["reward_funcs"] = [reward_model] + ([funcs] if isinstance(funcs, str) else list(funcs))
    if engine == "gtpo":
        _trl_batch_on_gtpo_engine(spec, take, where)
    return spec


def _model_init(spec: dict[str, Any], take, engine: str) -> None:
    """``model_revision``, ``attn_implementation`` (and on gtpo's engine ``trust_remote_code``: a GRPOConfig field on
    TRL's), ``load_in_4bit`` / ``load_in_8bit`` and ``bnb_*`` -> ``model_init_kwargs`` as TRL's scripts build it."""
    init = dict(spec.get("model_init_kwargs") or {})
    if engine == "trl" and spec.get("dtype") == "float16":  # TRL's ModelConfig.dtype: the dtype the model loads in
        init.setdefault("dtype", take("dtype"))
    for trl_key, key in (("model_revision", "revision"), ("attn_implementation", "attn_implementation")):
        value = take(trl_key)
        if value is not None:
            init.setdefault(key, value)
    if engine == "gtpo" and "trust_remote_code" in spec:
        init.setdefault("trust_remote_code", take("trust_remote_code"))
    four, eight = take("load_in_4bit", False), take("load_in_8bit", False)
    quant = {k: take(k) for k in ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage") if k in spec}
    if four or eight:
        config: dict[str, Any] = {"load_in_4bit": True} if four else {"load_in_8bit": True}
        if four:  # trl.get_quantization_config: compute in the model's dtype
            config["bnb_4bit_compute_dtype"] = spec.get("dtype") if spec.get("dtype") not in (None, "auto") \
                else "bfloat16"
            config["bnb_4bit_quant_type"] = quant.get("bnb_4bit_quant_type") or "nf4"
            config["bnb_4bit_use_double_quant"] = bool(quant.get("use_bnb_nested_quant", False))
            if quant.get("bnb_4bit_quant_storage"):
                config["bnb_4bit_quant_storage"] = quant["bnb_4bit_quant_storage"]
        init.setdefault("quantization_config", config)
    if init:
        spec["model_init_kwargs"] = init


def _peft(spec: dict[str, Any], take, put, where) -> None:
    """``use_peft`` + ``lora_*`` -> ``peft`` (TRL's get_peft_config: the LoRA settings apply only with use_peft)."""
    lora = {_LORA[k]: take(k) for k in list(_LORA) if k in spec}
    task = take("lora_task_type")
    use = take("use_peft")
    if use is None:
        if lora:
            logger.info("lora_* settings without use_peft: true are not used (as in trl grpo)")
        return
    if not use:
        return
    peft = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": None}  # ModelConfig's defaults
    peft.update({k: v for k, v in lora.items() if v is not None})
    if task not in (None, "CAUSAL_LM"):
        raise ConfigError(f"{where('lora_task_type')}: lora_task_type: only CAUSAL_LM is trained here (a causal LM's "
                          f"GRPO), got {task!r}; leave it out or set CAUSAL_LM")
    put("peft", peft, "use_peft")


def _datasets(spec: dict[str, Any], take, put, engine: str) -> None:
    """``dataset_name`` (+ ``dataset_config``, ``dataset_train_split``) -> ``dataset``; ``dataset_test_split`` ->
    ``eval_dataset`` when ``eval_strategy`` is not ``no`` (TRL's rule). ``eval_strategy`` is a GTPOConfig field on both
    engines; a TRL YAML (one with ``dataset_name``) that leaves it unset gets TRL's default ``no`` (so ``eval_steps``
    alone evaluates nothing, as in ``trl grpo``), where a gtpo YAML's unset ``eval_strategy`` follows ``eval_steps``."""
    name, config = take("dataset_name"), take("dataset_config")
    train_split, test_split = take("dataset_train_split", "train"), take("dataset_test_split", "test")
    if name is None:
        return
    strategy = spec.setdefault("eval_strategy", "no")  # TRL's default, in a YAML written for trl grpo
    dataset = {"name": name, "split": train_split, **({"config": config} if config else {})}
    put("dataset", dataset, "dataset_name")
    if strategy != "no" and "eval_dataset" not in spec:
        spec["eval_dataset"] = {**dataset, "split": test_split}


def _whole(key: str, value, where) -> None:
    """A batch size or count of ``key``: a whole number >= 1, else a ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where(key)}: {key} must be a whole number >= 1, got {value!r}")


def _trl_batch_on_gtpo_engine(spec: dict[str, Any], take, where) -> None:
    """TRL's batch on gtpo's trainer: an optimizer step of TRL's takes ``per_device_train_batch_size x
    gradient_accumulation_steps x processes`` completions from one generation (``steps_per_generation`` =
    ``gradient_accumulation_steps``, its default), which is gtpo's step of ``prompts_per_step`` = that many
    completions / ``group_size`` prompts, in micro-batches of ``per_device_train_batch_size``. With several updates
    per generation (``num_iterations`` > 1) TRL's ``max_steps`` counts updates, gtpo's rollouts, so the two differ:
    refused, naming the fields. The number of processes is the launcher's ``WORLD_SIZE`` (1 without one)."""
    given = [k for k in TRL_BATCH_KEYS + ("generation_batch_size",) if k in spec]
    if not given:
        return
    per_device = take("per_device_train_batch_size", 8)  # GRPOConfig's default
    accumulation = take("gradient_accumulation_steps", 1)
    _whole("per_device_train_batch_size", per_device, where)
    _whole("gradient_accumulation_steps", accumulation, where)
    steps = take("steps_per_generation", None)
    if steps not in (None, accumulation):
        raise ConfigError(f"{where('steps_per_generation')}: steps_per_generation ({steps}) other than "
                          f"gradient_accumulation_steps ({accumulation}) reuses a generation over several optimizer "
                          "steps, which gtpo's trainer does not do: train with engine: trl (--engine trl)")
    generation = spec.pop("generation_batch_size", None)
    completions = per_device * accumulation * int(os.environ.get("WORLD_SIZE", "1"))
    if generation not in (None, completions):
        raise ConfigError(f"{where('generation_batch_size')}: generation_batch_size ({generation}) other than "
                          f"per_device_train_batch_size x gradient_accumulation_steps x processes ({completions}) "
                          "reuses a generation over several optimizer steps, which gtpo's trainer does not do: train "
                          "with engine: trl (--engine trl)")
    if (spec.get("num_iterations") or 1) != 1:
        raise ConfigError(f"{where(given[0])}: with num_iterations > 1, TRL's batch fields ({', '.join(given)}) and "
                          "max_steps count optimizer updates while gtpo's trainer counts rollouts: set gtpo's "
                          "prompts_per_step and micro_batch_size instead, or train with engine: trl (--engine trl)")
    for key in ("prompts_per_step", "micro_batch_size"):
        if key in spec:
            raise ConfigError(f"{where(given[0])}: set either TRL's batch ({', '.join(given)}) or gtpo's ({key}), "
                              "not both; or set `engine: trl` (--engine trl) to train on TRL's engine with TRL's batch")
    group_key = next((k for k in ("group_size", "num_generations") if spec.get(k) is not None), None)
    group = spec[group_key] if group_key else 8  # both trainers' default G is 8
    if group_key:
        _whole(group_key, group, where)
    if completions % group:
        raise ConfigError(f"{where(given[0])}: TRL's batch ({', '.join(given)}: {completions} completions per step, "
                          f"per_device_train_batch_size x gradient_accumulation_steps x processes) must be a multiple "
                          f"of {group_key or 'num_generations'} ({group}), as in TRL")
    spec["prompts_per_step"] = completions // group
    spec["micro_batch_size"] = per_device
