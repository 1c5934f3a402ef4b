"""Scoring completions: reward functions under TRL's contract, their validation, DAPO's overlong penalty.

Each reward function gets TRL's call ``f(prompts=, completions=, completion_ids=, **dataset_columns)``
and returns one value per completion: a real number (Python, numpy or a one-element tensor; bools
count as 0/1, as in TRL) or None (not scored by this function). As in TRL, a function may be
``async def``: the async functions of a step run concurrently (``asyncio.gather``) on an event loop
of their own, kept for the scorer's lifetime (a daemon thread), so that they may hold loop-bound
clients between steps. A sequence-classification model is a reward too
(:class:`SequenceClassificationReward`: its logit on the prompt + completion, as TRL scores it). The reward is the weighted sum of
the functions' values. Anything unusable raises :class:`gtpo.errors.RewardFunctionError` naming
the function, the completion, its prompt index in the step, its dataset row and, when the function
raised, the line of its own code that raised and the first prompt it fails on.

:class:`ScoredBatch` is a rollout with its rewards; DAPO's dynamic sampling takes its groups apart
(:meth:`ScoredBatch.group`) and puts the kept ones together (:meth:`ScoredBatch.concat`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import os
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import RewardFunctionError
from ..sampling.rollout import Rollout

__all__ = ["RewardScorer", "ScoredBatch", "SequenceClassificationReward", "overlong_penalty"]


@dataclass
class ScoredBatch:
    """A rollout with its rewards. ``rewards (N,)``, ``per_func (N, F)`` (NaN: not scored by that
    function); ``rows``: the dataset row of each prompt (``P`` entries); rows prompt-major."""

    rollout: Rollout
    rows: list[int]
    rewards: torch.Tensor
    per_func: torch.Tensor

    def group(self, p: int, g: int) -> "ScoredBatch":
        """The ``p``-th group (``g`` rows) as a batch of one prompt."""
        sl = slice(p * g, (p + 1) * g)
        r = self.rollout
        return ScoredBatch(
            Rollout(r.prompt_ids[sl], r.prompt_mask[sl], r.completion_ids[sl], r.completion_mask[sl],
                    r.truncated[sl], r.texts[sl], None if r.sampling_logp is None else r.sampling_logp[sl],
                    None if r.agent is None else r.agent.rows(sl)),
            [self.rows[p]], self.rewards[sl], self.per_func[sl],
        )

    def group_varies(self, p: int, g: int) -> bool:
        """Whether the rewards of the ``p``-th group differ (a zero-variance group does not)."""
        grp = self.rewards[p * g:(p + 1) * g]
        return bool((grp.max() - grp.min()) > 1e-8)

    @staticmethod
    def concat(batches: list["ScoredBatch"], pad_id: int) -> "ScoredBatch":
        """One batch of ``batches``, prompts re-padded on the left and completions on the right."""
        width_s = max(b.rollout.prompt_ids.shape[1] for b in batches)
        width_t = max(b.rollout.completion_ids.shape[1] for b in batches)
        pad = torch.nn.functional.pad
        r = [b.rollout for b in batches]
        rollout = Rollout(
            torch.cat([pad(x.prompt_ids, (width_s - x.prompt_ids.shape[1], 0), value=pad_id) for x in r]),
            torch.cat([pad(x.prompt_mask, (width_s - x.prompt_mask.shape[1], 0), value=0) for x in r]),
            torch.cat([pad(x.completion_ids, (0, width_t - x.completion_ids.shape[1]), value=pad_id) for x in r]),
            torch.cat([pad(x.completion_mask, (0, width_t - x.completion_mask.shape[1]), value=0) for x in r]),
            torch.cat([x.truncated for x in r]),
            [t for x in r for t in x.texts],
            None if any(x.sampling_logp is None for x in r) else
            torch.cat([pad(x.sampling_logp, (0, width_t - x.sampling_logp.shape[1]), value=0.0) for x in r]),
            None if any(x.agent is None for x in r) else type(r[0].agent).concat([x.agent for x in r], width_t),
        )
        return ScoredBatch(rollout, [row for b in batches for row in b.rows],
                           torch.cat([b.rewards for b in batches]), torch.cat([b.per_func for b in batches]))


def overlong_penalty(lengths: torch.Tensor, *, max_completion_length: int, buffer_length: int,
                     penalty_factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025): ``(N,)`` penalties for completion
    ``lengths (N,)``: 0 up to ``max_completion_length - buffer_length`` tokens, then falling
    linearly to ``-penalty_factor`` at ``max_completion_length``."""
    start = max_completion_length - buffer_length
    over = (lengths.float() - start).clamp(min=0) / buffer_length
    return -penalty_factor * over.clamp(max=1.0)


def unwrap(result: Any) -> Any:
    """``result`` of :meth:`_EventLoop.run`, raising it when it is the exception an awaitable raised."""
    if isinstance(result, BaseException):
        raise result
    return result


