"""The decoding loop: sampling completions from a causal LM's forward over its key/value cache.

Sampling runs in :func:`decode`, a decoding loop over the model's forward and its ``DynamicCache``
with transformers' own logits processors, where :func:`decode_loop_config` finds the settings
covered (temperature, top-k, top-p, minimum lengths; otherwise the caller uses
``model.generate``). It computes what ``generate`` computes, without its per-token bookkeeping,
with inverse-CDF sampling (:func:`sample_categorical`) instead of ``torch.multinomial``, and rows
that reached EOS leave the batch: the decoding work follows the unfinished rows, not the longest
one. The same distribution as ``generate``, another random stream. :func:`prefill` and
:func:`prefill_shared` fill the cache with the prompts (the latter once per group of identical
prompts, :mod:`gtpo.sampling.shared_prefix`).

Three things keep the loop's own work per token small (docs/performance.md, "The decoding loop"):
the key/value cache grows in place in buffers sized for the whole completion
(:class:`GrowingLayer`, instead of a ``torch.cat`` of the whole cache per token and layer); on a
CPU in bfloat16/float16, the attention of the one new token runs as two batched matmuls over the
grouped query heads (:func:`decode_attention`; PyTorch's CPU SDPA kernel is 4-10x slower there for
a single query); and on an accelerator the host reads (did a row end? is a distribution broken?)
happen every ``sync_every`` tokens, not every token.

``decode(..., compile_options=...)`` (``GTPOConfig.decode_compile``) runs each step over a static, preallocated
key/value cache with fixed shapes, compiled once per shape bucket (:class:`StaticStep`): the same tokens as the
eager step (:class:`EagerStep`); off by default until measured faster (:func:`decode_compile_options`; docs/performance.md,
"The compiled decode step").
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time

import torch

from ..run.models import unwrap_peft
from .padding import position_ids
from .shared_prefix import cache_kwarg, plain_dynamic_cache, prompt_groups, shared_prompt_cache

logger = logging.getLogger("gtpo")

__all__ = ["DECODE_ATTENTION", "EagerStep", "GrowingLayer", "STATIC_BUCKET", "StaticStep", "decode", "decode_attention",
           "decode_compile_options", "decode_loop_config", "grow_cache", "prefill", "prefill_shared", "sample_categorical"]


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


_BROKEN = "probability tensor contains either inf, nan or element < 0, or a row sums to 0"

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


# ----------------------------------------------------------------------------- the key/value cache
def _dynamic_layer_type():
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # transformers without per-layer caches: no growing layers
        return None
    return DynamicLayer


_DynamicLayer = _dynamic_layer_type()


if _DynamicLayer is not None:
    class GrowingLayer(_DynamicLayer):
        """A ``DynamicLayer`` whose keys and values live in buffers sized for the whole decoding.

        ``update`` writes the new positions into the buffers and returns views of the filled part
        (``keys``/``values`` are those views, as ``DynamicLayer``'s are its tensors), instead of
        concatenating the whole cache with them: the per-token copy of a layer's cache (a growing
        ``(n, heads, L, head_dim)`` pair, 30 layers for SmolLM2) becomes a write of one position.
        ``batch_select_indices`` (rows that finished leave the batch) selects buffer rows. The
        values attended to are those ``DynamicLayer`` would hold, so every output is the same.
        """

        @classmethod
        def from_layer(cls, layer, capacity: int) -> "GrowingLayer":
            """A growing copy of an initialized ``DynamicLayer`` with room for ``capacity`` more
            positions (the layer itself is left unchanged)."""
            new = cls()
            keys, values = layer.keys, layer.values  # (n, h_kv, L, d), (n, h_kv, L, d_v)
            n, heads, length = keys.shape[:3]
            new._keys = keys.new_empty(n, heads, length + capacity, keys.shape[-1])
            new._values = values.new_empty(n, values.shape[1], length + capacity, values.shape[-1])
            new._keys[:, :, :length] = keys
            new._values[:, :, :length] = values
            new._length = length
            new.device = keys.device
            new.is_initialized = True
            new._views()
            return new

        def _views(self) -> None:
            self.keys = self._keys[:, :, :self._length]
            self.values = self._values[:, :, :self._length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            start, stop = self._length, self._length + key_states.shape[-2]
            if stop > self._keys.shape[2]:
                raise RuntimeError(f"GrowingLayer: {stop} positions exceed the buffer's {self._keys.shape[2]}")
            self._keys[:, :, start:stop] = key_states
            self._values[:, :, start:stop] = value_states
            self._length = stop
            self._views()
            return self.keys, self.values

        def get_seq_length(self, *args, **kwargs) -> int:
            return self._length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self._views()
else:  # pragma: no cover - transformers without DynamicLayer
    GrowingLayer = None


def grow_cache(cache, capacity: int) -> bool:
    """Replace the initialized plain ``DynamicLayer``s of ``cache`` by :class:`GrowingLayer`
    copies with room for ``capacity`` more positions; True when every layer was replaced (False,
    cache unchanged: another layer type, an empty layer, or no per-layer cache)."""
    layers = getattr(cache, "layers", None)
    if GrowingLayer is None or not layers:
        return False
    if any(type(layer) is not _DynamicLayer or not layer.is_initialized or layer.keys is None
           or layer.keys.dim() != 4 for layer in layers):
        return False
    cache.layers = [GrowingLayer.from_layer(layer, capacity) for layer in layers]
    return True


# ----------------------------------------------------------------------------- attention of one new token
DECODE_ATTENTION = "gtpo_decode"
# attention-function keywords that change the maths: another function handles those calls
_SDPA_ONLY = ("softcap", "s_aux", "sliding_window", "position_bias")
# query dtypes decode_attention computes itself; float32 stays with SDPA (as fast there, measured on SmolLM2
# rollouts, and float32 runs keep their exact tokens)
MATMUL_ATTENTION_DTYPES = (torch.bfloat16, torch.float16)


def decode_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                     dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' attention function for the decoding step: one query position attending to
    the cache, as two batched matmuls over the grouped query heads, for queries in
    :data:`MATMUL_ATTENTION_DTYPES` (bfloat16, float16); every other call (float32, prompts,
    training, dropout, soft-capping, sinks, sliding windows) goes to transformers' SDPA function.

    ``softmax(q k^T * scaling + mask) v`` with the query heads that share a key/value head
    stacked as rows (``(n, h_kv, h / h_kv, d)``: no ``repeat_kv`` copy), the softmax in float32
    at least: the same maths as ``scaled_dot_product_attention``. PyTorch's CPU SDPA kernel for a
    single bfloat16 query took 1.9-5.6 ms per layer for 32 rows of SmolLM2's heads over 60-180
    cached positions, this 0.25-0.5 ms (one thread, shared machine); in float32 both took 0.4-1.9 ms.

    Args:
        query: ``(n, h, 1, d)``; ``key``/``value``: ``(n, h_kv, L, d)``; ``attention_mask``: the
            SDPA mask of the step (``(n | 1, 1, 1, L)`` bool, True = attend, or additive float) or None.

    Returns:
        ``((n, 1, h, d) attention output, None)``, as transformers' attention functions.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (query.shape[2] != 1 or query.dtype not in MATMUL_ATTENTION_DTYPES or dropout or key.shape[1] == 0
            or query.shape[1] % key.shape[1] or any(kwargs.get(k) is not None for k in _SDPA_ONLY)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    n, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    q = query.reshape(n, kv_heads, heads // kv_heads, dim)  # query head h = kv * (h / h_kv) + g
    scores = torch.matmul(q, key.transpose(-1, -2)) * (dim ** -0.5 if scaling is None else scaling)  # (n, h_kv, g, L)
    if attention_mask is not None:
        mask = attention_mask[..., -1:, :]  # (n | 1, 1, 1, L)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(value.dtype)
    out = torch.matmul(probs, value)  # (n, h_kv, g, d_v)
    return out.reshape(n, heads, 1, value.shape[-1]).transpose(1, 2), None


def _register_decode_attention() -> bool:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # pragma: no cover - transformers without attention interfaces
        return False
    AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)  # the masks SDPA gets
    return True


@contextlib.contextmanager
def _decode_attention_on(model, device: torch.device):
    """Within the block, ``model`` (SDPA attention, on a CPU) attends with :func:`decode_attention`;
    its attention implementation is restored after. Other implementations and devices: unchanged."""
    config = getattr(unwrap_peft(model), "config", None)
    if (device.type != "cpu" or config is None or getattr(config, "_attn_implementation", None) != "sdpa"
            or not _register_decode_attention()):
        yield
        return
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


# ----------------------------------------------------------------------------- sampling
def sample_categorical(probs: torch.Tensor, *, valid: torch.Tensor | None = None) -> torch.Tensor:
    """One index per row of ``probs (n, V)``, drawn from the categorical distribution of the row.

    Inverse-CDF sampling: ``u`` uniform on ``[0, total)`` per row, the first index whose cumulative
    mass exceeds ``u``. Exactly the categorical distribution up to float32 rounding of the
    cumulative sums; an index of zero probability (filtered by top-k/top-p) is never drawn, since
    its cumulative mass equals the previous one. One uniform number per row where
    ``torch.multinomial`` draws V exponentials per row: 0.8 ms against 31 ms for 32 rows of
    SmolLM2's 49,152 tokens on 2 CPU threads.

    Args:
        probs: ``(n, V)`` non-negative weights (rows need not sum to 1).
        valid: a ``()`` bool tensor: instead of raising, the check is ANDed into it in place (no
            host read: the caller reads it when it syncs anyway, see :func:`decode`).

    Returns:
        ``(n,)`` int64 indices.

    Raises:
        RuntimeError: a row has a NaN/inf weight or no positive mass (the message names them, as
            ``torch.multinomial``'s does, so callers that catch non-finite probabilities keep working).
    """
    cdf = probs.cumsum(dim=-1)  # (n, V)
    total = cdf[:, -1:]  # (n, 1)
    ok = torch.isfinite(total).all() & (total > 0).all()
    if valid is not None:
        valid &= ok
    elif not bool(ok):
        raise RuntimeError(_BROKEN)
    u = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device) * total  # (n, 1) in [0, total)
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def _step_mask_builder(model):
    """The attention mask one decoding step passes to the model, from the 2-D ``mask (n, L)``.

    For SDPA (and :data:`DECODE_ATTENTION`) a prepared 4-D bool mask ``(n, 1, 1, L)`` (True =
    attend): the one new token attends to every unpadded position, which is all a causal mask is
    for one query. transformers returns a 4-D mask as it is, so its mask code does not read
    the padding mask on the host each forward (``_ignore_causal_mask_sdpa``'s ``bool(padding_mask.
    sum() == numel)``, transformers 5.x: one device sync per token, defeating ``sync_every``).
    Other implementations get the 2-D mask unchanged (eager's mask code reads nothing, tested;
    flash attention's ``attention_mask.all()`` does read, not covered here).
    """
    base = unwrap_peft(model)
    impl = getattr(getattr(base, "config", None), "_attn_implementation", None)
    if impl in ("sdpa", DECODE_ATTENTION):
        return lambda mask: mask.bool()[:, None, None, :]
    return lambda mask: mask


# ----------------------------------------------------------------------------- one decoding step
class EagerStep:
    """One decoding step of :func:`decode` in eager mode: the model's forward on the ``(n, 1)`` new
    tokens over its ``DynamicCache`` (made of :class:`GrowingLayer`s), rows that finished dropped
    from the cache (:meth:`select`): the work follows the unfinished rows."""

    def __init__(self, model, cache, attention_mask: torch.Tensor, max_new: int):
        grow_cache(cache, max_new)  # the last prompt token and up to max_new - 1 sampled ones are fed
        self.model, self.cache, self.kwarg = model, cache, cache_kwarg()
        self.mask = attention_mask.long()  # (n, S + t)
        self.position = position_ids(self.mask)[:, -1:]  # (n, 1) position of the token fed next
        self.step_mask = _step_mask_builder(model)

    def __call__(self, token: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``(n, V)`` float32 logits of the next token after ``token (n, 1)`` (``rows``: unused)."""
        logits = self.model(input_ids=token, attention_mask=self.step_mask(self.mask), position_ids=self.position,
                            use_cache=True, logits_to_keep=1, **{self.kwarg: self.cache}).logits  # (n, 1, V)
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        self.position = self.position + 1
        return logits[:, -1].to(dtype=torch.float32)

    def select(self, keep: torch.Tensor) -> None:
        """Keep the batch rows ``keep (n',)`` (the others finished)."""
        self.cache.batch_select_indices(keep)
        self.mask, self.position = self.mask[keep], self.position[keep]


#: the static cache's length is rounded up to a multiple of this: one compiled step serves every prompt width of
#: a bucket (the step compiles once per (rows, bucket, dtype, device))
STATIC_BUCKET = 64


def _static_forward(model, token, mask, position, cache, kwarg):
    """The model's forward on ``token (N, 1)`` over the static ``cache``: ``(N, V)`` float32 logits."""
    out = model(input_ids=token, attention_mask=mask, position_ids=position, use_cache=True, logits_to_keep=1,
                **{kwarg: cache})
    return out.logits[:, -1].to(dtype=torch.float32)


class StaticStep:
    """One decoding step of :func:`decode` over a preallocated static key/value cache, optionally
    compiled (``torch.compile``) once per shape bucket.

    The cache (transformers' ``StaticCache``) holds every row for ``S - 1 + max_new`` positions
    rounded up to :data:`STATIC_BUCKET`, filled from the prompt cache :func:`prefill` /
    :func:`prefill_shared` computed (the same prompt keys and values as the eager loop); one cache
    per (rows, dtype, device) is kept on the model and refilled by later rollouts (the compiled
    graph is tied to its tensors), the longest needed so far. Every
    step runs the forward on all ``N`` rows with fixed shapes (tokens ``(N, 1)``, a ``(N, 1, 1,
    L_max)`` boolean mask of the filled positions, positions ``(N, 1)``), so one compiled graph
    serves the whole rollout and every later rollout of the same bucket: rows that finished are
    not dropped (that would change the shapes and recompile) but masked out of the sampling,
    which takes the logits of the rows still in the batch only, exactly as :class:`EagerStep`
    gives them (so the random stream, and the tokens, are the eager loop's). The cost: finished
    rows keep being computed, and attention runs over ``L_max`` positions (masked) from the first
    token.
    """

    def __init__(self, model, cache, attention_mask: torch.Tensor, capacity: int, compile_options: dict | None):
        self.model, self.cache, self.kwarg = model, cache, cache_kwarg()
        n, width = attention_mask.shape
        self.index = width - 1  # the cache position of the token fed next
        self.full = torch.zeros(n, capacity, dtype=torch.bool, device=attention_mask.device)  # (N, L_max)
        self.full[:, :width] = attention_mask.bool()
        self.position = position_ids(attention_mask.long())[:, -1:].clone()  # (N, 1)
        self.token = torch.zeros(n, 1, dtype=torch.long, device=attention_mask.device)  # (N, 1)
        self.step_mask = _step_mask_builder(model)
        self.forward = _static_forward if compile_options is None else _compiled_forward(model, compile_options)
        self.key = (n, capacity, str(next(unwrap_peft(model).parameters()).dtype), attention_mask.device.type,
                    id(self.forward))

    @classmethod
    def build(cls, model, cache, attention_mask: torch.Tensor, max_new: int, compile_options: dict | None):
        """The static step over a copy of the prefilled ``cache`` (a ``DynamicCache`` of the first
        ``S - 1`` prompt columns), or None where the model's static cache is not made of plain
        full-attention layers or the prompt cache is empty (one-token prompts): the eager step."""
        try:
            from transformers import StaticCache
            from transformers.cache_utils import StaticLayer
        except ImportError:  # pragma: no cover - transformers without per-layer static caches
            return None
        layers = getattr(cache, "layers", None)
        if not layers or any(layer.keys is None or layer.keys.dim() != 4 for layer in layers):
            return None
        width = attention_mask.shape[1]
        capacity = -(-(width - 1 + max_new) // STATIC_BUCKET) * STATIC_BUCKET
        base = unwrap_peft(model)
        # one static cache per (rows, dtype, device), kept on the model and refilled by later rollouts: a compiled
        # step guards on the cache's tensors (static addresses, CUDA graphs), so a new cache per rollout would
        # compile again. A rollout that needs fewer positions uses it as it is (the rest masked); one that needs
        # more replaces it (memory: one cache, the longest so far)
        keys = layers[0].keys
        store = base.__dict__.setdefault("_gtpo_static_caches", {})
        key = (attention_mask.shape[0], keys.dtype, keys.device)
        static = store.get(key)
        if static is not None and static.layers[0].max_cache_len >= capacity:
            capacity = static.layers[0].max_cache_len
        else:
            store.pop(key, None)
            static = StaticCache(config=base.config, max_cache_len=capacity)
            if len(static.layers) != len(layers) or any(type(s) is not StaticLayer for s in static.layers):
                return None
            for target, source in zip(static.layers, layers):
                target.lazy_initialization(source.keys, source.values)
        if (len(static.layers) != len(layers)
                or any(t.keys.shape[1:2] + t.keys.shape[3:] != s.keys.shape[1:2] + s.keys.shape[3:]
                       for t, s in zip(static.layers, layers))):
            return None
        store[key] = static
        for target, source in zip(static.layers, layers):  # positions past the prompt: masked until written
            length = source.keys.shape[2]
            target.keys[:, :, :length] = source.keys
            target.values[:, :, :length] = source.values
            target.cumulative_length.fill_(length)
        return cls(model, static, attention_mask, capacity, compile_options)

    def __call__(self, token: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``(n, V)`` float32 logits after ``token (n, 1)`` for the batch rows ``rows (n,)`` still
        decoding (the forward runs on all ``N``)."""
        self.token[rows] = token
        self.full[:, self.index] = True
        first = self.key not in _COMPILED_SHAPES and self.forward is not _static_forward
        start = time.perf_counter()
        args = (self.model, self.token, self.step_mask(self.full), self.position, self.cache, self.kwarg)
        try:
            logits = self.forward(*args)  # (N, V)
        except Exception as err:  # noqa: BLE001 -- the compiler failed before the step ran: the same step eagerly
            if not first:
                raise
            logger.warning("decode_compile: compiling the decode step failed (%s: %s); this rollout decodes "
                           "uncompiled (set decode_compile: false to skip the attempt)", type(err).__name__,
                           str(err).splitlines()[0] if str(err) else "")
            self.forward = _static_forward
            first = False
            logits = self.forward(*args)
        if first:
            _COMPILED_SHAPES[self.key] = time.perf_counter() - start
            logger.info("decode_compile: the decode step compiled for %d rows x %d cached positions (%s, %s) in "
                        "%.1f s (once per shape bucket)", *self.key[:4], _COMPILED_SHAPES[self.key])
        self.index += 1
        self.position += 1
        return logits[rows]

    def select(self, keep: torch.Tensor) -> None:
        """Rows that finished stay in the static batch (masked out of the sampling by the caller's ``rows``)."""


#: (rows, cache length, dtype, device type, id of the compiled step) -> seconds of the compiled step's first call
#: (compilation included)
_COMPILED_SHAPES: dict = {}


def _compiled_forward(model, options: dict):
    """:func:`_static_forward` compiled with ``torch.compile(**options)``, one per model and options
    (kept on the model, so later rollouts reuse it; dynamo compiles it once per shape bucket)."""
    base = unwrap_peft(model)
    store = base.__dict__.setdefault("_gtpo_compiled_decode", {})
    key = tuple(sorted(options.items()))
    if key not in store:
        store[key] = torch.compile(_static_forward, dynamic=False, **options)
    return store[key]


def decode_compile_options(setting, device: torch.device) -> dict | None:
    """The ``torch.compile`` options of the decode step for ``GTPOConfig.decode_compile`` on
    ``device``, or None: the eager step.

    ``False``: None. ``True``: compiled (inductor; ``mode="reduce-overhead"``, CUDA graphs, on CUDA).
    ``"auto"``: compiled where it was measured faster, eager elsewhere, said once in the log. On CUDA
    it is compiled with CUDA graphs: the eager loop is launch-bound there (~40 ms a token for 3B on
    an H200) and the compiled step measured 4.0x the eager loop's tokens/s on one H200 (Qwen2.5-0.5B
    shape, 48 rows x 128 tokens, float32 greedy, the same tokens; 34 s for the first call, compilation
    and graph capture included; ``bench/gpu_check.py``'s ``decode_compile`` part, docs/performance.md).
    On a CPU it is eager: the compiled step measured no faster on SmolLM2-135M and costs tens of
    seconds of compilation per shape (docs/performance.md, issue 46).
    """
    if setting is False or setting == "false":
        return None
    cuda = device.type == "cuda"
    if setting is True or setting == "true":
        return {"mode": "reduce-overhead"} if cuda else {}
    if setting != "auto":
        raise ValueError(f"GTPOConfig.decode_compile must be 'auto', true or false, got {setting!r}")
    if cuda:
        _log_once("decode_compile auto: the decode step is compiled with CUDA graphs on cuda (measured 4.0x the eager "
                  "loop's tokens/s on an H200, the same tokens; compiled once per shape bucket, tens of seconds the "
                  "first time: docs/performance.md); decode_compile: false keeps it eager")
        return {"mode": "reduce-overhead"}
    _log_once(f"decode_compile auto: eager decode step on {device.type} (the compiled static-cache step measured "
              "no faster on CPU and compiles for tens of seconds per shape: docs/performance.md, issue 46); "
              "decode_compile: true compiles it anyway")
    return None


_LOGGED: set = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.info(message)


def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache, config, *,
           eos_ids: list[int], pad_id: int, sync_every: int | None = None, static: bool = False,
           compile_options: dict | None = None) -> torch.Tensor:
    """Sample completions token by token from the model's forward and key/value cache.

    The computation of transformers' ``generate`` sampling loop for the settings of
    :func:`decode_loop_config` — the model's forward on the last token with the 2-D attention
    mask and position ids ``cumsum(mask) - 1`` continued by one per token, float32 logits of the
    last position, transformers' own logits processors (:func:`_processors`), ``softmax`` and a
    draw from it (or ``argmax`` when ``config.do_sample`` is false) — with these differences:

    * no per-token bookkeeping of ``generate`` (input preparation, keyword updates, stopping
      criteria objects): ~15 % of a rollout of the tiny models of ``bench/``;
    * the draw is :func:`sample_categorical` (inverse CDF, one uniform number per row) instead of
      ``torch.multinomial`` (V exponentials per row, ~30 ms per token at SmolLM2's vocabulary):
      the same distribution from another random stream;
    * a row that has produced EOS leaves the batch (its cache rows are dropped), so the decoding
      work follows the number of unfinished rows instead of the longest one;
    * the cache's plain layers become :class:`GrowingLayer`s (filled in place, no per-token
      concatenation) and, on a CPU with SDPA attention, the new token attends through
      :func:`decode_attention` (bfloat16/float16 queries): the same values, less work.

    With ``sample_categorical`` replaced by ``torch.multinomial`` and no row ending early, the
    tokens are exactly ``generate``'s for the same seed; greedy decoding gives ``generate``'s
    tokens whatever rows end when (both tested, in float64).

    Host reads: whether rows ended (to drop them) and whether a distribution was broken (to
    raise) are read every ``sync_every`` tokens. On a CPU (default 1) a read costs nothing and
    rows leave the batch at once. On an accelerator (default 8) each read stalls the host until
    the device has finished, so the host cannot queue the next token's kernels ahead: rows that
    ended since the last read stay in the batch until the next one, writing padding (their
    tokens are not kept), and the random stream of the rows left then differs from
    ``sync_every=1``'s (the same distribution); the result is trimmed to the longest completion.

    Args:
        model: a decoder-only causal LM (``PreTrainedModel`` or peft model) in eval mode.
        input_ids: ``(N, S)`` left-padded prompt ids; ``attention_mask (N, S)``.
        cache: a ``DynamicCache`` holding the first ``S - 1`` columns of the prompt rows.
        config: a completed ``GenerationConfig`` from :func:`decode_loop_config`.
        eos_ids: token ids that end a completion; ``pad_id`` fills positions after the end.
        sync_every: tokens between host reads (None: 1 on a CPU, 8 elsewhere).
        static: run the steps over a static key/value cache (:class:`StaticStep`: fixed shapes,
            finished rows masked out of the sampling instead of leaving the batch); the same tokens.
        compile_options: ``torch.compile`` keywords (``{}``: inductor's defaults; from
            :func:`decode_compile_options`): the static step, compiled once per shape bucket.
            Either falls back to the eager step where the model's static cache is not made of
            plain full-attention layers or the prompt cache is empty.

    Returns:
        ``(N, T')`` sampled ids, ``T' <= max_new_tokens`` the longest completion (EOS included);
        a row's tokens after its first EOS are ``pad_id``.

    Raises:
        RuntimeError: a sampled distribution had a NaN/inf weight or no mass (as
            :func:`sample_categorical`), at the first host read after it.
    """
    n, width = input_ids.shape
    device = input_ids.device
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    processors = _processors(config, width, eos)
    max_new = int(config.max_new_tokens)
    out = torch.full((n, max_new), pad_id, dtype=torch.long, device=device)  # (N, T)
    if max_new == 0:
        return out
    every = (1 if device.type == "cpu" else 8) if sync_every is None else int(sync_every)
    if every < 1:
        raise ValueError(f"decode: sync_every must be >= 1, got {sync_every}")
    step = None
    if static or compile_options is not None:
        step = StaticStep.build(model, cache, attention_mask, max_new, compile_options)
    if step is None:
        step = EagerStep(model, cache, attention_mask, max_new)
    rows = torch.arange(n, device=device)  # (n,) the batch row of each row still in the batch
    seq = input_ids  # (n, S + t) prompt and tokens so far (the processors' view)
    token = input_ids[:, -1:]  # (n, 1)
    ended = torch.zeros(n, dtype=torch.bool, device=device)  # (n,) produced EOS (not dropped yet)
    valid = torch.ones((), dtype=torch.bool, device=device)  # every distribution so far was sound
    steps = 0
    with _decode_attention_on(model, device):
        for t in range(max_new):
            logits = step(token, rows)  # (n, V) float32
            scores = processors(seq, logits)  # (n, V)
            if config.do_sample:
                nxt = sample_categorical(torch.softmax(scores, dim=-1), valid=valid)  # (n,)
            else:
                nxt = scores.argmax(dim=-1)
            if every > 1:  # rows that ended since the last read are still in the batch: they write padding
                nxt = nxt.masked_fill(ended, pad_id)
            out[rows, t] = nxt
            steps = t + 1
            is_eos = torch.isin(nxt, eos)  # (n,)
            ended = (ended | is_eos) if every > 1 else is_eos  # sync_every 1: ended rows were dropped at once
            if steps == max_new:
                break
            if steps % every == 0:
                if not bool(valid):
                    raise RuntimeError(_BROKEN)
                if bool(ended.any()):
                    if bool(ended.all()):
                        break
                    keep = (~ended).nonzero().squeeze(1)  # (n',)
                    step.select(keep)
                    rows, seq, nxt, ended = rows[keep], seq[keep], nxt[keep], ended[keep]
            token = nxt.unsqueeze(1)
            seq = torch.cat([seq, token], dim=1)
    if not bool(valid):
        raise RuntimeError(_BROKEN)
    out = out[:, :steps]
    if every > 1:  # rows that ended between reads wrote padding past the longest completion: trim it
        is_eos = torch.isin(out, eos)  # (N, T')
        lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, steps)  # (N,)
        out = out[:, :int(lengths.max())]
    return out
