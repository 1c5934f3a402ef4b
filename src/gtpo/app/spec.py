"""A run's spec: the YAML of ``gtpo train`` with its command-line overrides, resolved and checked.

A spec is a dict: the run keys (:data:`RUN_KEYS`: ``model``, ``dataset``, ``eval_dataset``, ``reward_funcs``,
``peft``, ...) and every :class:`gtpo.GTPOConfig` field at the top level (with ``engine: trl``, also
``trl.GRPOConfig`` options). :func:`resolve_train_spec` builds it the way ``gtpo train`` does (the embedded default
run, a YAML file, or GTPOConfig's defaults; then ``--field value`` overrides with dotted names; then a preset);
:func:`split_spec` separates and validates it into ``(run, config)``. Every error names what was wrong and where
(the file, or ``--field`` for a value set on the command line). No torch here; TRL is imported only for
``engine: trl``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from importlib import resources
from typing import Any, NamedTuple

from ..config import SHARED_VLLM_FIELDS, GTPOConfig
from ..errors import ConfigError
from .trl_names import TRL_SPEC_KEYS, apply_trl_names

__all__ = ["DATASET_KEYS", "DEFAULT_SOURCE", "ENGINES", "PEFT_KEYS", "RUN_DEFAULTS", "RUN_KEYS", "SFT_KEYS", "TrainSpec",
           "apply_overrides", "coerce_value", "default_config_text", "load_yaml", "parse_overrides", "parse_value",
           "resolve_train_spec", "split_spec", "suggest", "yaml11_float"]

RUN_KEYS: dict[str, str] = {
    "model": "Hub id, local directory, .gguf file, or 'smollm2-135m-instruct' (the offline SmolLM2 GGUF).",
    "dataset": "Training data: a task name (gsm8k, math, a reasoning-gym task, ...) or a local file, or a mapping "
    "{name, split, size, seed, template, system_prompt, columns, path, kwargs}.",
    "eval_dataset": "Held-out data in the same form; used for eval_steps and the before/after accuracy.",
    "reward_funcs": "List of reward functions: built-in names (paper, paper_normalized, correctness, format, "
    "format_soft, reasoning_gym, last_number_correctness) or package.module:function or path/file.py:function.",
    "eval_reward": "Scorer of the before/after accuracy (a reward spec as above; 1.0 = correct). Default: correctness.",
    "eval_before_after": "Measure greedy accuracy on eval_dataset before and after training and print both.",
    "peft": "LoRA settings {r, lora_alpha, lora_dropout, target_modules} (peft.LoraConfig), or null for full fine-tuning.",
    "sft_warmup": "Optional supervised format warm-up before RL: {max_steps, learning_rate, batch_size, size}, or null.",
    "probes": "Texts whose token probabilities are tracked every step: {name: [prefix, target]}.",
    "resume_from_checkpoint": "true (newest complete checkpoint in output_dir) or a checkpoint path.",
    "log_level": "Logging level (info, warning, ...).",
    "engine": "Trainer of the run: gtpo (this project's trainer) or trl (TRL's GRPOTrainer with GTPO's conflict "
    "weights, entropy control and loss: gtpo.integrations.trl; vLLM, DeepSpeed, FSDP). With trl, trl.GRPOConfig "
    "options (use_vllm, vllm_mode, deepspeed, bf16, per_device_train_batch_size, gradient_accumulation_steps, "
    "push_to_hub, ...) may be set at the top level too.",
}
RUN_DEFAULTS: dict[str, Any] = {
    "model": None,
    "dataset": None,
    "eval_dataset": None,
    "reward_funcs": None,
    "eval_reward": "correctness",
    "eval_before_after": False,
    "peft": None,
    "sft_warmup": None,
    "probes": None,
    "resume_from_checkpoint": None,
    "log_level": "info",
    "engine": "gtpo",
}
ENGINES = ("gtpo", "trl")
DATASET_KEYS = ("name", "split", "size", "seed", "template", "system_prompt", "columns", "path", "kwargs", "config")
PEFT_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora", "use_dora", "modules_to_save")
SFT_KEYS = ("max_steps", "learning_rate", "batch_size", "size", "max_length")


# ----------------------------------------------------------------------------- YAML + overrides
def default_config_text() -> str:
    """The embedded default run (``gtpo/configs/default.yaml``), what ``gtpo train`` without arguments runs."""
    return resources.files("gtpo").joinpath("configs/default.yaml").read_text()


def load_yaml(path: str) -> dict[str, Any]:
    import yaml

    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else path
        raise ConfigError(f"YAML syntax error in {where}: {getattr(err, 'problem', err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values, got {type(data).__name__}")
    return data


def parse_value(text: str) -> Any:
    """A command-line value read as YAML, with numbers like ``1e-3`` read as floats."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value) if any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            return value
    return value


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """``['--a', '1', '--b.c=x', '--flag']`` -> ``{'a': 1, 'b.c': 'x', 'flag': True}``."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or len(tok) < 3:
            raise ConfigError(f"unexpected argument {tok!r}: overrides look like --field value")
        key = tok[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            raw = tokens[i + 1]
            i += 2
        else:
            raw = "true"
            i += 1
        out[key.replace("-", "_") if "." not in key else key] = parse_value(raw)
    return out


def suggest(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def apply_overrides(spec: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        target = spec
        for part in parts[:-1]:
            current = target.get(part)
            if current is None:
                current = {}
            elif isinstance(current, str) and part in ("dataset", "eval_dataset"):
                current = {"name": current}
            elif not isinstance(current, dict):
                raise ConfigError(f"--{dotted}: {part!r} is {current!r}, not a mapping")
            target[part] = current
            target = current
        target[parts[-1]] = value
    return spec


def split_spec(spec: dict[str, Any], *, source: str,
               options: frozenset[str] | set[str] = frozenset()) -> tuple[dict[str, Any], GTPOConfig]:
    """Separate run keys from config fields; validate both; returns ``(run, config)``.

    An error about a value names where it came from: ``--field`` when ``field`` is in ``options``
    (the keys set on the command line), else ``source`` (the YAML file).
    """

    def where(key: str | None) -> str:
        return f"--{key}" if key in options else source

    fields = GTPOConfig.field_names()
    run = dict(RUN_DEFAULTS)
    cfg_values = {}
    engine = spec.get("engine", RUN_DEFAULTS["engine"])
    if engine not in ENGINES:
        raise ConfigError(f"{where('engine')}: engine must be one of {list(ENGINES)}, got {engine!r}")
    spec = apply_trl_names(spec, engine=engine, where=where)  # a YAML written for `trl grpo`
    trl_options: dict[str, Any] = {}
    for key, value in spec.items():
        if key in RUN_KEYS:
            run[key] = value
        elif key in fields and not (engine == "trl" and key in SHARED_VLLM_FIELDS):
            cfg_values[key] = value
        elif engine == "trl":
            trl_options[key] = value  # checked against trl.GRPOConfig below
        else:
            raise ConfigError(f"{source}: unknown config field {key!r}{suggest(key, fields + list(RUN_KEYS))}"
                              f"{_trl_hint(key)}")
    if engine == "trl":
        from ..integrations.trl import check_trl_options

        run["trl"] = check_trl_options(trl_options, fields + list(RUN_KEYS), where)
    types = {f.name: f.type for f in dataclasses.fields(GTPOConfig)}
    for key, value in list(cfg_values.items()):
        cfg_values[key] = coerce_value(key, value, types[key], where(key))
    try:
        config = GTPOConfig.from_dict(cfg_values, source=source)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where(getattr(err, 'field', None))}: {err}") from None
    for name, allowed in (("dataset", DATASET_KEYS), ("eval_dataset", DATASET_KEYS), ("peft", PEFT_KEYS),
                          ("sft_warmup", SFT_KEYS)):
        value = run.get(name)
        if isinstance(value, dict):
            for key in value:
                if key not in allowed:
                    raise ConfigError(f"{where(f'{name}.{key}')}: unknown key '{name}.{key}'"
                                      f"{suggest(key, list(allowed))}")
    if isinstance(run["reward_funcs"], str):
        run["reward_funcs"] = [s.strip() for s in run["reward_funcs"].split(",") if s.strip()]
    _check_run_keys(run, source, where)
    return run, config


def _trl_hint(key: str) -> str:
    """``'; it is an option of TRL's GRPOConfig: ...'`` when ``key`` is one (``engine: trl`` takes it)."""
    from ..integrations import trl_option_names

    if key in trl_option_names():
        return "; it is an option of TRL's GRPOConfig: set `engine: trl` (--engine trl) to train on TRL's engine"
    return ""


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _check_run_keys(run: dict[str, Any], source: str, where=None) -> None:
    """Types of the run keys (``model``, ``dataset``, ...), each error naming the key."""

    def bad(key: str, expected: str) -> ConfigError:
        return ConfigError(f"{where(key) if where else source}: {key} must be {expected}, got {run[key]!r}")

    if run["model"] is not None and not isinstance(run["model"], str):
        raise bad("model", "a hub id, a local path or a .gguf file (a string)")
    for key in ("dataset", "eval_dataset"):
        if run[key] is not None and not isinstance(run[key], (str, dict)):
            raise bad(key, "a task name, a file path, or a mapping {name, split, size, ...}")
    funcs = run["reward_funcs"]
    if funcs is not None and (not isinstance(funcs, list) or not funcs
                              or not all(isinstance(f, str) and f.strip() for f in funcs)):
        raise bad("reward_funcs", "a non-empty list of reward names (e.g. [correctness, format])")
    if run["eval_reward"] is not None and not isinstance(run["eval_reward"], str):
        raise bad("eval_reward", "a reward name or null")
    if not isinstance(run["eval_before_after"], bool):
        raise bad("eval_before_after", "true or false")
    for key in ("peft", "sft_warmup"):
        if run[key] is not None and not isinstance(run[key], (bool, dict)) and run[key] != "none":
            raise bad(key, "a mapping of settings, true (defaults) or null")
    probes = run["probes"]
    if probes is not None and not (isinstance(probes, dict) and all(
            isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(t, str) for t in v) for v in probes.values())):
        raise bad("probes", "a mapping {name: [prefix, target]} of strings")
    if run["resume_from_checkpoint"] is not None and not isinstance(run["resume_from_checkpoint"], (bool, str)):
        raise bad("resume_from_checkpoint", "true, false or a checkpoint path")
    if not isinstance(run["log_level"], str) or run["log_level"].lower() not in _LOG_LEVELS:
        raise bad("log_level", f"one of {list(_LOG_LEVELS)}")


