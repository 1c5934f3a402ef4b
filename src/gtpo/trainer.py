"""The training loop: rollout -> rewards -> advantages -> loss -> step, for any HF causal LM.

One step, top to bottom (:meth:`GTPOTrainer.step`):

1. take ``prompts_per_step`` prompts (each process its share of whole groups) and sample
   ``group_size`` completions each (``gtpo.rollout.generate``: one prefill per prompt, then gtpo's
   decoding loop on the KV cache, or transformers ``generate`` with ``decode_loop=False``);
2. score them with every reward function (TRL's contract) and sum with ``reward_weights``;
   DAPO's dynamic sampling replaces zero-variance groups, its overlong shaping penalises length;
3. group advantages (``gtpo.advantages``); for GTPO the conflict-token weights from the
   *unshaped* advantage signs (``gtpo.conflict``);
4. ``num_iterations`` updates over micro-batches: one forward gives log-probs *and* entropies
   through the chunked LM head (``gtpo.ops``), the loss comes from ``gtpo.losses.policy_loss``
   with the normalisers of the whole batch, gradients are clipped, non-finite updates skipped;
5. metrics to ``metrics.jsonl`` (and trackers), sample completions, checkpoints, evaluation.

Fault tolerance (docs/fault-tolerance.md): atomic checkpoints and a bitwise-exact resume; SIGTERM /
SIGINT finish the step and save; NaN/inf updates are never applied (``max_consecutive_skips`` in a
row stop the run, :class:`TrainingStopped`); a checkpoint that cannot be written raises
:class:`CheckpointError` with the previous one intact; bad input raises ``ValueError`` naming what
and where (the config field, the dataset row, the reward function and prompt).

GTPO never loads a reference model. GRPO/Dr.GRPO/DAPO load one only when ``beta > 0`` (with
LoRA the adapter is simply disabled to get the reference log-probs).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import numbers
import os
import shutil
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from . import checkpoint as ckpt
from .checkpoint import CheckpointError
from .advantages import entropy_keep_mask, group_advantages, shape_advantages
from .config import GTPOConfig
from .conflict import conflict_runs, conflict_weights
from .losses import policy_loss
from .ops import masked_mean, token_logprobs_and_entropy
from .rollout import (
    Rollout, completion_hidden_states, completion_mask_from_ids, encode_prompts, eos_token_ids, generate,
    position_ids,
)

logger = logging.getLogger("gtpo")


class RewardFunctionError(ValueError):
    """A reward function raised or returned something unusable."""


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is kept."""


# why a step had no policy-gradient signal (every effective advantage zero, or the update skipped)
NO_SIGNAL_REASONS = ("filtered", "zero_variance", "masked", "nonfinite")
# the "entropy filter dropped everything" warning repeats at most once per this many steps
FILTERED_WARNING_INTERVAL = 50

# files of a run in output_dir (what "output_dir already holds a run" means, and what overwriting removes)
RUN_FILES = ("metrics.jsonl", "completions.jsonl", "run_config.json", "summary.json")


