"""TRL's engine, its trainer: :class:`TRLGTPOTrainer` (``trl.GRPOTrainer`` training GTPO through
:mod:`gtpo.maths.method`), DAPO's overlong penalty as a TRL reward (:class:`OverlongPenalty`) and what
``gtpo train --engine trl`` adds around it (:func:`metrics_file_callback`, :func:`drop_long_prompts`). The config is
:mod:`gtpo.integrations.trl.config`; the package's documentation (where each step happens, the normalisation):
:mod:`gtpo.integrations.trl`.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import Any

import torch
from trl import GRPOTrainer

from ...config import GTPOConfig
from ...errors import ConfigError
from ...maths import method
from ...maths.losses import POLICY_LOSSES, LossExtras
from ...rewards.scoring import overlong_penalty
from .config import TRLGTPOConfig

__all__ = ["OverlongPenalty", "TRLGTPOTrainer", "drop_long_prompts", "metrics_file_callback"]

logger = logging.getLogger("gtpo")


# ----------------------------------------------------------------------------------------- rewards
class OverlongPenalty:
    """DAPO's soft overlong punishment (Yu et al. 2025) as a TRL reward function:
    :func:`gtpo.rewards.scoring.overlong_penalty` of each completion's length (``len(completion_ids[i])``, the
    first EOS included, as gtpo's trainer counts it). Appended to the reward functions with weight 1
    when ``overlong_buffer_length > 0``."""

    __name__ = "overlong_penalty"

    def __init__(self, max_completion_length: int, buffer_length: int, penalty_factor: float):
        self.max_completion_length = max_completion_length
        self.buffer_length = buffer_length
        self.penalty_factor = penalty_factor

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        lengths = torch.tensor([len(ids) for ids in completion_ids], dtype=torch.float32)
        return overlong_penalty(lengths, max_completion_length=self.max_completion_length,
                                buffer_length=self.buffer_length, penalty_factor=self.penalty_factor).tolist()


# ----------------------------------------------------------------------------------------- trainer
_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                    "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def _loss_mask(batch: dict) -> torch.Tensor:
    """``(N, T)`` float, TRL's loss mask through :func:`gtpo.maths.method.loss_mask`: the completion mask (TRL
    already zeroed the truncated rows with ``mask_truncated_completions``) times the tool mask when present
    (``tools`` / ``environment_factory``, or a ``rollout_func``'s ``env_mask``: 0 on tool / environment tokens,
    which are then never trained, never conflict partners and never in ``<H>_i``; docs/method.md
    "Multi-turn completions")."""
    return method.loss_mask(batch["completion_mask"], None, mask_truncated_completions=False,
                            tool_mask=batch.get("tool_mask"))


class TRLGTPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` that trains GTPO (arXiv 2508.03772) when ``args.loss_type == "gtpo"``.

    The constructor is ``trl.GRPOTrainer``'s (``model``, ``reward_funcs``, ``args``, ``train_dataset``,
    ``eval_dataset``, ``processing_class``, ``peft_config``, ``rollout_func``, ...); ``args`` is a
    :class:`TRLGTPOConfig` (default: ``TRLGTPOConfig("<model>-GTPO")``). With another ``loss_type`` the
    trainer is TRL's, plus ``logprob_temperature`` and ``overlong_buffer_length`` when they are set.

    Logged (``self._metrics``, TRL's logging): ``gtpo/conflict_frac`` (tokens in a conflict run / loss
    tokens), ``gtpo/n_conflict_mean``, ``gtpo/weighted_token_frac`` (loss tokens with lambda != 1),
    ``gtpo/filtered_frac`` (completions the entropy filter dropped), ``gtpo/adv_shaped_mean``,
    ``gtpo/adv_shift_mean`` (mean gamma shift of the kept completions), ``entropy`` (token mean),
    ``clip_ratio/region_mean`` and ``gtpo/initial_entropy`` (``<H>_ini``, the paper's rule; saved in
    each checkpoint as ``gtpo_state.json`` and restored on resume).
    """

    _tag_names = ["trl", "grpo", "gtpo"]
    _name = "GTPO"
    _paper = {
        "title": "GTPO: Stabilizing Group Relative Policy Optimization via Gradient and Entropy Control",
        "id": "2508.03772",
        "citation": (
            "@article{simoni2026gtpo,\n"
            "    title   = {{GTPO: Stabilizing Group Relative Policy Optimization via Gradient and Entropy Control}},\n"
            "    author  = {M. Simoni and A. Fontana and G. Rossolini and A. Saracino and P. Mori},\n"
            "    journal = {Transactions of the Association for Computational Linguistics},\n"
            "    year    = 2026,\n"
            "    eprint  = {arXiv:2508.03772},\n"
            "}"
        ),
    }

    def __init__(self, model, reward_funcs=None, args: TRLGTPOConfig | None = None, *rest, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", type(model).__name__)
            args = TRLGTPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-GTPO")
        elif not isinstance(args, TRLGTPOConfig):
            raise TypeError(f"args must be a gtpo.integrations.trl.TRLGTPOConfig (trl.GRPOConfig plus GTPO's "
                            f"fields), got {type(args).__name__}; build it with TRLGTPOConfig(...) or "
                            "TRLGTPOConfig.from_preset(...)")
        if args.overlong_buffer_length > 0:
            funcs = [] if reward_funcs is None else list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) \
                else [reward_funcs]
            reward_funcs = funcs + [OverlongPenalty(args.max_completion_length, args.overlong_buffer_length,
                                                    args.overlong_penalty_factor)]
            if args.reward_weights is not None:
                args = copy.copy(args)
                args.reward_weights = [*args.reward_weights, 1.0]
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        self.gtpo_config: GTPOConfig | None = args.to_gtpo_config() if args.loss_type == "gtpo" else None
        # the loss of a micro-batch under TRL's normalisation (module documentation): the mean over B * GA
        # completions (times G for completion_reduction="sum"), with TRL's clip range
        self._gtpo_loss_config = None if self.gtpo_config is None else self.gtpo_config.replace(
            completion_reduction="mean", epsilon=self.epsilon_low, epsilon_high=self.epsilon_high)
        self.gtpo_initial_entropy: float | None = None  # <H>_ini (entropy_rule="initial")
        self._gtpo_rewards: torch.Tensor | None = None  # (N_global, n_funcs) of the last _calculate_rewards
        self._gtpo_capture = False  # keep the entropies of the next policy forward (rollout log-probs)
        self._gtpo_captured: torch.Tensor | None = None
        if args.resolved_logprob_temperature != args.temperature:
            self._patch_logprob_temperature(args.resolved_logprob_temperature)

    def _patch_logprob_temperature(self, temperature: float) -> None:
        """TRL's fused head divides the logits by the sampling temperature; gtpo's ``logprob_temperature``
        (the reference code samples at 0.9 and trains on the raw logits) replaces it for the training
        forwards (generation keeps ``temperature``)."""
        from trl.trainer.utils import add_fused_lm_head

        def base(m):  # as TRL: the head is patched on the model inside a PEFT wrapper
            try:
                from peft import PeftModel
            except ImportError:  # pragma: no cover - peft is a dependency of gtpo
                return m
            return m.get_base_model() if isinstance(m, PeftModel) else m

        add_fused_lm_head(base(self.model), temperature=temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                          outputs=("log_probs", "entropy"))
        if self.ref_model is not None:
            add_fused_lm_head(self.ref_model, temperature=temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)

    # ---------------------------------------------------------------------------- rollout side
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gtpo_rewards = rewards_per_func  # gathered over processes: (N_global, n_funcs), global row order
        return rewards_per_func

    def _get_per_token_logps_and_entropies(self, model, *args, compute_entropy=False, **kwargs):
        if not self._gtpo_capture or model is not self.model:
            return super()._get_per_token_logps_and_entropies(model, *args, compute_entropy=compute_entropy, **kwargs)
        # the rollout log-probs forward: the fused head computes the entropies anyway; keep them
        self._gtpo_capture = False
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(model, *args, compute_entropy=True,
                                                                           **kwargs)
        self._gtpo_captured = entropies
        return logps, entropies if compute_entropy else None, aux

    def _generate_and_score_completions(self, inputs):
        if self.gtpo_config is None:
            return self._log_turns(super()._generate_and_score_completions(inputs))
        self._gtpo_capture, self._gtpo_captured = self.gtpo_config.entropy_control, None
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._gtpo_capture = False
        output.update(self._gtpo_inputs(output))
        self._gtpo_captured = None
        return self._log_turns(output)

    def _log_turns(self, output: dict) -> dict:
        """Multi-turn batches (``tool_mask``: tools, environment_factory, a rollout_func's env_mask): the
        ``tools/turns_mean`` and ``tools/env_token_frac`` that gtpo's trainer logs too
        (:func:`gtpo.run.step_metrics.agent_metrics`), over all processes; TRL logs ``tools/call_frequency`` and
        ``tools/failure_frequency`` itself."""
        if output.get("tool_mask") is None:
            return output
        from ...run.step_metrics import agent_metrics

        mode = "train" if self.model.training else "eval"
        stats = agent_metrics(output["completion_mask"], output["tool_mask"])
        for key, value in stats.items():
            self._metrics[mode][key].append(float(self.accelerator.reduce(value.reshape(1), reduction="mean")))
        return output

    def _gtpo_inputs(self, batch: dict) -> dict[str, torch.Tensor]:
        """GTPO's per-row inputs of this process's ``N`` rows of ``batch`` (TRL's generation output), from whole
        groups: ``advantages (N,)`` with exact zeros for zero-variance groups, ``gtpo_token_weights (N, T)`` and
        ``gtpo_n_conflict (N,)`` (conflict masks on), ``gtpo_shift_mask (N,)`` (``gamma_groups="varying"``),
        ``gtpo_rows (N,)`` (``completion_sign``), ``gtpo_seq_entropy (N,)`` (rollout entropies, when TRL's
        rollout forward ran). Logs ``gtpo/conflict_frac``, ``gtpo/n_conflict_mean``, ``gtpo/initial_entropy``."""
        cfg, acc = self.gtpo_config, self.accelerator
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        ids, mask = batch["completion_ids"], _loss_mask(batch)
        n, t = ids.shape
        rank = acc.process_index
        local = slice(rank * n, (rank + 1) * n)
        out: dict[str, torch.Tensor] = {}

        # 1. exact zeros for zero-variance groups (as gtpo.maths.advantages.group_advantages)
        rpf = self._gtpo_rewards
        rewards = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)  # (N_global,)
        rewards[torch.isnan(rpf).all(dim=1)] = torch.nan
        constant = method.constant_groups(rewards, G)[local].to(batch["advantages"].device)  # (N,)
        advantages = torch.where(constant, torch.zeros_like(batch["advantages"]), batch["advantages"])
        out["advantages"] = advantages

        # 2. per-group inputs on whole groups (gtpo.maths.method.group_inputs): locally when this process holds whole
        #    groups (its rows are the contiguous slice `local` of the global batch), else on the gathered batch
        if cfg.resolved_conflict_masks or cfg.gamma_groups == "varying" or cfg.completion_sign != "all":
            whole = n % G == 0
            if whole:
                g_ids, g_mask, g_adv, rows = ids, mask, advantages, slice(0, n)
            else:
                g_ids = acc.gather(acc.pad_across_processes(ids, dim=1, pad_index=0))
                g_mask = acc.gather(acc.pad_across_processes(mask, dim=1, pad_index=0))
                g_adv = acc.gather(advantages)
                rows = local
            group = method.group_inputs(g_ids, g_mask, g_adv, cfg).rows(rows)
            if group.token_weights is not None:  # this process's columns (the gathered batch was padded)
                group = group._replace(token_weights=group.token_weights[:, :t], conflict_run=group.conflict_run[:, :t])
                stats = method.conflict_stats(group, mask)
                stats = acc.reduce(stats, reduction="sum")
                self._metrics[mode]["gtpo/conflict_frac"].append(float(stats[0] / stats[1].clamp(min=1)))
                self._metrics[mode]["gtpo/n_conflict_mean"].append(float(stats[2] / stats[3].clamp(min=1)))
                out["gtpo_token_weights"] = group.token_weights
                out["gtpo_n_conflict"] = group.n_conflict
            if group.shift_mask is not None:
                out["gtpo_shift_mask"] = group.shift_mask
            if group.sign_mask is not None:
                out["gtpo_rows"] = group.sign_mask

        # 3. the rollout policy's completion entropies, when TRL's rollout log-probs forward ran
        if self._gtpo_captured is not None:
            out["gtpo_seq_entropy"] = method.completion_entropy(self._gtpo_captured, mask)

        # 4. <H>_ini: the policy's mean completion entropy on the first batch (the paper's rule)
        if method.uses_initial_entropy(cfg):
            if self.gtpo_initial_entropy is None:
                self.gtpo_initial_entropy = self._measure_initial_entropy(batch, mask, out.get("gtpo_seq_entropy"))
            if self.gtpo_initial_entropy is not None:
                self._metrics[mode]["gtpo/initial_entropy"].append(self.gtpo_initial_entropy)
        return out

    @torch.no_grad()
    def _measure_initial_entropy(self, batch: dict, mask: torch.Tensor, seq_entropy: torch.Tensor | None) -> float | None:
        """``<H>_ini``: the mean over the completions with loss tokens (all processes) of their mean token entropy
        under the current policy (at ``logprob_temperature``); one extra forward unless ``seq_entropy (N,)`` is
        given. None (measured again on the next batch) when no completion has tokens or it is not finite."""
        if seq_entropy is None:
            from trl.models.utils import disable_gradient_checkpointing

            input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                _, entropies, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, batch["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size, compute_entropy=True,
                    **{k: batch.get(k) for k in _MULTIMODAL_KEYS},
                )
            seq_entropy = method.completion_entropy(entropies, mask)
        total = self.accelerator.reduce(method.initial_entropy_sums(seq_entropy, mask), reduction="sum")
        return method.initial_entropy_value(total)

    # ------------------------------------------------------------------------------- loss side
    def _compute_loss(self, model, inputs):
        if self.gtpo_config is None:
            return super()._compute_loss(model, inputs)
        cfg, acc = self.gtpo_config, self.accelerator
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = _loss_mask(inputs)  # (B, T)
        logp, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled, **{k: inputs.get(k) for k in _MULTIMODAL_KEYS},
        )  # (B, T) each
        B = completion_ids.size(0)

        # <H>_i of the rollout policy: from generation time, or this forward's (the policy has not changed
        # since the rollout), kept in the micro-batch for the later passes (num_iterations)
        seq_entropy = inputs.get("gtpo_seq_entropy")
        if seq_entropy is None and cfg.entropy_control:
            seq_entropy = method.completion_entropy(entropies, mask)
            inputs["gtpo_seq_entropy"] = seq_entropy
        advantages = inputs["advantages"]  # (B,) unshaped
        initial = self.gtpo_initial_entropy if method.uses_initial_entropy(cfg) else None
        effective, dropped, _ = method.effective_advantages(advantages, seq_entropy, cfg, initial_entropy=initial,
                                                            shift_mask=inputs.get("gtpo_shift_mask"),
                                                            sign_rows=inputs.get("gtpo_rows"))

        # lambda, times TRL's per-token multipliers that combine with GTPO
        lam = inputs.get("gtpo_token_weights")  # (B, T) or None
        extra = None
        if self.top_entropy_quantile < 1.0:
            extra = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            ratio = inputs["importance_sampling_ratio"]  # (B, T) or (B, 1)
            extra = ratio if extra is None else extra * ratio
        if self.off_policy_mask_threshold is not None:
            old = inputs.get("old_per_token_logps")
            sampling = inputs.get("sampling_per_token_logps", old if old is not None else logp.detach())
            off = self.get_off_policy_mask(advantages.unsqueeze(1), logp, sampling, mask, self.off_policy_mask_threshold)
            extra = off if extra is None else extra * off
        token_weights = lam
        if extra is not None:
            base = lam if lam is not None else torch.ones_like(logp)
            token_weights = base * extra.to(base.dtype)
        n_conflict = inputs.get("gtpo_n_conflict")

        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        extras = LossExtras(token_weights=token_weights, n_conflict=n_conflict, num_sequences=B * accumulation)
        out = POLICY_LOSSES["gtpo"](logp, inputs.get("old_per_token_logps"), effective, mask, extras,
                                    self._gtpo_loss_config)
        loss = out.loss * G if cfg.completion_reduction == "sum" else out.loss

        if self.aux_loss_enabled:  # as TRL: scaled for gradient accumulation
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(acc.gather_for_metrics(aux_loss).mean().item())
        self._log_loss_metrics(mode, mask, entropies, advantages, effective, dropped, lam, out.metrics)
        return loss

    def _log_loss_metrics(self, mode: str, mask, entropies, advantages, effective, dropped, lam, metrics) -> None:
        """The loss metrics of a micro-batch, reduced over processes in one call (one host sync)."""
        maskf = mask.float()
        tokens = maskf.sum()
        kept = (~dropped).float()
        weighted = ((lam != 1).float() * maskf).sum() if lam is not None else torch.zeros((), device=maskf.device)
        local = torch.stack([
            (entropies.detach().float() * maskf).sum(), tokens,
            dropped.float().sum(), torch.tensor(float(mask.shape[0]), device=maskf.device),
            effective.detach().float().sum(),
            ((effective - advantages).detach().float() * kept).sum(), kept.sum(),
            weighted, metrics["clipfrac"].float() * tokens,
        ])
        total = self.accelerator.reduce(local, reduction="sum").tolist()
        m = self._metrics[mode]
        m["entropy"].append(total[0] / max(total[1], 1.0))
        m["gtpo/filtered_frac"].append(total[2] / total[3])
        m["gtpo/adv_shaped_mean"].append(total[4] / total[3])
        m["gtpo/adv_shift_mean"].append(total[5] / max(total[6], 1.0))
        m["gtpo/weighted_token_frac"].append(total[7] / max(total[1], 1.0))
        m["clip_ratio/region_mean"].append(total[8] / max(total[1], 1.0))

    # --------------------------------------------------------------------------- checkpoints
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.gtpo_config is not None and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            with open(os.path.join(folder, "gtpo_state.json"), "w") as fh:
                json.dump({"initial_entropy": self.gtpo_initial_entropy}, fh)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = None if checkpoint is None else os.path.join(checkpoint, "gtpo_state.json")
        if self.gtpo_config is not None and path is not None and os.path.exists(path):
            with open(path) as fh:
                self.gtpo_initial_entropy = json.load(fh)["initial_entropy"]


