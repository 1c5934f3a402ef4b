"""A run's spec: the YAML of ``gtpo train`` with its command-line overrides, resolved and checked.

A spec is a dict: the run keys (the fields of :class:`RunSpec`: ``model``, ``dataset``, ``eval_dataset``,
``reward_funcs``, ``peft``, ...) and every :class:`gtpo.GTPOConfig` field at the top level (with ``engine: trl``,
also ``trl.GRPOConfig`` options). :func:`resolve_train_spec` builds it the way ``gtpo train`` does (the embedded default
run, a YAML file, or GTPOConfig's defaults; then ``--field value`` overrides with dotted names; then a preset);
:func:`split_spec` separates and validates it into ``(run, config)``: a :class:`RunSpec` and a
:class:`GTPOConfig`, both typed dataclasses whose fields document themselves. Every error names what was wrong and where
(the file, or ``--field`` for a value set on the command line). No torch here; TRL is imported only for
``engine: trl``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, NamedTuple

from ..config import SHARED_VLLM_FIELDS, GTPOConfig, documented_field, field_annotation, type_problem
from ..errors import ConfigError, ConfigValueError
from .trl_names import TRL_SPEC_KEYS, apply_trl_names

__all__ = ["DATASET_KEYS", "DEFAULT_SOURCE", "ENGINES", "LOG_LEVELS", "PEFT_KEYS", "RunSpec", "SFT_KEYS", "TrainSpec",
           "apply_overrides", "default_config_text", "from_yaml", "load_yaml", "parse_overrides", "parse_value",
           "resolve_train_spec", "split_spec", "suggest", "typed_values"]

ENGINES = ("gtpo", "trl")
DATASET_KEYS = ("name", "split", "size", "seed", "template", "system_prompt", "columns", "path", "kwargs", "config")
PEFT_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora", "use_dora", "modules_to_save")
SFT_KEYS = ("max_steps", "learning_rate", "batch_size", "size", "max_length")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "passive")  # passive (TRL's default): info


def _key(default: Any, help: str, metavar: str, expected: str, accepts: Callable[[Any], bool]) -> Any:
    """A run key: a dataclass field (:func:`gtpo.config.documented_field`: its documentation in ``metadata['help']``)
    whose metadata also holds its ``--help`` placeholder (``metavar``), and what it accepts: ``accepts(value)``, and in
    words ``expected`` (the error message's)."""
    return documented_field(default, help, metavar=metavar, expected=expected, accepts=accepts)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_dataset(value: Any) -> bool:
    return isinstance(value, (str, dict))


def _is_settings(value: Any) -> bool:
    return isinstance(value, (bool, dict)) or value == "none"


def _is_reward_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(f, str) and f.strip() for f in value)


def _is_probes(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(t, str) for t in v) for v in value.values())


