"""Setting up a run of gtpo's trainer, one part per function: the accelerate setups it supports (``cpu_only``,
``check_distributed_type``), the precision, the policy model (loading, quantization, gradient checkpointing, PEFT),
the reference model, the optimizer and the scheduler, and the speed switches (``tf32``, ``torch_compile``).

:class:`gtpo.trainer.GTPOTrainer` calls them in this order; each can be read and tested alone
(``tests/test_setup.py``). They implement the dtype and device contract of ``docs/gpu.md``:

=====================  ===================  ==================  ==================================
path                   weights held in      trainable params    forward (sampling, training, head)
=====================  ===================  ==================  ==================================
float32 (any)          float32              float32             float32
bf16 full fine-tuning  float32 (master)     float32             bfloat16 (autocast)
bf16 LoRA              bfloat16 (frozen)    float32 (adapter)   bfloat16 (autocast)
bf16 QLoRA             4-bit + bfloat16     float32 (adapter)   bfloat16 (autocast, 4-bit kernels)
=====================  ===================  ==================  ==================================

In every path the optimizer state (AdamW's moments; 8-bit with ``optim: adamw_8bit``), the log-probs,
the entropies and the loss are float32, and the reference model (``beta > 0`` without LoRA) is held
in the forward's dtype. On a GPU every process loads its model onto its own device
(``device_map={"": local index}``), which a 4-bit base needs (bitsandbytes places it at load time).

Float32 (the default) is the trainer's behaviour before this module existed, bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Any, Collection, Iterable

import torch
from torch import nn

from ..config import GTPOConfig

__all__ = ["AVX512_BF16_FLAG", "FAST_BF16_CPU_FLAGS", "Precision", "apply_tf32", "build_optimizer",
           "build_reference_model", "build_scheduler", "add_adapter", "check_distributed_type",
           "check_quantized_placement", "check_speed_switches", "checkpointing_kwargs", "compile_options", "cpu_only",
           "enable_checkpointing", "tf32_available",
           "cpu_flags", "cpu_vendor", "has_native_bf16", "is_quantized", "load_policy_model", "policy_load_kwargs",
           "precision_for", "prepare_quantized_base", "prepare_tokenizer", "requested_dtype", "resolve_dtype",
           "run_precision", "vllm_dtype_name"]

logger = logging.getLogger("gtpo")

#: /proc/cpuinfo flags of CPUs whose bfloat16 matmuls are faster than their float32 ones whatever the vendor
#: (Intel AMX tiles).
FAST_BF16_CPU_FLAGS = ("amx_bf16",)
#: the AVX-512 BF16 dot-product flag: faster than float32 on AMD CPUs (Zen 4 EPYC, 2 threads: float32 matmul
#: ~86 GFLOP/s with MKL, bfloat16 ~365), slower on Intel CPUs without AMX (a Xeon with avx512_bf16: MKL float32
#: ~263 GFLOP/s, bfloat16 ~145); docs/performance.md.
AVX512_BF16_FLAG = "avx512_bf16"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# ----------------------------------------------------------------------------- precision
def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags (the ``flags`` line of ``/proc/cpuinfo``, or of the text ``cpuinfo``);
    empty where there is no such file (not Linux)."""
    return frozenset(_cpuinfo_field(cpuinfo, ("flags", "Features")).split())


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """The CPU's vendor (the ``vendor_id`` line of ``/proc/cpuinfo`` or of the text ``cpuinfo``, e.g.
    ``"GenuineIntel"``, ``"AuthenticAMD"``); ``""`` where there is none."""
    return _cpuinfo_field(cpuinfo, ("vendor_id",)).strip()


def _cpuinfo_field(cpuinfo: str | None, keys: tuple[str, ...]) -> str:
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as fh:
                cpuinfo = fh.read()
        except OSError:
            return ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value
    return ""