# ----------------------------------------------------------------------------- policy forward
class PolicyForward(nn.Module):
    """Log-probs and entropies of completion tokens from one forward pass of a causal LM.

    Wraps the model so that distributed wrappers (DDP) see one module whose ``forward`` runs the
    decoder and the chunked LM head: the ``(N, T, V)`` logits are never materialised.
    """

    def __init__(self, model: nn.Module, *, chunk_size: int | None = None):
        super().__init__()
        self.model = model
        self.chunk_size = chunk_size

    def _base(self) -> nn.Module:
        model = self.model
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids (N, S+T)``, ``attention_mask (N, S+T)``, ``completion_ids (N, T)`` ->
        ``logp (N, T)`` (with grad) and ``entropy (N, T)`` (no grad)."""
        base = self._base()
        t = completion_ids.shape[1]
        config = base.config
        special_head = getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)
        if special_head:  # models that post-process logits: use the full head (rare; exact)
            logits = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                          use_cache=False, logits_to_keep=t + 1).logits[:, :-1].float() / temperature
            logp_all = torch.log_softmax(logits, dim=-1)
            logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1).detach()
            return logp, entropy
        # (N, T, D): the state before each completion token; the prompt shared by the rows of a
        # group runs once per group, not once per row (exact; gtpo.rollout.completion_hidden_states)
        hidden = completion_hidden_states(base.get_decoder(), input_ids, attention_mask, t)
        head = base.get_output_embeddings()
        return token_logprobs_and_entropy(
            hidden, head.weight, completion_ids, temperature=temperature, chunk_size=self.chunk_size,
            bias=getattr(head, "bias", None),
        )


# ----------------------------------------------------------------------------- data order
class PromptSampler:
    """Epoch-wise seeded permutation of dataset rows; its state makes resuming exact."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.epoch, self.position = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def next(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.position >= self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._perm = self._permutation()
            out.append(self._perm[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._perm = self._permutation()


@dataclass
class ScoredBatch:
    """A rollout with its rewards. ``rewards (N,)``, ``per_func (N, F)``; rows prompt-major."""

    rollout: Rollout
    rows: list[int]                 # dataset row of each prompt, P entries
    rewards: torch.Tensor
    per_func: torch.Tensor


def _as_list_of_dicts(dataset, name: str = "train_dataset") -> Any:
    from datasets import Dataset

    if isinstance(dataset, Dataset):
        return dataset
    if isinstance(dataset, (list, tuple)):
        if not dataset:
            raise ValueError(f"{name} is empty: give at least one row with a 'prompt'")
        bad = next((i for i, r in enumerate(dataset) if not isinstance(r, dict)), None)
        if bad is not None:
            raise ValueError(f"{name} as a list must hold dicts with a 'prompt' key; row {bad} is "
                             f"{type(dataset[bad]).__name__}")
        try:
            return Dataset.from_list(list(dataset))
        except Exception as err:  # pyarrow cannot build a table: e.g. a column mixing strings and lists
            raise ValueError(
                f"{name}: cannot build a dataset from these rows ({type(err).__name__}: {str(err).splitlines()[0]}); "
                "every row must have the same columns with values of one type (e.g. 'prompt' always a string, "
                "or always a list of messages)"
            ) from err
    raise ValueError(f"{name} must be a datasets.Dataset or a list of dicts, got {type(dataset).__name__}")


def _reward_name(func: Callable) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


# ----------------------------------------------------------------------------- the trainer
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
    """

    def __init__(
        self,
        model: str | nn.Module,
        reward_funcs: Callable | str | list,
        train_dataset,
        args: GTPOConfig | None = None,
        processing_class=None,
        peft_config=None,
        eval_dataset=None,
        eval_reward_func: Callable | None = None,
        probe_texts: dict[str, str] | None = None,
    ):
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        self.args = args = args if args is not None else GTPOConfig()
        if not isinstance(args, GTPOConfig):
            raise ValueError(f"args must be a GTPOConfig, got {type(args).__name__}")
        args.validate()
        mixed = "bf16" if args.bf16 else "no"
        # no accelerator device: run on CPU, and with several processes (accelerate launch /
        # torchrun) as multi-CPU DDP over gloo
        no_device = not (torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()))
        self.accelerator = Accelerator(
            mixed_precision=mixed, log_with=list(args.report_to) or None, project_dir=args.output_dir, cpu=no_device
        )
        acc = self.accelerator
        if args.prompts_per_step % acc.num_processes:
            raise ValueError(
                f"GTPOConfig.prompts_per_step ({args.prompts_per_step}) must be divisible by the number of "
                f"processes ({acc.num_processes}): each process holds whole groups"
            )
        self.local_prompts = args.prompts_per_step // acc.num_processes
        set_seed(args.seed, device_specific=True)

        self.model_name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", type(model).__name__)
        self.tokenizer = self._load_tokenizer(model, processing_class)
        base_model = self._load_model(model)
        if args.gradient_checkpointing:
            base_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if peft_config is not None and hasattr(base_model, "enable_input_require_grads"):
                base_model.enable_input_require_grads()
        self.ref_model = None
        if args.beta > 0 and peft_config is None:
            self.ref_model = copy.deepcopy(base_model).eval().requires_grad_(False)
        if peft_config is not None:
            from peft import get_peft_model

            base_model = get_peft_model(base_model, peft_config)
        self.is_peft = peft_config is not None

        # rewards
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not funcs:
            raise ValueError("reward_funcs is empty: give at least one reward function")
        self.reward_funcs = [self._resolve_reward(f) for f in funcs]
        self.reward_names = [_reward_name(f) for f in self.reward_funcs]
        weights = args.reward_weights if args.reward_weights is not None else [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(
                f"GTPOConfig.reward_weights has {len(weights)} entries but there are {len(self.reward_funcs)} "
                f"reward functions ({self.reward_names})"
            )
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        if not torch.isfinite(self.reward_weights).all():
            raise ValueError(f"GTPOConfig.reward_weights {list(weights)} do not fit in float32")

        # data
        self.train_dataset = self._prepare_dataset(train_dataset, "train_dataset")
        self.eval_dataset = None if eval_dataset is None else _as_list_of_dicts(eval_dataset, "eval_dataset")
        self.eval_reward_func = eval_reward_func
        self.sampler = PromptSampler(len(self.train_dataset), args.seed)

        # optimisation
        from transformers import get_scheduler

        self.policy = PolicyForward(base_model, chunk_size=args.logprob_chunk_size)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        # fused AdamW (one kernel over all parameters; transformers' default "adamw_torch_fused") on
        # CPU and CUDA: the default per-parameter loop runs ~10 small ops per tensor and step
        fused = acc.device.type in ("cpu", "cuda") and all(p.dtype.is_floating_point for p in params)
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
            fused=True if fused else None,
        )
        try:
            self.scheduler = get_scheduler(
                args.lr_scheduler_type, self.optimizer,
                num_warmup_steps=int(math.ceil(args.warmup_ratio * args.max_steps)), num_training_steps=args.max_steps,
            )
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"GTPOConfig.lr_scheduler_type={args.lr_scheduler_type!r} cannot be used: {err}") from err
        self.policy, self.optimizer = acc.prepare(self.policy, self.optimizer)
        if self.ref_model is not None:
            self.ref_model.to(acc.device)
        self.eos_ids = eos_token_ids(self.tokenizer, self.unwrapped_model)
        self.probe_texts = probe_texts or {}

        # state
        self.global_step = 0
        self.skipped_steps = 0        # steps with at least one skipped (non-finite) update
        self.skipped_updates = 0      # optimizer updates skipped (num_iterations per step at most)
        self.consecutive_skips = 0    # consecutive steps with a skipped update, up to this one
        self.initial_entropy: float | None = None
        self.no_signal_steps = dict.fromkeys(NO_SIGNAL_REASONS, 0)  # steps without gradient signal, by reason
        self._last_filtered_warning: int | None = None
        self._stop_signal: int | None = None
        self.stopped_early: str | None = None  # the checkpoint written when a signal stopped train()
        self.stopped_by: str | None = None     # the signal's name

    # ------------------------------------------------------------------ loading
    @property
    def unwrapped_model(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.policy).model

    def _load_tokenizer(self, model, processing_class):
        from .models import load_tokenizer

        tok = processing_class
        if tok is None:
            source = model if isinstance(model, str) else getattr(model.config, "_name_or_path", None)
            if not source:
                raise ValueError("processing_class (the tokenizer) is required when model is an object without a path")
            tok = load_tokenizer(source)
        if tok.pad_token is None:
            if tok.eos_token is None:
                raise ValueError("the tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token")
            logger.warning("the tokenizer has no pad token: using its EOS token %r as pad", tok.eos_token)
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
        return tok

    def _load_model(self, model) -> nn.Module:
        from transformers import PreTrainedModel

        if isinstance(model, nn.Module):
            if not isinstance(model, PreTrainedModel):
                raise ValueError(f"model must be a transformers PreTrainedModel or a path, got {type(model).__name__}")
            return model
        if not isinstance(model, str):
            raise ValueError(f"model must be a hub id, a local path or a PreTrainedModel, got {type(model).__name__}")
        from .models import load_model

        return load_model(model)

    def _resolve_reward(self, func):
        if callable(func):
            return func
        from .rewards import resolve_reward

        return resolve_reward(func)

    def _prepare_dataset(self, dataset, name: str):
        dataset = _as_list_of_dicts(dataset, name)
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty: give at least one row with a 'prompt'")
        if "prompt" not in dataset.column_names:
            hint = " (rename the question column to 'prompt')" if "question" in dataset.column_names else ""
            raise ValueError(f"{name} has no 'prompt' column (columns: {dataset.column_names}){hint}")
        ids = []
        for i, prompt in enumerate(dataset["prompt"]):  # one by one, so that an error names its row
            try:
                ids.extend(encode_prompts(self.tokenizer, [prompt]))
            except ValueError as err:
                raise ValueError(f"{name} row {i}: {err}") from err
            except Exception as err:  # e.g. a chat template that fails on malformed messages
                raise ValueError(f"{name} row {i}: cannot encode the prompt {prompt!r:.200}: "
                                 f"{type(err).__name__}: {err}") from err
        keep = [i for i, x in enumerate(ids) if len(x) <= self.args.max_prompt_length]
        dropped = len(ids) - len(keep)
        if not keep:
            longest = min(len(x) for x in ids)
            raise ValueError(
                f"every prompt of {name} is longer than max_prompt_length={self.args.max_prompt_length} "
                f"tokens (the shortest has {longest}); raise max_prompt_length"
            )
        if dropped:
            logger.warning("%s: dropped %d of %d prompts longer than max_prompt_length=%d",
                           name, dropped, len(ids), self.args.max_prompt_length)
            dataset = dataset.select(keep)
        self.dropped_prompts = dropped
        self._prompt_ids = [ids[i] for i in keep]
        return dataset

    # ------------------------------------------------------------------ rewards
    def _score(self, rows: list[int], rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """``rewards (N,)`` and ``per_func (N, F)`` for completions of dataset ``rows`` (P entries).

        Each reward function gets TRL's call ``f(prompts=, completions=, completion_ids=,
        **dataset_columns)`` and must return N values, each a real number (Python, numpy or a
        one-element tensor; bools count as 0/1, as in TRL) or None (not scored by this function).
        Anything else raises :class:`RewardFunctionError` naming the function, the completion, its
        prompt index in the step and its dataset row.
        """
        g = self.args.group_size
        batch = self.train_dataset.select(rows)
        columns = {k: [v for v in batch[k] for _ in range(g)] for k in batch.column_names if k != "prompt"}
        prompts = [p for p in batch["prompt"] for _ in range(g)]
        conversational = not isinstance(prompts[0], str)
        completions = [[{"role": "assistant", "content": t}] for t in rollout.texts] if conversational else rollout.texts
        ids = [c[m.bool()].tolist() for c, m in zip(rollout.completion_ids, rollout.completion_mask)]
        n = len(prompts)
        step = self.global_step + 1
        per_func = torch.empty((n, len(self.reward_funcs)), dtype=torch.float32)
        for j, (func, name) in enumerate(zip(self.reward_funcs, self.reward_names)):
            def call(sl: slice, func=func):
                return func(prompts=prompts[sl], completions=completions[sl], completion_ids=ids[sl],
                            **{k: v[sl] for k, v in columns.items()})

            try:
                out = call(slice(None))
            except Exception as err:  # name the function and the prompt; keep the original traceback chained
                raise RewardFunctionError(self._reward_raised_message(name, err, call, rows, prompts, step)) from err
            out = _reward_values(out, name, n, rows, g, step)
            for i, v in enumerate(out):
                per_func[i, j] = _reward_value(v, name, i, rows, g, step)
        all_none = torch.isnan(per_func).all(dim=1)
        if all_none.any():
            i = int(all_none.nonzero()[0])
            raise RewardFunctionError(
                f"every reward function returned None for completion {i} (prompt index {i // g}, dataset row "
                f"{rows[i // g]}, step {step}); at least one must score each completion ({self.reward_names})"
            )
        rewards = (torch.nan_to_num(per_func, nan=0.0) * self.reward_weights).sum(dim=1)
        if not torch.isfinite(rewards).all():
            i = int((~torch.isfinite(rewards)).nonzero()[0])
            raise RewardFunctionError(
                f"the weighted sum of the rewards of completion {i} (prompt index {i // g}, dataset row {rows[i // g]}, "
                f"step {step}) overflows float32: {dict(zip(self.reward_names, per_func[i].tolist()))} with "
                f"reward_weights {self.reward_weights.tolist()}; rescale the reward functions"
            )
        if self.args.overlong_buffer_length > 0:
            rewards = rewards + self._overlong_penalty(rollout)
        return rewards, per_func

    def _reward_raised_message(self, name: str, err: Exception, call: Callable, rows: list[int], prompts: list,
                               step: int) -> str:
        """Say which reward function raised what, where in its code, and on which prompt.

        The batch call gives no prompt index, so the function is called again one prompt group at
        a time (only on this error path) to find the first prompt it fails on.
        """
        g = self.args.group_size
        where = _user_frame(err)
        msg = (f"reward function {name!r} raised {type(err).__name__}: {err}{where} "
               f"(step {step}, dataset rows {rows})")
        for p in range(len(rows)):
            try:
                call(slice(p * g, (p + 1) * g))
            except Exception as err_p:
                prompt = prompts[p * g]
                text = prompt if isinstance(prompt, str) else prompt[-1].get("content", prompt) if prompt else prompt
                msg += (f"; it fails on prompt index {p} (dataset row {rows[p]}: {str(text)[:80]!r})"
                        + ("" if type(err_p) is type(err) else f" with {type(err_p).__name__}: {err_p}"))
                break
        if isinstance(err, TypeError) and "argument" in str(err):
            msg += ("; reward functions are called as f(prompts=..., completions=..., completion_ids=..., "
                    "**dataset_columns): give the function a **kwargs parameter")
        return msg

    def _overlong_penalty(self, rollout: Rollout) -> torch.Tensor:
        """DAPO soft overlong punishment: ``(N,)`` linear penalty inside the last buffer tokens."""
        a = self.args
        lengths = rollout.lengths.float()
        start = a.max_completion_length - a.overlong_buffer_length
        over = (lengths - start).clamp(min=0) / a.overlong_buffer_length
        return -a.overlong_penalty_factor * over.clamp(max=1.0)

    # ------------------------------------------------------------------ rollout
    def _rollout(self, rows: list[int]) -> Rollout:
        a = self.args
        try:
            return generate(
                self.unwrapped_model, self.tokenizer, [None] * len(rows),
                prompt_ids=[self._prompt_ids[r] for r in rows],
                num_samples=a.group_size, max_new_tokens=a.max_completion_length, temperature=a.temperature,
                top_p=a.top_p, top_k=a.top_k, repetition_penalty=a.repetition_penalty,
                batch_size=a.generation_batch_size, decode_loop=a.decode_loop,
            )
        except RuntimeError as err:
            text = str(err).lower()
            if "nan" not in text and "inf" not in text:
                raise
            # sampling from non-finite probabilities: the policy's forward overflows on these prompts
            raise TrainingStopped(
                f"sampling completions failed at step {self.global_step + 1} (dataset rows {rows}): the policy "
                f"produced non-finite probabilities ({type(err).__name__}: {str(err).splitlines()[0]}). "
                f"{self._checkpoint_note()} Lower learning_rate or max_grad_norm, or train in float32 instead of bf16"
            ) from err

    def _next_rows(self) -> list[int]:
        """This process's share of the next ``prompts_per_step`` prompts (same order on every process)."""
        global_rows = self.sampler.next(self.args.prompts_per_step)
        r = self.accelerator.process_index
        return global_rows[r * self.local_prompts:(r + 1) * self.local_prompts]

    def _sample_batch(self) -> tuple[ScoredBatch, dict[str, float]]:
        rows = self._next_rows()
        rollout = self._rollout(rows)
        rewards, per_func = self._score(rows, rollout)
        batch = ScoredBatch(rollout, rows, rewards, per_func)
        stats = {"dynamic_sampling/rounds": 0.0}
        if not self.args.resolved_dynamic_sampling:
            return batch, stats
        # DAPO dynamic sampling: keep groups with reward variance, refill from new prompts.
        g = self.args.group_size
        keep = [batch_group(batch, p, g) for p in range(len(rows)) if _group_varies(rewards, p, g)]
        spare = [batch_group(batch, p, g) for p in range(len(rows)) if not _group_varies(rewards, p, g)]
        for round_ in range(self.args.max_resample_rounds):
            need = torch.tensor([float(len(keep) < self.local_prompts)], device=self.accelerator.device)
            if self.accelerator.gather(need).sum().item() == 0:
                break
            stats["dynamic_sampling/rounds"] = float(round_ + 1)
            more_rows = self._next_rows()
            if len(keep) >= self.local_prompts:
                continue
            more = self._rollout(more_rows)
            r2, f2 = self._score(more_rows, more)
            extra = ScoredBatch(more, more_rows, r2, f2)
            for p in range(len(more_rows)):
                (keep if _group_varies(r2, p, g) else spare).append(batch_group(extra, p, g))
        groups = (keep + spare)[: self.local_prompts]
        return cat_groups(groups, self.tokenizer.pad_token_id), stats

    # ------------------------------------------------------------------ update
    def _forward(self, rollout: Rollout, index: slice, mask: torch.Tensor):
        dev = self.accelerator.device
        input_ids = torch.cat([rollout.prompt_ids[index], rollout.completion_ids[index]], dim=1).to(dev)
        attn = torch.cat([rollout.prompt_mask[index], mask[index]], dim=1).to(dev)
        return self.policy(input_ids, attn, rollout.completion_ids[index].to(dev), self.args.resolved_logprob_temperature)

    @torch.no_grad()
    def _reference_logp(self, rollout: Rollout, mask: torch.Tensor, micro: int) -> torch.Tensor:
        """``(N, T)`` reference-model log-probs (for ``beta > 0``)."""
        outs = []
        for s in range(0, mask.shape[0], micro):
            index = slice(s, s + micro)
            if self.is_peft:
                with self.unwrapped_model.disable_adapter():
                    logp, _ = self._forward(rollout, index, mask)
            else:
                ref = PolicyForward(self.ref_model, chunk_size=self.args.logprob_chunk_size)
                dev = self.accelerator.device
                input_ids = torch.cat([rollout.prompt_ids[index], rollout.completion_ids[index]], 1).to(dev)
                attn = torch.cat([rollout.prompt_mask[index], mask[index]], 1).to(dev)
                logp, _ = ref(input_ids, attn, rollout.completion_ids[index].to(dev), self.args.resolved_logprob_temperature)
            outs.append(logp.detach())
        return torch.cat(outs)

    @torch.no_grad()
    def _measure_entropy(self, rollout: Rollout, mask: torch.Tensor, micro: int) -> float:
        """Mean completion entropy <H> of the current policy over the batch (all processes): the mean of
        the completions' mean token entropies, over the completions that have tokens in ``mask``."""
        total = torch.zeros(2, device=self.accelerator.device)
        for s in range(0, mask.shape[0], micro):
            index = slice(s, s + micro)
            _, ent = self._forward(rollout, index, mask)
            m = mask[index].to(ent.device).float()
            has_tokens = m.sum(dim=1) > 0  # completions masked out entirely (truncated) have no entropy
            seq = masked_mean(ent, m, dim=1)
            total += torch.stack([seq[has_tokens].sum(), has_tokens.sum().float()])
        total = self.accelerator.reduce(total, "sum")
        return float(total[0] / total[1])

    def _signal_counts(self, advantages: torch.Tensor, seq_entropy: torch.Tensor, mask: torch.Tensor,
                       initial_entropy: float | None) -> torch.Tensor:
        """``(4,)`` counts over a micro-batch: rows with tokens, rows with a non-zero effective advantage
        (the one that multiplies the gradient), rows the entropy filter dropped, rows with ``A != 0``.

        ``advantages (M,)`` unshaped, ``seq_entropy (M,)``, ``mask (M, T)`` the loss mask.
        """
        a = self.args
        has_tokens = mask.sum(dim=1) > 0
        effective, dropped = advantages, torch.zeros_like(has_tokens)
        if a.loss_type == "gtpo":
            threshold = a.entropy_threshold if a.entropy_filter else None
            kw = dict(threshold=threshold, scope=a.entropy_filter_scope, initial_entropy=initial_entropy)
            dropped = ~entropy_keep_mask(advantages, seq_entropy, **kw)
            effective = shape_advantages(advantages, seq_entropy, gamma=a.gamma, **kw)
        counts = [has_tokens, has_tokens & (effective != 0), has_tokens & dropped, has_tokens & (advantages != 0)]
        return torch.stack([c.sum() for c in counts]).float()

    def _no_signal_reason(self, counts: torch.Tensor, skipped_updates: int, seq_entropy: torch.Tensor,
                          mask: torch.Tensor) -> str | None:
        """Why this step had no gradient signal (None if it had), counted in ``no_signal_steps``; the
        first step whose entropy filter dropped everything (and one per FILTERED_WARNING_INTERVAL
        steps after it) logs a warning saying what to change."""
        with_tokens, with_signal, dropped, nonzero = (int(c) for c in counts.tolist())
        if skipped_updates:
            reason = "nonfinite"
        elif with_signal > 0:
            return None
        elif with_tokens == 0:
            reason = "masked"
        elif dropped > 0:
            reason = "filtered"
        else:
            reason = "zero_variance"
        self.no_signal_steps[reason] += 1
        last = self._last_filtered_warning
        if reason == "filtered" and (last is None or self.global_step - last >= FILTERED_WARNING_INTERVAL):
            self._last_filtered_warning = self.global_step
            a = self.args
            has_tokens = mask.sum(dim=1) > 0
            measured = float(seq_entropy[has_tokens].mean()) if bool(has_tokens.any()) else float("nan")
            logger.warning(
                "step %d: the entropy filter dropped every completion (mean token entropy %.3f nats > "
                "entropy_threshold %.3f), so this step trained nothing (%d such step(s) so far). Use the paper's "
                "rule (entropy_rule: initial), a higher entropy_threshold (e.g. %.2f), or a lower temperature "
                "(now %g); entropy_filter: false switches the filter off.",
                self.global_step, measured, a.entropy_threshold, self.no_signal_steps["filtered"],
                math.ceil(measured * 10 + 1) / 10 if math.isfinite(measured) else 2.0, a.temperature,
            )
        return reason

    def step(self) -> dict[str, float]:
        """One optimisation step; returns its metrics."""
        a, acc = self.args, self.accelerator
        t0 = time.perf_counter()
        batch, stats = self._sample_batch()
        t_gen = time.perf_counter() - t0
        rollout = batch.rollout
        g = a.group_size
        n, t = rollout.completion_ids.shape
        dev = acc.device

        # advantages over the whole (all-process) batch, then this process's rows
        all_rewards = acc.gather(batch.rewards.to(dev)).float().cpu()
        all_adv = group_advantages(all_rewards, g, scale=a.resolved_scale_rewards)
        r = acc.process_index
        advantages = all_adv[r * n:(r + 1) * n]
        mask = rollout.completion_mask.clone()
        if a.mask_truncated_completions:
            mask[rollout.truncated] = 0
        maskf = mask.float()

        token_weights = n_conflict = None
        conflict_frac = torch.tensor(0.0)
        if a.loss_type == "gtpo":
            # on the loss mask: a truncated completion masked out of the loss is nobody's conflict
            # partner (its tokens are not pushed down, so there is nothing to protect) [D]
            token_weights, n_conflict = conflict_weights(
                rollout.completion_ids, mask, advantages, g, **a.conflict_kwargs()
            )
            pre, suf = conflict_runs(rollout.completion_ids, mask, advantages, g)
            conflict_frac = ((pre | suf).float() * maskf).sum() / maskf.sum().clamp(min=1)

        # normalisers of the whole (all-process) batch; the loss is scaled by the world size so that
        # DDP's gradient mean equals the gradient of the full-batch loss
        world = acc.num_processes
        num_tokens = max(int(acc.reduce(maskf.sum().to(dev), "sum").item()), 1)
        num_sequences = n * world
        micro = a.micro_batch_size or n
        ref_logp = self._reference_logp(rollout, mask, micro) if a.beta > 0 else None
        initial_entropy = None
        if a.loss_type == "gtpo" and a.entropy_rule == "initial":
            if self.initial_entropy is None:
                measured = self._measure_entropy(rollout, mask, micro)
                if math.isfinite(measured):  # a non-finite first forward is skipped below; measure again next step
                    self.initial_entropy = measured
            initial_entropy = self.initial_entropy

        t1 = time.perf_counter()
        old_logp = torch.zeros((n, t), device=dev) if a.num_iterations > 1 else None
        # GTPO's entropy filter and gamma shift use the rollout policy's entropies in every iteration,
        # like the advantages they shape (frozen at the rollout) [D]
        rollout_seq_ent = torch.zeros(n, device=dev)
        signal = torch.zeros(4, device=dev)  # rows with tokens, with signal, dropped by the filter, with A != 0
        sums: dict[str, torch.Tensor] = {}
        ent_sum = torch.zeros((), device=dev)
        loss_total = torch.zeros((), device=dev)
        grad_norm = torch.zeros((), device=dev)
        skipped_updates = 0
        loss_kwargs = a.loss_kwargs()
        for it in range(a.num_iterations):
            loss_total = torch.zeros((), device=dev)
            starts = list(range(0, n, micro))
            for k, s in enumerate(starts):
                index = slice(s, s + micro)
                sync = contextlib.nullcontext() if k == len(starts) - 1 else acc.no_sync(self.policy)
                with sync:
                    logp, ent = self._forward(rollout, index, mask)
                    m = maskf[index].to(dev)
                    if it == 0:
                        rollout_seq_ent[index] = masked_mean(ent, m, dim=1)
                        signal += self._signal_counts(advantages[index].to(dev), rollout_seq_ent[index], m,
                                                      initial_entropy)
                        if old_logp is not None:
                            old_logp[index] = logp.detach()
                    seq_ent = rollout_seq_ent[index]
                    extra: dict[str, Any] = {}
                    if a.loss_type == "gtpo":
                        extra = dict(seq_entropy=seq_ent, token_weights=token_weights[index].to(dev),
                                     n_conflict=n_conflict[index].to(dev), initial_entropy=initial_entropy)
                    out = policy_loss(
                        a.loss_type, logp, m, advantages[index].to(dev),
                        old_logp=old_logp[index] if (old_logp is not None and it > 0) else None,
                        ref_logp=None if ref_logp is None else ref_logp[index],
                        num_sequences=num_sequences, num_tokens=num_tokens, **loss_kwargs, **extra,
                    )
                    acc.backward(out.loss * world)
                loss_total = loss_total + out.loss.detach() * world
                if it == 0:
                    ent_sum = ent_sum + (ent * m).sum()
                    w = float(m.shape[0])
                    for key, val in out.metrics.items():
                        sums[key] = sums.get(key, torch.zeros((), device=dev)) + val.detach().float() * w
            params = [p for p in self.policy.parameters() if p.requires_grad]
            max_norm = a.max_grad_norm if a.max_grad_norm > 0 else float("inf")
            grad_norm = torch.as_tensor(acc.clip_grad_norm_(params, max_norm), device=dev)
            # a NaN/inf loss or gradient: this update is never applied, nor are the rest of this step's
            # updates (they would see the same batch and weights); the decision is the same on every process
            nonfinite = (~torch.isfinite(grad_norm) | ~torch.isfinite(loss_total)).float().reshape(())
            if acc.num_processes > 1:
                nonfinite = acc.reduce(nonfinite, "max")
            if bool(nonfinite):
                skipped_updates = a.num_iterations - it
                self.optimizer.zero_grad(set_to_none=True)
                break
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()  # the schedule follows the step count, skipped steps included
        self.global_step += 1
        no_signal = self._no_signal_reason(acc.reduce(signal, "sum"), skipped_updates, rollout_seq_ent, maskf)
        if skipped_updates:
            self.skipped_steps += 1
            self.skipped_updates += skipped_updates
            self.consecutive_skips += 1
        else:
            self.consecutive_skips = 0
        t_upd = time.perf_counter() - t1

        # metrics (one host sync, here)
        lengths = rollout.lengths.float()
        per_group_std = all_rewards.view(-1, g).std(dim=1)
        local = {
            "loss": loss_total,
            "entropy/mean": ent_sum / maskf.sum().clamp(min=1).to(dev),
            "completion_length/mean": lengths.mean(),
            "truncated_frac": rollout.truncated.float().mean(),
            "gtpo/conflict_frac": conflict_frac,
        }
        for key, val in sums.items():
            local[key] = val / n
        for j, name in enumerate(self.reward_names):
            col = batch.per_func[:, j]
            valid = ~torch.isnan(col)
            local[f"reward/{name}/mean"] = col[valid].mean() if valid.any() else torch.tensor(0.0)
        keys = sorted(local)
        vec = torch.stack([torch.as_tensor(local[k], dtype=torch.float32).to(dev).reshape(()) for k in keys])
        vec = acc.reduce(vec, "mean").cpu().tolist()
        max_len = float(acc.reduce(lengths.max().to(dev), "max"))
        metrics: dict[str, float] = dict(zip(keys, vec))
        step_time = time.perf_counter() - t0
        gen_tokens = float(acc.reduce(lengths.sum().to(dev), "sum"))
        metrics.update({
            "step": self.global_step,
            "reward/mean": float(all_rewards.mean()),
            "reward/std": float(all_rewards.std()) if all_rewards.numel() > 1 else 0.0,
            "frac_zero_std_groups": float((per_group_std < 1e-8).float().mean()),
            "completion_length/max": max_len,
            "grad_norm": float(grad_norm) if torch.isfinite(grad_norm) else float("nan"),
            "lr": float(self.scheduler.get_last_lr()[0]),
            "skipped_steps": float(self.skipped_steps),
            "skipped_updates": float(self.skipped_updates),
            "no_signal_steps": float(sum(self.no_signal_steps.values())),
            **{f"no_signal/{k}": float(v) for k, v in self.no_signal_steps.items()},
            "no_signal": float(no_signal is not None),
            "step_time_s": step_time,
            "generation_time_s": t_gen,
            "update_time_s": t_upd,
            "tokens_per_s": gen_tokens / max(step_time, 1e-9),
            **stats,
        })
        if self.initial_entropy is not None:
            metrics["gtpo/initial_entropy"] = self.initial_entropy
        self._last_batch = batch
        return metrics

    # ------------------------------------------------------------------ probes
    @torch.no_grad()
    def _probe(self) -> dict[str, float]:
        """Mean probability of each probe text's tokens given its prefix (tracks shared/format tokens)."""
        out = {}
        model = self.unwrapped_model
        dev = self.accelerator.device
        for name, (prefix, target) in self.probe_texts.items():
            p_ids = self.tokenizer(prefix, add_special_tokens=False)["input_ids"]
            t_ids = self.tokenizer(target, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([p_ids + t_ids], device=dev)
            logits = model(input_ids=ids).logits[0, len(p_ids) - 1:-1].float() / self.args.resolved_logprob_temperature
            probs = torch.softmax(logits, -1).gather(-1, torch.tensor(t_ids, device=dev).unsqueeze(-1))
            out[f"probe/{name}"] = float(probs.mean())
        return out

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> str:
        """Write ``checkpoint-<step>`` atomically; returns its path.

        Everything goes into ``.tmp-checkpoint-<step>``, is fsynced, and the directory is renamed
        to ``checkpoint-<step>`` (the commit point, see :mod:`gtpo.checkpoint`). If writing fails on
        any process (a full disk, a quota, an I/O error), the temporary directory is removed, the
        older checkpoints are untouched, and :class:`CheckpointError` names what failed, where, and
        the newest intact checkpoint.
        """
        acc, a = self.accelerator, self.args
        final = os.path.join(a.output_dir, f"checkpoint-{self.global_step}")
        tmp = ckpt.temp_dir_for(a.output_dir, self.global_step)

        def stage(write: Callable[[], None]) -> None:
            error = None
            try:
                write()
            except Exception as err:  # noqa: BLE001 -- any write failure (OSError, safetensors', torch's) is reported
                error = err
            self._raise_if_checkpoint_failed(error, final, tmp)

        def make_tmp() -> None:
            if acc.is_main_process:
                # the logs of the steps this checkpoint covers become durable before it does
                for name in ("metrics.jsonl", "completions.jsonl"):
                    path = os.path.join(a.output_dir, name)
                    if os.path.isfile(path):
                        with open(path, "rb") as fh:
                            os.fsync(fh.fileno())
                shutil.rmtree(tmp, ignore_errors=True)
                os.makedirs(tmp)

        def write_files() -> None:
            if acc.is_main_process:
                self.unwrapped_model.save_pretrained(tmp, safe_serialization=True)
                self.tokenizer.save_pretrained(tmp)
                torch.save(self.optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
                torch.save(self.scheduler.state_dict(), os.path.join(tmp, "scheduler.pt"))
            torch.save(ckpt.rng_state(), os.path.join(tmp, f"rng_state_{acc.process_index}.pth"))

        def commit() -> None:
            if acc.is_main_process:
                ckpt.commit(tmp, final, self._state())

        stage(make_tmp)
        stage(write_files)
        stage(commit)
        if acc.is_main_process:
            try:
                ckpt.rotate(a.output_dir, a.save_total_limit)
            except OSError as err:  # the new checkpoint is complete; an old one simply stays
                logger.warning("could not delete old checkpoints in %s: %s", a.output_dir, err)
        acc.wait_for_everyone()
        return final

    def _raise_if_checkpoint_failed(self, error: Exception | None, final: str, tmp: str) -> None:
        """Collective: if writing failed on any process, remove the temporary directory and raise."""
        acc = self.accelerator
        failed = error is not None
        if acc.num_processes > 1:
            failed = bool(acc.reduce(torch.tensor(float(failed), device=acc.device), "max"))
        if not failed:
            return
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        what = ckpt.describe_write_error(error) if error is not None else "a write failure on another process"
        raise CheckpointError(
            f"{what} while writing {os.path.basename(final)} in {self.args.output_dir}; {self._intact_note()} "
            "Free some space (or lower save_total_limit) and resume with resume_from_checkpoint=True "
            "(gtpo train ... --resume_from_checkpoint true)"
        ) from error

    def _intact_note(self) -> str:
        newest = ckpt.latest_checkpoint(self.args.output_dir)
        if newest is None:
            return "no earlier checkpoint exists (the run would restart from step 0)."
        return f"the previous checkpoint {os.path.basename(newest)} is intact ({newest})."

    def _checkpoint_note(self) -> str:
        newest = ckpt.latest_checkpoint(self.args.output_dir)
        if newest is None:
            return "No checkpoint has been written yet."
        return f"The newest complete checkpoint is {newest}."

    def _state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
            "skipped_updates": self.skipped_updates,
            "consecutive_skips": self.consecutive_skips,
            "initial_entropy": self.initial_entropy,
            "no_signal_steps": dict(self.no_signal_steps),
            "sampler": self.sampler.state_dict(),
            "num_processes": self.accelerator.num_processes,
            "config": self.args.to_dict(),
        }

    # fields that may change between a run and its resume without changing what is trained
    _RESUMABLE_CHANGES = frozenset({
        "output_dir", "overwrite_output_dir", "max_steps", "save_steps", "save_total_limit", "logging_steps",
        "report_to", "run_name", "disable_tqdm", "log_completions_steps", "num_completions_to_print", "eval_steps",
        "eval_num_samples", "eval_k", "eval_temperature", "eval_max_new_tokens",
    })

    def load_checkpoint(self, path: str) -> None:
        """Restore weights, optimizer, scheduler, RNG and loop state from ``checkpoint-<step>``.

        Everything a step depends on is restored, so a resumed run continues bitwise as the
        uninterrupted one would (same process count, CPU or deterministic kernels): weights,
        AdamW moments, scheduler, the Python/numpy/torch(/CUDA) RNG states, the data order
        (sampler epoch and position), ``<H>_ini`` and the skip counters.
        """
        state = ckpt.read_state(path)
        acc = self.accelerator
        rng = os.path.join(path, f"rng_state_{acc.process_index}.pth")
        try:
            _load_weights(self.unwrapped_model, path, peft=self.is_peft)
            self.optimizer.load_state_dict(ckpt.load_torch_file(os.path.join(path, "optimizer.pt")))
            self.scheduler.load_state_dict(ckpt.load_torch_file(os.path.join(path, "scheduler.pt")))
            rng_state = ckpt.load_torch_file(rng) if os.path.isfile(rng) else None
            sampler = state["sampler"]
            self.sampler.load_state_dict(sampler)
        except Exception as err:  # noqa: BLE001 -- name the checkpoint and the alternatives
            parent = os.path.dirname(os.path.abspath(path))
            older = [p for _s, p in ckpt.list_checkpoints(parent) if os.path.abspath(p) != os.path.abspath(path)]
            hint = (f" Other complete checkpoints: {', '.join(older)}; resume from one of them with "
                    "resume_from_checkpoint=PATH (--resume_from_checkpoint PATH)." if older else "")
            raise ValueError(f"cannot load checkpoint {path}: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}.{hint}") from err
        if rng_state is not None:
            ckpt.set_rng_state(rng_state)
        else:
            logger.warning("%s has no %s: the random streams restart from the seed (the run stays valid but is "
                           "not bitwise identical to an uninterrupted one)", path, os.path.basename(rng))
        self.global_step = int(state["global_step"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.skipped_updates = int(state.get("skipped_updates", self.skipped_steps))
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        self.initial_entropy = state.get("initial_entropy")
        self.no_signal_steps = {**dict.fromkeys(NO_SIGNAL_REASONS, 0), **state.get("no_signal_steps", {})}
        saved_config = state.get("config") or {}
        current = self.args.to_dict()
        changed = [k for k in current if k in saved_config and k not in self._RESUMABLE_CHANGES
                   and saved_config[k] != current[k]]
        if changed:
            logger.warning("resuming %s with a changed config (%s): training continues, but not as the checkpointed "
                           "run would have", path,
                           ", ".join(f"{k}: {saved_config[k]!r} -> {current[k]!r}" for k in changed))
        if state.get("num_processes", acc.num_processes) != acc.num_processes:
            logger.warning("%s was written by %s processes and is resumed by %d: the data order continues, the "
                           "random streams differ", path, state.get("num_processes"), acc.num_processes)

    # ------------------------------------------------------------------ the loop
    def _check_output_dir(self, resuming: bool) -> None:
        """Refuse an output_dir holding another run, unless resuming or overwriting (all processes)."""
        a, acc = self.args, self.accelerator
        if os.path.exists(a.output_dir) and not os.path.isdir(a.output_dir):
            raise ValueError(f"output_dir {a.output_dir!r} exists and is not a directory; choose another output_dir")
        existing = []
        if not resuming and os.path.isdir(a.output_dir):
            existing = [n for n in os.listdir(a.output_dir) if n in RUN_FILES or n.startswith("checkpoint-")]
        if existing and not a.overwrite_output_dir:
            raise ValueError(
                f"output_dir {a.output_dir!r} already holds a run ({', '.join(sorted(existing)[:3])}); "
                "resume it (resume_from_checkpoint=True / --resume_from_checkpoint true), choose another "
                "output_dir, or set overwrite_output_dir=True (--overwrite) to replace it"
            )
        acc.wait_for_everyone()
        if acc.is_main_process:
            for name in existing:
                path = os.path.join(a.output_dir, name)
                ckpt.remove_checkpoint(path) if os.path.isdir(path) else os.remove(path)
        try:  # every process (no process may wait for one that failed)
            os.makedirs(a.output_dir, exist_ok=True)
        except OSError as err:
            raise ValueError(f"cannot create output_dir {a.output_dir!r}: {err.strerror or err}") from err
        acc.wait_for_everyone()

    def _resolve_resume(self, resume_from_checkpoint) -> str | None:
        value = resume_from_checkpoint
        if isinstance(value, str) and value.strip().lower() in ("false", "no", "none", "null", ""):
            value = None
        if value is None or value is False:
            return None
        if value is True or (isinstance(value, str) and value.strip().lower() == "true"):
            path = ckpt.latest_checkpoint(self.args.output_dir)
            if path is None:
                logger.warning("resume_from_checkpoint=True but %s has no complete checkpoint: starting from step 0",
                               self.args.output_dir)
            return path
        if not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"resume_from_checkpoint must be True, False/None or a checkpoint directory, got {value!r}")
        path = os.fspath(value)
        if not os.path.isdir(path):
            newest = ckpt.latest_checkpoint(self.args.output_dir)
            hint = f"; the newest complete checkpoint of output_dir is {newest}" if newest else ""
            raise ValueError(f"resume_from_checkpoint: {path!r} is not a directory{hint}")
        ckpt.read_state(path)
        return path

    def _drop_later_checkpoints(self, resumed: str) -> None:
        """Resuming from an older checkpoint of output_dir abandons the steps after it: their metrics
        lines are dropped, and so are their checkpoints, so that a later ``resume_from_checkpoint=True``
        cannot pick a checkpoint of the abandoned continuation."""
        a, acc = self.args, self.accelerator
        if os.path.abspath(os.path.dirname(os.path.abspath(resumed))) != os.path.abspath(a.output_dir):
            return
        later = [p for s, p in ckpt.list_checkpoints(a.output_dir) if s > self.global_step]
        if later and acc.is_main_process:
            logger.warning("resuming from step %d: removing the checkpoints of later steps %s (they belong to the "
                           "abandoned continuation of this run)", self.global_step,
                           ", ".join(os.path.basename(p) for p in later))
            for path in later:
                ckpt.remove_checkpoint(path)
        acc.wait_for_everyone()

    def _install_signal_handlers(self) -> dict:
        """SIGTERM/SIGINT: finish the current step, save, return. A second signal: the previous
        handler (default: exit at once; checkpoints are atomic, so nothing is corrupted)."""
        previous = {}

        def handler(signum, _frame):
            self._stop_signal = signum
            for s, h in previous.items():
                signal.signal(s, h)
            logger.warning("received %s: finishing the current step, then saving a checkpoint "
                           "(send it again to stop at once)", signal.Signals(signum).name)

        import threading

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                previous[s] = signal.getsignal(s)
                signal.signal(s, handler)
        return previous

    def _stop_requested(self) -> bool:
        """Whether a stop signal reached any process (one collective per step with several processes)."""
        flag = self._stop_signal is not None
        if self.accelerator.num_processes > 1:
            t = torch.tensor(float(flag), device=self.accelerator.device)
            flag = bool(self.accelerator.reduce(t, "max"))
        return flag

    def _append_log(self, path: str, obj: dict) -> None:
        try:
            _append_jsonl(path, obj)
        except OSError as err:
            raise CheckpointError(
                f"{ckpt.describe_write_error(err)} while appending step {obj.get('step')} to {path}; "
                f"{self._checkpoint_note()} Free some space and resume with resume_from_checkpoint=True "
                "(gtpo train ... --resume_from_checkpoint true)"
            ) from err

    def _nonfinite_message(self) -> str:
        a = self.args
        first = self.global_step - self.consecutive_skips + 1
        steps = f"step {first}" if first == self.global_step else f"steps {first}-{self.global_step}"
        return (
            f"{steps} ({self.consecutive_skips} in a row; max_consecutive_skips={a.max_consecutive_skips}) had a "
            "non-finite (NaN/inf) loss or gradient, so training stops. Non-finite updates are never applied: "
            f"the weights are finite and were last updated at step {first - 1}. {self._checkpoint_note()} "
            "Lower learning_rate, set max_grad_norm, check the reward functions (and bf16), then resume with "
            "resume_from_checkpoint=True (gtpo train ... --resume_from_checkpoint true)"
        )

    def train(self, resume_from_checkpoint: str | bool | None = None) -> dict[str, float]:
        """Run until ``max_steps`` (or a stop signal); returns the last step's metrics.

        Fault tolerance (see docs/fault-tolerance.md): checkpoints are atomic, resume is exact;
        SIGTERM/SIGINT finish the current step, save a checkpoint and return with
        ``self.stopped_early`` set to its path (a second signal stops at once); a step whose loss or
        gradient is NaN/inf is skipped, and ``max_consecutive_skips`` of them in a row raise
        :class:`TrainingStopped`; a checkpoint that cannot be written raises :class:`CheckpointError`
        and leaves the previous one intact.
        """
        from tqdm.auto import tqdm

        a, acc = self.args, self.accelerator
        self.stopped_early = None
        self.stopped_by = None
        self._stop_signal = None
        resume = self._resolve_resume(resume_from_checkpoint)
        asked = resume_from_checkpoint is True or (isinstance(resume_from_checkpoint, str)
                                                   and resume_from_checkpoint.strip().lower() == "true")
        self._check_output_dir(resuming=resume is not None or asked)
        if acc.is_main_process:  # leftovers of a killed run: never loaded, removed here
            ckpt.remove_stale_temps(a.output_dir)
            shutil.rmtree(os.path.join(a.output_dir, ".tmp-final"), ignore_errors=True)
            for name in RUN_FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(a.output_dir, name + ".tmp"))
        acc.wait_for_everyone()
        if resume is not None:
            self.load_checkpoint(resume)
            logger.info("resumed from %s at step %d", resume, self.global_step)
            self._drop_later_checkpoints(resume)
        metrics_path = os.path.join(a.output_dir, "metrics.jsonl")
        if acc.is_main_process:
            try:
                # lines of steps after the checkpoint are re-logged by the resumed run
                _truncate_metrics(metrics_path, self.global_step)
                _truncate_metrics(os.path.join(a.output_dir, "completions.jsonl"), self.global_step)
                ckpt.write_json_atomic(os.path.join(a.output_dir, "run_config.json"),
                                       {**a.to_dict(), "model": str(self.model_name), "reward_funcs": self.reward_names,
                                        "num_processes": acc.num_processes, "dropped_prompts": self.dropped_prompts})
            except OSError as err:
                raise CheckpointError(f"cannot write to output_dir {a.output_dir}: "
                                      f"{ckpt.describe_write_error(err)}") from err
        if a.report_to:
            acc.init_trackers(a.run_name or os.path.basename(os.path.abspath(a.output_dir)), config=a.to_dict())
        previous = self._install_signal_handlers()
        bar = tqdm(total=a.max_steps, initial=self.global_step, disable=a.disable_tqdm or not acc.is_main_process,
                   desc=f"{a.loss_type} training", dynamic_ncols=True)
        metrics: dict[str, float] = {}
        last_saved = self.global_step if resume is not None else -1
        try:
            if self.probe_texts and self.global_step == 0 and acc.is_main_process:
                self._append_log(metrics_path, {"step": 0, **self._probe()})
            while self.global_step < a.max_steps:
                metrics = self.step()
                give_up = self.consecutive_skips >= a.max_consecutive_skips
                if not give_up:
                    if self.eval_dataset is not None and a.eval_steps and self.global_step % a.eval_steps == 0:
                        metrics.update(self.evaluate())
                    if self.probe_texts:
                        metrics.update(self._probe())
                if acc.is_main_process:
                    self._append_log(metrics_path, metrics)
                    if a.log_completions_steps and self.global_step % a.log_completions_steps == 0:
                        self._log_completions()
                if give_up:  # the last good checkpoint stays as it is
                    raise TrainingStopped(self._nonfinite_message())
                if a.report_to and self.global_step % a.logging_steps == 0:
                    acc.log({k: v for k, v in metrics.items() if k != "step"}, step=self.global_step)
                bar.update(1)
                postfix = dict(reward=f"{metrics['reward/mean']:.3f}", entropy=f"{metrics['entropy/mean']:.3f}",
                               step_s=f"{metrics['step_time_s']:.2f}")
                if any(self.no_signal_steps.values()):
                    postfix["no_signal"] = self.no_signal_summary()
                bar.set_postfix(postfix)
                if a.save_steps and self.global_step % a.save_steps == 0:
                    self.save_checkpoint()
                    last_saved = self.global_step
                if self.global_step < a.max_steps and self._stop_requested():
                    if last_saved != self.global_step:
                        self.save_checkpoint()
                    path = os.path.join(a.output_dir, f"checkpoint-{self.global_step}")
                    self.stopped_by = (signal.Signals(self._stop_signal).name if self._stop_signal is not None
                                       else "a signal to another process")
                    logger.warning("stopped by %s after step %d of %d; checkpoint saved in %s. Resume with "
                                   "resume_from_checkpoint=True (gtpo train ... --resume_from_checkpoint true)",
                                   self.stopped_by, self.global_step, a.max_steps, path)
                    self.stopped_early = path
                    return metrics
            self.save_model()
        finally:
            bar.close()
            for s, h in previous.items():
                signal.signal(s, h)
            if a.report_to:
                acc.end_training()
        return metrics

    def no_signal_summary(self) -> str:
        """``'3 (filtered 2, nonfinite 1)'``: steps without gradient signal and why; ``'0'`` if none."""
        total = sum(self.no_signal_steps.values())
        parts = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in self.no_signal_steps.items() if v)
        return f"{total} ({parts})" if total else "0"

    def save_model(self, output_dir: str | None = None) -> None:
        """Save the final model (or adapter) and tokenizer; files replace the old ones atomically.

        A failure (e.g. a full disk) removes the temporary directory and raises
        :class:`CheckpointError`; the checkpoints are untouched, so resuming writes it again.
        """
        out = output_dir or self.args.output_dir
        acc = self.accelerator
        acc.wait_for_everyone()
        if not acc.is_main_process:
            return
        tmp = os.path.join(out, ".tmp-final")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            self.unwrapped_model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            ckpt.fsync_tree(tmp)
            for name in os.listdir(tmp):
                os.replace(os.path.join(tmp, name), os.path.join(out, name))
            os.rmdir(tmp)
            ckpt.fsync_dir(out)
        except Exception as err:  # noqa: BLE001 -- any write failure is reported the same way
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"{ckpt.describe_write_error(err)} while writing the final model to {out}; "
                f"{self._checkpoint_note()} Free some space and resume with resume_from_checkpoint=True "
                "(gtpo train ... --resume_from_checkpoint true) to write it again"
            ) from err

    # ------------------------------------------------------------------ evaluation & logs
    def evaluate(self) -> dict[str, float]:
        """Evaluate on ``eval_dataset``; returns ``eval/*`` metrics."""
        from .evaluation.api import evaluate_during_training

        a = self.args
        return evaluate_during_training(
            self.unwrapped_model, self.tokenizer, self.eval_dataset, n=a.eval_num_samples, k_list=a.eval_k,
            max_new_tokens=a.eval_max_new_tokens or a.max_completion_length, temperature=a.eval_temperature,
            batch_size=a.generation_batch_size or 64, reward_fn=self.eval_reward_func,
        )

    def _log_completions(self) -> None:
        batch = self._last_batch
        g = self.args.group_size
        rows = []
        prompts = self.train_dataset.select(batch.rows)["prompt"]
        for i in range(min(self.args.num_completions_to_print, len(batch.rollout.texts))):
            prompt = prompts[i // g]
            rows.append({
                "step": self.global_step,
                "prompt": prompt if isinstance(prompt, str) else prompt[-1]["content"],
                "completion": batch.rollout.texts[i],
                "reward": float(batch.rewards[i]),
            })
        path = os.path.join(self.args.output_dir, "completions.jsonl")
        for row in rows:
            self._append_log(path, row)


# ----------------------------------------------------------------------------- helpers
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _user_frame(err: BaseException) -> str:
    """`` at file.py:12 in fn`` for the frame of the reward function that raised (its own code)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename != __file__]  # not the trainer's
    if not frames:
        return ""
    own, deepest = frames[0], frames[-1]
    where = f" at {os.path.basename(own.filename)}:{own.lineno} in {own.name}"
    if deepest is not own:
        where += f" (raised in {os.path.basename(deepest.filename)}:{deepest.lineno} in {deepest.name})"
    return where


def _reward_values(out: Any, name: str, n: int, rows: list[int], g: int, step: int) -> list:
    """The N values returned by reward function ``name`` as a list (a list/tuple, or a 1-D tensor/array)."""
    if isinstance(out, torch.Tensor) or type(out).__module__ == "numpy":
        shape = tuple(out.shape)
        if len(shape) != 1:
            raise RewardFunctionError(
                f"reward function {name!r} returned a {type(out).__name__} of shape {shape} at step {step}; "
                f"expected a list of {n} floats or None (one per completion)"
            )
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(out).__name__} ({out!r:.80}) at step {step}; expected a "
            f"list of {n} floats or None (one per completion)"
        )
    if len(out) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(out)} values for {n} completions at step {step} "
            f"({len(rows)} prompts x group_size {g}; dataset rows {rows}); return one value per completion"
        )
    return list(out)


def _reward_value(v: Any, name: str, i: int, rows: list[int], g: int, step: int) -> float:
    """One reward as a float (NaN for None), or RewardFunctionError naming completion ``i`` and its prompt."""
    where = f"for completion {i} (prompt index {i // g}, dataset row {rows[i // g]}, step {step})"
    if v is None:
        return float("nan")
    if isinstance(v, torch.Tensor) or type(v).__module__ == "numpy":
        if getattr(v, "ndim", 0) == 0 or (hasattr(v, "numel") and v.numel() == 1) or getattr(v, "size", 0) == 1:
            try:
                v = v.item()
            except (ValueError, RuntimeError):
                pass
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        v = float(bool(v))
    if not isinstance(v, numbers.Real):
        raise RewardFunctionError(
            f"reward function {name!r} returned {v!r:.80} ({type(v).__name__}) {where}; expected a float or None"
        )
    try:
        v = float(v)
    except (OverflowError, ValueError, TypeError) as err:  # e.g. an int beyond the float range
        raise RewardFunctionError(
            f"reward function {name!r} returned {v!r:.80} {where}, which is not a float ({err})") from err
    if not math.isfinite(v):
        raise RewardFunctionError(
            f"reward function {name!r} returned {v} {where}; rewards must be finite (or None to skip a completion)"
        )
    if abs(v) > _FLOAT32_MAX:
        raise RewardFunctionError(f"reward function {name!r} returned {v} {where}, beyond the float32 range")
    return v


def _group_varies(rewards: torch.Tensor, p: int, g: int) -> bool:
    grp = rewards[p * g:(p + 1) * g]
    return bool((grp.max() - grp.min()) > 1e-8)


def batch_group(batch: ScoredBatch, p: int, g: int) -> ScoredBatch:
    """The ``p``-th group of a batch as a batch of one prompt."""
    sl = slice(p * g, (p + 1) * g)
    r = batch.rollout
    return ScoredBatch(
        Rollout(r.prompt_ids[sl], r.prompt_mask[sl], r.completion_ids[sl], r.completion_mask[sl], r.truncated[sl],
                r.texts[sl]),
        [batch.rows[p]], batch.rewards[sl], batch.per_func[sl],
    )


def cat_groups(groups: list[ScoredBatch], pad_id: int) -> ScoredBatch:
    """Concatenate batches, re-padding prompts on the left and completions on the right."""
    width_s = max(b.rollout.prompt_ids.shape[1] for b in groups)
    width_t = max(b.rollout.completion_ids.shape[1] for b in groups)
    pad = torch.nn.functional.pad
    r = [b.rollout for b in groups]
    rollout = Rollout(
        torch.cat([pad(x.prompt_ids, (width_s - x.prompt_ids.shape[1], 0), value=pad_id) for x in r]),
        torch.cat([pad(x.prompt_mask, (width_s - x.prompt_mask.shape[1], 0), value=0) for x in r]),
        torch.cat([pad(x.completion_ids, (0, width_t - x.completion_ids.shape[1]), value=pad_id) for x in r]),
        torch.cat([pad(x.completion_mask, (0, width_t - x.completion_mask.shape[1]), value=0) for x in r]),
        torch.cat([x.truncated for x in r]),
        [t for x in r for t in x.texts],
    )
    return ScoredBatch(rollout, [row for b in groups for row in b.rows],
                       torch.cat([b.rewards for b in groups]), torch.cat([b.per_func for b in groups]))


def _append_jsonl(path: str, obj: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(obj, default=float) + "\n")
        fh.flush()


def _truncate_metrics(path: str, step: int) -> None:
    """Keep only lines of steps <= ``step`` of a JSON-lines log (a resumed run re-logs the later ones).

    Starting from step 0 keeps nothing (the step-0 probe line is written again); a line cut by a
    kill is dropped.
    """
    if not os.path.isfile(path):
        return
    kept = []
    with open(path) as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if step > 0 and isinstance(obj, dict) and obj.get("step", 0) <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write("".join(kept))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _load_weights(model: nn.Module, path: str, *, peft: bool) -> None:
    """Load weights saved by ``save_pretrained`` in ``path`` into ``model`` exactly."""
    from safetensors.torch import load_file

    if peft:
        from peft import set_peft_model_state_dict

        file = os.path.join(path, "adapter_model.safetensors")
        if not os.path.isfile(file):
            raise ValueError(f"checkpoint {path} has no adapter_model.safetensors (was it saved from a LoRA run?)")
        set_peft_model_state_dict(model, load_file(file))
        return
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"checkpoint {path} has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(os.path.join(path, f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set()
    if getattr(model.config, "tie_word_embeddings", False):
        tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