@dataclass
class RunSpec:
    """The run keys of a ``gtpo train`` spec (YAML top level, ``--key value``): what the run trains and how: the
    model, the data, the reward functions, LoRA, the engine, resuming. The trainer's hyperparameters are the
    :class:`gtpo.GTPOConfig` beside it (:func:`split_spec` separates a spec into both). Each field documents itself
    in ``metadata['help']`` (``gtpo train --help``, ``docs/config.md``); a wrong value raises
    :class:`~gtpo.errors.ConfigValueError` naming the key (``field``). ``None`` accepted where a key is optional."""

    model: str | None = _key(
        None, "Hub id, local directory, .gguf file, or 'smollm2-135m-instruct' (the offline SmolLM2 GGUF). A GGUF is "
        "converted once into a plain model directory under ~/.cache/gtpo ($GTPO_CACHE), which later runs load.",
        "PATH|HUB_ID", "a hub id, a local path or a .gguf file (a string)", _is_str)
    dataset: str | dict[str, Any] | None = _key(
        None, "Training data: a task name (gsm8k, math, a reasoning-gym task, ...) or a local file, or a mapping "
        "{name, split, size, seed, template, system_prompt, columns, path, kwargs}.",
        "NAME|PATH|MAPPING", "a task name, a file path, or a mapping {name, split, size, ...}", _is_dataset)
    eval_dataset: str | dict[str, Any] | None = _key(
        None, "Held-out data in the same form; used for eval_steps and the before/after accuracy.",
        "NAME|PATH|MAPPING", "a task name, a file path, or a mapping {name, split, size, ...}", _is_dataset)
    reward_funcs: list[str] | None = _key(
        None, "List of reward functions: built-in names (paper, paper_normalized, correctness, format, "
        "format_soft, reasoning_gym, last_number_correctness) or package.module:function or path/file.py:function.",
        "LIST", "a non-empty list of reward names (e.g. [correctness, format])", _is_reward_list)
    tools: list[str] | None = _key(
        None, "Tools the model may call (TRL's tools; multi-turn rollouts on both engines, docs/agents.md): a list of "
        "package.module:function or path/file.py:function (a relative path: from the current directory, else from "
        "the YAML's directory). Each function needs type hints and a docstring; prompts must be conversational.",
        "LIST", "a non-empty list of 'module:function' / 'file.py:function' strings", _is_reward_list)
    environment_factory: str | None = _key(
        None, "An environment class (TRL's environment_factory), package.module:Class or path/file.py:Class: one "
        "instance per completion, reset(**row) before each rollout, its public methods the tools (docs/agents.md).",
        "CLASS", "a 'module:Class' or 'file.py:Class' string", _is_str)
    eval_reward: str | None = _key(
        "correctness", "Scorer of the before/after accuracy (a reward spec as above; 1.0 = correct). Default: "
        "correctness.", "NAME", "a reward name or null", _is_str)
    eval_before_after: bool = _key(
        False, "Measure greedy accuracy on eval_dataset before and after training and print both.",
        "BOOL", "true or false", lambda v: isinstance(v, bool))
    peft: dict[str, Any] | bool | str | None = _key(
        None, "LoRA settings {r, lora_alpha, lora_dropout, target_modules} (peft.LoraConfig), or null for full "
        "fine-tuning.", "MAPPING|null", "a mapping of settings, true (defaults) or null", _is_settings)
    sft_warmup: dict[str, Any] | bool | str | None = _key(
        None, "Optional supervised format warm-up before RL: {max_steps, learning_rate, batch_size, size}, or null.",
        "MAPPING|null", "a mapping of settings, true (defaults) or null", _is_settings)
    probes: dict[str, list[str]] | None = _key(
        None, "Texts whose token probabilities are tracked every step: {name: [prefix, target]}.",
        "MAPPING", "a mapping {name: [prefix, target]} of strings", _is_probes)
    resume_from_checkpoint: bool | str | None = _key(
        None, "true (newest complete checkpoint in output_dir) or a checkpoint path.",
        "BOOL|PATH", "true, false or a checkpoint path", lambda v: isinstance(v, (bool, str)))
    log_level: str = _key(
        "info", "Logging level (info, warning, ...; TRL's passive: info).", "{debug,info,warning,error}", f"one of {list(LOG_LEVELS)}",
        lambda v: isinstance(v, str) and v.lower() in LOG_LEVELS)
    engine: str = _key(
        "gtpo", "Trainer of the run: gtpo (this project's trainer) or trl (TRL's GRPOTrainer with GTPO's conflict "
        "weights, entropy control and loss: gtpo.integrations.trl; vLLM, DeepSpeed, FSDP). With trl, trl.GRPOConfig "
        "options (use_vllm, vllm_mode, deepspeed, bf16, per_device_train_batch_size, gradient_accumulation_steps, "
        "push_to_hub, ...) may be set at the top level too.",
        "{gtpo,trl}", f"one of {list(ENGINES)}", lambda v: v in ENGINES)
    #: not a key: the trl.GRPOConfig options the spec sets at its top level (engine: trl), checked against TRL's fields
    trl: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "trl.GRPOConfig options of engine: trl (the spec's other top-level keys), checked against TRL's "
                "fields.", "key": False})

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def keys(cls) -> list[dataclasses.Field]:
        """The run keys (every field but ``trl``, which holds the spec's other keys), in declaration order."""
        return [f for f in dataclasses.fields(cls) if f.metadata.get("key", True)]

    @classmethod
    def key_names(cls) -> list[str]:
        return [f.name for f in cls.keys()]

    @classmethod
    def key_help(cls) -> dict[str, str]:
        """``{key: documentation}`` of every run key (``gtpo train --help``, ``docs/config.md``)."""
        return {f.name: f.metadata["help"] for f in cls.keys()}

    def validate(self) -> None:
        """Raise :class:`~gtpo.errors.ConfigValueError` naming the key (``field``): a value of the wrong type, or an
        unknown key inside ``dataset`` / ``eval_dataset`` / ``peft`` / ``sft_warmup`` (``field`` ``'peft.r'``)."""
        for f in self.keys():
            value = getattr(self, f.name)
            if (value is not None or "None" not in field_annotation(f)) and not f.metadata["accepts"](value):
                raise ConfigValueError(f"{f.name} must be {f.metadata['expected']}, got {value!r}", f.name)
        for name, allowed in (("dataset", DATASET_KEYS), ("eval_dataset", DATASET_KEYS), ("peft", PEFT_KEYS),
                              ("sft_warmup", SFT_KEYS)):
            value = getattr(self, name)
            for key in value if isinstance(value, dict) else ():
                if key not in allowed:
                    raise ConfigValueError(f"unknown key '{name}.{key}'{suggest(key, list(allowed))}", f"{name}.{key}")

    def to_dict(self) -> dict[str, Any]:
        """The run keys and their values (without ``trl``)."""
        return {name: getattr(self, name) for name in self.key_names()}


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
               options: frozenset[str] | set[str] = frozenset()) -> tuple[RunSpec, GTPOConfig]:
    """Separate run keys from config fields; validate both; returns ``(run, config)``: a :class:`RunSpec` and a
    :class:`GTPOConfig`.

    An error about a value names where it came from: ``--field`` when ``field`` is in ``options``
    (the keys set on the command line), else ``source`` (the YAML file).
    """

    def where(key: str | None) -> str:
        return f"--{key}" if key in options else source

    fields = GTPOConfig.field_names()
    run_keys = RunSpec.key_names()
    run_values: dict[str, Any] = {}
    cfg_values = {}
    engine = spec.get("engine", RunSpec.engine)
    if engine not in ENGINES:
        raise ConfigError(f"{where('engine')}: engine must be one of {list(ENGINES)}, got {engine!r}")
    spec = apply_trl_names(spec, engine=engine, where=where)  # a YAML written for `trl grpo`
    from .trl_options import drop_trl_nulls

    spec = drop_trl_nulls(spec)
    if engine == "gtpo":  # TRL's other options: the same, ignored where they have no effect, or refused with why
        from ..integrations import trl_option_defaults, trl_option_names
        from .trl_options import apply_on_gtpo_engine

        spec = apply_on_gtpo_engine(spec, known=set(fields) | set(run_keys), where=where,
                                    trl_names=trl_option_names(), trl_defaults=trl_option_defaults())
    trl_options: dict[str, Any] = {}
    for key, value in spec.items():
        if key in run_keys:
            run_values[key] = value
        elif key in fields and not (engine == "trl" and key in SHARED_VLLM_FIELDS + ("generation_batch_size",)):
            cfg_values[key] = value
        elif engine == "trl":
            trl_options[key] = value  # checked against trl.GRPOConfig below (TRL's batch field: as TRL reads it)
        else:
            raise ConfigError(f"{source}: unknown config field {key!r}{suggest(key, fields + run_keys)}"
                              f"{_trl_hint(key)}")
    if engine == "trl":
        from ..integrations.trl import check_trl_options

        trl_options = check_trl_options(trl_options, fields + run_keys, where)
    cfg_values = typed_values(GTPOConfig, cfg_values, where)
    try:
        config = GTPOConfig.from_dict(cfg_values, source=source)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where(getattr(err, 'field', None))}: {err}") from None
    for key in ("reward_funcs", "tools"):  # --reward_funcs correctness,format
        if isinstance(run_values.get(key), str):
            run_values[key] = [s.strip() for s in run_values[key].split(",") if s.strip()]
    try:
        run = RunSpec(**run_values, trl=trl_options)
    except ConfigValueError as err:
        raise ConfigError(f"{where(err.field)}: {err}") from None
    return run, config