def coerce_value(key: str, value: Any, type_text: Any, source: str) -> Any:
    """Light type checking of config values read from YAML / the command line."""
    t = str(type_text)
    if value is None:
        if "None" in t:
            return None
        raise ConfigError(f"{source}: {key} cannot be null (expected {t})")
    if t.startswith("bool"):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
    if t.startswith("int"):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {key} must be an integer, got {value!r}")
    if t.startswith("float") or t.startswith("list[float]"):
        value = yaml11_float(value, t)
    if t.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: {key} must be a number, got {value!r}")
        return float(value)
    if t.startswith("str") and "list" not in t and not isinstance(value, str):
        raise ConfigError(f"{source}: {key} must be a string, got {value!r}")
    if t.startswith("list[int]") and isinstance(value, int):
        return [value]
    return value


def yaml11_float(value: Any, type_text: str) -> Any:
    """``'1e-5'`` -> ``1e-05``: PyYAML reads YAML 1.1, where a float needs a dot (``1.0e-5``), so
    ``1e-5`` arrives as a string; accept every spelling Python's ``float`` accepts."""

    def one(v: Any) -> Any:
        if isinstance(v, str):
            try:
                return float(v.strip())
            except ValueError:
                return v
        return v

    if type_text.startswith("list[float]") and isinstance(value, list):
        return [one(v) for v in value]
    return one(value)