def has_native_bf16(device: torch.device, *, flags: Collection[str] | None = None,
                    vendor: str | None = None) -> bool:
    """Whether ``device`` multiplies bfloat16 faster than float32: a CUDA GPU with bf16 tensor cores
    (compute capability >= 8.0, not emulated); a CPU with AMX (:data:`FAST_BF16_CPU_FLAGS`), or an AMD CPU
    with :data:`AVX512_BF16_FLAG` (on Intel CPUs without AMX that flag's bfloat16 matmuls measured slower
    than MKL's float32 ones). ``flags`` / ``vendor``: the CPU's, default :func:`cpu_flags` / :func:`cpu_vendor`."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        found = cpu_flags() if flags is None else flags
        if any(f in found for f in FAST_BF16_CPU_FLAGS):
            return True
        return AVX512_BF16_FLAG in found and (cpu_vendor() if vendor is None else vendor) == "AuthenticAMD"
    if device.type == "xpu":
        return bool(getattr(torch, "xpu", None) and torch.xpu.is_available() and torch.xpu.is_bf16_supported())
    return False


def resolve_dtype(requested: str, device: torch.device, *, flags: Collection[str] | None = None,
                  vendor: str | None = None) -> torch.dtype:
    """The compute dtype of a run that asked for ``requested`` (:attr:`GTPOConfig.requested_dtype`) on
    ``device``: ``"auto"`` is bfloat16 where :func:`has_native_bf16`, float32 elsewhere."""
    if requested == "auto":
        return torch.bfloat16 if has_native_bf16(device, flags=flags, vendor=vendor) else torch.float32
    if requested == "float16":
        raise ValueError("GTPOConfig.dtype (or model_init_kwargs.dtype) float16: gtpo's trainer does no loss "
                         "scaling, so float16 gradients underflow; use bfloat16 (or float32), or TRL's engine "
                         "(engine: trl) with fp16: true")
    if requested not in _DTYPES:
        raise ValueError(f"GTPOConfig.dtype must be one of 'auto', 'float32', 'bfloat16', got {requested!r}")
    return _DTYPES[requested]


def requested_dtype(args: GTPOConfig, model: str | nn.Module) -> str:
    """The dtype a run asks for: :attr:`GTPOConfig.requested_dtype` when the config says one (``dtype``,
    ``model_init_kwargs.dtype`` or ``bf16``), else the dtype of a loaded ``model`` (a bfloat16 model
    trains in bfloat16), else float32."""
    said = args.dtype is not None or (args.model_init_kwargs or {}).get("dtype") is not None or args.bf16
    if said or isinstance(model, str):
        return args.requested_dtype
    dtypes = {p.dtype for p in model.parameters() if p.dtype.is_floating_point}
    return str(dtypes.pop()).removeprefix("torch.") if len(dtypes) == 1 else "float32"


@dataclass(frozen=True)
class Precision:
    """The dtypes of a run (the table of the module documentation).

    ``compute``: the dtype of the forward's matmuls (sampling, training forward, LM head);
    ``load``: the dtype the weights are held in (``from_pretrained(dtype=...)``); ``trainable``: the
    trainable parameters' (and so the optimizer's) dtype, float32 always.
    """

    compute: torch.dtype
    load: torch.dtype
    trainable: torch.dtype = torch.float32

    @property
    def autocast(self) -> bool:
        """Whether forwards run under ``torch.autocast(dtype=compute)`` (a lower precision than float32)."""
        return self.compute != torch.float32

    def context(self, device: torch.device | str):
        """``torch.autocast`` in the compute dtype on ``device``'s type, or a no-op context in float32."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=self.compute)


def precision_for(compute: torch.dtype, *, adapter: bool) -> Precision:
    """The :class:`Precision` of a run computing in ``compute``: an adapter (LoRA/QLoRA) trains over a base
    held in ``compute``; full fine-tuning holds float32 master weights (a bfloat16 weight does not move
    under AdamW steps of ~1e-6 relative size: 8 significant bits)."""
    return Precision(compute=compute, load=compute if adapter else torch.float32)


def vllm_dtype_name(requested: str, precision: Precision) -> str:
    """The vLLM engine's dtype: ``vllm_dtype`` when set, else (``"auto"``) the run's compute dtype (not the
    dtype the weights are held in: float32 master weights, or a float32 embedding, would start a float32
    engine)."""
    if requested != "auto":
        return requested
    return str(precision.compute).removeprefix("torch.")


