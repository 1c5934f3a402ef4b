"""Running a training job from a spec: what ``gtpo train`` and ``gtpo sft`` do once their arguments are parsed.

:func:`run_training` builds the run of a spec (:mod:`gtpo.app.spec`): the datasets (:func:`load_dataset_spec`), the
reward functions, the optional SFT warm-up, the model and its LoRA (:func:`build_peft_config`), then trains it on the
chosen engine (gtpo's :class:`gtpo.GTPOTrainer`, or TRL's through :mod:`gtpo.app.trl_run`), measures the greedy
accuracy on ``eval_dataset`` before and after (``eval_before_after``; :func:`measure_accuracy`, on the trainer's model
for both engines), and writes
``summary.json`` and the report (:func:`finish_run`). :class:`RunHooks` lets experiments and benchmarks replace the
accuracy measurement (e.g. to keep every problem's verdict) without patching anything. A stopped run prints the
exact command that resumes it (:func:`resume_command`).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from typing import Any

from ..config import GTPOConfig
from ..errors import CheckpointError, ConfigError, TrainingStopped
from .common import (RunHooks, RunInputs, build_peft_config, finish_run, load_dataset_spec, measure_accuracy,
                     measures_accuracy, where_of)
from .spec import RunSpec, split_spec

logger = logging.getLogger("gtpo")

__all__ = ["load_run_inputs", "resume_command", "run_training", "sft_warmup"]

def _check_runnable(run: RunSpec, config: GTPOConfig, *, source: str, options) -> None:
    """A run needs a model, a dataset and reward functions; on gtpo's engine ``use_vllm`` needs vLLM and
    ``disable_dropout`` must stay true."""
    missing = [(key, hint) for key, hint in (
        ("model", "--model PATH|HUB_ID"), ("dataset", "--dataset NAME|FILE"),
        ("reward_funcs", "--reward_funcs correctness (names: paper, correctness, format, ...)"))
        if not getattr(run, key)]
    if missing:
        raise ConfigError(
            f"{source}: a run needs " + "; ".join(f"{key} (set `{key}:` or pass {hint})" for key, hint in missing)
            + ". Only `gtpo train` without arguments runs the offline demo; `--demo` starts from it")
    if run.engine == "gtpo":
        _refuse_on_gtpo_engine(config, source=source, options=options)
    _check_speed_switches(config, source=source, options=options)
    if run.engine == "gtpo":  # transformers refuses a schedule's keywords when it is built: before the model loads
        from ..run.build import check_scheduler

        try:
            check_scheduler(config)
        except ValueError as err:
            key = "lr_scheduler_kwargs" if config.lr_scheduler_kwargs else "lr_scheduler_type"
            raise ConfigError(f"{where_of(options, key, source)}: {err}") from None
    if config.use_vllm and run.engine == "gtpo":
        from ..sampling.vllm_engine import VLLM_INSTALL_HINT, vllm_available, vllm_server_refusal

        if config.vllm_mode != "colocate":
            raise ConfigError(vllm_server_refusal(where_of(options, "vllm_mode", source)))
        if not vllm_available():
            raise ConfigError(f"{where_of(options, 'use_vllm', source)}: use_vllm needs vLLM, which is not installed: "
                              f"{VLLM_INSTALL_HINT}")


def _refuse_on_gtpo_engine(config: GTPOConfig, *, source: str, options) -> None:
    """Before any model loads: what gtpo's engine refuses of a valid config (:func:`gtpo.config.check_gtpo_engine`)."""
    from ..config import check_gtpo_engine
    from ..errors import ConfigValueError

    try:
        check_gtpo_engine(config)
    except ConfigValueError as err:
        raise ConfigError(f"{where_of(options, err.field, source)}: {err}") from None


def _refuse_resuming_a_model_only_checkpoint(run: RunSpec, config: GTPOConfig) -> None:
    """Before any model loads: resuming gtpo's engine from a checkpoint written with ``save_only_model`` (no
    optimizer, scheduler or RNG state) is refused (:func:`gtpo.run.checkpoint.refuse_model_only`)."""
    from ..run.checkpoint import latest_checkpoint, read_state, refuse_model_only

    resume = run.resume_from_checkpoint
    if isinstance(resume, str) and resume.strip().lower() in ("true", "false", "no", "none", "null", ""):
        resume = resume.strip().lower() == "true"
    path = latest_checkpoint(config.output_dir) if resume is True else resume if isinstance(resume, str) else None
    if path is None or not os.path.isdir(path):
        return  # nothing to resume from, or a path the trainer names in its own error
    try:
        refuse_model_only(path, read_state(path))
    except ValueError as err:
        if "save_only_model" in str(err):
            raise ConfigError(str(err)) from None