class TrainSpec(NamedTuple):
    """A resolved ``gtpo train`` spec: ``spec`` (YAML + overrides + preset), ``source`` (where it came from, for
    errors), ``options`` (the top-level keys set on the command line; errors about them name ``--key``)."""

    spec: dict[str, Any]
    source: str
    options: frozenset[str]


DEFAULT_SOURCE = "the default run (gtpo/configs/default.yaml)"


def resolve_train_spec(config_path: str | None, overrides: dict[str, Any], *, demo: bool = False) -> TrainSpec:
    """The spec ``gtpo train [CONFIG] [--field value ...]`` trains: the embedded default run (``demo``), the YAML at
    ``config_path``, or GTPOConfig's defaults; then ``overrides`` (:func:`parse_overrides`; ``overwrite`` is an alias
    of ``overwrite_output_dir``, ``preset`` applies a preset under the file's and the options' values).

    Raises:
        ConfigError: naming the option or the file: an unknown option, a bad preset, ``--demo`` with a file.
    """
    import yaml

    overrides = dict(overrides)
    preset = overrides.pop("preset", None)
    if "overwrite" in overrides:  # --overwrite: alias of --overwrite_output_dir true
        value = overrides.pop("overwrite")
        if not isinstance(value, bool):
            raise ConfigError(f"--overwrite takes no value (or true/false), got {value!r}")
        overrides["overwrite_output_dir"] = value
    if demo and config_path is not None:
        raise ConfigError(f"--demo starts from the embedded default run; it cannot be combined with a config file "
                          f"({config_path!r})")
    if demo:
        spec, source = yaml.safe_load(default_config_text()), DEFAULT_SOURCE
    elif config_path is None:
        spec, source = {}, "the command line"
    else:
        spec, source = load_yaml(config_path), config_path
    allowed = set(GTPOConfig.field_names()) | set(RUN_KEYS) | set(TRL_SPEC_KEYS)
    engine = overrides.get("engine", spec.get("engine"))
    for key in overrides:
        top = key.split(".")[0]
        if top not in allowed and engine != "trl":  # engine trl: split_spec checks them against TRL's fields
            raise ConfigError(f"unknown option --{key}{suggest(top, sorted(allowed))}{_trl_hint(top)}")
    spec = apply_overrides(spec, overrides)
    if preset:
        if preset not in GTPOConfig.PRESETS:
            raise ConfigError(f"--preset: unknown preset {preset!r}; known presets: {list(GTPOConfig.PRESETS)}")
        spec = GTPOConfig.apply_preset(preset, spec)  # the config file's and the options' values win
    options = frozenset({key.split(".")[0] for key in overrides} | ({"preset"} if preset else set()))
    return TrainSpec(spec, source, options)
