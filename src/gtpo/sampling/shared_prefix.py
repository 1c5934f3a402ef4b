"""A prompt shared by the G rows of a group, computed once: key/value caches and their groups.

The G completions of a prompt share its tokens, so both passes over a rollout compute each
prompt once per group instead of G times [D]:

* sampling (:func:`gtpo.sampling.decode.prefill_shared`) runs the decoder once over each distinct prompt
  (all but its last token) and copies the key/value cache to the G rows of the group;
* the training forward (:func:`gtpo.sampling.policy.completion_hidden_states`) does the same WITH
  gradients: the cache rows of a group are an index-select of one prompt forward, so autograd
  sums the G gradients into it. The result equals the plain forward over the ``(N, S + T)`` batch
  up to float rounding, with ``(G-1)/G`` of the prompt tokens' forward and backward work saved.

Sharing falls back to the plain computation where it would not be exact or is not supported: no
two consecutive rows with the same prompt, a prompt of one token, caches other than plain
full-attention ``DynamicCache`` layers (sliding-window, linear-attention, static caches),
gradient checkpointing, or active dropout (training forward).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn

__all__ = ["cache_kwarg", "plain_dynamic_cache", "prompt_groups", "sharing_is_exact", "shared_prompt_cache"]


@torch.compiler.assume_constant_result  # torch.compile (torch_compile) takes its value, not its lru_cache
@functools.lru_cache(maxsize=None)
def cache_kwarg() -> str:
    """Name of the cache argument of transformers models: ``"cache"`` (transformers >= 5.2x,
    where ``past_key_values`` is a deprecated alias) or ``"past_key_values"`` (older)."""
    from transformers import GenerationMixin

    params = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return "cache" if "cache" in params else "past_key_values"


def plain_dynamic_cache(config):
    """An empty ``DynamicCache`` for ``config`` whose layers are all plain full-attention
    ``DynamicLayer``s (exactly what a prompt prefix can be shared in), else None."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        return None
    try:
        cache = DynamicCache(config=config)
    except TypeError:  # a transformers version without per-layer cache types
        return None
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return cache


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Runs of consecutive identical prompt rows (the G rows of a group, prompt-major).

    Args:
        prompt_ids: ``(N, S)`` left-padded prompt ids.
        prompt_mask: ``(N, S)`` 1 on prompt tokens.

    Returns:
        ``first (U,)`` int64, the first row of each run, and ``inverse (N,)`` int64, the run of
        each row (``prompt_ids[first][inverse] == prompt_ids``); None when every row differs from
        the previous one (nothing to share). Rows count as equal only if ids AND mask are equal
        (a pad id can be a real token: EOS == PAD). One host sync (the number of runs).
    """
    n = prompt_ids.shape[0]
    if n < 2 or prompt_ids.shape[1] == 0:
        return None
    same_ids = (prompt_ids[1:] == prompt_ids[:-1]).all(dim=1)  # (N-1,) row i+1 equals row i
    same = same_ids & (prompt_mask[1:] == prompt_mask[:-1]).all(dim=1)  # (N-1,)
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=same.device), ~same])  # (N,) a run starts here
    first = starts.nonzero().squeeze(1)  # (U,)
    if first.shape[0] == n:
        return None
    inverse = starts.long().cumsum(0) - 1  # (N,)
    return first, inverse


def sharing_is_exact(module: nn.Module) -> bool:
    """False when a training forward of ``module`` would differ between one prompt forward
    shared by G rows and G separate ones: active dropout (a different mask per row) or gradient
    checkpointing (transformers then turns the cache off)."""
    if not module.training:
        return True
    config = getattr(module, "config", None)
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        return False
    for m in module.modules():
        if getattr(m, "gradient_checkpointing", False) is True:
            return False
        if isinstance(m, nn.Dropout) and m.p > 0:
            return False
    return True


def shared_prompt_cache(decoder: nn.Module, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                        groups: tuple[torch.Tensor, torch.Tensor]):
    """Key/value cache of the prompt prefix ``ids (N, L)``, computed once per group.

    Runs ``decoder`` (the transformer body of a causal LM, ``model.get_decoder()``) over the
    ``U`` distinct rows ``ids[first]`` with a fresh ``DynamicCache``, then index-selects the
    cache rows with ``inverse`` so that it holds ``N`` rows: row i's keys/values are those of its
    group's prompt. Under autograd the selection is differentiable (its backward sums the rows of
    a group), so gradients reach the single prompt forward exactly as they would reach G copies.

    Args:
        decoder: the decoder module (takes ``input_ids``, ``attention_mask``, ``position_ids``,
            the cache and ``use_cache``).
        ids: ``(N, L)`` prefix ids; ``mask (N, L)``; ``positions (N, L)`` (:func:`position_ids`).
        groups: ``(first (U,), inverse (N,))`` from :func:`prompt_groups`.

    Returns:
        The filled cache (``N`` rows, ``L`` positions), or None when the model's cache is not a
        plain full-attention ``DynamicCache`` (the caller then runs the plain forward).
    """
    cache = plain_dynamic_cache(decoder.config)
    if cache is None:
        return None
    first, inverse = groups
    decoder(input_ids=ids[first], attention_mask=mask[first], position_ids=positions[first],
            use_cache=True, **{cache_kwarg(): cache})
    cache.batch_select_indices(inverse)
    return cache
