"""The decoding loop: sampling completions from a causal LM's forward over its key/value cache.

Sampling runs in :func:`decode`, a decoding loop over the model's forward and its ``DynamicCache``
with transformers' own logits processors, where :func:`decode_loop_config` finds the settings
covered (temperature, top-k, top-p, minimum lengths; otherwise the caller uses
``model.generate``). It computes what ``generate`` computes, without its per-token bookkeeping,
with inverse-CDF sampling (:func:`sample_categorical`) instead of ``torch.multinomial``, and rows
that reached EOS leave the batch: the decoding work follows the unfinished rows, not the longest
one. The same distribution as ``generate``, another random stream. :func:`prefill` and
:func:`prefill_shared` fill the cache with the prompts (the latter once per group of identical
prompts, :mod:`gtpo.shared_prefix`).
"""

from __future__ import annotations

import inspect

import torch

from .models import unwrap_peft
from .padding import position_ids
from .shared_prefix import cache_kwarg, plain_dynamic_cache, prompt_groups, shared_prompt_cache

__all__ = ["decode", "decode_loop_config", "prefill", "prefill_shared", "sample_categorical"]


def prefill_shared(model, ids: torch.Tensor, mask: torch.Tensor):
    """The prompt cache of ``ids (N, S)`` without its last column, one decoder pass per group of
    identical rows, expanded to the N rows; None when there is nothing to share or the model's
    generation uses another cache (sliding window, static, linear attention) or none."""
    width = ids.shape[1]
    gen_config = getattr(model, "generation_config", None)
    if width < 2 or getattr(gen_config, "cache_implementation", None) is not None:
        return None
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False) or not hasattr(model, "get_decoder"):
        return None
    groups = prompt_groups(ids[:, :-1], mask[:, :-1])
    if groups is None:
        return None
    return shared_prompt_cache(model.get_decoder(), ids[:, :-1], mask[:, :-1], position_ids(mask)[:, :-1], groups)


def prefill(model, ids: torch.Tensor, mask: torch.Tensor):
    """The cache of ``ids (N, S)`` without its last column, every row computed (no sharing); an
    empty cache for one-token prompts. None when the model's cache is not a plain ``DynamicCache``."""
    cache = plain_dynamic_cache(model.config)
    if cache is None or ids.shape[1] < 2:
        return cache
    model.get_decoder()(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids(mask)[:, :-1],
                        use_cache=True, **{cache_kwarg(): cache})
    return cache


# GenerationConfig fields :func:`decode` implements (any value) ...
_LOOP_FIELDS = frozenset({"max_new_tokens", "min_new_tokens", "min_length", "do_sample", "temperature", "top_k",
                          "top_p", "eos_token_id", "pad_token_id", "bos_token_id"})
# ... fields it supports at one value only (the value that changes nothing) ...
_LOOP_NEUTRAL = {"repetition_penalty": 1.0, "num_beams": 1, "num_return_sequences": 1, "use_cache": True,
                 "output_attentions": False, "output_hidden_states": False, "output_scores": False,
                 "output_logits": False, "return_dict_in_generate": False, "renormalize_logits": False,
                 "remove_invalid_values": False}
# ... and fields without effect on sampling with ``max_new_tokens`` set and one beam.
_LOOP_IGNORED = frozenset({"transformers_version", "_from_model_config", "max_length", "early_stopping",
                           "length_penalty", "decoder_start_token_id"})


def decode_loop_config(model, gen_config):
    """The generation config :func:`decode` would sample with, or None where it does not apply.

    The config is ``gen_config`` completed with the model's own ``generation_config`` for the
    fields ``gen_config`` leaves unset, exactly as ``model.generate`` completes it (so the
    bench model's ``min_new_tokens``, or a checkpoint's, is honoured). :func:`decode` applies
    when the model is a decoder-only LM with ``get_decoder()`` whose key/value cache is a plain
    full-attention ``DynamicCache``, its forward takes ``logits_to_keep``, ``max_new_tokens`` is
    set, and the completed config sets nothing but ``max_new_tokens``, ``min_new_tokens``,
    ``min_length``, ``do_sample``, ``temperature``, ``top_k``, ``top_p`` and the special token ids
    (``repetition_penalty`` 1, one beam, one sequence per row, no extra outputs). Anything else
    (repetition penalty, bad words, min-p, beams, sliding-window or static caches,
    encoder-decoders, ...) returns None: the caller uses ``model.generate``.
    """
    import copy

    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) or not hasattr(model, "get_decoder"):
        return None
    if plain_dynamic_cache(config) is None:
        return None
    base = unwrap_peft(model)
    if "logits_to_keep" not in inspect.signature(base.forward).parameters:
        return None
    merged = copy.deepcopy(gen_config)
    own = getattr(model, "generation_config", None)
    if own is not None:
        merged.update(**own.to_dict(), defaults_only=True, allow_custom_entries=True)
    if merged.max_new_tokens is None:
        return None
    for key, value in merged.to_diff_dict().items():
        if key in _LOOP_FIELDS or key in _LOOP_IGNORED or value is None:
            continue
        if key in _LOOP_NEUTRAL and value == _LOOP_NEUTRAL[key]:
            continue
        return None
    return merged