#: accelerate's mixed-precision names and the compute dtype each would autocast to
_LAUNCHER_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def launcher_mixed_precision(compute: torch.dtype, *, where: str) -> str | None:
    """The mixed precision a launcher asked accelerate for (``accelerate launch --mixed_precision``, a default
    accelerate config, ``ACCELERATE_MIXED_PRECISION``: all reach the process as that variable) when it
    differs from the run's compute dtype ``compute``; None when unset, ``no``, or the same dtype. The run's
    ``dtype`` decides: gtpo keeps accelerate's mixed precision off (its own autocast, :class:`Precision`),
    so a conflicting setting is ignored with a warning naming both (``where``: the run, as in the message)
    -- not refused, because a machine-wide default accelerate config would otherwise fail every float32
    run on that machine (docs/gpu.md)."""
    import os

    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if launcher in ("", "no") or _LAUNCHER_DTYPES.get(launcher) == compute:
        return None
    run = str(compute).removeprefix("torch.")
    logger.warning("%s: the launcher's mixed precision (ACCELERATE_MIXED_PRECISION=%s, from `accelerate launch "
                   "--mixed_precision` or the accelerate config) is ignored: the run's dtype=%s decides (set "
                   "`dtype: %s` to compute in it)", where, launcher, run,
                   {"bf16": "bfloat16", "fp16": "float16"}.get(launcher, launcher))
    return launcher


def accelerator_without_mixed_precision(**kwargs):
    """``accelerate.Accelerator(mixed_precision="no", **kwargs)``: gtpo's autocast is its own (:class:`Precision`),
    so accelerate's stays off whatever the launcher or an earlier accelerator of this process set (an
    accelerator state already made with another mixed precision, e.g. by a TRL run in the same notebook, is
    reset; the process state -- devices, process group -- is kept)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    state = AcceleratorState._shared_state
    if state and state.get("_mixed_precision", "no") != "no":
        AcceleratorState._reset_state(reset_partial_state=False)
    return Accelerator(mixed_precision="no", **kwargs)


# ----------------------------------------------------------------------------- the policy model
def cpu_only() -> bool:
    """True when no accelerator device is present: the run is on CPU, and with several processes
    (accelerate launch / torchrun) DDP over gloo. Every accelerate state of a run must be created with
    ``cpu=cpu_only()``: accelerate's process state is a singleton, and one created first without it
    (``PartialState()``) makes every process of a CPU launch a single-process run."""
    return not (torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()))


def check_distributed_type(distributed_type, *, running: str | None = None) -> None:
    """Refuse the accelerate setups this trainer does not implement (FSDP, DeepSpeed): it samples with the
    unwrapped model, saves model and optimizer from the main process and steps the optimizer itself, all
    of which assume every process holds the whole model. DDP (several processes, each a full replica)
    and single-device runs are what it supports; TRL's engine runs GTPO under FSDP and DeepSpeed. ``running``:
    what accelerate runs when ``distributed_type`` is what the launcher asked for (:func:`gtpo.run.launch.check_launch`)."""
    name = getattr(distributed_type, "value", str(distributed_type)).upper()
    if name in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
        asked = "" if running is None or running == name else \
            f" (asked by the accelerate config; accelerate would run {running} instead, nothing sharded)"
        raise ValueError(
            f"gtpo's own trainer does not support accelerate's {name}{asked} (it samples with the unwrapped model and saves "
            "model and optimizer from the main process, which assumes full replicas): launch it with plain DDP "
            "(accelerate launch --multi_gpu --num_processes N -m gtpo.cli train ...), or train with TRL's engine, "
            "which shards with FSDP/DeepSpeed: engine: trl in the YAML (--engine trl)"
        )


def prepare_tokenizer(tokenizer, model: str | nn.Module):
    """The policy's tokenizer (loaded from ``model``'s name or path when None), left-padded, with a pad
    token (its EOS token when it has none)."""
    from .models import load_tokenizer

    if tokenizer is None:
        source = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
        if not source:
            raise ValueError("processing_class (the tokenizer) is required when model is an object without a path")
        tokenizer = load_tokenizer(source)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token")
        logger.warning("the tokenizer has no pad token: using its EOS token %r as pad", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` (or the model under a peft wrapper) has a 4-bit or 8-bit base."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False)
                or getattr(base, "is_quantized", False))


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def policy_load_kwargs(user_kwargs: dict | None, precision: Precision, device: torch.device) -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments of the policy: ``model_init_kwargs``
    (:func:`gtpo.run.models.model_init_kwargs`: dtype names, quantization mappings) with ``dtype`` the
    precision's ``load`` dtype, a 4-bit base computing in the run's dtype unless its
    ``bnb_4bit_compute_dtype`` is set, and on a GPU ``device_map={"": this process's device index}``
    unless ``device_map`` is given (each DDP process loads onto its own GPU; bitsandbytes would put
    every process's 4-bit base on ``torch.cuda.current_device()``, GPU 0 before the process group exists)."""
    from .models import model_init_kwargs

    given = dict(user_kwargs or {})
    quant = given.get("quantization_config")
    if isinstance(quant, dict) and quant.get("load_in_4bit") and "bnb_4bit_compute_dtype" not in quant:
        given["quantization_config"] = {**quant, "bnb_4bit_compute_dtype": str(precision.compute).removeprefix("torch.")}
    out = model_init_kwargs(given)
    out["dtype"] = precision.load
    device = torch.device(device)
    if device.type == "cuda" and "device_map" not in out:
        out["device_map"] = {"": _device_index(device)}
    return out