def reward_name(func: Callable) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def is_async_reward(func: Callable) -> bool:
    """Whether calling ``func`` gives a coroutine: an ``async def`` function or a callable object whose
    ``__call__`` is one (``functools.partial`` of either included)."""
    while hasattr(func, "func") and not inspect.isfunction(func):  # functools.partial
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


class _EventLoop:
    """An asyncio loop on a daemon thread, started at the first :meth:`run` (async reward functions; TRL runs
    them the same way, so that a running loop of the caller, e.g. Jupyter's, does not matter)."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None

    def run(self, awaitables: list) -> list:
        """Await ``awaitables`` concurrently; returns their results in order (an exception in place of a result
        that raised)."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="gtpo-async-rewards", daemon=True).start()

        async def gather():
            return await asyncio.gather(*awaitables, return_exceptions=True)

        return asyncio.run_coroutine_threadsafe(gather(), self.loop).result()


class SequenceClassificationReward:
    """A sequence-classification model as a reward function (TRL's contract): the reward of a completion is the
    model's first logit on the prompt followed by the completion, as TRL's ``GRPOTrainer`` scores a reward model.

    Standard prompts are scored on ``prompt + completion``; conversational ones on the reward tokenizer's chat
    template of the prompt messages plus the completion's. Texts are tokenized without special tokens, padded on
    the right (the model reads the last non-pad token: ``model.config.pad_token_id`` is set to the tokenizer's).
    The model runs in inference mode on the run's device (the policy's accelerator device, as TRL prepares reward
    models with its accelerator; :meth:`place`): the tokenized texts are sent to the model's device and the scores
    come back to the host. Rollouts live on the host, so the model never follows their device.

    Args:
        model: a ``transformers`` ``...ForSequenceClassification`` model (``num_labels=1`` as TRL loads it).
        tokenizer: its tokenizer; loaded from ``model.config._name_or_path`` when None. A tokenizer without a pad
            token pads with its EOS token.
        name: the reward's name in metrics (default: the last part of the model's path or hub id).
    """

    def __init__(self, model, tokenizer=None, *, name: str | None = None):
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model.config._name_or_path)
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token is None:
                raise ValueError(f"reward model {model.config._name_or_path!r}: its tokenizer has neither a pad "
                                 "nor an EOS token; give a tokenizer with a pad token")
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.__name__ = name or str(model.config._name_or_path).rstrip("/").split("/")[-1] or type(model).__name__

    @classmethod
    def from_pretrained(cls, path: str, **model_kwargs) -> "SequenceClassificationReward":
        """Load a reward model (``AutoModelForSequenceClassification``, ``num_labels=1``) and its tokenizer from a
        local directory or a hub id; ValueError naming ``path`` when it is not a sequence-classification model."""
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        try:
            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as err:
            raise ValueError(f"reward model {path!r}: cannot read its config: {str(err).splitlines()[0]}") from err
        if not any(a.endswith("ForSequenceClassification") for a in (config.architectures or [])):
            raise ValueError(f"reward model {path!r}: expected a sequence-classification model (architectures "
                             f"...ForSequenceClassification), got {config.architectures}")
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **model_kwargs)
        return cls(model, AutoTokenizer.from_pretrained(path))

    def place(self, device) -> None:
        """Move the model to ``device`` (the run's: the policy's accelerator device) if it is elsewhere."""
        if next(self.model.parameters()).device != torch.device(device):
            self.model.to(device)

    def texts(self, prompts: list, completions: list) -> list[str]:
        """The texts the model scores, one per completion (see the class docstring)."""
        out = []
        for prompt, completion in zip(prompts, completions):
            if isinstance(prompt, str):
                out.append(prompt + (completion if isinstance(completion, str) else completion[-1]["content"]))
            else:
                messages = list(prompt) + (list(completion) if not isinstance(completion, str)
                                           else [{"role": "assistant", "content": completion}])
                out.append(self.tokenizer.apply_chat_template(messages, tokenize=False))
        return out

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        enc = self.tokenizer(self.texts(prompts, completions), return_tensors="pt", padding=True,
                             padding_side="right", add_special_tokens=False)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            logits = self.model(**{k: v.to(device) for k, v in enc.items()}).logits  # (N, num_labels)
        return logits[:, 0].float().cpu().tolist()