def _launch_option(key: str) -> bool:
    """Whether ``key`` is an option of ``accelerate launch`` (``gtpo train`` launches with it: gtpo.app.launch)."""
    from .launch_names import launch_option_names

    return key in launch_option_names()


def _trl_option(key: str) -> bool:
    """Whether ``key`` is an option of ``trl.GRPOConfig`` (or one gtpo's engine has a verdict on)."""
    from ..integrations import trl_option_names
    from .trl_options import ACCEPTED_VALUES, NO_EFFECT, REFUSED

    return key in trl_option_names() or key in NO_EFFECT or key in ACCEPTED_VALUES or key in REFUSED


def _trl_hint(key: str) -> str:
    """``'; it is an option of TRL's GRPOConfig: ...'`` when ``key`` is one (``engine: trl`` takes it)."""
    from ..integrations import trl_option_names

    if key in trl_option_names():
        return "; it is an option of TRL's GRPOConfig: set `engine: trl` (--engine trl) to train on TRL's engine"
    return ""


def typed_values(cls: type, values: dict[str, Any], where: Callable[[str], str]) -> dict[str, Any]:
    """``values`` (read from YAML or the command line) for fields of the dataclass ``cls`` (:class:`GTPOConfig`,
    :class:`gtpo.sft.SFTArgs`), each read as its annotation says (:func:`from_yaml`) and checked against it (the
    config's own type check); unknown keys pass through (``cls`` names them).

    Raises:
        ConfigError: ``'<where(key)>: <key> must be <the expected type>, got <value>'``.
    """
    annotations = {f.name: field_annotation(f) for f in dataclasses.fields(cls)}
    out = dict(values)
    for key, value in values.items():
        if key not in annotations:
            continue
        value = out[key] = from_yaml(value, annotations[key])
        problem = type_problem(value, annotations[key])
        if problem:
            raise ConfigError(f"{where(key)}: {key} must be {problem}, got {value!r}")
    return out


