"""Sampling G completions per prompt with transformers ``generate``.

Rows are prompt-major: completion ``s`` of prompt ``p`` is row ``p * num_samples + s``, the layout
every maths function of the package expects (``rewards (N,)`` with ``N = P * G``).

``completion_mask`` is built from the generated ids, never from a pad id: it is 1 on every
generated token up to and including the first EOS, 0 after it. This matters for models whose
EOS equals their pad token (SmolLM2, Qwen base models), where a pad-id test would mask the EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
        top_k=None if greedy or not top_k else top_k,
        repetition_penalty=repetition_penalty,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        bos_token_id=getattr(tokenizer, "bos_token_id", None),
    )
    rows = [ids for ids in prompt_ids for _ in range(num_samples)]
    step = batch_size or len(rows)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    chunks = []
    try:
        for start in range(0, len(rows), step):
            ids, mask = left_pad(rows[start:start + step], pad_id)
            out = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gen_config
            )
            chunks.append((ids, mask, out[:, ids.shape[1]:].cpu()))
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
