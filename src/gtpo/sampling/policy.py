"""The policy forward of the update: log-probs and entropies of the completion tokens.

:class:`PolicyForward` wraps a causal LM so that distributed wrappers (DDP) see one module whose
``forward`` runs the decoder over the prompts and completions (each group's prompt once,
:func:`completion_hidden_states`) and the chunked LM head (:func:`gtpo.maths.ops.token_logprobs_and_entropy`):
the ``(N, T, V)`` logits never exist at once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..maths.ops import token_logprobs_and_entropy
from ..run.models import unwrap_peft
from .padding import position_ids
from .shared_prefix import cache_kwarg, prompt_groups, shared_prompt_cache, sharing_is_exact

__all__ = ["PolicyForward", "completion_hidden_states", "prompt_sharing"]


def prompt_sharing(decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The groups :func:`completion_hidden_states` computes each prompt of once: ``(first (U,), inverse (N,))``
    (:func:`prompt_groups` over the prompts without their last token), or None where sharing would not be exact
    (:func:`sharing_is_exact`), no two consecutive rows share a prompt, or the prompts are one token long.

    ``input_ids (N, S + T)``, ``attention_mask (N, S + T)``, ``completion_length`` T. Data-dependent (one host
    sync: the number of groups), so :class:`PolicyForward` calls it outside the compiled forward."""
    prefix = input_ids.shape[1] - completion_length - 1  # shared tokens: the prompt without its last token
    if prefix <= 0 or not sharing_is_exact(decoder):
        return None
    return prompt_groups(input_ids[:, :prefix], attention_mask[:, :prefix])


def completion_hidden_states(
    decoder: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    *,
    share_prompts: bool = True,
    groups: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Last hidden states ``(N, T, D)`` that predict the completion tokens (with gradients).

    Args:
        decoder: the transformer body of a causal LM (``model.get_decoder()``), in train or eval mode.
        input_ids: ``(N, S + T)`` left-padded prompts followed by right-padded completions.
        attention_mask: ``(N, S + T)`` 1 on real tokens.
        completion_length: ``T``.
        share_prompts: compute each run of identical prompts (a group) once (see the module
            docstring); False always runs the plain forward.
        groups: the groups of :func:`prompt_sharing`, found beforehand (a compiled caller finds them outside
            the compiled region: they are data-dependent); None with ``share_prompts`` finds them here.

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
    if not share_prompts:
        groups = None
    elif groups is None:
        groups = prompt_sharing(decoder, input_ids, attention_mask, t)
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


class PolicyForward(nn.Module):
    """Log-probs and entropies of completion tokens from one forward pass of a causal LM.

    Wraps the model so that distributed wrappers (DDP) see one module whose ``forward`` runs the
    decoder and the chunked LM head: the ``(N, T, V)`` logits are never materialised.

    ``compute_dtype``: with a dtype below float32 (bfloat16) the forward runs under ``torch.autocast``
    in it and the head's matmul too (hidden states and head weight cast to it; the softmax, log-probs
    and entropies stay float32); None or float32: the model's own dtypes, no autocast. A quantized
    base's ``is_loaded_in_4bit`` / ``is_loaded_in_8bit`` / ``hf_device_map`` are exposed, so that
    accelerate checks the placement of a 4-bit base instead of moving it with ``.to``.

    ``compile``: ``torch.compile`` keyword arguments (``backend``, ``mode``: ``torch_compile``) to compile this
    forward with (the decoder and the chunked head, not the model's own ``forward``, so sampling with the same model
    stays eager); None runs it eagerly. Shapes are dynamic (``dynamic=None``: recompiled once dynamic when a length
    first changes).
    """

    def __init__(self, model: nn.Module, *, chunk_size: int | None = None, compute_dtype: torch.dtype | None = None,
                 compile: dict[str, Any] | None = None):
        super().__init__()
        self.model = model
        self.chunk_size = chunk_size
        self.compute_dtype = None if compute_dtype in (None, torch.float32) else compute_dtype
        #: the forward's body compiled with ``compile``'s options (a function, not a submodule), or None: eager
        self._compiled = torch.compile(self._forward, **compile) if compile is not None else None
        base = unwrap_peft(model)
        for name in ("is_loaded_in_4bit", "is_loaded_in_8bit"):
            if getattr(base, name, False):
                setattr(self, name, True)
        if getattr(base, "hf_device_map", None):
            self.hf_device_map = base.hf_device_map

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids (N, S+T)``, ``attention_mask (N, S+T)``, ``completion_ids (N, T)`` ->
        ``logp (N, T)`` (with grad) and ``entropy (N, T)`` (no grad), float32 for half-precision models."""
        body = self._forward if self._compiled is None else self._compiled
        base = unwrap_peft(self.model)
        # the prompts' groups, found here, outside a compiled body: finding them is data-dependent (a graph break)
        groups = None if _special_head(base.config) else prompt_sharing(
            base.get_decoder(), input_ids, attention_mask, completion_ids.shape[1])
        if self.compute_dtype is None:
            return body(input_ids, attention_mask, completion_ids, temperature, groups)
        with torch.autocast(device_type=input_ids.device.type, dtype=self.compute_dtype):
            return body(input_ids, attention_mask, completion_ids, temperature, groups)

    def _forward(self, input_ids, attention_mask, completion_ids, temperature, groups):
        base = unwrap_peft(self.model)
        t = completion_ids.shape[1]
        if _special_head(base.config):  # models that post-process logits: use the full head (rare; exact)
            logits = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                          use_cache=False, logits_to_keep=t + 1).logits[:, :-1].float() / temperature
            logp_all = torch.log_softmax(logits, dim=-1)
            logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1).detach()
            return logp, entropy
        # (N, T, D): the state before each completion token; the prompt shared by the rows of a
        # group runs once per group, not once per row (exact; completion_hidden_states)
        hidden = completion_hidden_states(base.get_decoder(), input_ids, attention_mask, t,
                                          share_prompts=groups is not None, groups=groups)
        head = base.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        if self.compute_dtype is not None:  # the head's matmul in the compute dtype (autocast is off inside)
            hidden, weight = hidden.to(self.compute_dtype), weight.to(self.compute_dtype)
            bias = None if bias is None else bias.to(self.compute_dtype)
        elif hidden.dtype != weight.dtype:  # e.g. a float32 norm over a bfloat16 head
            hidden = hidden.to(weight.dtype)
        return token_logprobs_and_entropy(
            hidden, weight, completion_ids, temperature=temperature, chunk_size=self.chunk_size, bias=bias,
        )


def _special_head(config) -> bool:
    """Whether the model post-processes its logits (``final_logit_softcapping``, ``logit_scale``): the policy
    forward then runs the full head."""
    return bool(getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None))
