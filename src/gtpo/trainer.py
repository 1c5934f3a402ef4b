"""The training loop for any Hugging Face causal LM: GTPO, or the GRPO / Dr.GRPO / DAPO baselines.

One step (:meth:`GTPOTrainer.step`), top to bottom:

1. **rollout** (:meth:`~GTPOTrainer.sample_batch`): ``prompts_per_step`` prompts (each process its
   share of whole groups), ``group_size`` completions each (:func:`gtpo.sampling.rollout.generate`, or with
   ``use_vllm`` a colocated vLLM engine, :class:`gtpo.sampling.vllm_engine.VLLMEngine`, whose weights follow the
   policy after every optimizer step);
2. **score**: every reward function under TRL's contract, weighted (:class:`gtpo.rewards.scoring.RewardScorer`);
   DAPO's overlong penalty; dynamic sampling replaces zero-variance groups;
3. **advantages** over the whole (all-process) batch (:func:`gtpo.maths.advantages.group_advantages`);
4. **gtpo inputs** (:meth:`~GTPOTrainer.gtpo_inputs`): the loss mask, GTPO's per-row inputs of whole
   groups (:func:`gtpo.maths.method.group_inputs`: the conflict weights lambda from the UNSHAPED advantage
   signs, the rows the gamma shift and the sign controls reach), ⟨H⟩_ini;
5. **update** (:meth:`~GTPOTrainer.update`): ``num_iterations`` passes over micro-batches; one forward
   gives log-probs and entropies (:class:`gtpo.sampling.policy.PolicyForward`), the entropy filter and the
   gamma shift shape the advantages (:func:`gtpo.maths.method.effective_advantages`, the rollout policy's
   entropies in every pass), the loss is ``gtpo.maths.losses.POLICY_LOSSES[loss_type]`` (one signature for
   every loss) with the normalisers of the whole batch (with vLLM: times the truncated importance weights of the sampler
   mismatch, :func:`gtpo.maths.losses.sampler_importance_weights`); gradients are clipped, non-finite updates
   skipped;
6. **metrics** (:func:`gtpo.run.step_metrics.step_metrics`) to ``metrics.jsonl`` (and trackers); sample
   completions, checkpoints and evaluation in :meth:`~GTPOTrainer.train`.

What the update takes and returns is :mod:`gtpo.run.update`. The run directory (checks, logs, atomic checkpoints,
exact resume, final model) is :class:`gtpo.run.checkpoint.RunDirectory`. SIGTERM / SIGINT finish the step and save
(:mod:`gtpo.run.signals`); NaN/inf updates are never applied (``max_consecutive_skips`` in a row raise
:class:`gtpo.errors.TrainingStopped`); bad input raises ``ValueError`` naming what and where. GTPO never loads a
reference model; GRPO/Dr.GRPO/DAPO load one only when ``beta > 0`` (with LoRA the adapter is disabled instead).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from .config import GTPOConfig, check_gtpo_engine, fields_where, resolved
from .data.loaders import as_dataset
from .errors import HubUploadError, TrainingStopped
from .maths import method
from .maths.advantages import group_advantages
from .maths.losses import POLICY_LOSSES
from .rewards.scoring import RewardScorer, ScoredBatch, overlong_penalty
from .run.build import check_distributed_type, cpu_only
from .run.checkpoint import RESUME_HINT, RunDirectory
from .run.launch import check_launch, process_group_kwargs
from .run.diagnostics import NoSignalCounter, policy_change_sums, probe_probabilities, signal_counts
from .run.hub import HubPusher, check_push_to_hub, repo_name
from .run.signals import install_stop_handlers, restore_handlers, stop_requested
from .run.step_metrics import step_metrics
from .run.trackers import check_trackers, log_table, start_trackers
from .run.update import SamplerStats, UpdateInputs, UpdateResult
from .sampling.policy import PolicyForward
from .sampling.rollout import PromptSampler, Rollout, SamplingParams, encode_dataset_prompts, eos_token_ids, generate
from .sampling.tools import environment_reward

if TYPE_CHECKING:
    from .run.build import Precision

logger = logging.getLogger("gtpo")

# config fields that may change between a run and its resume without changing what is trained (``_f(resumable=True)``)
RESUMABLE_CHANGES = frozenset(fields_where("resumable", True))


class GTPOTrainer:
    """Train a causal LM with GTPO (default) or the GRPO / Dr.GRPO / DAPO baselines.

    Args:
        model: a hub id or local path (loaded with ``AutoModelForCausalLM``), or a loaded
            ``PreTrainedModel``.
        reward_funcs: one callable or a list, each ``f(prompts, completions, completion_ids,
            **dataset_columns) -> list[float | None]`` (TRL's contract), or names known to
            ``gtpo.rewards.resolve_reward``.
        train_dataset: ``datasets.Dataset`` or a list of dicts with a ``prompt`` column (a string,
            or a list of chat messages); other columns reach the reward functions.
        args: a :class:`GTPOConfig`.
        processing_class: the tokenizer; loaded from ``model`` when None.
        peft_config: a ``peft`` config (e.g. ``LoraConfig``) to train an adapter only.
        eval_dataset: rows with ``prompt`` and ``answer`` evaluated every ``args.eval_steps``.
        eval_reward_func: scorer used for evaluation (default: the evaluation module's).
        probe_texts: ``{name: (prefix, target)}``: the mean probability of each target's tokens
            after its prefix is logged every step (``probe/<name>``).
        precision: the run's :class:`gtpo.run.build.Precision` when the caller decided it and loaded ``model`` with
            it (:func:`gtpo.run.build.run_precision`, as the application layer does); None: decided here, the same way.
        tools: Python functions the model may call (TRL's ``tools``): type hints and a docstring per function;
            completions become multi-turn (:mod:`gtpo.sampling.tools`, docs/agents.md): the rollout stops at a tool
            call, runs it (``tool_call_timeout``), appends its result as tool tokens that the loss never sees, and
            continues (``max_tool_calling_iterations``, ``max_completion_length``). Needs conversational prompts;
            reward functions get each completion as its list of messages.
        environment_factory: a class whose instances have ``reset(**row)`` and tool methods (TRL's
            ``environment_factory``): one instance per completion; reward functions get them as ``environments``;
            a ``get_reward()`` method becomes a reward function named after the class.
        rollout_func: TRL's ``rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs",
            "env_mask"?, ...}`` replacing gtpo's sampler (``prompts``: one per completion, ``group_size`` per dataset
            prompt; ``trainer``: this trainer, with TRL's ``processing_class``, ``model``, ``args``); ``env_mask``
            0 marks environment tokens, other keys reach the reward functions.
    """

    def __init__(self, model: str | nn.Module, reward_funcs: Callable | str | list, train_dataset,
                 args: GTPOConfig | None = None, processing_class=None, peft_config=None, eval_dataset=None,
                 eval_reward_func: Callable | None = None, probe_texts: dict[str, tuple[str, str]] | None = None,
                 precision: Precision | None = None, tools: list[Callable] | None = None,
                 environment_factory: Callable | None = None, rollout_func: Callable | None = None):
        from accelerate.utils import set_seed

        from .run import build as setup
        from .rewards import resolve_reward

        self.args = args = args if args is not None else GTPOConfig()
        if not isinstance(args, GTPOConfig):
            raise ValueError(f"args must be a GTPOConfig, got {type(args).__name__}")
        args.validate()
        check_gtpo_engine(args)  # what gtpo's engine refuses of a valid config (save_strategy: best)
        check_push_to_hub(args)  # push_to_hub needs the Hub: refused offline, before the model loads
        if args.use_vllm and (tools or environment_factory is not None):
            raise ValueError("GTPOConfig.use_vllm: gtpo's trainer runs tool-calling rollouts on its own sampler only "
                             "(multi-turn turns on the colocated vLLM engine are not implemented): set use_vllm: false, "
                             "or train with engine: trl, whose vLLM rollouts call tools (docs/agents.md)")
        if args.use_vllm and args.vllm_enable_sleep_mode and cpu_only():
            raise ValueError("GTPOConfig.vllm_enable_sleep_mode: vLLM has no sleep mode on CPU; set it to false")
        if args.use_vllm:
            from .sampling.vllm_engine import require_vllm, vllm_server_refusal

            if args.vllm_mode != "colocate":
                raise ValueError(vllm_server_refusal("GTPOConfig.vllm_mode"))
            require_vllm("GTPOConfig.use_vllm")
        check_trackers(args.report_to, where="GTPOConfig.report_to")  # a missing tracker would log nothing
        setup.apply_tf32(args)  # before the model loads: tf32 true without a TF32 GPU is refused here
        setup.check_scheduler(args)  # lr_scheduler_type / lr_scheduler_kwargs that transformers refuses
        # bf16 autocast is the policy's own (PolicyForward, sampling): accelerate's mixed precision stays off,
        # whatever the launcher says (a conflicting setting is named in a warning once the dtype is known)
        from accelerate.utils import InitProcessGroupKwargs

        self.accelerator = acc = setup.accelerator_without_mixed_precision(
            log_with=list(args.report_to) or None, project_dir=args.output_dir, cpu=cpu_only(),
            kwargs_handlers=[InitProcessGroupKwargs(**process_group_kwargs(args.ddp_timeout))])
        check_launch(acc.state, engine="gtpo")  # a launch that formed another run than it asked for: refused
        if args.prompts_per_step % acc.num_processes:
            raise ValueError(
                f"GTPOConfig.prompts_per_step ({args.prompts_per_step}) must be divisible by the number of "
                f"processes ({acc.num_processes}): each process holds whole groups"
            )
        check_distributed_type(acc.distributed_type)
        self.local_prompts = args.prompts_per_step // acc.num_processes
        set_seed(args.seed, device_specific=True)
        self.run_dir = RunDirectory(args.output_dir, acc)
        #: push_to_hub's uploads (gtpo.run.hub; the main process's only)
        self.hub = HubPusher(args) if args.push_to_hub and acc.is_main_process else None

        # model and tokenizer (gtpo.run.build; the dtypes and devices of docs/gpu.md)
        self.model_name = model if isinstance(model, str) else \
            getattr(getattr(model, "config", None), "_name_or_path", type(model).__name__)
        self.tokenizer = setup.prepare_tokenizer(processing_class, model)
        self.is_peft = peft_config is not None
        self.precision = precision or setup.run_precision(args, model, adapter=self.is_peft, device=acc.device)
        setup.launcher_mixed_precision(self.precision.compute, where="GTPOTrainer")
        base_model = setup.load_policy_model(model, args, peft_config=peft_config, precision=self.precision,
                                             device=acc.device)
        ref_model = setup.build_reference_model(base_model, args, adapter=self.is_peft, precision=self.precision)
        if self.is_peft:
            base_model = setup.add_adapter(base_model, peft_config, self.precision)

        # multi-turn rollouts (gtpo.sampling.tools): tools / environment_factory, or a TRL rollout_func
        train_dataset = as_dataset(train_dataset, "train_dataset")
        self.rollout_func = rollout_func
        self.toolbox = self._toolbox(tools, environment_factory, rollout_func, train_dataset)

        # rewards and data
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else \
            [] if reward_funcs is None else [reward_funcs]
        funcs = [f if callable(f) else resolve_reward(f) for f in funcs]
        if self.toolbox is not None and self.toolbox.has_env_reward:  # TRL: the environment's get_reward is a reward
            funcs.append(environment_reward(type(self.toolbox.environments(1)[0]).__name__))
        self.scorer = RewardScorer(funcs, args.reward_weights, device=acc.device)
        render = None if self.toolbox is None else self.toolbox.prompt_renderer()
        self.train_dataset, self._prompt_ids, self.dropped_prompts = encode_dataset_prompts(
            train_dataset, self.tokenizer, args.max_prompt_length, render=render)
        self.eval_dataset = None if eval_dataset is None else as_dataset(eval_dataset, "eval_dataset")
        self.eval_reward_func = eval_reward_func
        self.probe_texts = probe_texts or {}
        #: rollout steps in one pass over the training prompts (TRL's epoch: the prompts of a step are
        #: prompts_per_step whole groups, an incomplete last batch does not make a step)
        self.steps_per_epoch = max(1, len(self.train_dataset) // args.prompts_per_step)
        epochs = args.max_steps < 0  # num_train_epochs decides: an epoch drops its incomplete tail, as TRL's
        if epochs and len(self.train_dataset) < args.prompts_per_step:
            raise ValueError(f"GTPOConfig.max_steps=-1 trains num_train_epochs epochs, but the training set has "
                             f"{len(self.train_dataset)} prompts, fewer than one step's prompts_per_step "
                             f"({args.prompts_per_step}): an epoch would have no step. Lower prompts_per_step or set "
                             "max_steps")
        self.sampler = PromptSampler(len(self.train_dataset), args.seed,
                                     batch_size=args.prompts_per_step if epochs else None)
        #: the steps this run trains (``max_steps``, or with -1 ``ceil(num_train_epochs * steps_per_epoch)``)
        self.max_steps = args.total_steps(self.steps_per_epoch)

        # optimisation (gtpo.run.build: optim, lr_scheduler_type)
        compile_options = setup.compile_options(args)
        self.policy = PolicyForward(base_model, chunk_size=args.logprob_chunk_size, compute_dtype=self.precision.compute,
                                    compile=compile_options)
        self.optimizer = setup.build_optimizer([p for p in self.policy.parameters() if p.requires_grad], args,
                                               acc.device)
        self.scheduler = setup.build_scheduler(self.optimizer, args, num_training_steps=self.max_steps)
        self.policy, self.optimizer = acc.prepare(self.policy, self.optimizer)
        self.ref_policy = None
        if ref_model is not None:
            self.ref_policy = PolicyForward(ref_model.to(acc.device), chunk_size=args.logprob_chunk_size,
                                            compute_dtype=self.precision.compute, compile=compile_options)
        self.loss_fn = POLICY_LOSSES[args.loss_type]
        self.eos_ids = eos_token_ids(self.tokenizer, self.unwrapped_model)

        # loop state (saved in checkpoints)
        self.global_step = 0
        self.skipped_steps = 0        # steps with at least one skipped (non-finite) update
        self.skipped_updates = 0      # optimizer updates skipped (num_iterations per step at most)
        self.consecutive_skips = 0    # consecutive steps with a skipped update, up to this one
        self.initial_entropy: float | None = None
        self.num_tokens = 0           # prompt and completion tokens trained on so far, all processes (TRL's metric)
        self.no_signal = NoSignalCounter()  # steps without gradient signal, by reason
        self.last_batch: ScoredBatch | None = None
        self.last_advantages: torch.Tensor | None = None  # (N,) this process's advantages of last_batch
        self.step_learning_rate: float | None = None  # the learning rate the last step's updates used
        self._stop_signal: int | None = None
        self.stopped_early: str | None = None  # the checkpoint written when a signal stopped train()
        self.stopped_by: str | None = None     # the signal's name

        # vLLM (use_vllm): the engine is started at the first rollout, from the weights of that moment (after a
        # resume: the checkpoint's); its weights are refreshed before a rollout that follows an optimizer step
        self._vllm = None
        self._vllm_stale = False
        self._vllm_sync_s = 0.0
        if args.use_vllm and args.vllm_logprobs_mode is None:
            logger.warning("use_vllm: logprob_temperature=%s is neither the sampling temperature (%s) nor 1.0, so "
                           "vLLM cannot give comparable log-probs: the vllm/logprob_gap metrics and the importance-"
                           "sampling correction are off", args.logprob_temperature, args.temperature)

    @property
    def unwrapped_model(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.policy).model

    # TRL's names, for a rollout_func written for TRL's GRPOTrainer (it gets the trainer as its second argument)
    @property
    def model(self) -> nn.Module:
        """The policy model (:attr:`unwrapped_model`; TRL's ``trainer.model``)."""
        return self.unwrapped_model

    @property
    def processing_class(self):
        """The tokenizer (TRL's ``trainer.processing_class``)."""
        return self.tokenizer

    @property
    def num_generations(self) -> int:
        """``group_size`` (TRL's ``trainer.num_generations``)."""
        return self.args.group_size

    def _toolbox(self, tools, environment_factory, rollout_func, dataset):
        """The run's :class:`gtpo.sampling.tools.Toolbox` (None without tools and environment), after refusing what
        cannot train: tools with vLLM or with a rollout_func, tools on standard (string) prompts."""
        a = self.args
        if not tools and environment_factory is None:
            if a.max_tool_calling_iterations is not None:
                logger.warning("max_tool_calling_iterations=%s has no effect without tools or environment_factory",
                               a.max_tool_calling_iterations)
            return None
        if rollout_func is not None:
            raise ValueError("GTPOTrainer: give tools / environment_factory or a rollout_func, not both (a rollout_func "
                             "runs its own tool loop and returns env_mask)")
        if len(dataset) and "prompt" in dataset.column_names and isinstance(dataset[0]["prompt"], str):
            raise ValueError("GTPOTrainer: tools need conversational prompts (train_dataset's 'prompt' a list of "
                             "{'role', 'content'} messages), as in TRL: the chat template shows the tools, the tool "
                             "results are messages, and reward functions get each completion as its messages. Row 0's "
                             "prompt is a string; give e.g. [{'role': 'user', 'content': prompt}]")
        from .sampling.tools import Toolbox

        return Toolbox(self.tokenizer, tools, environment_factory, where="GTPOTrainer")

    # ================================================================== vLLM
    def vllm_engine_kwargs(self) -> dict[str, Any]:
        """The keyword arguments :meth:`vllm_engine` starts the engine with
        (:meth:`gtpo.sampling.vllm_engine.VLLMEngine.from_model`): ``dtype`` is ``vllm_dtype``, or with 'auto' the
        run's compute dtype (:func:`gtpo.run.build.vllm_dtype_name`)."""
        from .run.build import vllm_dtype_name

        a = self.args
        return dict(max_model_len=a.resolved_vllm_max_model_length, dtype=vllm_dtype_name(a.vllm_dtype, self.precision),
                    gpu_memory_utilization=a.vllm_gpu_memory_utilization,
                    kv_cache_memory_bytes=a.vllm_kv_cache_memory_bytes,
                    max_num_seqs=max(self.local_prompts * a.group_size, 64), enforce_eager=a.vllm_enforce_eager,
                    seed=a.seed + self.accelerator.process_index,
                    logprobs_mode=a.vllm_logprobs_mode or "processed_logprobs",
                    enable_sleep_mode=a.vllm_enable_sleep_mode)

    @property
    def vllm_engine(self):
        """The colocated :class:`gtpo.sampling.vllm_engine.VLLMEngine` (``use_vllm``), started on first use from the
        policy's current weights and synced with them (:meth:`sync_vllm`; a sleeping engine is woken and
        given the weights); None without ``use_vllm``."""
        if not self.args.use_vllm:
            return None
        if self._vllm is None:
            from .sampling.vllm_engine import VLLMEngine

            started = time.perf_counter()
            self._vllm = VLLMEngine.from_model(self.unwrapped_model, self.tokenizer, **self.vllm_engine_kwargs())
            self._vllm_stale = False
            logger.info("vLLM engine started in %.1f s (weights synced in %.2f s)", time.perf_counter() - started,
                        self._vllm.last_sync_s)
        elif self._vllm.asleep:
            self._vllm_sync_s += self._vllm.wake_up(self.unwrapped_model)
            self._vllm_stale = False
        else:
            self.sync_vllm()
        return self._vllm

    def sync_vllm(self) -> None:
        """Give the engine the policy's current weights if an optimizer step (or a checkpoint load) changed
        them since the last sync (once per step, before its rollout); the time goes to ``vllm/sync_time_s``."""
        if self._vllm is not None and self._vllm_stale and not self._vllm.asleep:
            self._vllm_sync_s += self._vllm.update_weights(self.unwrapped_model)
            self._vllm_stale = False

    def close_vllm(self) -> None:
        """Shut the vLLM engine down (freeing its memory); the next rollout starts a new one."""
        if self._vllm is not None:
            self._vllm.close()
            self._vllm = None

    # ================================================================== one step
    def step(self) -> dict[str, float]:
        """One optimisation step: rollout -> score -> advantages -> gtpo inputs -> update; its metrics."""
        a, acc = self.args, self.accelerator
        t0 = time.perf_counter()
        self._vllm_sync_s = 0.0
        batch, stats = self.sample_batch()                                      # 1-2. rollout, score
        if a.use_vllm:
            stats["vllm/sync_time_s"] = self._vllm_sync_s
            if a.vllm_enable_sleep_mode and self._vllm is not None:  # the update gets the engine's memory
                self._vllm.sleep()
        t_gen = time.perf_counter() - t0
        all_rewards = acc.gather(batch.rewards.to(acc.device)).float().cpu()  # (P_all * G,)
        all_adv = group_advantages(all_rewards, a.group_size, scale=a.resolved_scale_rewards)  # 3. advantages
        n = batch.rollout.completion_ids.shape[0]
        advantages = all_adv[acc.process_index * n:(acc.process_index + 1) * n]  # (N,) this process's rows
        inputs = self.gtpo_inputs(batch.rollout, advantages)                   # 4. gtpo inputs
        t1 = time.perf_counter()
        result = self.update(batch.rollout, advantages, inputs)                # 5. update
        t_upd = time.perf_counter() - t1
        learning_rate = float(self.scheduler.get_last_lr()[0])  # this step's, logged as TRL logs it
        self.scheduler.step()  # the schedule follows the step count, skipped steps included
        self.global_step += 1
        self._count_skips(result.skipped_updates)
        no_signal = self.no_signal.record(
            self.global_step, acc.reduce(result.signal, "sum"), skipped=result.skipped_updates > 0,
            seq_entropy=result.seq_entropy, mask=inputs.mask, threshold=a.entropy_threshold, temperature=a.temperature)
        self.last_batch, self.last_advantages = batch, advantages
        metrics = step_metrics(self, batch, all_rewards, inputs, result, stats, no_signal,    # 6. metrics
                               times=(time.perf_counter() - t0, t_gen, t_upd), learning_rate=learning_rate)
        self.num_tokens = int(metrics["num_tokens"])
        return metrics

    # ------------------------------------------------------------------ 1-2. rollout and score
    @property
    def sampling(self) -> SamplingParams:
        """How the rollouts sample (``SamplingParams.for_rollout(self.args)``), whichever sampler runs them."""
        return SamplingParams.for_rollout(self.args)

    def sample_rollout(self, rows: list[int]) -> Rollout:
        """``group_size`` completions for each of the dataset ``rows`` (this process's prompts): gtpo's sampler
        (or vLLM), multi-turn with tools (:func:`gtpo.sampling.tools.tool_rollout`), or the ``rollout_func``."""
        a = self.args
        if self.rollout_func is not None:
            return self._rollout_func_rollout(rows)
        try:
            prompt_ids = [self._prompt_ids[r] for r in rows]
            if self.toolbox is not None:
                return self._tool_rollout(rows)
            if a.use_vllm:
                return self.vllm_engine.generate(
                    prompt_ids, sampling=self.sampling, num_samples=a.group_size, eos_ids=self.eos_ids,
                    pad_id=self.tokenizer.pad_token_id, logprobs=a.vllm_logprobs_mode is not None,
                )
            with self.precision.context(self.accelerator.device):  # sampling in the run's dtype too
                return generate(
                    self.unwrapped_model, self.tokenizer, [None] * len(rows), sampling=self.sampling,
                    prompt_ids=prompt_ids, num_samples=a.group_size, batch_size=a.generation_chunk_size,
                    decode_loop=a.decode_loop, merge_lora=a.merge_lora_for_sampling, decode_compile=a.decode_compile,
                )
        except RuntimeError as err:
            text = str(err).lower()
            if "nan" not in text and "inf" not in text:
                raise
            # sampling from non-finite probabilities: the policy's forward overflows on these prompts
            raise TrainingStopped(
                f"sampling completions failed at step {self.global_step + 1} (dataset rows {rows}): the policy "
                f"produced non-finite probabilities ({type(err).__name__}: {str(err).splitlines()[0]}). "
                f"{self.run_dir.checkpoint_note()} Lower learning_rate or max_grad_norm, or train in float32 "
                "instead of bf16"
            ) from err

    def _sample_turn(self, prompt_ids: list[list[int]], num_samples: int, sampling: SamplingParams) -> Rollout:
        """One turn of ``num_samples`` completions for each of ``prompt_ids`` with gtpo's sampler."""
        a = self.args
        with self.precision.context(self.accelerator.device):
            return generate(self.unwrapped_model, self.tokenizer, [None] * len(prompt_ids), sampling=sampling,
                            prompt_ids=prompt_ids, num_samples=num_samples, batch_size=a.generation_chunk_size,
                            decode_loop=a.decode_loop, merge_lora=a.merge_lora_for_sampling)

    def _tool_rollout(self, rows: list[int]) -> Rollout:
        """Multi-turn completions with the run's tools (:func:`gtpo.sampling.tools.tool_rollout`)."""
        from .sampling.tools import tool_rollout

        a = self.args
        data = self.train_dataset.select(rows)
        return tool_rollout(self.unwrapped_model, self.toolbox, list(data["prompt"]), [dict(x) for x in data],
                            sampling=self.sampling, num_samples=a.group_size,
                            max_iterations=a.max_tool_calling_iterations, timeout=a.tool_call_timeout,
                            eos_ids=self.eos_ids, sample=self._sample_turn)

    def _rollout_func_rollout(self, rows: list[int]) -> Rollout:
        """TRL's ``rollout_func(prompts, trainer)`` on this process's prompts, each repeated ``group_size`` times as
        TRL passes them (:func:`gtpo.sampling.tools.rollout_from_func`)."""
        from .sampling.tools import rollout_from_func

        g = self.args.group_size
        prompts = [p for p in self.train_dataset.select(rows)["prompt"] for _ in range(g)]
        with self.precision.context(self.accelerator.device):
            output = self.rollout_func(prompts, self)
        return rollout_from_func(output, self.tokenizer, conversational=not isinstance(prompts[0], str),
                                 n=len(prompts), eos_ids=self.eos_ids)

    def score(self, rows: list[int], rollout: Rollout) -> ScoredBatch:
        """The rollout of dataset ``rows`` with its rewards (reward functions, then DAPO's overlong penalty)."""
        a = self.args
        data = self.train_dataset.select(rows)
        columns = {k: data[k] for k in data.column_names if k != "prompt"}
        rewards, per_func = self.scorer(rollout, data["prompt"], columns, rows=rows, group_size=a.group_size,
                                        step=self.global_step + 1)
        if a.overlong_buffer_length > 0:
            rewards = rewards + overlong_penalty(rollout.lengths, max_completion_length=a.max_completion_length,
                                                 buffer_length=a.overlong_buffer_length,
                                                 penalty_factor=a.overlong_penalty_factor)
        return ScoredBatch(rollout, rows, rewards, per_func)

    def _next_rows(self) -> list[int]:
        """This process's share of the next ``prompts_per_step`` prompts (same order on every process)."""
        global_rows = self.sampler.next(self.args.prompts_per_step)
        r = self.accelerator.process_index
        return global_rows[r * self.local_prompts:(r + 1) * self.local_prompts]

    def sample_batch(self) -> tuple[ScoredBatch, dict[str, float]]:
        """This process's scored batch; with DAPO's dynamic sampling, groups whose rewards are all equal
        are replaced by groups of new prompts (up to ``max_resample_rounds`` rounds, kept in lockstep
        across processes)."""
        rows = self._next_rows()
        batch = self.score(rows, self.sample_rollout(rows))
        stats = {"dynamic_sampling/rounds": 0.0}
        if not self.args.resolved_dynamic_sampling:
            return batch, stats
        g = self.args.group_size
        keep = [batch.group(p, g) for p in range(len(rows)) if batch.group_varies(p, g)]
        spare = [batch.group(p, g) for p in range(len(rows)) if not batch.group_varies(p, g)]
        for round_ in range(self.args.max_resample_rounds):
            need = torch.tensor([float(len(keep) < self.local_prompts)], device=self.accelerator.device)
            if self.accelerator.gather(need).sum().item() == 0:
                break
            stats["dynamic_sampling/rounds"] = float(round_ + 1)
            more_rows = self._next_rows()
            if len(keep) >= self.local_prompts:
                continue
            extra = self.score(more_rows, self.sample_rollout(more_rows))
            for p in range(len(more_rows)):
                (keep if extra.group_varies(p, g) else spare).append(extra.group(p, g))
        return ScoredBatch.concat((keep + spare)[: self.local_prompts], self.tokenizer.pad_token_id), stats

    # ------------------------------------------------------------------ 4. gtpo inputs
    def gtpo_inputs(self, rollout: Rollout, advantages: torch.Tensor) -> UpdateInputs:
        """The loss mask and GTPO's per-row inputs of whole groups (:func:`gtpo.maths.method.group_inputs`: conflict
        weights from the UNSHAPED signs on the loss mask, the gamma-shift and sign rows), ⟨H⟩_ini and the
        reference log-probs, for ``rollout`` (N rows) and ``advantages (N,)``."""
        a = self.args
        maskf = method.loss_mask(rollout.completion_mask, rollout.truncated,
                                 mask_truncated_completions=a.mask_truncated_completions,
                                 tool_mask=None if rollout.agent is None else rollout.agent.tool_mask)
        group = method.group_inputs(rollout.completion_ids, maskf, advantages, a)
        stats = method.conflict_stats(group, maskf)
        inputs = UpdateInputs(
            mask=maskf, token_weights=group.token_weights, n_conflict=group.n_conflict,
            conflict_frac=stats[0] / stats[1].clamp(min=1), shift_mask=group.shift_mask, sign_mask=group.sign_mask,
            initial_entropy=None, ref_logp=None,
        )
        if method.uses_initial_entropy(a):
            if self.initial_entropy is None:  # a non-finite first forward is skipped; measured again next step
                self.initial_entropy = self._mean_completion_entropy(rollout, maskf)
            inputs.initial_entropy = self.initial_entropy
        if a.beta > 0:
            inputs.ref_logp = self._reference_logp(rollout, maskf)
        return inputs

    def forward(self, rollout: Rollout, index: slice, mask: torch.Tensor, policy: nn.Module | None = None):
        """``logp (M, T)`` and ``entropy (M, T)`` of the policy (or ``policy``) on the rows ``index`` of
        ``rollout`` (``mask (N, T)``: the loss mask), at ``logprob_temperature``; with grad unless called
        under ``torch.no_grad()``."""
        dev = self.accelerator.device
        # copied per micro-batch from the (pinned, on a GPU: Rollout.pin_memory) host rollout, joined on the device
        prompt, completion = rollout.prompt_ids[index].to(dev, non_blocking=True), \
            rollout.completion_ids[index].to(dev, non_blocking=True)
        input_ids = torch.cat([prompt, completion], dim=1)
        seen = mask[index]  # the loss mask: the completion's tokens (none for a masked truncated row)
        if rollout.agent is not None:  # tool tokens are out of the loss but in the context the model reads
            seen = rollout.completion_mask[index] * (seen.sum(1, keepdim=True) > 0)
        attn = torch.cat([rollout.prompt_mask[index].to(dev, non_blocking=True), seen.long().to(dev)], dim=1)
        return (policy or self.policy)(input_ids, attn, completion, self.args.resolved_logprob_temperature)

    def _micro_batches(self, n: int) -> list[slice]:
        micro = self.args.micro_batch_size or n
        return [slice(s, s + micro) for s in range(0, n, micro)]

    @torch.no_grad()
    def _reference_logp(self, rollout: Rollout, mask: torch.Tensor) -> torch.Tensor:
        """``(N, T)`` log-probs of the reference model (the LoRA base: the adapter disabled)."""
        outs = []
        for index in self._micro_batches(mask.shape[0]):
            if self.ref_policy is None:
                with self.unwrapped_model.disable_adapter():
                    outs.append(self.forward(rollout, index, mask)[0].detach())
            else:
                outs.append(self.forward(rollout, index, mask, policy=self.ref_policy)[0].detach())
        return torch.cat(outs)

    @torch.no_grad()
    def _mean_completion_entropy(self, rollout: Rollout, mask: torch.Tensor) -> float | None:
        """⟨H⟩ of the current policy over the batch (all processes): the mean of the completions' mean
        token entropies, over the completions that have tokens in ``mask`` (None: not measurable)."""
        total = torch.zeros(2, device=self.accelerator.device)
        for index in self._micro_batches(mask.shape[0]):
            _, ent = self.forward(rollout, index, mask)
            m = mask[index].to(ent.device)
            total += method.initial_entropy_sums(method.completion_entropy(ent, m), m)
        return method.initial_entropy_value(self.accelerator.reduce(total, "sum"))

    # ------------------------------------------------------------------ 5. update
    def update(self, rollout: Rollout, advantages: torch.Tensor, inputs: UpdateInputs) -> UpdateResult:
        """``num_iterations`` optimizer updates on this batch, gradients accumulated over micro-batches
        with the whole batch's normalisers (so the update does not depend on ``micro_batch_size``).

        Each micro-batch: forward (log-probs, entropies), effective advantages
        (:func:`gtpo.maths.method.effective_advantages`, from the rollout policy's entropies, frozen over the passes [D]),
        the loss of ``loss_type``, backward. Then the gradient is clipped; a non-finite loss or gradient
        skips this update and the rest of the step's (the same on every process).
        """
        a, acc = self.args, self.accelerator
        dev = acc.device
        n, t = rollout.completion_ids.shape
        world = acc.num_processes
        # the loss is scaled by the world size: DDP's gradient mean is then the gradient of the global loss
        num_tokens = max(int(acc.reduce(inputs.mask.sum().to(dev), "sum").item()), 1)
        first_logp = torch.zeros((n, t), device=dev) if (a.num_iterations > 1 or a.log_policy_change) else None
        seq_entropy = torch.zeros(n, device=dev)
        signal = torch.zeros(3, device=dev)
        sums: dict[str, torch.Tensor] = {}
        entropy_sum = torch.zeros((), device=dev)
        loss_total = grad_norm = torch.zeros((), device=dev)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params] if a.log_policy_change else None
        skipped = 0
        batches = self._micro_batches(n)
        sampler = SamplerStats(dev, a) if rollout.sampling_logp is not None else None
        for it in range(a.num_iterations):
            loss_total = torch.zeros((), device=dev)
            for k, index in enumerate(batches):
                sync = contextlib.nullcontext() if k == len(batches) - 1 else acc.no_sync(self.policy)
                with sync:
                    logp, ent = self.forward(rollout, index, inputs.mask)
                    m = inputs.mask[index].to(dev)
                    adv = advantages[index].to(dev)
                    if it == 0:
                        seq_entropy[index] = method.completion_entropy(ent, m)
                        if first_logp is not None:
                            first_logp[index] = logp.detach()
                    eff, dropped, adv_metrics = self._effective_advantages(adv, seq_entropy[index], inputs, index)
                    is_weights = None
                    if sampler is not None:  # vLLM sampled these tokens: its gap to pi_old, the IS weights
                        old = logp.detach() if it == 0 else first_logp[index]
                        is_weights = sampler.observe(old, rollout.sampling_logp[index].to(dev), m, first=it == 0)
                    extras = inputs.loss_extras(index, is_weights, device=dev, num_sequences=n * world,
                                                num_tokens=num_tokens)
                    old_logp = first_logp[index] if it > 0 else None
                    out = self.loss_fn(logp, old_logp, eff, m, extras, a)
                    acc.backward(out.loss * world)
                loss_total = loss_total + out.loss.detach() * world
                if it == 0:
                    entropy_sum = entropy_sum + (ent * m).sum()
                    signal += signal_counts(eff, dropped, m)
                    for key, val in {**out.metrics, **adv_metrics}.items():
                        sums[key] = sums.get(key, torch.zeros((), device=dev)) + val.detach().float() * m.shape[0]
            max_norm = a.max_grad_norm if a.max_grad_norm > 0 else float("inf")
            grad_norm = torch.as_tensor(acc.clip_grad_norm_(params, max_norm), device=dev)
            nonfinite = (~torch.isfinite(grad_norm) | ~torch.isfinite(loss_total)).float().reshape(())
            if world > 1:
                nonfinite = acc.reduce(nonfinite, "max")
            if bool(nonfinite):  # never applied, nor the rest of this step's updates (same batch, same weights)
                skipped = a.num_iterations - it
                self.optimizer.zero_grad(set_to_none=True)
                break
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._vllm_stale = True  # the engine gets the new weights before the next rollout
        change = {} if before is None else self._policy_change(rollout, inputs.mask, first_logp, params, before)
        return UpdateResult(loss_total, grad_norm, skipped, sums, entropy_sum, signal, seq_entropy, change,
                            None if sampler is None else sampler.metrics())

    def _effective_advantages(self, advantages: torch.Tensor, seq_entropy: torch.Tensor, inputs: UpdateInputs,
                              index: slice) -> method.EffectiveAdvantages:
        """:func:`gtpo.maths.method.effective_advantages` of the rows ``index`` (``advantages (M,)``, the rollout
        policy's ``seq_entropy (M,)``), with ⟨H⟩_ini and the rows' gamma-shift and sign masks."""
        def rows(t):
            return None if t is None else t[index].to(advantages.device)

        return method.effective_advantages(advantages, seq_entropy, self.args, initial_entropy=inputs.initial_entropy,
                                           shift_mask=rows(inputs.shift_mask), sign_rows=rows(inputs.sign_mask))

    @torch.no_grad()
    def _policy_change(self, rollout: Rollout, mask: torch.Tensor, old_logp: torch.Tensor, params: list,
                       before: list) -> dict[str, torch.Tensor]:
        """``update_norm`` (over all processes' identical parameters) and the KLs between the policy
        after and before this step, on this batch's tokens (``log_policy_change``)."""
        norm = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, before)))
        kl = torch.zeros(3, device=self.accelerator.device)
        for index in self._micro_batches(mask.shape[0]):
            new_logp, _ = self.forward(rollout, index, mask)
            kl += policy_change_sums(new_logp, old_logp[index], mask[index].to(new_logp.device))
        kl = self.accelerator.reduce(kl, "sum")
        count = kl[2].clamp(min=1)
        return {"update_norm": norm, "kl/new_old": kl[0] / count, "kl/old_new": kl[1] / count}

    # ------------------------------------------------------------------ counters and "no signal"
    def _count_skips(self, skipped_updates: int) -> None:
        if skipped_updates:
            self.skipped_steps += 1
            self.skipped_updates += skipped_updates
            self.consecutive_skips += 1
        else:
            self.consecutive_skips = 0

    # ================================================================== the loop
    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict[str, float]:
        """Run until ``self.max_steps`` (``max_steps``, or ``num_train_epochs`` epochs with -1) or a stop signal;
        returns the last step's metrics.

        Fault tolerance (docs/fault-tolerance.md): checkpoints are atomic, resume is exact;
        SIGTERM/SIGINT finish the current step, save a checkpoint and return with
        ``self.stopped_early`` set to its path (a second signal stops at once); a step whose loss or
        gradient is NaN/inf is skipped, and ``max_consecutive_skips`` of them in a row raise
        :class:`TrainingStopped`; a checkpoint that cannot be written raises ``CheckpointError``
        and leaves the previous one intact.
        """
        from tqdm.auto import tqdm

        a, acc, run_dir = self.args, self.accelerator, self.run_dir
        self.stopped_early = self.stopped_by = self._stop_signal = None
        resume = run_dir.resolve_resume(resume_from_checkpoint)
        asked = resume_from_checkpoint is True or (isinstance(resume_from_checkpoint, str)
                                                   and resume_from_checkpoint.strip().lower() == "true")
        run_dir.prepare(resuming=resume is not None or asked, overwrite=a.overwrite_output_dir)
        if resume is not None:
            self.load_checkpoint(resume)
            logger.info("resumed from %s at step %d", resume, self.global_step)
            run_dir.drop_later_checkpoints(resume, self.global_step)
        run_dir.start_logs(self.global_step, {**a.to_dict(), "model": str(self.model_name),
                                              "reward_funcs": self.scorer.names, "num_processes": acc.num_processes,
                                              "dropped_prompts": self.dropped_prompts})
        if a.report_to:
            start_trackers(acc, a.run_name or os.path.basename(os.path.abspath(a.output_dir)), a.to_dict())
        if a.push_to_hub:
            self._create_hub_repo()
        previous = install_stop_handlers(self._on_stop_signal)
        bar = tqdm(total=self.max_steps, initial=self.global_step, disable=a.disable_tqdm or not acc.is_main_process,
                   desc=f"{a.loss_type} training", dynamic_ncols=True)
        metrics: dict[str, float] = {}
        last_saved = self.global_step if resume is not None else -1
        try:
            if self.global_step == 0:  # step 0: TRL's eval_on_start (before the first step), the probes
                start = self.evaluate() if a.eval_on_start and self.eval_dataset is not None else {}
                if start and a.report_to:
                    acc.log(start, step=0)
                if self.probe_texts and acc.is_main_process:
                    start = {**start, **self._probe()}
                if start and acc.is_main_process:
                    run_dir.append("metrics.jsonl", {"step": 0, **start})
            while self.global_step < self.max_steps:
                metrics = self.step()
                give_up = self.consecutive_skips >= a.max_consecutive_skips
                if not give_up:
                    if self.evaluates_at(self.global_step):
                        metrics.update(self.evaluate())
                    if self.probe_texts:
                        metrics.update(self._probe())
                if acc.is_main_process:
                    run_dir.append("metrics.jsonl", metrics)
                    if a.log_completions_steps and self.global_step % a.log_completions_steps == 0:
                        self._log_completions()
                if give_up:  # the last good checkpoint stays as it is
                    raise TrainingStopped(self._nonfinite_message())
                if a.report_to and (self.global_step % a.every("logging_steps", self.max_steps) == 0
                                    or (self.global_step == 1 and a.logging_first_step)):
                    acc.log({k: v for k, v in metrics.items() if k != "step"}, step=self.global_step)
                    if a.log_completions:  # TRL's completions table, to the trackers
                        log_table(acc, "completions", self.completions_table(), step=self.global_step)
                bar.update(1)
                postfix = {"reward": f"{metrics['reward']:.3f}", "entropy": f"{metrics['entropy']:.3f}",
                           "step_s": f"{metrics['step_time']:.2f}"}
                if self.no_signal.total:
                    postfix["no_signal"] = self.no_signal.summary()
                bar.set_postfix(postfix)
                if self.saves_at(self.global_step):
                    self.push_checkpoint(self.save_checkpoint())
                    last_saved = self.global_step
                if self.global_step < self.max_steps and stop_requested(self._stop_signal is not None, acc):
                    if last_saved != self.global_step or a.save_only_model:  # a stop checkpoint is resumable
                        self.save_checkpoint(model_only=False)
                    self.stopped_early = os.path.join(a.output_dir, f"checkpoint-{self.global_step}")
                    self.stopped_by = (signal.Signals(self._stop_signal).name if self._stop_signal is not None
                                       else "a signal to another process")
                    logger.warning("stopped by %s after step %d of %d; checkpoint saved in %s. Resume with "
                                   "resume_from_checkpoint=True (gtpo train ... --resume_from_checkpoint true)",
                                   self.stopped_by, self.global_step, self.max_steps, self.stopped_early)
                    return metrics
            self.save_model()
            if self.hub is not None:
                self.hub.push_final()
        finally:
            bar.close()
            restore_handlers(previous)
            if self.hub is not None:
                self.hub.wait()
            if a.report_to:
                acc.end_training()
            run_dir.release()  # the output_dir's lock (RunDirectory.prepare)
        return metrics

    def saves_at(self, step: int) -> bool:
        """Whether ``save_strategy`` writes a checkpoint after ``step``: 'steps' every ``save_steps`` steps (0: never),
        'epoch' at the end of each epoch (every :attr:`steps_per_epoch` steps), both also after the last step (as
        transformers' Trainer does), 'no' never (the final model and a stop checkpoint are written whatever it
        says)."""
        a = self.args
        if a.save_strategy == "steps":
            return bool(a.save_steps) and (step % a.every("save_steps", self.max_steps) == 0 or step == self.max_steps)
        if a.save_strategy == "epoch":
            return step % self.steps_per_epoch == 0 or step == self.max_steps
        return False

    def _create_hub_repo(self) -> None:
        """``push_to_hub``: the main process creates the repository (:meth:`gtpo.run.hub.HubPusher.create_repo`);
        if that fails every process raises :class:`HubUploadError`, before the first step."""
        acc, error = self.accelerator, None
        if self.hub is not None:
            try:
                self.hub.create_repo()
            except Exception as err:  # noqa: BLE001 -- named below, on every process
                error = err
        failed = error is not None
        if acc.num_processes > 1:
            failed = bool(acc.reduce(torch.tensor(float(failed), device=acc.device), "max"))
        if failed:
            what = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}" if error else \
                "it failed on the main process"
            raise HubUploadError(
                f"push_to_hub: could not create or reach the Hub repository {repo_name(self.args)!r} ({what}); no "
                "step was trained. Check hub_model_id, hub_token (or `hf auth login`) and the network, or set "
                "push_to_hub: false") from error

    def push_checkpoint(self, path: str) -> None:
        """``push_to_hub``: push the checkpoint just written at ``path`` (main process, in the background;
        :meth:`gtpo.run.hub.HubPusher.push_checkpoint`)."""
        if self.hub is not None:
            self.hub.push_checkpoint(path, step=self.global_step, epoch=self.global_step // self.steps_per_epoch)

    def evaluates_at(self, step: int) -> bool:
        """Whether the eval dataset is evaluated after ``step`` (transformers' rule for ``eval_strategy``): 'steps'
        every ``eval_steps`` (None/0: ``logging_steps``) and at the last step; 'epoch' at the end of every epoch
        (``steps_per_epoch`` steps) and at the last step (the end of a partial last epoch); never without an eval
        dataset."""
        if self.eval_dataset is None:
            return False
        strategy = self.args.resolved_eval_strategy
        if strategy == "steps":
            return step % self.args.every("eval_steps", self.max_steps) == 0 or step == self.max_steps
        if strategy == "epoch":
            return step % self.steps_per_epoch == 0 or step == self.max_steps
        return False

    def evaluate(self) -> dict[str, float]:
        """Evaluate on ``eval_dataset``; returns ``eval/*`` metrics. Every process calls it: each evaluates its share
        of the problems and every process returns the metrics of all of them
        (:func:`gtpo.evaluation.api.evaluate_during_training`'s ``processes``)."""
        from .evaluation.api import evaluate_during_training
        from .evaluation.options import ScoringOptions

        a = self.args
        with self.precision.context(self.accelerator.device):
            return evaluate_during_training(
                self.unwrapped_model, self.tokenizer, self.eval_dataset, sampling=SamplingParams.for_evaluation(a),
                n=a.eval_num_samples, k_list=a.eval_k, batch_size=resolved(a, "per_device_eval_batch_size"),
                scoring=ScoringOptions(reward_fn=self.eval_reward_func), engine=self.vllm_engine, merge_lora=a.merge_lora_for_sampling,
                decode_compile=a.decode_compile, processes=self.accelerator,
            )

    def _probe(self) -> dict[str, float]:
        with self.precision.context(self.accelerator.device):
            return probe_probabilities(self.unwrapped_model, self.tokenizer, self.probe_texts,
                                       temperature=self.args.resolved_logprob_temperature)

    def _shown_completions(self) -> int:
        """How many of the last step's completions are logged (``num_completions_to_print``; None: all)."""
        count, total = self.args.num_completions_to_print, len(self.last_batch.rollout.texts)
        return total if count is None else min(count, total)

    def completions_table(self) -> dict[str, list]:
        """The last step's first ``num_completions_to_print`` completions (this process's) as TRL's
        ``log_completions`` table: ``{column: values}`` with step, prompt (a chat's last message), completion, each
        reward function's score (None where it did not score), the weighted reward and the advantage."""
        batch, g, k = self.last_batch, self.args.group_size, self._shown_completions()
        prompts = self.train_dataset.select(batch.rows)["prompt"]
        shown = [prompts[i // g] for i in range(k)]
        table: dict[str, list] = {
            "step": [self.global_step] * k,
            "prompt": [p if isinstance(p, str) else p[-1]["content"] for p in shown],
            "completion": list(batch.rollout.texts[:k]),
        }
        per_func = batch.per_func[:k].float().cpu()
        for j, name in enumerate(self.scorer.names):
            table[name] = [None if math.isnan(v) else v for v in per_func[:, j].tolist()]
        table["reward"] = batch.rewards[:k].float().cpu().tolist()
        table["advantage"] = self.last_advantages[:k].float().cpu().tolist()
        return table

    def _log_completions(self) -> None:
        batch, g = self.last_batch, self.args.group_size
        prompts = self.train_dataset.select(batch.rows)["prompt"]
        agent = batch.rollout.agent
        for i in range(self._shown_completions()):
            prompt = prompts[i // g]
            record = {"step": self.global_step, "prompt": prompt if isinstance(prompt, str) else prompt[-1]["content"],
                      "completion": batch.rollout.texts[i], "reward": float(batch.rewards[i])}
            if agent is not None and agent.conversations is not None:  # the whole conversation, tool messages included
                record["messages"] = agent.conversations[i]
                record["tool_calls"] = int(agent.calls[i])
            self.run_dir.append("completions.jsonl", record)

    def _nonfinite_message(self) -> str:
        first = self.global_step - self.consecutive_skips + 1
        steps = f"step {first}" if first == self.global_step else f"steps {first}-{self.global_step}"
        return (
            f"{steps} ({self.consecutive_skips} in a row; max_consecutive_skips={self.args.max_consecutive_skips}) "
            "had a non-finite (NaN/inf) loss or gradient, so training stops. Non-finite updates are never "
            f"applied: the weights are finite and were last updated at step {first - 1}. "
            f"{self.run_dir.checkpoint_note()} Lower learning_rate, set max_grad_norm, check the reward functions "
            f"(and bf16), then {RESUME_HINT}"
        )

    # ------------------------------------------------------------------ checkpoints
    def _state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
            "skipped_updates": self.skipped_updates,
            "consecutive_skips": self.consecutive_skips,
            "initial_entropy": self.initial_entropy,
            "num_tokens": self.num_tokens,
            "no_signal_steps": self.no_signal.state_dict(),
            "sampler": self.sampler.state_dict(),
            "num_processes": self.accelerator.num_processes,
            "config": self.args.to_dict(),
        }

    def save_checkpoint(self, model_only: bool | None = None) -> str:
        """Write ``checkpoint-<global_step>`` atomically (:meth:`gtpo.run.checkpoint.RunDirectory.save_checkpoint`);
        ``model_only`` (None: ``save_only_model``) leaves out the optimizer, scheduler and RNG states."""
        return self.run_dir.save_checkpoint(
            self.global_step, model=self.unwrapped_model, tokenizer=self.tokenizer, optimizer=self.optimizer,
            scheduler=self.scheduler, state=self._state(), save_total_limit=self.args.save_total_limit,
            model_only=self.args.save_only_model if model_only is None else model_only,
        )

    def load_checkpoint(self, path: str) -> None:
        """Restore weights, optimizer, scheduler, RNG and loop state from ``checkpoint-<step>``.

        Everything a step depends on is restored, so a resumed run continues bitwise as the
        uninterrupted one would (same process count, CPU or deterministic kernels): weights, AdamW
        moments, scheduler, the Python/numpy/torch(/CUDA) RNG states, the data order, ``<H>_ini``,
        the skip and no-signal counters.
        """
        state = self.run_dir.load_checkpoint(path, model=self.unwrapped_model, optimizer=self.optimizer,
                                             scheduler=self.scheduler, peft=self.is_peft)
        self.sampler.load_state_dict(state["sampler"])
        self._vllm_stale = True  # an engine already started gets the restored weights before the next rollout
        self.global_step = int(state["global_step"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.skipped_updates = int(state.get("skipped_updates", self.skipped_steps))
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        self.initial_entropy = state.get("initial_entropy")
        self.num_tokens = int(state.get("num_tokens", 0))
        self.no_signal.load_state_dict(state.get("no_signal_steps", {}))
        saved, current = state.get("config") or {}, self.args.to_dict()
        changed = [k for k in current if k in saved and k not in RESUMABLE_CHANGES and saved[k] != current[k]]
        if changed:
            logger.warning("resuming %s with a changed config (%s): training continues, but not as the checkpointed "
                           "run would have", path, ", ".join(f"{k}: {saved[k]!r} -> {current[k]!r}" for k in changed))
        if state.get("num_processes", self.accelerator.num_processes) != self.accelerator.num_processes:
            logger.warning("%s was written by %s processes and is resumed by %d: the data order continues, the "
                           "random streams differ", path, state.get("num_processes"), self.accelerator.num_processes)

    def _on_stop_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT (:func:`gtpo.run.signals.install_stop_handlers`): ``train`` stops after this step."""
        self._stop_signal = signum

    def save_model(self, output_dir: str | None = None) -> None:
        """Save the final model (or adapter) and tokenizer, replacing the old files atomically; a full model in the
        run's dtype unless ``save_dtype`` is 'float32' (adapters as trained)."""
        p = self.precision
        dtype = None if self.is_peft or self.args.save_dtype == "float32" or p.compute == p.load else p.compute
        self.run_dir.save_model(self.unwrapped_model, self.tokenizer, output_dir, dtype=dtype)
