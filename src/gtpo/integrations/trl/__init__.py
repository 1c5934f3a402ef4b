"""GTPO on TRL's engine: ``TRLGTPOConfig`` and ``TRLGTPOTrainer``, a drop-in ``trl.GRPOTrainer``.

GTPO (Simoni et al., TACL 2026, arXiv 2508.03772) needs more than a per-token loss slot: its
conflict weights are computed on whole groups before TRL shuffles and splits the rollout batch,
its entropy filter and gamma shift act on each completion's mean entropy, and its loss reduces
per completion. This package adds exactly that to TRL's ``GRPOTrainer`` and keeps everything else
TRL's: generation (transformers or vLLM), reward functions, DDP / DeepSpeed / FSDP, PEFT,
gradient checkpointing, logging, checkpoints and the Hub::

    from gtpo.integrations.trl import TRLGTPOConfig, TRLGTPOTrainer

    args = TRLGTPOConfig.from_preset("official", output_dir="runs/x", use_vllm=True)   # a trl.GRPOConfig
    trainer = TRLGTPOTrainer(model="Qwen/Qwen2.5-3B-Instruct", reward_funcs=[...], args=args,
                             train_dataset=ds, peft_config=lora)   # trl.GRPOTrainer's constructor
    trainer.train()

The method is this package's, never a copy: the composition of :mod:`gtpo.maths.method` that gtpo's own
trainer calls too (:func:`~gtpo.maths.method.group_inputs`: lambda and ``n_conflict`` from the UNSHAPED
advantage signs on the loss mask, the gamma-shift and sign rows; :func:`~gtpo.maths.method.effective_advantages`:
filter, ``<H>_ini`` rule, gamma shift; :func:`~gtpo.maths.method.initial_entropy_sums`), and the loss
``gtpo.maths.losses.POLICY_LOSSES["gtpo"]`` with the one signature of every loss. Any other ``loss_type`` ("grpo", "dapo", "dr_grpo", "bnpo", "cispo",
"sapo", "luspo", "vespo") is TRL's own code, unchanged.

Where each step happens (trl 1.16):

1. ``_generate_and_score_completions`` (TRL's, then GTPO's inputs on the local rows): advantages of
   zero-variance groups are made exactly 0 (TRL's float mean can leave a +-1e-8 residue that would
   make such a group "active"); the conflict weights ``gtpo_token_weights (N, T)`` and counts
   ``gtpo_n_conflict (N,)`` are computed on WHOLE groups -- locally when this process holds whole
   groups, otherwise on the gathered batch of all processes (completions padded to the longest)
   and sliced back; the rows the gamma shift reaches (``gamma_groups="varying"``) and the
   ``completion_sign`` rows likewise; ``<H>_ini`` is measured once. These per-row tensors are added
   to TRL's batch dict, so ``shuffle_sequence_dict`` / ``split_tensor_dict`` carry them with their
   rows into the micro-batches.
2. The completions' mean token entropies ``<H>_i`` are the ROLLOUT policy's, frozen over the
   ``num_iterations`` passes as in gtpo's own trainer: when TRL computes rollout log-probs at
   generation time (the policy changes within a generation batch, or vLLM's importance sampling),
   the entropies of that same forward are kept (no extra cost); otherwise the policy of every
   micro-batch is the rollout policy and the entropies of the loss forward are used (and kept for
   the later passes).
3. ``_compute_loss`` (``loss_type="gtpo"``): one forward (TRL's fused log-prob/entropy head),
   :func:`~gtpo.maths.method.effective_advantages` with ``<H>_i``, then ``POLICY_LOSSES["gtpo"]``
   with TRL's normalisation (below). TRL's per-token multipliers that combine with GTPO -- the
   top-entropy token mask (``top_entropy_quantile``), vLLM's importance-sampling ratio and the
   off-policy sequence mask -- multiply lambda in the loss; ``gtpo/weighted_token_frac`` is still
   computed from lambda alone.

Normalisation. TRL scales each micro-batch loss for gradient accumulation itself
(``loss_is_scaled_for_ga``) and DDP / DeepSpeed / FSDP average gradients over processes. With
``c_i`` the token mean of completion i's weighted surrogate (divided by ``max(n_conflict_i, 1)``
when ``divide_by_conflict_count``), the loss of a micro-batch of ``B`` completions is::

    (G if completion_reduction == "sum" else 1) * sum_{i in micro-batch} c_i / (B * GA)

(``GA = current_gradient_accumulation_steps``, 1 in evaluation): the optimizer step's gradient is
that of ``(G or 1) * mean_i c_i`` over all its completions, i.e. GTPO's ``sum over each group,
mean over groups`` [C] or the paper's ``1/G`` mean [P] -- independently of how groups were split
over micro-batches and processes (each ``c_i`` needs only its own row). It is
``POLICY_LOSSES["gtpo"]`` with ``completion_reduction="mean"`` and ``num_sequences=B * GA``, times G for "sum".

Config: :class:`TRLGTPOConfig` is ``trl.GRPOConfig`` plus GTPO's method fields, declared (in
:mod:`gtpo.integrations.trl.config`) with the defaults and documentation of :class:`gtpo.GTPOConfig` (read from its
dataclass fields: :data:`GTPO_METHOD_FIELDS`). Names map as follows:

* ``group_size`` -> ``num_generations``;
* ``prompts_per_step`` P -> ``generation_batch_size`` = P * G (TRL counts completions, over all processes);
* ``micro_batch_size`` -> ``per_device_train_batch_size``;
* ``loss_type`` "gtpo" -> ``loss_type`` "gtpo" (this class's default); gtpo's "grpo" / "dr_grpo" / "dapo"
  (and ``loss_aggregation`` seq_mean_token_mean / constant / token_mean) -> TRL's "grpo" / "dr_grpo" / "dapo";
* ``scale_rewards`` None -> GTPOConfig's rule (:func:`gtpo.config.resolved`, on both engines): "none" for gtpo and
  dr_grpo, "group" otherwise (TRL's default);
* ``max_steps`` (rollout steps, each with ``num_iterations`` updates) -> ``max_steps * num_iterations``
  (TRL counts optimizer steps); ``warmup_steps`` and ``warmup_ratio`` -> ``warmup_steps`` (optimizer steps);
* ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``max_completion_length``, ``num_iterations``,
  ``epsilon``, ``epsilon_high``, ``beta``, ``mask_truncated_completions``, ``reward_weights`` and the optimiser
  and logging fields -> the same names, the same meaning;
* GTPO's method fields (:data:`GTPO_METHOD_FIELDS`: conflict weights, entropy control, ``completion_sign``,
  ``logprob_temperature``, DAPO's ``overlong_buffer_length`` / ``overlong_penalty_factor``) -> the same names,
  defaults and documentation; the overlong penalty is a reward function appended with weight 1;
* ``use_vllm`` and the vLLM fields TRL shares (:data:`SHARED_VLLM_FIELDS`: ``vllm_gpu_memory_utilization``,
  ``vllm_max_model_length``, ``vllm_importance_sampling_*``) -> TRL's fields of the same names, when set (TRL's
  defaults otherwise); gtpo's ``vllm_kv_cache_memory_bytes``, ``vllm_dtype`` and ``vllm_enforce_eager`` have no
  TRL counterpart (:data:`ENGINE_ONLY`);
* ``dynamic_sampling`` (the dapo preset) -> not available: TRL's GRPOTrainer has no dynamic sampling;
* gtpo's ``generation_chunk_size`` (completions per generate() call) -> no equivalent; ``generation_batch_size``
  is TRL's field on both engines (gtpo's engine reads it as ``prompts_per_step`` x ``group_size``); the settings of gtpo's own trainer (:data:`ENGINE_ONLY`) have no effect here.

``gtpo train --engine trl`` (``engine: trl`` in the YAML) trains a gtpo YAML on this engine through
:func:`gtpo.app.trl_run.run_trl_training`, with :meth:`TRLGTPOConfig.from_gtpo_config` doing the mapping above; fields
of ``trl.GRPOConfig`` (``use_vllm``, ``vllm_mode``, ``deepspeed``, ``bf16``, ``push_to_hub``, ...)
pass through.

With ``loss_type="gtpo"`` these TRL options are refused with an error, because GTPO does not
define them: ``beta != 0`` (GTPO drops KL and the reference model), ``importance_sampling_level=
"sequence"``, ``delta`` (two-sided clipping), ``multi_objective_aggregation="normalize_then_sum"``
(not group-relative), TRL's entropy bonus (``entropy_coef`` / ``use_adaptive_entropy``; GTPO's
gamma is an entropy penalty). Tool calling (``tools``, ``environment_factory``, a ``rollout_func``
returning ``env_mask``) trains GTPO over the model tokens only: TRL's ``tool_mask`` reaches the method
(docs/method.md "Multi-turn completions"). GTPO's ablation switches
(``conflict_masks``, ``entropy_filter``, ``gamma``, ``completion_sign`` on a baseline) need gtpo's
own trainer and are refused for TRL's loss types.
"""

from __future__ import annotations

from .config import (ENGINE_ONLY, GTPO_METHOD_FIELDS, RENAMED, SAME_FIELDS, SHARED_VLLM_FIELDS, TESTED_TRL,
                     UNAVAILABLE, TRLGTPOConfig, check_trl_options, missing_trl_api, trl_precision)
from .trainer import OverlongPenalty, TRLGTPOTrainer, drop_long_prompts, metrics_file_callback

__all__ = ["ENGINE_ONLY", "GTPO_METHOD_FIELDS", "OverlongPenalty", "RENAMED", "SHARED_VLLM_FIELDS", "TESTED_TRL",
           "TRLGTPOConfig", "TRLGTPOTrainer", "UNAVAILABLE", "check_trl_options", "drop_long_prompts",
           "metrics_file_callback", "missing_trl_api", "trl_precision"]