# ----------------------------------------------------------------------------------------- gtpo train --engine trl
def _metrics_record(logs: dict[str, Any], step: int) -> dict[str, Any]:
    """One ``metrics.jsonl`` line from a TRL log dict: TRL's names as they are (gtpo's trainer writes the same ones,
    :mod:`gtpo.run.metric_names`), ``eval_x`` -> ``eval/x`` as TRL's trackers show them."""
    record: dict[str, Any] = {"step": step}
    for key, value in logs.items():
        record["eval/" + key[len("eval_"):] if key.startswith("eval_") else key] = value
    return record


def metrics_file_callback(output_dir: str):
    """A TrainerCallback appending every log of the main process to ``output_dir/metrics.jsonl``."""
    from transformers import TrainerCallback

    class MetricsFile(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                os.makedirs(output_dir, exist_ok=True)
                with open(os.path.join(output_dir, "metrics.jsonl"), "a") as fh:
                    fh.write(json.dumps(_metrics_record(logs, state.global_step)) + "\n")

    return MetricsFile()


def drop_long_prompts(dataset, tokenizer, limit: int):
    """``dataset`` without the prompts longer than ``limit`` tokens (chat template applied), as gtpo's trainer
    does (TRL's GRPOTrainer has no prompt-length limit)."""
    from ...sampling.rollout import encode_prompts

    lengths = [len(ids) for ids in encode_prompts(tokenizer, list(dataset["prompt"]))]
    keep = [i for i, n in enumerate(lengths) if n <= limit]
    if not keep:
        raise ConfigError(f"max_prompt_length: every prompt of the dataset is longer than {limit} tokens (the "
                          f"shortest has {min(lengths)}); raise max_prompt_length")
    if len(keep) < len(lengths):
        logger.warning("train_dataset: dropped %d of %d prompts longer than max_prompt_length=%d",
                       len(lengths) - len(keep), len(lengths), limit)
        dataset = dataset.select(keep)
    return dataset