def run_precision(args: GTPOConfig, model: str | nn.Module, *, adapter: bool, device: torch.device) -> Precision:
    """The :class:`Precision` of a run, decided once: the dtype ``args`` asks for (:func:`requested_dtype`, or
    ``model``'s when a loaded model and no dtype is said) resolved against ``device`` (this process's), ``adapter``
    whether a peft config trains. The trainer decides it so when it is not given one; a caller that loads the model
    itself first (the application layer) decides it here, loads with :func:`policy_load_kwargs` and passes it to
    the trainer (``GTPOTrainer(..., precision=)``)."""
    return precision_for(resolve_dtype(requested_dtype(args, model), device), adapter=adapter)


def _first_device(model: nn.Module) -> torch.device:
    return next(p.device for p in model.parameters())


def check_quantized_placement(model: nn.Module, device: torch.device) -> None:
    """Refuse a quantized model whose weights are on another accelerator than this process's ``device``
    (a 4-bit base cannot be moved by DDP's ``.to``; bitsandbytes placed it when it was loaded)."""
    device = torch.device(device)
    if not is_quantized(model) or device.type == "cpu":
        return
    where = {p.device for p in model.parameters()}
    want = torch.device(device.type, _device_index(device))
    if where != {want}:
        raise ValueError(
            f"the model's 4-bit/8-bit base is on {sorted(map(str, where))} but this process trains on {want}: a "
            "quantized base is placed when it is loaded and cannot be moved. Pass the model's name or path to "
            "GTPOTrainer (it loads each process's copy onto that process's GPU), or load it with "
            f"device_map={{'': {want.index}}} (the process's LOCAL_RANK)")


def prepare_quantized_base(model: nn.Module, precision: Precision) -> nn.Module:
    """A 4-bit/8-bit base prepared for adapter training: every weight frozen, the non-quantized weights
    (embeddings, norms, LM head) held in the precision's ``load`` dtype (peft's
    ``prepare_model_for_kbit_training`` would upcast them to float32: a float32 head of 128k x 4096 is
    2 GB more and a float32 head matmul; TRL keeps them in bfloat16 too), and bitsandbytes' CPU repacking
    switched off (:func:`gtpo.run.models.keep_4bit_weights_trainable`)."""
    from .models import keep_4bit_weights_trainable

    for param in model.parameters():
        param.requires_grad_(False)
        if param.dtype.is_floating_point and param.dtype != precision.load and type(param).__name__ != "Params4bit":
            param.data = param.data.to(precision.load)
    keep_4bit_weights_trainable(model)
    return model


def _cast_base(model: nn.Module, precision: Precision) -> nn.Module:
    """A loaded (not quantized) model's floating-point weights in the precision's ``load`` dtype."""
    if any(p.dtype.is_floating_point and p.dtype != precision.load for p in model.parameters()):
        model = model.to(precision.load)
    return model


