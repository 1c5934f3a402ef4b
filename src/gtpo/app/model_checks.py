"""The model settings of a spec that libraries validate only once a model loads -- peft's LoRA values, bitsandbytes'
quantization, transformers' attention implementation, the load dtype -- checked before any model loads (issue 41,
item 2): each error names the key as the YAML wrote it (TRL's ``lora_r``, ``load_in_4bit``, ``attn_implementation``,
or gtpo's ``peft.r``, ``model_init_kwargs.quantization_config``), the file or ``--option``, and what to do.

:func:`check_model_settings` runs for both engines (their models load the same way) from
:func:`gtpo.app.training.load_run_inputs`, after the spec is split and before the datasets and the model are loaded.
The LoRA values are checked by peft itself: the spec's ``peft.LoraConfig`` (:func:`gtpo.app.common.build_peft_config`)
is applied to a one-layer stand-in model, which runs peft's own validation of ``r``, ``lora_alpha``,
``lora_dropout``, ``bias``, ... (peft checks them only when it builds the adapter's layers, i.e. after the model has
loaded); ``target_modules`` and ``modules_to_save`` name the real model's modules, so they are left to peft at load.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..config import GTPOConfig
from ..errors import ConfigError
from .common import where_of
from .spec import RunSpec
from .trl_names import TRL_LORA_NAMES

__all__ = ["check_model_settings", "peft_problem"]

#: what each LoRA setting must be, said in the error that names it
_PEFT_FIX = {
    "r": "a positive integer (the LoRA rank, e.g. 16)",
    "lora_alpha": "a number (the adapter's output is scaled by lora_alpha / r, e.g. 2 * r)",
    "lora_dropout": "a probability in [0, 1) (e.g. 0.05)",
    "bias": "'none', 'all' or 'lora_only'",
    "use_rslora": "true or false",
    "use_dora": "true or false",
}
#: LoRA settings that name the real model's modules: peft checks them against the model when it loads
_MODEL_DEPENDENT = ("target_modules", "modules_to_save")
#: bitsandbytes' 4-bit quantization types (transformers' BitsAndBytesConfig.bnb_4bit_quant_type)
_QUANT_TYPES = ("nf4", "fp4")


def check_model_settings(run: RunSpec, config: GTPOConfig, spec: dict[str, Any], *, source: str, options) -> None:
    """Refuse, before any model loads, the LoRA, quantization, attention and dtype settings the libraries would refuse
    after loading it. ``spec``: the spec as the user wrote it (before TRL's names were mapped), to name the key they
    used; ``source`` / ``options``: the file and the keys set on the command line (:func:`where_of`).

    Raises:
        ConfigError: ``'<file or --option>: <key>: <why>; <what to do>'``.
    """
    _check_peft(run.peft, spec, source, options)
    _check_quantization(run, config, spec, source, options)
    _check_attn_implementation(config, spec, source, options)
    _check_load_dtype(run, config, spec, source, options)


def _named(spec: dict[str, Any], trl_key: str | None, gtpo_key: str) -> tuple[str, str]:
    """``(the key as the user wrote it, its top-level key)``: TRL's name when the spec has it, else gtpo's."""
    if trl_key is not None and trl_key in spec:
        return trl_key, trl_key
    return gtpo_key, gtpo_key.split(".")[0]


# ----------------------------------------------------------------------------- LoRA (peft)
def _stand_in():
    """A one-layer model for peft to build an adapter on (``proj``: a 4 x 4 linear layer)."""
    from torch import nn

    model = nn.Module()
    model.proj = nn.Linear(4, 4)
    return model


def _apply_peft(opts: dict[str, Any]) -> None:
    """Build ``peft.LoraConfig(**opts)`` over gtpo's defaults and inject it into :func:`_stand_in` (peft's own checks
    of the values; the model-dependent settings are replaced by the stand-in's layer)."""
    import warnings

    from peft import inject_adapter_in_model

    from .common import build_peft_config

    lora = build_peft_config({**opts, "target_modules": ["proj"], "modules_to_save": None})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inject_adapter_in_model(lora, _stand_in())


def peft_problem(value: Any) -> tuple[str | None, Exception] | None:
    """None when peft accepts the spec's ``peft`` (a mapping of LoraConfig fields, ``true`` or None), else ``(the
    setting peft refused, or None when only the combination fails; peft's error)``. Each setting is tried alone
    over gtpo's defaults first, so the error names the one that is wrong."""
    if not isinstance(value, dict):
        return None
    for key in ("use_rslora", "use_dora"):
        if key in value and not isinstance(value[key], bool):
            return key, TypeError(f"{key} must be true or false, got {value[key]!r}")
    for key, item in value.items():
        if key in _MODEL_DEPENDENT:
            continue
        try:
            _apply_peft({key: item})
        except Exception as err:  # noqa: BLE001 -- whatever peft (or torch under it) raises for the value
            return key, err
    try:
        _apply_peft({k: v for k, v in value.items() if k not in _MODEL_DEPENDENT})
    except Exception as err:  # noqa: BLE001
        return None, err
    return None


def _check_peft(value: Any, spec: dict[str, Any], source: str, options) -> None:
    found = peft_problem(value)
    if found is None:
        return
    key, err = found
    if key is None:
        name, top = _named(spec, "use_peft", "peft")
        raise ConfigError(f"{where_of(options, top, source)}: {name}: peft refuses these LoRA settings together "
                          f"({type(err).__name__}: {err}); see peft.LoraConfig")
    name, top = _named(spec, TRL_LORA_NAMES.get(key), f"peft.{key}")
    fix = _PEFT_FIX.get(key, "a value peft.LoraConfig accepts")
    raise ConfigError(f"{where_of(options, top, source)}: {name}: peft refuses {value[key]!r} "
                      f"({type(err).__name__}: {err}); {name} must be {fix}")


# ----------------------------------------------------------------------------- quantization (bitsandbytes)
def _check_quantization(run: RunSpec, config: GTPOConfig, spec: dict[str, Any], source: str, options) -> None:
    quant = (config.model_init_kwargs or {}).get("quantization_config")
    if not quant:
        return
    trl_key = next((k for k in ("load_in_4bit", "load_in_8bit") if spec.get(k)), None)
    name, top = _named(spec, trl_key, "model_init_kwargs.quantization_config")
    where = where_of(options, top, source)
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(f"{where}: {name} loads the base model quantized with bitsandbytes, which is not installed: "
                          "pip install bitsandbytes (QLoRA), or remove it to train the base in the run's dtype")
    quant_type = quant.get("bnb_4bit_quant_type") if isinstance(quant, dict) else None
    if quant_type is not None and quant_type not in _QUANT_TYPES:
        qname, qtop = _named(spec, "bnb_4bit_quant_type", "model_init_kwargs.quantization_config.bnb_4bit_quant_type")
        raise ConfigError(f"{where_of(options, qtop, source)}: {qname} must be one of {list(_QUANT_TYPES)} "
                          f"(bitsandbytes' 4-bit types), got {quant_type!r}")
    from ..run.models import model_init_kwargs

    try:
        model_init_kwargs(config.model_init_kwargs)
    except (ValueError, TypeError, AttributeError) as err:
        raise ConfigError(f"{where}: {name}: transformers' BitsAndBytesConfig refuses it: {err}") from None
    if run.peft is None:
        adapter = "use_peft: true (with lora_r, ...)" if trl_key or "use_peft" in spec else "peft: {r: 16}"
        raise ConfigError(f"{where}: {name}: a quantized base cannot be trained itself, only an adapter on it "
                          f"(transformers refuses to fine-tune a purely quantized model): set {adapter}, or remove "
                          f"{name} to train the whole model")


# ----------------------------------------------------------------------------- attention implementation
def _attention_devices(matrix_entry: dict) -> bool:
    """Whether this machine has a device flash attention of ``matrix_entry`` (transformers' compatibility matrix)
    runs on."""
    return any(check() for check, _ in matrix_entry.get("supported_devices", ()))


def _check_attn_implementation(config: GTPOConfig, spec: dict[str, Any], source: str, options) -> None:
    value = (config.model_init_kwargs or {}).get("attn_implementation")
    if value is None:
        return
    name, top = _named(spec, "attn_implementation", "model_init_kwargs.attn_implementation")
    where = where_of(options, top, source)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, FLASH_ATTENTION_COMPATIBILITY_MATRIX, is_kernel

    known = ["eager", "paged|eager"] + [k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if k != "paged|eager"]
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {name} must be a string (one of {known}), got {value!r}")
    if is_kernel(value):  # a kernel from the hub ('org/repo'): transformers fetches and checks it when loading
        return
    plain = value.removeprefix("paged|") if value != "paged|eager" else value
    if plain not in known:
        raise ConfigError(f"{where}: {name}: transformers has no attention implementation {value!r}; use one of "
                          f"{known} (sdpa is the default), or a hub kernel 'org/repo'")
    if plain.startswith("flash_attention_"):
        entry = FLASH_ATTENTION_COMPATIBILITY_MATRIX.get(int(plain.rsplit("_", 1)[1]), {})
        if not _attention_devices(entry):
            raise ConfigError(f"{where}: {name}: {plain} runs on GPUs (CUDA, and some NPU/XPU devices) and this "
                              "machine has none: remove it or use attn_implementation: sdpa (the default) or eager")
        from transformers.utils import is_kernels_available

        available = entry.get("general_availability_check")
        if available is not None and not available() and not is_kernels_available():
            package = "flash-attn" if plain == "flash_attention_2" else f"the flash-attn {plain[-1]} package"
            raise ConfigError(f"{where}: {name}: {plain} needs {package} (pip install flash-attn "
                              "--no-build-isolation) or the kernels package (pip install kernels), neither of which "
                              "is installed: install one, or use attn_implementation: sdpa")


# ----------------------------------------------------------------------------- the dtype the model loads in
def _check_load_dtype(run: RunSpec, config: GTPOConfig, spec: dict[str, Any], source: str, options) -> None:
    if run.engine != "gtpo" or config.requested_dtype != "float16":
        return
    where = where_of(options, "model_init_kwargs", source)
    raise ConfigError(f"{where}: model_init_kwargs.dtype: float16 cannot train on gtpo's trainer, which does no loss "
                      "scaling (float16 gradients underflow): use bfloat16 (dtype: bfloat16 or bf16: true) or float32, "
                      "or train with TRL's engine (engine: trl), which takes float16 with loss scaling (fp16)")