class RewardScorer:
    """Reward functions with their weights; called on a rollout it returns the rewards.

    Args:
        funcs: callables with TRL's contract (see the module docstring).
        weights: one weight per function (default all 1); must be finite in float32.
        device: the run's device (the policy's); sequence-classification reward models are placed there once and
            their inputs sent to them (None: they stay where they are).
    """

    def __init__(self, funcs: list[Callable], weights: list[float] | None = None, *, device=None):
        if not funcs:
            raise ValueError("reward_funcs is empty: give at least one reward function")
        self.funcs = [SequenceClassificationReward(f) if isinstance(f, torch.nn.Module) else f for f in funcs]
        if device is not None:
            for f in self.funcs:
                if isinstance(f, SequenceClassificationReward):
                    f.place(device)
        self._loop = _EventLoop()
        self.names = [reward_name(f) for f in self.funcs]
        weights = weights if weights is not None else [1.0] * len(self.funcs)
        if len(weights) != len(self.funcs):
            raise ValueError(f"GTPOConfig.reward_weights has {len(weights)} entries but there are {len(self.funcs)} "
                             f"reward functions ({self.names})")
        self.weights = torch.tensor(weights, dtype=torch.float32)  # (F,)
        if not torch.isfinite(self.weights).all():
            raise ValueError(f"GTPOConfig.reward_weights {list(weights)} do not fit in float32")

    def __call__(self, rollout: Rollout, prompts: list, columns: dict[str, list], *, rows: list[int], group_size: int,
                 step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``rewards (N,)`` (weighted sum, NaN-free) and ``per_func (N, F)`` (NaN where a function
        returned None) for the completions of ``rollout``.

        ``prompts`` and ``columns`` (the dataset's other columns) hold one entry per PROMPT
        (``P``); ``rows`` are their dataset rows and ``step`` the training step, both for messages.

        Each reward function gets TRL's call ``f(prompts=, completions=, completion_ids=,
        **dataset_columns)`` and must return N values, each a real number (Python, numpy or a
        one-element tensor; bools count as 0/1, as in TRL) or None (not scored by this function).
        Anything else raises :class:`RewardFunctionError` naming the function, the completion, its
        prompt index in the step and its dataset row.
        """
        g = group_size
        columns = {k: [v for v in values for _ in range(g)] for k, values in columns.items()}
        prompts = [p for p in prompts for _ in range(g)]
        conversational = not isinstance(prompts[0], str)
        completions = [[{"role": "assistant", "content": t}] for t in rollout.texts] if conversational else rollout.texts
        agent = rollout.agent
        if agent is not None:  # multi-turn: the whole conversation after the prompt (TRL's completions)
            if agent.conversations is not None:
                completions = agent.conversations
            if agent.environments is not None:  # TRL passes each completion's environment
                columns = {**columns, "environments": agent.environments}
            if agent.fields:  # a rollout_func's extra keys (TRL's extra_fields)
                columns = {**columns, **agent.fields}
        ids = [c[m.bool()].tolist() for c, m in zip(rollout.completion_ids, rollout.completion_mask)]
        n = len(prompts)
        per_func = torch.empty((n, len(self.funcs)), dtype=torch.float32)

        def call(sl: slice, func):
            out = func(prompts=prompts[sl], completions=completions[sl], completion_ids=ids[sl],
                       **{k: v[sl] for k, v in columns.items()})
            return unwrap(self._loop.run([out])[0]) if inspect.isawaitable(out) else out

        # the async functions of the step run concurrently, started before the others (as TRL gathers them)
        pending = [j for j, f in enumerate(self.funcs) if is_async_reward(f)]
        gathered = dict(zip(pending, self._loop.run([
            self.funcs[j](prompts=prompts, completions=completions, completion_ids=ids, **columns)
            for j in pending]))) if pending else {}
        for j, (func, name) in enumerate(zip(self.funcs, self.names)):
            one = functools.partial(call, func=func)
            try:
                out = unwrap(gathered[j]) if j in gathered else one(slice(None))
            except Exception as err:  # name the function and the prompt; keep the original traceback chained
                raise RewardFunctionError(_raised_message(name, err, one, rows, prompts, g, step)) from err
            out = _reward_values(out, name, n, rows, g, step)
            for i, v in enumerate(out):
                per_func[i, j] = _reward_value(v, name, i, rows, g, step)
        all_none = torch.isnan(per_func).all(dim=1)
        if all_none.any():
            i = int(all_none.nonzero()[0])
            raise RewardFunctionError(
                f"every reward function returned None for completion {i} (prompt index {i // g}, dataset row "
                f"{rows[i // g]}, step {step}); at least one must score each completion ({self.names})"
            )
        rewards = (torch.nan_to_num(per_func, nan=0.0) * self.weights).sum(dim=1)
        if not torch.isfinite(rewards).all():
            i = int((~torch.isfinite(rewards)).nonzero()[0])
            raise RewardFunctionError(
                f"the weighted sum of the rewards of completion {i} (prompt index {i // g}, dataset row {rows[i // g]}, "
                f"step {step}) overflows float32: {dict(zip(self.names, per_func[i].tolist()))} with "
                f"reward_weights {self.weights.tolist()}; rescale the reward functions"
            )
        return rewards, per_func


def _raised_message(name: str, err: Exception, call: Callable, rows: list[int], prompts: list, g: int,
                    step: int) -> str:
    """Say which reward function raised what, where in its code, and on which prompt.

    The batch call gives no prompt index, so the function is called again one prompt group at
    a time (only on this error path) to find the first prompt it fails on.
    """
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


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _user_frame(err: BaseException) -> str:
    """`` at file.py:12 in fn`` for the frame of the reward function that raised (its own code)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename != __file__]  # not this module's
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