def load_policy_model(model: str | nn.Module, args: GTPOConfig, *, peft_config, precision: Precision,
                      device: torch.device) -> nn.Module:
    """The model the trainer optimises, on CPU or already on ``device`` (4-bit bases, GPU loads).

    ``model``: a name or path (loaded with :func:`policy_load_kwargs`) or a loaded ``PreTrainedModel``
    (its weights cast to the precision's ``load`` dtype; a quantized one must already be on ``device``:
    :func:`check_quantized_placement`). A quantized base needs ``peft_config`` and is prepared with
    :func:`prepare_quantized_base`; then gradient checkpointing (``gradient_checkpointing_kwargs``:
    :func:`enable_checkpointing`) and the
    adapter (``get_peft_model``), whose trainable parameters are float32.
    """
    from transformers import PreTrainedModel

    from .models import load_model

    if isinstance(model, str):
        base = load_model(model, **policy_load_kwargs(args.model_init_kwargs, precision, device))
    elif isinstance(model, PreTrainedModel):
        base = model
        check_quantized_placement(base, device)
        if not is_quantized(base):
            base = _cast_base(base, precision)
    else:
        raise ValueError(f"model must be a hub id, a local path or a transformers PreTrainedModel, got "
                         f"{type(model).__name__}")
    if is_quantized(base):
        if peft_config is None:
            raise ValueError("the model's base is quantized (model_init_kwargs.quantization_config): only an "
                             "adapter can be trained on it; give a peft config (peft: {r: ...} in the YAML)")
        base = prepare_quantized_base(base, precision)
    if args.gradient_checkpointing:
        enable_checkpointing(base, args.gradient_checkpointing_kwargs)
        if peft_config is not None and hasattr(base, "enable_input_require_grads"):
            base.enable_input_require_grads()
    return base


def checkpointing_kwargs(kwargs: dict | None) -> tuple[dict[str, Any], int, bool]:
    """``(checkpoint kwargs, every_n_layers, offload)`` of ``gradient_checkpointing_kwargs`` as transformers' Trainer
    splits them (``every_n_layers`` and ``offload`` are ``activation_checkpointing_enable``'s, the rest
    ``torch.utils.checkpoint.checkpoint``'s), with ``use_reentrant`` False unless given, as TRL's GRPOTrainer sets it."""
    rest = dict(kwargs or {})
    every_n_layers = rest.pop("every_n_layers", 1)
    offload = rest.pop("offload", False)
    rest.setdefault("use_reentrant", False)
    return rest, every_n_layers, offload


def enable_checkpointing(model: nn.Module, kwargs: dict | None) -> None:
    """Gradient checkpointing on ``model`` with ``gradient_checkpointing_kwargs`` (:func:`checkpointing_kwargs`):
    ``activation_checkpointing_enable`` (transformers >= 5), else the older ``gradient_checkpointing_enable``."""
    checkpoint_kwargs, every_n_layers, offload = checkpointing_kwargs(kwargs)
    extra = {} if (every_n_layers, offload) == (1, False) else {"every_n_layers": every_n_layers, "offload": offload}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name warns there)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs, **extra)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs, **extra)


# ----------------------------------------------------------------------------- speed switches (tf32, torch.compile)
def tf32_available() -> bool:
    """Whether this machine has TF32 matmuls: a CUDA GPU of compute capability >= 8.0 (transformers'
    ``is_torch_tf32_available``, the test ``TrainingArguments(tf32=...)`` makes)."""
    from transformers.utils import is_torch_tf32_available

    return bool(is_torch_tf32_available())


