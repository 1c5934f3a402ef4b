"""``gtpo train`` with ``engine: trl``: the same spec trained on TRL's ``GRPOTrainer`` (:mod:`gtpo.integrations.trl`).

The same YAML as gtpo's own engine: ``model`` (a ``.gguf`` or the offline SmolLM2 is loaded by gtpo, any other model
by TRL), datasets, reward functions, ``peft``, ``eval_before_after`` and every GTPOConfig field
(:meth:`~gtpo.integrations.trl.TRLGTPOConfig.from_gtpo_config`); ``trl.GRPOConfig`` options set in the spec pass
through. Prompts longer than ``max_prompt_length`` are dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Any

from ..errors import ConfigError
from .common import RunHooks, RunInputs, build_peft_config, finish_run, measure_accuracy, measures_accuracy

logger = logging.getLogger("gtpo")

__all__ = ["run_trl_training"]


@contextlib.contextmanager
def _library_deprecations_hidden():
    """The deprecation notices transformers 5 gives TRL 1.16's and peft 0.21's own use of ``gradient_checkpointing`` /
    ``is_gradient_checkpointing`` (on every run, whatever the user set) hidden inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*`(is_)?gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def run_trl_training(inputs: RunInputs, *, spec: dict[str, Any], source: str = "the command line",
                     hooks: RunHooks | None = None) -> int:
    """Train ``inputs`` (``inputs.run.trl`` holds the ``trl.GRPOConfig`` options) on
    :class:`~gtpo.integrations.trl.TRLGTPOTrainer`. Writes TRL's checkpoints, the final model, ``metrics.jsonl``
    (TRL's logs), ``run_config.json``, ``summary.json`` and ``gtpo report``'s report to ``output_dir``; ``spec``
    tells which fields the user set (TRL's batch fields may not be mixed with gtpo's). Returns the exit code."""
    from accelerate import PartialState

    from ..integrations.trl import TRLGTPOConfig
    from ..run.build import cpu_only
    from ..run.launch import check_launch, process_group_kwargs
    from ..run.lock import claim_run_directory

    hooks = hooks or RunHooks()
    run, config, eval_dataset, model = inputs.run, inputs.config, inputs.eval_dataset, inputs.model
    options = dict(run.trl)
    if cpu_only():  # TRL's TrainingArguments forms a CPU process group (gloo) only with use_cpu, as gtpo's engine does
        options.setdefault("use_cpu", True)
    # the process state TRL's TrainingArguments makes (cpu, timeout), so that num_processes below is the run's
    cpu = bool(options.get("use_cpu")) or os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true")
    state = PartialState(cpu=cpu, **process_group_kwargs(config.ddp_timeout))
    evaluating = eval_dataset is not None and (config.resolved_eval_strategy != "no" or config.eval_on_start)
    if not evaluating:  # TRL refuses an evaluation without an eval dataset; gtpo's engine evaluates nothing then
        options.setdefault("eval_strategy", "no")
        options.setdefault("eval_on_start", False)
    elif config.per_device_eval_batch_size is None:  # TRL's evaluation batch must hold whole groups
        options.setdefault("per_device_eval_batch_size", config.group_size)
    if state.device.type == "cpu":  # no pinned memory without an accelerator (torch warns on every step)
        options.setdefault("dataloader_pin_memory", False)
    try:
        with _library_deprecations_hidden():
            args = TRLGTPOConfig.from_gtpo_config(config, num_processes=state.num_processes,
                                                  set_fields=set(spec), adapter=run.peft is not None, **options)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    # the process state TRL's trainer uses (TrainingArguments made it: use_cpu, ddp_timeout) against what the launcher
    # asked for, before any model loads
    args.device  # noqa: B018 (TrainingArguments sets up its process state on first use)
    trl_state = getattr(args, "distributed_state", None) or PartialState()
    check_launch(trl_state, engine="trl")
    # one run at a time in output_dir, for the run's life; seen by every process unless each node saves its own copy
    lock = claim_run_directory(config.output_dir, trl_state, shared=not getattr(args, "save_on_each_node", False))
    try:
        return _train(inputs, args, options, model, evaluating, trl_state, hooks)
    finally:
        if lock is not None:
            lock.release()


def _train(inputs: RunInputs, args, options: dict[str, Any], model, evaluating: bool, state, hooks: RunHooks) -> int:
    """The TRL run of :func:`run_trl_training` once its launch is checked and its output_dir locked."""
    from ..run.checkpoint import no_transformers_progress_bars, write_json_atomic
    from ..integrations.trl import TRLGTPOTrainer, drop_long_prompts, metrics_file_callback
    from ..run.launch import check_launch, requested_distributed_type, would_run
    from ..run.models import load_model, load_tokenizer, resolve_model_spec

    run, config, eval_dataset = inputs.run, inputs.config, inputs.eval_dataset
    if run.probes:
        logger.warning("probes are tracked by gtpo's own trainer only; TRL's engine ignores them")

    _, gguf = resolve_model_spec(model)
    tokenizer = load_tokenizer(model)
    # TRL loads hub ids and directories itself (args.model_init_kwargs); a GGUF is dequantized here, in the run's dtype
    policy = load_model(model, dtype=args.model_init_kwargs["dtype"]) if gguf else model
    train_dataset = drop_long_prompts(inputs.train_dataset, tokenizer, config.max_prompt_length)
    with _library_deprecations_hidden():
        trainer = TRLGTPOTrainer(model=policy, reward_funcs=inputs.reward_funcs, args=args,
                                 train_dataset=train_dataset, eval_dataset=eval_dataset if evaluating else None,
                                 processing_class=tokenizer, peft_config=build_peft_config(run.peft),
                                 callbacks=[metrics_file_callback(config.output_dir)],
                                 **({"tools": inputs.tools} if inputs.tools else {}),
                                 **({"environment_factory": inputs.environment_factory}
                                    if inputs.environment_factory is not None else {}))
    # the accelerator TRL built (after the model loaded): what check_launch foresaw from the process state
    asked = requested_distributed_type()
    if asked is not None and would_run(trainer.accelerator.state, asked) != asked:
        check_launch(trainer.accelerator.state, engine="trl")
    if hooks.on_trainer is not None:
        hooks.on_trainer(trainer)
    before = _accuracy_on_trainer("before", trainer, inputs, tokenizer, hooks)
    if state.is_main_process:
        os.makedirs(config.output_dir, exist_ok=True)
        write_json_atomic(os.path.join(config.output_dir, "run_config.json"),
                          {**config.to_dict(), "engine": "trl", "model": model, "trl": options})
    with _library_deprecations_hidden(), no_transformers_progress_bars():  # TRL's own bar stays
        trainer.train(resume_from_checkpoint=run.resume_from_checkpoint)
        trainer.save_model(config.output_dir)
    after = _accuracy_on_trainer("after", trainer, inputs, tokenizer, hooks)
    if state.is_main_process:
        finish_run({"engine": "trl", "steps": trainer.state.global_step}, inputs, before, after)
    return 0


def _accuracy_on_trainer(stage: str, trainer, inputs: RunInputs, tokenizer, hooks: RunHooks) -> float | None:
    """:func:`measure_accuracy` on TRL's trainer: its model (loaded by TRL in the run's dtype and placed on its
    device when the trainer was built; not a second copy), under its accelerator's autocast, on every process, each
    measuring its share of the problems (None when the run does not measure it: :func:`measures_accuracy`)."""
    if not measures_accuracy(inputs, stage):
        return None
    return measure_accuracy(stage, inputs, trainer.accelerator.unwrap_model(trainer.model), tokenizer, hooks,
                            autocast=trainer.accelerator.autocast(), processes=trainer.accelerator)
