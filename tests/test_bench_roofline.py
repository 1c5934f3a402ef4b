"""The FLOP count of the benchmarks' roofline (``bench/common.py``): golden values and torch's own count."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import common  # noqa: E402


def _config(**kw):
    from transformers import LlamaConfig

    settings = dict(vocab_size=10, hidden_size=4, intermediate_size=6, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=2, max_position_embeddings=64, tie_word_embeddings=True)
    return LlamaConfig(**{**settings, **kw})


def test_shape_golden():
    shape = common.transformer_shape(_config())
    # q 4x4, k 4x2, v 4x2, o 4x4, gate/up 4x6, down 6x4; (in + out) summed over the seven
    assert shape == dict(layers=1, hidden=4, attn=4, vocab=10, linear=16 + 8 + 8 + 16 + 24 + 24 + 24,
                         lora_io=8 + 6 + 6 + 8 + 10 + 10 + 10)


def test_forward_and_backward_flops_golden():
    shape = common.transformer_shape(_config())
    # a prompt of 3 tokens (its first 2 once: contexts 1 + 2), rows of 2 and 1 tokens (contexts 3 + 4, and 3)
    f = common.forward_flops(shape, 3, [2, 1], lora_rank=2)
    assert f == dict(linear=2 * 120 * 5, lora=2 * 2 * 58 * 5, attention=4 * 1 * 4 * 13, head=2 * 4 * 10 * 3,
                     total=1200 + 1160 + 208 + 240)
    assert common.backward_flops(f, full=False) == (1200 + 240) + 2 * 208 + 2 * 1160
    full = common.forward_flops(shape, 3, [2, 1])
    assert full["lora"] == 0 and common.backward_flops(full, full=True) == 2 * (1200 + 240) + 2 * 208
    step = common.step_flops(_config(), [3, 3], [[2, 1], [2, 1]], lora_rank=2)
    assert step["rollout"] == 2 * 2808 and step["update"] == 2 * (2808 + 4176)
    assert step["head"] == 2 * 240 * 3  # rollout, update forward, input-gradient backward


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_forward_flops_agree_with_torch_flop_counter(kv_heads):
    # one row, no prompt to share (a 1-token prompt), logits at every position: torch counts the
    # projections, the head and the eager attention's two matmuls over the full square of positions
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaForCausalLM

    config = _config(hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=kv_heads, head_dim=4, vocab_size=50)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    n = 7
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=torch.randint(0, 50, (1, n)))
    shape = common.transformer_shape(config)
    ours = common.forward_flops(shape, 1, [n])
    square = 4 * shape["layers"] * shape["attn"] * n * n  # eager attention: every pair, masked ones too
    assert counter.get_total_flops() == ours["linear"] + ours["head"] + square
    assert ours["attention"] == 4 * shape["layers"] * shape["attn"] * n * (n + 1) // 2  # causal: the pairs needed