def check_speed_switches(args: GTPOConfig, *, tf32_ok: bool | None = None) -> None:
    """Refuse, before any model loads, what this machine cannot do of ``tf32`` / ``torch_compile*``: ``tf32: true``
    without a TF32 GPU (``tf32_ok``, default :func:`tf32_available`; transformers' TrainingArguments refuses it the
    same way) and a ``torch_compile_backend`` torch does not have. ValueError starting ``GTPOConfig.<field>``."""
    if args.tf32 and not (tf32_available() if tf32_ok is None else tf32_ok):
        raise ValueError("GTPOConfig.tf32: true needs an NVIDIA GPU of the Ampere generation or newer (compute "
                         "capability >= 8.0) with CUDA, and this machine has none (transformers refuses --tf32 the "
                         "same way): remove tf32 or set it to false / null; TF32 does not apply to CPU matmuls")
    if args.compiles and args.torch_compile_backend is not None:
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
        if args.torch_compile_backend not in known:
            raise ValueError(f"GTPOConfig.torch_compile_backend: unknown backend {args.torch_compile_backend!r}; "
                             f"torch {torch.__version__} has {sorted(known)} (default: inductor)")


def compile_options(args: GTPOConfig) -> dict[str, Any] | None:
    """``torch.compile``'s keyword arguments for the training forward (:class:`gtpo.sampling.policy.PolicyForward`)
    when the run compiles (:attr:`GTPOConfig.compiles`): ``backend`` (``torch_compile_backend``, default
    ``"inductor"`` as in transformers) and ``mode`` (``torch_compile_mode``); None: eager."""
    if not args.compiles:
        return None
    return {"backend": args.torch_compile_backend or "inductor", "mode": args.torch_compile_mode}


def apply_tf32(args: GTPOConfig, *, tf32_ok: bool | None = None) -> bool | None:
    """TF32 as transformers' TrainingArguments sets it: with ``tf32`` true/false where the machine has TF32
    (``tf32_ok``, default :func:`tf32_available`) it is turned on/off (``torch.backends.fp32_precision`` on torch >=
    2.9, else the cuda matmul / cudnn ``allow_tf32`` flags); ``torch_compile`` with ``tf32`` None turns it on (as
    transformers does to speed compiled kernels). Returns the value set, or None when nothing was changed (no TF32
    hardware, or ``tf32`` None without compilation). ``tf32: true`` without TF32 is refused
    (:func:`check_speed_switches`)."""
    check_speed_switches(args, tf32_ok=tf32_ok)
    if not (tf32_available() if tf32_ok is None else tf32_ok):
        return None
    enable = args.tf32 if args.tf32 is not None else (True if args.compiles else None)
    if enable is None:
        return None
    if hasattr(torch.backends, "fp32_precision"):  # torch >= 2.9 (transformers' enable_tf32)
        torch.backends.fp32_precision = "tf32" if enable else "ieee"
    else:  # pragma: no cover - torch < 2.9
        torch.backends.cuda.matmul.allow_tf32 = enable
        torch.backends.cudnn.allow_tf32 = enable
    return enable


def add_adapter(base: nn.Module, peft_config, precision: Precision) -> nn.Module:
    """``get_peft_model(base, peft_config)`` with every trainable parameter in the precision's ``trainable``
    dtype (peft upcasts bf16 adapters to float32 itself; this makes it a rule)."""
    import warnings

    from peft import get_peft_model

    with warnings.catch_warnings():  # peft 0.21 reads transformers 5's deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        model = get_peft_model(base, peft_config)
    for param in model.parameters():
        if param.requires_grad and param.dtype != precision.trainable:
            param.data = param.data.to(precision.trainable)
    return model


def build_reference_model(base: nn.Module, args: GTPOConfig, *, adapter: bool, precision: Precision
                          ) -> nn.Module | None:
    """The frozen reference model of the KL term (``beta > 0``), a copy of the initial policy held in the
    compute dtype; None without KL, or with an adapter (the base with the adapter disabled is the
    reference)."""
    if args.beta <= 0 or adapter:
        return None
    return _frozen_copy_in(base, precision.compute)


