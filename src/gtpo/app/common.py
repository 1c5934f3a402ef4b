"""What both engines' runs share: the run's inputs and hooks, datasets and LoRA from a spec, the greedy accuracy,
the summary and the report (:mod:`gtpo.app.training` runs gtpo's trainer, :mod:`gtpo.app.trl_run` TRL's)."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..config import GTPOConfig
from ..errors import ConfigError
from .spec import RunSpec

__all__ = ["AccuracyFn", "RunHooks", "RunInputs", "build_peft_config", "dataset_spec", "finish_run",
           "greedy_accuracy", "load_dataset_spec", "measure_accuracy", "measures_accuracy", "where_of",
           "write_summary_and_report"]

#: ``accuracy(model, tokenizer, dataset, reward, config, engine=None, stage=None) -> float``: the greedy accuracy
#: of ``model`` on ``dataset`` (1.0 = every problem correct); ``engine`` is the trainer's vLLM engine or None,
#: ``stage`` ``"before"`` or ``"after"`` training. One that takes a ``processes`` keyword is called on every process
#: of a multi-process run with the run's accelerate state (each measures its share: :func:`greedy_accuracy`); one
#: that does not, on the main process alone (:func:`measure_accuracy`).
AccuracyFn = Callable[..., float]


def dataset_spec(value: Any, *, default_split: str) -> dict[str, Any]:
    """A spec's dataset value as a mapping with a ``name`` (or ``path``) and a ``split``."""
    if value is None:
        raise ConfigError("no dataset given: set `dataset:` in the config or pass --dataset NAME|FILE")
    spec = {"name": value} if isinstance(value, str) else dict(value)
    if "name" not in spec and "path" not in spec:
        raise ConfigError(f"dataset spec {value!r} needs a 'name' (task name or file path)")
    spec.setdefault("split", default_split)
    return spec


def load_dataset_spec(value: Any, *, default_split: str):
    """The dataset of a spec's ``dataset`` / ``eval_dataset`` (a name or file, or a mapping ``{name, split, size,
    seed, template, system_prompt, columns, path, kwargs}``): :func:`gtpo.data.load_task`."""
    from ..data import load_task

    spec = dataset_spec(value, default_split=default_split)
    kwargs = dict(spec.pop("kwargs", None) or {})
    name = spec.pop("name", None) or spec.get("path")
    return load_task(name, **spec, **kwargs)


def build_peft_config(value: Any):
    """A ``peft.LoraConfig`` from the spec's ``peft`` (a mapping of LoraConfig fields over r=16, alpha 32, dropout 0,
    all linear projections; ``true`` for those defaults), or None (``null`` / ``false`` / ``"none"``: full
    fine-tuning)."""
    if value in (None, False, "none"):
        return None
    from peft import LoraConfig

    opts = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
    opts.update(value if isinstance(value, dict) else {})
    return LoraConfig(task_type="CAUSAL_LM", **opts)


def greedy_accuracy(model, tokenizer, dataset, reward, config: GTPOConfig, engine=None, stage: str | None = None,
                    processes=None) -> float:
    """Greedy accuracy of ``model`` on ``dataset`` (n=1, temperature 0, batch 64; ``reward`` scores a reply, None:
    the evaluation's answer check), decoded by ``engine`` (a vLLM engine) when given; the same measurement at every
    ``stage``. ``processes``: the accelerate state of a multi-process run, every process calling: each decodes and
    scores its share of ``dataset`` and every process returns the accuracy of all of it, the number one process
    would measure (:func:`gtpo.evaluation.api.evaluate_during_training`)."""
    from ..evaluation.api import evaluate_during_training
    from ..evaluation.options import ScoringOptions

    out = evaluate_during_training(
        model, tokenizer, dataset, n=1, k_list=[1], max_new_tokens=config.eval_max_new_tokens or config.max_completion_length,
        temperature=0.0, batch_size=64, scoring=ScoringOptions(reward_fn=reward), engine=engine, processes=processes,
    )
    return float(out["eval/accuracy_greedy"])


def where_of(options, key: str, source: str) -> str:
    """``--key`` when ``key`` was set on the command line, else ``source`` (the YAML file)."""
    return f"--{key}" if key in options else source


@dataclass
class RunHooks:
    """What an experiment or a benchmark may replace in a run, instead of patching it.

    ``accuracy``: the before/after greedy accuracy (``eval_before_after``), called as
    ``accuracy(model, tokenizer, dataset, reward, config, engine=None, stage="before" | "after") -> float``
    (:func:`measure_accuracy`) with the model the run trains, the trainer's own (its dtype, its device; with LoRA a
    peft model, whose adapter before training is new and adds nothing), under the trainer's precision; default
    :func:`greedy_accuracy`. One with a ``processes`` keyword is called on every process of a multi-process run
    and measures its share there (as :func:`greedy_accuracy`); one without, on the main process alone while the
    others wait (in the process group's collectives: an evaluation longer than its timeout aborts the run).
    ``on_trainer``: called with the built trainer before training starts (e.g. to keep a reference)."""

    accuracy: AccuracyFn = None  # type: ignore[assignment]
    on_trainer: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if self.accuracy is None:
            self.accuracy = greedy_accuracy


