"""Sampling G completions per prompt: a decoding loop over the model's KV cache, or transformers ``generate``.

Rows are prompt-major: completion ``s`` of prompt ``p`` is row ``p * num_samples + s``, the layout
every maths function of the package expects (``rewards (N,)`` with ``N = P * G``).

``completion_mask`` is built from the generated ids, never from a pad id: it is 1 on every
generated token up to and including the first EOS, 0 after it. This matters for models whose
EOS equals their pad token (SmolLM2, Qwen base models), where a pad-id test would mask the EOS.

The G completions of a prompt share its tokens, so both passes over a rollout compute each
prompt once per group instead of G times [D] (:func:`shared_prompt_cache`):

* :func:`generate` runs the decoder once over each distinct prompt (all but its last token),
  copies the key/value cache to the G rows of the group and lets the decoding loop (or
  ``generate``: the documented "re-use a cache to continue generation" pattern) continue from it: the same
  sampling distribution, (G-1)/G of the prompt prefill saved;
* :func:`completion_hidden_states` does the same WITH gradients for the policy forward of the
  update: the cache rows of a group are an index-select of one prompt forward, so autograd sums
  the G gradients into it. The result equals the plain forward over the ``(N, S + T)`` batch up
  to float rounding, with ``(G-1)/G`` of the prompt tokens' forward and backward work saved.

Sampling itself runs in :func:`decode`, a decoding loop over the model's forward and its
``DynamicCache`` with transformers' own logits processors, where :func:`decode_loop_config`
finds the settings covered (temperature, top-k, top-p, minimum lengths; otherwise
``model.generate`` samples). It computes what ``generate`` computes, without its per-token
bookkeeping, with inverse-CDF sampling (:func:`sample_categorical`) instead of
``torch.multinomial``, and rows that reached EOS leave the batch: the decoding work follows the
unfinished rows, not the longest one. The same distribution as ``generate``, another random stream.

The shared prompt passes fall back to the plain computation where sharing would not be exact or
is not supported: no two consecutive rows with the same prompt, a prompt of one token, caches other than plain
full-attention ``DynamicCache`` layers (sliding-window, linear-attention, static caches),
gradient checkpointing, or active dropout (training forward).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Rollout:
    """A batch of sampled completions.

    Attributes:
        prompt_ids: ``(N, S)`` prompt tokens, left-padded.
        prompt_mask: ``(N, S)`` 1 on prompt tokens, 0 on left padding.
        completion_ids: ``(N, T)`` generated tokens, right-padded with the pad id.
        completion_mask: ``(N, T)`` 1 on generated tokens through the first EOS (included).
        truncated: ``(N,)`` bool, True where no EOS was produced within ``max_new_tokens``.
        texts: ``N`` decoded completions (special tokens skipped).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]

    @property
    def lengths(self) -> torch.Tensor:
        """``(N,)`` number of masked completion tokens."""
        return self.completion_mask.sum(dim=1)


def prompt_text(tokenizer, prompt) -> str:
    """The text fed to the model for one prompt.

    A list of chat messages (a "conversational" prompt) goes through the tokenizer's chat template
    with ``add_generation_prompt=True``; a string (a "standard" prompt) is used as it is.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "a conversational prompt (a list of chat messages) needs a tokenizer with a chat template; "
                "this tokenizer has none. Set tokenizer.chat_template or give prompts as plain strings."
            )
        return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    raise ValueError(
        f"a prompt must be a string or a list of {{'role', 'content'}} messages, got {type(prompt).__name__}"
    )


def encode_prompts(tokenizer, prompts: list) -> list[list[int]]:
    """Token ids of each prompt (chat template applied; no special tokens added twice)."""
    ids = []
    for prompt in prompts:
        text = prompt_text(tokenizer, prompt)
        add_special = isinstance(prompt, str)
        ids.append(tokenizer(text, add_special_tokens=add_special)["input_ids"])
    return ids


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, S)`` ids and mask of left-padded sequences."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[i, width - len(seq):] = 1
    return ids, mask


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask through the first EOS and truncation flags.

    Args:
        completion_ids: ``(N, T)`` generated ids (anything after the first EOS is ignored).
        eos_ids: token ids that end a completion.

    Returns:
        ``mask (N, T)`` long, 1 up to and including the first EOS; ``truncated (N,)`` bool.
    """
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, dtype=completion_ids.dtype, device=completion_ids.device))
    n, t = completion_ids.shape
    has_eos = is_eos.any(dim=1)
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full((n,), t, device=completion_ids.device))
    positions = torch.arange(t, device=completion_ids.device).unsqueeze(0)
    mask = (positions <= first.unsqueeze(1)) & (positions < t)
    return mask.long(), ~has_eos