def _frozen_copy_in(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A frozen (``eval``, no gradients) deep copy of ``model`` whose floating-point parameters and buffers are
    in ``dtype`` -- ``copy.deepcopy(model).to(dtype)`` without its transient: each tensor is cast while it is
    copied (the deep copy's memo is given the cast tensors), so float32 master weights are never copied whole
    in float32 before the cast (4 bytes per parameter at the peak; 32 GB for an 8B model). Tied weights stay
    tied (one tensor, one memo entry)."""
    memo: dict[int, Any] = {}
    for param in model.parameters():
        if param.dtype.is_floating_point and param.dtype != dtype and id(param) not in memo:
            memo[id(param)] = nn.Parameter(param.detach().to(dtype), requires_grad=False)
    for buf in model.buffers():
        if buf.dtype.is_floating_point and buf.dtype != dtype and id(buf) not in memo:
            memo[id(buf)] = buf.detach().to(dtype)
    return copy.deepcopy(model, memo).eval().requires_grad_(False)


# ----------------------------------------------------------------------------- optimisation
def _param_groups(params: Iterable[nn.Parameter], weight_decay: float) -> list[dict]:
    params = list(params)
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def build_optimizer(params: Iterable[nn.Parameter], args: GTPOConfig, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer of ``optim`` over ``params`` (matrices with ``weight_decay``, vectors without):

    * ``adamw_torch_fused``: ``torch.optim.AdamW(fused=True)`` where the device and dtypes allow it
      (CPU, CUDA; floating-point parameters), else the default implementation;
    * ``adamw_torch``: ``torch.optim.AdamW`` (foreach kernels);
    * ``adamw_8bit`` / ``paged_adamw_8bit``: bitsandbytes' ``AdamW8bit`` / ``PagedAdamW8bit``.
    """
    params = list(params)
    if not params:
        raise ValueError("the model has no trainable parameters")
    groups = _param_groups(params, args.weight_decay)
    common = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    device = torch.device(device)
    if args.optim in ("adamw_torch_fused", "adamw_torch"):
        fused = args.optim == "adamw_torch_fused" and device.type in ("cpu", "cuda") \
            and all(p.dtype.is_floating_point for p in params)
        return torch.optim.AdamW(groups, **common, fused=True if fused else None)
    try:
        import bitsandbytes as bnb
    except ImportError as err:
        raise ValueError(f"GTPOConfig.optim={args.optim!r} needs bitsandbytes, which is not installed: "
                         "pip install bitsandbytes (or optim: adamw_torch_fused)") from err
    cls = bnb.optim.PagedAdamW8bit if args.optim == "paged_adamw_8bit" else bnb.optim.AdamW8bit
    return cls(groups, **common)  # paged on CPU: bitsandbytes warns and runs it unpaged


def build_scheduler(optimizer: torch.optim.Optimizer, args: GTPOConfig, num_training_steps: int | None = None):
    """``transformers.get_scheduler(lr_scheduler_type, scheduler_specific_kwargs=lr_scheduler_kwargs)`` (as TRL's
    Trainer builds it) over ``num_training_steps`` (the run's resolved step count, :meth:`GTPOConfig.total_steps`;
    default ``max_steps``) with ``args.num_warmup_steps()`` of them warming up (``warmup_steps``, else ``warmup_ratio``
    of them, rounded up)."""
    from transformers import get_scheduler

    steps = args.max_steps if num_training_steps is None else num_training_steps
    try:
        return get_scheduler(args.lr_scheduler_type, optimizer,
                             num_warmup_steps=args.num_warmup_steps(max_steps=steps),
                             num_training_steps=steps,
                             scheduler_specific_kwargs=dict(args.lr_scheduler_kwargs or {}))
    except (ValueError, TypeError, KeyError) as err:
        kwargs = f" with lr_scheduler_kwargs={args.lr_scheduler_kwargs!r}" if args.lr_scheduler_kwargs else ""
        raise ValueError(f"GTPOConfig.lr_scheduler_type={args.lr_scheduler_type!r}{kwargs} cannot be used: {err} "
                         "(transformers.get_scheduler's arguments of that schedule)") from err


def check_scheduler(args: GTPOConfig) -> None:
    """Build the schedule of ``args`` on a one-parameter optimizer, so that a ``lr_scheduler_type`` /
    ``lr_scheduler_kwargs`` that transformers refuses (a keyword the schedule does not take, a missing ``min_lr``) is
    an error before any model loads. Raises ``ValueError`` naming both fields."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    build_scheduler(optimizer, args, num_training_steps=args.max_steps if args.max_steps > 0 else 100)