def _check_speed_switches(config: GTPOConfig, *, source: str, options) -> None:
    """The refusals of ``tf32`` / ``torch_compile_backend`` on this machine (:func:`gtpo.run.build.check_speed_switches`:
    transformers' on TRL's engine, the same on gtpo's), before any model loads, naming the option or the file."""
    import re

    from ..run.build import check_speed_switches

    try:
        check_speed_switches(config)
    except ValueError as err:
        found = re.match(r"GTPOConfig\.(\w+)", str(err))
        key = found.group(1) if found else "tf32"
        raise ConfigError(f"{where_of(options, key, source)}: {str(err).removeprefix('GTPOConfig.')}") from None


def _quantizes(spec: dict[str, Any]) -> bool:
    """Whether a spec loads a 4-bit/8-bit base (``model_init_kwargs.quantization_config``, TRL's ``load_in_4bit``)."""
    init = spec.get("model_init_kwargs")
    return bool(isinstance(init, dict) and init.get("quantization_config")) or bool(
        spec.get("load_in_4bit") or spec.get("load_in_8bit"))


def load_run_inputs(spec: dict[str, Any], *, source: str, options=frozenset()) -> RunInputs:
    """Validate ``spec`` (:func:`gtpo.app.spec.split_spec`) and load what its run is made of: datasets, reward
    functions, the SFT warm-up (``sft_warmup``: trained once into ``output_dir/sft-warmup`` and reused)."""
    from ..rewards import resolve_reward

    from ..run.models import import_bitsandbytes_quietly

    # before anything imports peft or TRL (which import bitsandbytes), so checking the spec imports it quietly too
    import_bitsandbytes_quietly(quantizing=_quantizes(spec))
    run, config = split_spec(spec, source=source, options=options)
    logging.basicConfig(level=getattr(logging, run.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _check_runnable(run, config, source=source, options=options)
    from .model_checks import check_model_settings

    check_model_settings(run, config, spec, source=source, options=options)  # before any model loads
    from ..run.trackers import check_trackers

    check_trackers(config.report_to, where=where_of(options, "report_to", source))  # both engines, before loading
    _check_push_to_hub(config, source=source, options=options)
    if run.engine == "gtpo":
        _refuse_resuming_a_model_only_checkpoint(run, config)
    train_ds = load_dataset_spec(run.dataset, default_split="train")
    eval_ds = None if run.eval_dataset is None else load_dataset_spec(run.eval_dataset, default_split="test")
    rewards = [resolve_reward(r) for r in run.reward_funcs]
    eval_reward = resolve_reward(run.eval_reward) if run.eval_reward else None
    tools, environment = _load_tools(run, source=source, options=options)
    model = str(run.model)
    if run.sft_warmup:
        model = sft_warmup(model, train_ds, run, config)
    return RunInputs(run, config, train_ds, eval_ds, rewards, eval_reward, model, tools, environment)


def _load_tools(run: RunSpec, *, source: str, options) -> tuple[list | None, Any]:
    """The run's ``tools`` (functions) and ``environment_factory`` (a class), imported (docs/agents.md); the
    trainer checks them before training (type hints, docstrings, the chat template, reset)."""
    from .common import import_object

    base = os.path.dirname(os.path.abspath(source)) if source and os.path.isfile(source) else None

    def where(key: str) -> str:  # "--tools" on the command line, "run.yaml: tools" in the file
        return where_of(options, key, source) + ("" if key in options else f": {key}")

    try:
        tools = None if not run.tools else [
            import_object(t, f"{where('tools')}[{i}]", base_dir=base) for i, t in enumerate(run.tools)]
        env = None if not run.environment_factory else import_object(
            run.environment_factory, where("environment_factory"), base_dir=base)
        if tools or env is not None:  # what no chat template can show, before any model loads
            from ..sampling.tools import check_tools

            check_tools(tools, env, where=where("tools" if tools else "environment_factory"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return tools, env


def _check_push_to_hub(config: GTPOConfig, *, source: str, options) -> None:
    """``push_to_hub`` offline: refused on both engines before anything loads (:func:`gtpo.run.hub.check_push_to_hub`)."""
    from ..errors import ConfigValueError
    from ..run.hub import check_push_to_hub

    try:
        check_push_to_hub(config, where=where_of(options, "push_to_hub", source))
    except ConfigValueError as err:
        raise ConfigError(str(err)) from None


def run_training(spec: dict[str, Any], *, source: str, argv: list[str] | None = None,
                 options: frozenset[str] | set[str] = frozenset(), hooks: RunHooks | None = None) -> int:
    """Run ``gtpo train`` from a resolved spec (:func:`gtpo.app.spec.resolve_train_spec`): gtpo's trainer, or TRL's
    with ``engine: trl`` (:func:`gtpo.app.trl_run.run_trl_training`). ``argv`` (the command line after ``train``)
    gives the exact command that resumes the run; ``options`` are the keys set on the command line (errors about
    them name the option); ``hooks`` replace the accuracy measurement (:class:`RunHooks`). Returns the exit code
    (0; 130 after a second interrupt); raises :class:`~gtpo.errors.TrainingStopped` /
    :class:`~gtpo.errors.CheckpointError` with a note naming the resume command."""
    hooks = hooks or RunHooks()
    from ..run.models import import_bitsandbytes_quietly
    from .launch import check_machines, launched, relaunch, split_launch_options

    import_bitsandbytes_quietly(quantizing=_quantizes(spec))  # before the launch keys are told from TRL's (TRL

    asked, (spec, launch_args) = spec, split_launch_options(spec, source=source)  # imports bitsandbytes): ...
    if launch_args and not launched():
        check_machines(asked, source=source)  # ranks and the main port, before any process starts
        if argv is None:
            raise ConfigError(f"{source}: accelerate launch options ({' '.join(launch_args)}) start `gtpo train` "
                              "again under accelerate launch, which needs the command line: run `gtpo train`, or "
                              "remove them and launch yourself (accelerate launch ... -m gtpo.cli train ...)")
        split_spec(spec, source=source, options=options)  # a bad file fails here, not in every launched process
        return relaunch(launch_args, argv)
    inputs = load_run_inputs(spec, source=source, options=options)
    if inputs.run.engine == "trl":
        _refuse_resuming_a_finished_trl_run(inputs)
        from .trl_run import run_trl_training

        return run_trl_training(inputs, spec=spec, source=source, hooks=hooks)
    return _run_gtpo_engine(inputs, argv=argv, source=source, hooks=hooks)


def _run_gtpo_engine(inputs: RunInputs, *, argv: list[str] | None, source: str, hooks: RunHooks) -> int:
    """Train ``inputs`` on gtpo's own trainer, with the before/after accuracy, ``summary.json`` and the report."""
    from accelerate import PartialState

    from ..run.models import load_model_and_tokenizer
    from ..run.build import policy_load_kwargs, run_precision
    from ..run.launch import check_launch, process_group_kwargs
    from ..trainer import GTPOTrainer, cpu_only

    run, config, eval_ds = inputs.run, inputs.config, inputs.eval_dataset
    probes = {k: tuple(v) for k, v in (run.probes or {}).items()}
    # as the trainer's Accelerator (the process state is a singleton), with the run's process-group timeout
    state = PartialState(cpu=cpu_only(), **process_group_kwargs(config.ddp_timeout))
    check_launch(state, engine="gtpo")  # before the model loads
    # the run's precision, decided once (gtpo.run.build, docs/gpu.md): the model is loaded with it after the process state
    # exists, as the trainer would load it (on a GPU onto this process's device: a 4-bit base is placed while loading,
    # on GPU 0 for all otherwise), and the trainer keeps both
    precision = run_precision(config, inputs.model, adapter=run.peft is not None, device=state.device)
    model, tokenizer = load_model_and_tokenizer(
        inputs.model, **policy_load_kwargs(config.model_init_kwargs, precision, state.device))
    trainer = GTPOTrainer(model, inputs.reward_funcs, inputs.train_dataset, args=config, processing_class=tokenizer,
                          peft_config=build_peft_config(run.peft), eval_dataset=eval_ds,
                          eval_reward_func=inputs.eval_reward, probe_texts=probes, precision=precision,
                          tools=inputs.tools, environment_factory=inputs.environment_factory)
    if hooks.on_trainer is not None:
        hooks.on_trainer(trainer)
    before = _accuracy_on_trainer("before", trainer, inputs, tokenizer, hooks)
    again = resume_command(argv, source=source, output_dir=config.output_dir)
    try:
        trainer.train(resume_from_checkpoint=run.resume_from_checkpoint)
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once; checkpoints are atomic
        from ..run.checkpoint import latest_checkpoint

        newest = latest_checkpoint(config.output_dir)
        print(f"gtpo train: interrupted; {config.output_dir} is resumable from "
              f"{newest or 'step 0 (no checkpoint yet)'}\nresume with: {again}", file=sys.stderr, flush=True)
        return 130
    except (TrainingStopped, CheckpointError) as err:  # the CLI prints the message and this note, exits 1
        err.add_note(f"resume with: {again}")
        raise
    except RuntimeError as err:  # with several processes: most likely another process died or hung (issue 43)
        if state.num_processes > 1:
            err.add_note(lost_process_note(state, config, again))
        raise
    if getattr(trainer, "stopped_early", None):
        if state.is_main_process:
            print(f"training stopped by {trainer.stopped_by} after step {trainer.global_step} of "
                  f"{getattr(trainer, 'max_steps', config.max_steps)}; "
                  f"checkpoint: {trainer.stopped_early}\nresume with: {again}", flush=True)
        return 0
    after = _accuracy_on_trainer("after", trainer, inputs, tokenizer, hooks)
    if state.is_main_process:
        summary: dict[str, Any] = {"no_signal_steps": trainer.no_signal.total,
                                   "no_signal_reasons": trainer.no_signal.state_dict()}
        if summary["no_signal_steps"]:
            print(f"{trainer.no_signal.summary()} of {trainer.global_step} steps had no gradient signal "
                  "(filtered: the entropy filter dropped every completion; zero-variance: every group's rewards "
                  "were equal; masked: every completion was truncated and masked; nonfinite: the update was "
                  "skipped)", flush=True)
        finish_run(summary, inputs, before, after)
    return 0


def lost_process_note(state, config: GTPOConfig, again: str) -> str:
    """The note added to an error that ends one process of a several-process run (a collective failed: gloo/NCCL
    say "Connection reset by peer" when another process died, "Timed out" when one stopped answering for
    ``ddp_timeout`` seconds): what it likely means, the newest complete checkpoint, the resume command."""
    from ..run.checkpoint import latest_checkpoint

    newest = latest_checkpoint(config.output_dir)
    return (f"gtpo train: process {state.process_index} of {state.num_processes} stopped: if the error above is a "
            "collective's (connection reset: another process of the run died; timed out: one stopped answering for "
            f"ddp_timeout={config.ddp_timeout}s), the launcher's log names the process that failed first. Checkpoints "
            f"are written atomically: {newest or 'no checkpoint was complete yet (step 0)'}. Resume, launched as "
            f"before, with: {again}")


def _accuracy_on_trainer(stage: str, trainer, inputs: RunInputs, tokenizer, hooks: RunHooks) -> float | None:
    """:func:`measure_accuracy` on gtpo's trainer: its model, its precision, its vLLM engine (``use_vllm``; every
    process asks for it: its start and weight sync involve them all), on every process, each measuring its share
    of the problems (None when the run does not measure it: :func:`measures_accuracy`)."""
    if not measures_accuracy(inputs, stage):
        return None
    engine = trainer.vllm_engine
    return measure_accuracy(stage, inputs, trainer.unwrapped_model, tokenizer, hooks, engine=engine,
                            autocast=trainer.precision.context(trainer.accelerator.device),
                            processes=trainer.accelerator)


def _refuse_resuming_a_finished_trl_run(inputs: RunInputs) -> None:
    """TRL's engine resumes a finished run as asked and then replaces its final model: refused as on gtpo's
    trainer (:func:`gtpo.run.checkpoint.refuse_resuming_a_finished_run`), before any model is loaded."""
    resume, config = inputs.run.resume_from_checkpoint, inputs.config
    asked = resume is True or (isinstance(resume, str) and resume.strip().lower() not in ("false", "no", "none", ""))
    if not asked or config.overwrite_output_dir or not os.path.isdir(config.output_dir):
        return
    from transformers.trainer_utils import get_last_checkpoint

    from ..run.checkpoint import refuse_resuming_a_finished_run

    try:
        refuse_resuming_a_finished_run(config.output_dir, get_last_checkpoint(config.output_dir))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def sft_warmup(model_spec: str, train_ds, run: RunSpec, config: GTPOConfig) -> str:
    """The spec's ``sft_warmup``: a supervised format warm-up of ``model_spec`` on ``train_ds``'s answers into
    ``output_dir/sft-warmup`` (reused when it exists); returns the directory RL starts from."""
    from ..run.models import load_model_and_tokenizer
    from ..sft import run_sft

    opts = dict(run.sft_warmup) if isinstance(run.sft_warmup, dict) else {}
    out = os.path.join(config.output_dir, "sft-warmup")
    if os.path.isfile(os.path.join(out, "config.json")):
        logger.info("reusing the SFT warm-up model in %s", out)
        return out
    size = opts.pop("size", None)
    data = train_ds.select(range(min(size, len(train_ds)))) if size else train_ds
    model, tokenizer = load_model_and_tokenizer(model_spec)
    run_sft(model, tokenizer, data, output_dir=out, peft_config=build_peft_config(run.peft), seed=config.seed, **opts)
    return out


def resume_command(argv: list[str] | None, *, source: str, output_dir: str) -> str:
    """The ``gtpo train`` command that resumes this run: the same arguments (without overwriting
    or an earlier resume option; a ``--hub_token`` value shown as ``<HUB_TOKEN>``) plus ``--resume_from_checkpoint
    true``."""
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
            if key == "--hub_token":  # never printed: the user puts it back (or uses `hf auth login`)
                args += ["--hub_token", "<HUB_TOKEN>"]
                i += 2 if takes_value else 1
                continue
            args.append(tok)
            i += 1
    return "gtpo train " + shlex.join(args + ["--resume_from_checkpoint", "true"])
