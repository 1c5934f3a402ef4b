"""``gtpo sft``'s job: supervised fine-tuning on a task's answers (TRL's SFTTrainer, :mod:`gtpo.sft`) from a spec.

The spec holds ``model``, ``dataset``, ``peft`` (:data:`SFT_RUN_KEYS`) and the :class:`gtpo.sft.SFTArgs` fields;
:func:`resolve_sft_spec` builds it from the embedded default run (``demo``) or a YAML file plus overrides, and
:func:`run_sft_job` trains it and returns the directory of the saved model.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..errors import ConfigError
from .spec import (DEFAULT_SOURCE, RunSpec, TrainSpec, apply_overrides, default_config_text, load_yaml, suggest,
                   typed_values)

__all__ = ["SFT_RUN_KEYS", "resolve_sft_spec", "run_sft_job", "sft_keys"]

SFT_RUN_KEYS = {
    "model": RunSpec.key_help()["model"],
    "dataset": RunSpec.key_help()["dataset"],
    "peft": "LoRA settings {r, lora_alpha, lora_dropout, target_modules} (merged into the saved model), or null "
            "for full fine-tuning.",
}


def sft_keys() -> dict[str, str]:
    """Every key of an SFT spec with its documentation: the run keys and :class:`gtpo.sft.SFTArgs`'s fields."""
    from ..sft import SFTArgs

    return {**SFT_RUN_KEYS, **SFTArgs.field_help()}


def resolve_sft_spec(config_path: str | None, overrides: dict[str, Any], *, demo: bool = False) -> TrainSpec:
    """The spec ``gtpo sft [CONFIG] [--key value ...]`` trains: the default run's model, data and LoRA (``demo``) or
    the YAML at ``config_path``, then ``overrides``. Raises :class:`~gtpo.errors.ConfigError` naming an unknown key
    or option, or a missing ``model`` / ``dataset``."""
    import yaml

    docs = sft_keys()
    spec: dict[str, Any] = {}
    source = "the command line"
    if demo:
        default = yaml.safe_load(default_config_text())
        spec = {k: default[k] for k in ("model", "dataset", "peft") if k in default}
        source = DEFAULT_SOURCE
    if config_path is not None:
        if demo:
            raise ConfigError("--demo cannot be combined with a config file")
        source = config_path
        spec.update(load_yaml(config_path))
    for key in overrides:
        top = key.split(".")[0]
        if top not in docs:
            raise ConfigError(f"unknown option --{key}{suggest(top, sorted(docs))}")
    spec = apply_overrides(spec, overrides)
    for key in spec:
        if key not in docs:
            raise ConfigError(f"{source}: unknown sft key {key!r}{suggest(key, sorted(docs))}")
    for key in ("model", "dataset"):
        if not spec.get(key):
            raise ConfigError(f"{source}: gtpo sft needs {key} (set `{key}:` or pass --{key}); `--demo` starts "
                              "from the offline default run")
    return TrainSpec(spec, source, frozenset(k.split(".")[0] for k in overrides))


def run_sft_job(spec: dict[str, Any], *, source: str, options=frozenset()) -> str:
    """Train the SFT spec; returns the directory of the saved (merged) model."""
    from ..run.models import load_model_and_tokenizer
    from ..sft import SFTArgs, run_sft
    from .common import build_peft_config, load_dataset_spec

    names = {f.name for f in dataclasses.fields(SFTArgs)}
    settings = typed_values(SFTArgs, {k: v for k, v in spec.items() if k in names},
                            lambda k: f"--{k}" if k in options else source)
    try:
        args = SFTArgs(**settings)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    logging.basicConfig(level=logging.INFO)
    train_ds = load_dataset_spec(spec["dataset"], default_split="train")
    model, tokenizer = load_model_and_tokenizer(str(spec["model"]))
    return run_sft(model, tokenizer, train_ds, args, peft_config=build_peft_config(spec.get("peft")))