@dataclass
class RunInputs:
    """What a spec's run is made of once loaded: ``run`` (the run keys: :class:`gtpo.app.spec.RunSpec`) and
    ``config`` (:class:`GTPOConfig`), the training / held-out datasets, the reward functions, the before/after
    scorer and the model to train (after the SFT warm-up when there is one)."""

    run: RunSpec
    config: GTPOConfig
    train_dataset: Any
    eval_dataset: Any
    reward_funcs: list
    eval_reward: Callable | None
    model: str
    tools: list | None = None
    environment_factory: Callable | None = None


def import_object(spec: str, where: str, *, base_dir: str | None = None) -> Any:
    """The object a ``package.module:name`` or ``path/file.py:name`` string names (a tool, an environment class): a
    relative file path from the current directory, else from ``base_dir`` (the YAML's directory). ValueError naming
    ``where`` (the key) and what is wrong."""
    import importlib
    import importlib.util

    target, sep, attr = str(spec).strip().rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"{where}: {spec!r} must be 'package.module:name' or 'path/file.py:name'")
    if target.endswith(".py"):
        path = target
        if not os.path.isabs(path) and not os.path.exists(path) and base_dir:
            path = os.path.join(base_dir, path)
        if not os.path.isfile(path):
            raise ValueError(f"{where}: {spec!r}: no file {target!r} (from {os.getcwd()!r}"
                             f"{f' or {base_dir!r}' if base_dir else ''})")
        name = "gtpo_user_" + os.path.splitext(os.path.basename(path))[0]
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
        try:
            module.__spec__.loader.exec_module(module)
        except Exception as err:
            raise ValueError(f"{where}: {spec!r}: loading {path} raised {type(err).__name__}: {err}") from err
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise ValueError(f"{where}: {spec!r}: cannot import module {target!r}: {err}") from err
    if not callable(getattr(module, attr, None)):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ValueError(f"{where}: {spec!r}: {target!r} has no callable {attr!r}; callables there: {public}")
    return getattr(module, attr)


def measures_accuracy(inputs: RunInputs, stage: str) -> bool:
    """Whether the run measures its greedy accuracy ``stage`` (``"before"`` / ``"after"``) training:
    ``eval_before_after`` with an ``eval_dataset``; before training not when resuming."""
    if not (inputs.run.eval_before_after and inputs.eval_dataset is not None):
        return False
    return stage == "after" or not inputs.run.resume_from_checkpoint


def takes_processes(fn: Callable) -> bool:
    """Whether the accuracy function ``fn`` takes the ``processes`` keyword (a multi-process run calls it on every
    process: :class:`RunHooks`)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "processes" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def measure_accuracy(stage: str, inputs: RunInputs, model, tokenizer, hooks: RunHooks, *, engine=None,
                     autocast=None, processes=None) -> float | None:
    """The run's greedy accuracy ``stage`` (``"before"`` / ``"after"``) training, the one path of both engines:
    ``hooks.accuracy`` on ``model``, the model the run trains (the trainer's own object, in its dtype on its
    device), decoded by ``engine`` (the trainer's vLLM engine) when given, under ``autocast`` (the trainer's
    precision context: the run's compute dtype) when given; printed by the main process. Every process calls it
    with ``processes`` (the trainer's accelerator): a hook that takes it (the default) measures there, each process
    its share of the problems; one that does not measures on the main process alone (None elsewhere). Returns the
    accuracy (None where not measured)."""
    shared = processes is not None and takes_processes(hooks.accuracy)
    main = processes is None or processes.is_main_process
    if not (shared or main):
        return None
    kwargs = {"processes": processes} if shared else {}
    with autocast if autocast is not None else contextlib.nullcontext():
        value = hooks.accuracy(model, tokenizer, inputs.eval_dataset, inputs.eval_reward, inputs.config, engine=engine,
                               stage=stage, **kwargs)
    if not main:
        return value
    when = "before training: " if stage == "before" else "after training:  "
    print(f"greedy accuracy {when}{value:.1%} on {len(inputs.eval_dataset)} held-out problems"
          + (" (vLLM)" if engine is not None else ""), flush=True)
    return value


def finish_run(summary: dict[str, Any], inputs: RunInputs, before: float | None, after: float | None) -> None:
    """Main process, after training (either engine): the greedy accuracy before and after training
    (:func:`measure_accuracy`; None: not measured) into ``summary``, then ``summary.json`` and the report."""
    if after is not None:
        summary.update({"accuracy_after": after, "eval_size": len(inputs.eval_dataset)})
        if before is not None:
            summary["accuracy_before"] = before
    write_summary_and_report(inputs.config.output_dir, summary)


def write_summary_and_report(output_dir: str, summary: dict[str, Any]) -> None:
    """``summary.json`` (``summary`` plus the steps, first and last reward, mean step time of ``metrics.jsonl``) and
    the report (``gtpo report``'s plots) of the run in ``output_dir``; prints the report's path."""
    from ..run.checkpoint import write_json_atomic
    from ..run.metric_names import canonical_record
    from ..report import load_metrics, write_report

    steps = [m for m in map(canonical_record, load_metrics(output_dir)) if "reward" in m]
    if steps:
        summary.update({"steps": len(steps), "reward_first": steps[0]["reward"], "reward_last": steps[-1]["reward"],
                        "mean_step_time_s": sum(m.get("step_time", 0.0) for m in steps) / len(steps)})
    write_json_atomic(os.path.join(output_dir, "summary.json"), summary)
    path = write_report([output_dir])
    print(f"report: {path}", flush=True)
