"""Padding and masks of token batches: left-padded prompts, right-padded completions, positions.

* prompts are left-padded (:func:`left_pad`), so that generation continues every row at the same
  column; their position ids are ``cumsum(mask) - 1`` (:func:`position_ids`), so left padding
  does not shift positions;
* completions are right-padded, and their mask is 1 up to and including the first EOS
  (:func:`completion_mask_from_ids`), built from the generated ids, never from a pad id: EOS may
  equal PAD (SmolLM2, Qwen base models).
"""

from __future__ import annotations

import torch

__all__ = ["completion_mask_from_ids", "left_pad", "position_ids"]


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


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(N, L)`` positions of left-padded rows: ``cumsum(mask) - 1``, so left padding does not shift
    them (padding positions are clamped to 0; they are masked out anyway)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