def eos_token_ids(tokenizer, model=None) -> list[int]:
    """EOS ids from the model's generation config and the tokenizer (deduplicated)."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and i not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config defines an EOS token")
    return ids


# ----------------------------------------------------------------------------- shared prompts
@functools.lru_cache(maxsize=None)
def cache_kwarg() -> str:
    """Name of the cache argument of transformers models: ``"cache"`` (transformers >= 5.2x,
    where ``past_key_values`` is a deprecated alias) or ``"past_key_values"`` (older)."""
    from transformers import GenerationMixin

    params = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return "cache" if "cache" in params else "past_key_values"


def _plain_dynamic_cache(config):
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


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(N, L)`` positions of left-padded rows: ``cumsum(mask) - 1``, so left padding does not shift
    them (padding positions are clamped to 0; they are masked out anyway)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


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


def _sharing_is_exact(module: nn.Module) -> bool:
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
    cache = _plain_dynamic_cache(decoder.config)
    if cache is None:
        return None
    first, inverse = groups
    decoder(input_ids=ids[first], attention_mask=mask[first], position_ids=positions[first],
            use_cache=True, **{cache_kwarg(): cache})
    cache.batch_select_indices(inverse)
    return cache


def completion_hidden_states(
    decoder: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    *,
    share_prompts: bool = True,
) -> torch.Tensor:
    """Last hidden states ``(N, T, D)`` that predict the completion tokens (with gradients).

    Args:
        decoder: the transformer body of a causal LM (``model.get_decoder()``), in train or eval mode.
        input_ids: ``(N, S + T)`` left-padded prompts followed by right-padded completions.
        attention_mask: ``(N, S + T)`` 1 on real tokens.
        completion_length: ``T``.
        share_prompts: compute each run of identical prompts (a group) once (see the module
            docstring); False always runs the plain forward.

    Returns:
        ``hidden (N, T, D)``: the final-norm hidden state at positions ``S - 1 .. S + T - 2``,
        i.e. the state before each completion token. Position ids are ``cumsum(mask) - 1``
        (left padding does not shift positions). The last token (it predicts nothing) is left
        out of the forward: under causal attention no other position depends on it. With
        sharing, the first ``S - 1`` tokens of each group run once and the last prompt token
        plus the completion (without its last token) run per row on top of the shared cache;
        the values equal those of the plain forward over the ``(N, S + T)`` batch up to float
        rounding.
    """
    width = input_ids.shape[1]
    valid = isinstance(completion_length, int) and not isinstance(completion_length, bool)
    if not valid or not 1 <= completion_length < width:
        raise ValueError(
            f"completion_length: expected an int T with 1 <= T < {width} (the input width S + T, with at least one "
            f"prompt token), got {completion_length!r}"
        )
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask: expected shape {tuple(input_ids.shape)} (input_ids), got "
                         f"{tuple(attention_mask.shape)}")
    t = completion_length
    positions = position_ids(attention_mask)  # (N, S+T)
    prefix = width - t - 1  # shared tokens: the prompt without its last token
    groups = None
    if share_prompts and prefix > 0 and _sharing_is_exact(decoder):
        groups = prompt_groups(input_ids[:, :prefix], attention_mask[:, :prefix])
    cache = None
    if groups is not None:
        cache = shared_prompt_cache(decoder, input_ids[:, :prefix], attention_mask[:, :prefix],
                                    positions[:, :prefix], groups)
    # the last token predicts nothing: causal attention lets it be left out of the forward
    if cache is None:
        hidden = decoder(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                         position_ids=positions[:, :-1], use_cache=False).last_hidden_state  # (N, S+T-1, D)
        return hidden[:, -t:]
    return decoder(input_ids=input_ids[:, prefix:-1], attention_mask=attention_mask[:, :-1],
                   position_ids=positions[:, prefix:-1], use_cache=True,
                   **{cache_kwarg(): cache}).last_hidden_state  # (N, T, D)


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list,
    *,
    num_samples: int = 1,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    repetition_penalty: float = 1.0,
    do_sample: bool = True,
    batch_size: int | None = None,
    max_prompt_length: int | None = None,
    prompt_ids: list[list[int]] | None = None,
    share_prompt_prefill: bool = True,
    decode_loop: bool = True,
) -> Rollout:
    """Sample ``num_samples`` completions for each prompt.

    Args:
        model: a causal LM (a ``PreTrainedModel`` or a peft model; not a DDP wrapper).
        tokenizer: its tokenizer (pad token set).
        prompts: ``P`` prompts, strings or chat-message lists.
        num_samples: G, completions per prompt.
        max_new_tokens: T at most.
        temperature, top_p, top_k, repetition_penalty: sampling settings (``temperature <= 0`` or
            ``do_sample=False`` decodes greedily).
        batch_size: completions per ``generate`` call (None: all at once).
        max_prompt_length: raise if a prompt is longer (the trainer drops such prompts beforehand).
        prompt_ids: pre-tokenised prompts (skips tokenisation).
        share_prompt_prefill: prefill each distinct prompt once and copy its key/value cache to
            its ``num_samples`` rows (see the module docstring; same distribution, less work);
            False prefills every row (plain ``generate``).
        decode_loop: sample with :func:`decode` (this module's decoding loop over the model's
            forward and key/value cache, with transformers' logits processors; finished rows leave
            the batch) where :func:`decode_loop_config` says it covers the settings; False, or
            settings it does not cover, use ``model.generate``.

    Returns:
        A :class:`Rollout` with ``N = P * num_samples`` rows, prompt-major.
    """
    from transformers import GenerationConfig

    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if prompt_ids is None:
        prompt_ids = encode_prompts(tokenizer, prompts)
    if max_prompt_length is not None:
        for i, ids in enumerate(prompt_ids):
            if len(ids) > max_prompt_length:
                raise ValueError(f"prompt {i} has {len(ids)} tokens, more than max_prompt_length={max_prompt_length}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = eos_token_ids(tokenizer, model)
    greedy = (not do_sample) or temperature <= 0
    gen_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else temperature,
        top_p=None if greedy else top_p,
        # 0 = off, passed explicitly: left unset (None), transformers fills in its global default
        # top_k=50 and would sample from the 50 most likely tokens only
        top_k=None if greedy else int(top_k or 0),
        repetition_penalty=repetition_penalty,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        bos_token_id=getattr(tokenizer, "bos_token_id", None),
    )
    loop_config = decode_loop_config(model, gen_config) if decode_loop else None
    rows = [ids for ids in prompt_ids for _ in range(num_samples)]
    step = batch_size or len(rows)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    chunks = []
    try:
        for start in range(0, len(rows), step):
            ids, mask = left_pad(rows[start:start + step], pad_id)
            ids_d, mask_d = ids.to(device), mask.to(device)
            # inference mode: no autograd bookkeeping at all (measured ~5 % faster than no_grad
            # on the tiny CPU models of bench/); the ids are cloned out as normal tensors
            with torch.inference_mode():
                cache = None
                if share_prompt_prefill and num_samples > 1:
                    cache = _prefill_shared(model, ids_d, mask_d)
                if loop_config is not None and cache is None:
                    cache = _prefill(model, ids_d, mask_d)
                if loop_config is not None and cache is not None:
                    comp = decode(model, ids_d, mask_d, cache, loop_config, eos_ids=eos_ids, pad_id=pad_id)
                else:
                    extra = {} if cache is None else {cache_kwarg(): cache}
                    out = model.generate(input_ids=ids_d, attention_mask=mask_d, generation_config=gen_config, **extra)
                    comp = out[:, ids.shape[1]:]
            chunks.append((ids, mask, comp.cpu().clone()))
    finally:
        model.train(was_training)
    width_s = max(c[0].shape[1] for c in chunks)
    width_t = max(max(c[2].shape[1] for c in chunks), 1)
    p_ids, p_mask, c_ids = [], [], []
    for ids, mask, comp in chunks:
        pad_s = width_s - ids.shape[1]
        p_ids.append(torch.nn.functional.pad(ids, (pad_s, 0), value=pad_id))
        p_mask.append(torch.nn.functional.pad(mask, (pad_s, 0), value=0))
        c_ids.append(torch.nn.functional.pad(comp, (0, width_t - comp.shape[1]), value=pad_id))
    completion_ids = torch.cat(c_ids)
    completion_mask, truncated = completion_mask_from_ids(completion_ids, eos_ids)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad_id)
    texts = tokenizer.batch_decode(
        [ids[m.bool()].tolist() for ids, m in zip(completion_ids, completion_mask)], skip_special_tokens=True
    )
    return Rollout(
        prompt_ids=torch.cat(p_ids),
        prompt_mask=torch.cat(p_mask),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=truncated,
        texts=texts,
    )


def _prefill_shared(model, ids: torch.Tensor, mask: torch.Tensor):
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


def _prefill(model, ids: torch.Tensor, mask: torch.Tensor):
    """The cache of ``ids (N, S)`` without its last column, every row computed (no sharing); an
    empty cache for one-token prompts. None when the model's cache is not a plain ``DynamicCache``."""
    cache = _plain_dynamic_cache(model.config)
    if cache is None or ids.shape[1] < 2:
        return cache
    model.get_decoder()(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids(mask)[:, :-1],
                        use_cache=True, **{cache_kwarg(): cache})
    return cache


# ----------------------------------------------------------------------------- decoding loop
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
    if _plain_dynamic_cache(config) is None:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
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