def from_yaml(value: Any, annotation: str) -> Any:
    """``value`` as a field annotated ``annotation`` (e.g. ``'float | None'``) takes it, where YAML cannot say it:
    ``'1e-5'`` -> ``1e-05`` for a float (PyYAML reads YAML 1.1, where a float needs a dot, so ``1e-5`` arrives as a
    string; every spelling Python's ``float`` accepts is read), also inside a ``list[float]``; ``3.0`` -> ``3`` for
    an integer; ``4`` -> ``[4]`` for a ``list[int]``; an integer -> a float for a float. Anything else unchanged."""
    kind = annotation.split("|")[0].strip()

    def number(v: Any) -> Any:
        if isinstance(v, str):
            try:
                return float(v.strip())
            except ValueError:
                return v
        return v

    if kind == "list[float]" and isinstance(value, list):
        return [number(v) for v in value]
    if kind == "float":
        value = number(value)
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "list[int]" and isinstance(value, int) and not isinstance(value, bool):
        return [value]
    return value


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
    allowed = set(GTPOConfig.field_names()) | set(RunSpec.key_names()) | set(TRL_SPEC_KEYS)
    engine = overrides.get("engine", spec.get("engine"))
    for key in overrides:
        top = key.split(".")[0]
        if top not in allowed and engine != "trl" and not _trl_option(top) and not _launch_option(top):
            raise ConfigError(f"unknown option --{key}{suggest(top, sorted(allowed))}{_trl_hint(top)}")
    spec = apply_overrides(spec, overrides)
    if preset:
        if preset not in GTPOConfig.PRESETS:
            raise ConfigError(f"--preset: unknown preset {preset!r}; known presets: {list(GTPOConfig.PRESETS)}")
        spec = GTPOConfig.apply_preset(preset, spec)  # the config file's and the options' values win
    options = frozenset({key.split(".")[0] for key in overrides} | ({"preset"} if preset else set()))
    return TrainSpec(spec, source, options)