def _processors(config, prompt_width: int, eos: torch.Tensor):
    """transformers' logits processors for the fields :func:`decode` implements, in the order
    ``generate`` applies them (EOS suppression, then temperature, top-k, top-p)."""
    from transformers import (LogitsProcessorList, MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor,
                              TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    processors = LogitsProcessorList()
    if config.min_length is not None and config.min_length > 0:
        processors.append(MinLengthLogitsProcessor(config.min_length, eos, device=eos.device))
    if config.min_new_tokens is not None and config.min_new_tokens > 0:
        processors.append(MinNewTokensLengthLogitsProcessor(prompt_width, config.min_new_tokens, eos,
                                                            device=eos.device))
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k is not None and config.top_k != 0:
            processors.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
        if config.top_p is not None and config.top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    return processors


def sample_categorical(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs (n, V)``, drawn from the categorical distribution of the row.

    Inverse-CDF sampling: ``u`` uniform on ``[0, total)`` per row, the first index whose cumulative
    mass exceeds ``u``. Exactly the categorical distribution up to float32 rounding of the
    cumulative sums; an index of zero probability (filtered by top-k/top-p) is never drawn, since
    its cumulative mass equals the previous one. One uniform number per row where
    ``torch.multinomial`` draws V exponentials per row: 0.8 ms against 31 ms for 32 rows of
    SmolLM2's 49,152 tokens on 2 CPU threads.

    Args:
        probs: ``(n, V)`` non-negative weights (rows need not sum to 1).

    Returns:
        ``(n,)`` int64 indices.

    Raises:
        RuntimeError: a row has a NaN/inf weight or no positive mass (the message names them, as
            ``torch.multinomial``'s does, so callers that catch non-finite probabilities keep working).
    """
    cdf = probs.cumsum(dim=-1)  # (n, V)
    total = cdf[:, -1:]  # (n, 1)
    if not bool(torch.isfinite(total).all() & (total > 0).all()):
        raise RuntimeError("probability tensor contains either inf, nan or element < 0, or a row sums to 0")
    u = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device) * total  # (n, 1) in [0, total)
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache, config, *,
           eos_ids: list[int], pad_id: int) -> torch.Tensor:
    """Sample completions token by token from the model's forward and key/value cache.

    The computation of transformers' ``generate`` sampling loop for the settings of
    :func:`decode_loop_config` — the model's forward on the last token with the 2-D attention
    mask and position ids ``cumsum(mask) - 1`` continued by one per token, float32 logits of the
    last position, transformers' own logits processors (:func:`_processors`), ``softmax`` and a
    draw from it (or ``argmax`` when ``config.do_sample`` is false) — with three differences:

    * no per-token bookkeeping of ``generate`` (input preparation, keyword updates, stopping
      criteria objects): ~15 % of a rollout of the tiny models of ``bench/``;
    * the draw is :func:`sample_categorical` (inverse CDF, one uniform number per row) instead of
      ``torch.multinomial`` (V exponentials per row, ~30 ms per token at SmolLM2's vocabulary):
      the same distribution from another random stream;
    * a row that has produced EOS leaves the batch (its cache rows are dropped), so the decoding
      work follows the number of unfinished rows instead of the longest one.

    With ``sample_categorical`` replaced by ``torch.multinomial`` and no row ending early, the
    tokens are exactly ``generate``'s for the same seed; greedy decoding gives ``generate``'s
    tokens whatever rows end when (both tested).

    Args:
        model: a decoder-only causal LM (``PreTrainedModel`` or peft model) in eval mode.
        input_ids: ``(N, S)`` left-padded prompt ids; ``attention_mask (N, S)``.
        cache: a ``DynamicCache`` holding the first ``S - 1`` columns of the prompt rows.
        config: a completed ``GenerationConfig`` from :func:`decode_loop_config`.
        eos_ids: token ids that end a completion; ``pad_id`` fills positions after the end.

    Returns:
        ``(N, T')`` sampled ids, ``T' <= max_new_tokens`` the number of decoding steps run (the
        longest completion); a row's tokens after its first EOS are ``pad_id``.
    """
    n, width = input_ids.shape
    device = input_ids.device
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    processors = _processors(config, width, eos)
    max_new = int(config.max_new_tokens)
    out = torch.full((n, max_new), pad_id, dtype=torch.long, device=device)  # (N, T)
    if max_new == 0:
        return out
    rows = torch.arange(n, device=device)  # (n,) the batch row of each unfinished row
    seq = input_ids  # (n, S + t) prompt and tokens so far (the processors' view)
    mask = attention_mask.long()  # (n, S + t)
    position = position_ids(mask)[:, -1:]  # (n, 1) position of the token fed next
    token = input_ids[:, -1:]  # (n, 1)
    kwarg = cache_kwarg()
    steps = 0
    for t in range(max_new):
        logits = model(input_ids=token, attention_mask=mask, position_ids=position, use_cache=True,
                       logits_to_keep=1, **{kwarg: cache}).logits  # (n, 1, V)
        scores = processors(seq, logits[:, -1].to(dtype=torch.float32))  # (n, V)
        if config.do_sample:
            nxt = sample_categorical(torch.softmax(scores, dim=-1))  # (n,)
        else:
            nxt = scores.argmax(dim=-1)
        out[rows, t] = nxt
        steps = t + 1
        if steps == max_new:
            break
        done = torch.isin(nxt, eos)  # (n,)
        if bool(done.any()):
            if bool(done.all()):
                break
            keep = (~done).nonzero().squeeze(1)  # (n',)
            cache.batch_select_indices(keep)
            rows, seq, mask, position, nxt = rows[keep], seq[keep], mask[keep], position[keep], nxt[keep]
        token = nxt.unsqueeze(1)
        seq = torch.cat([seq, token], dim=1)
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        position = position + 1
    return out[:, :steps]
