"""Host reads in the decoding loop (issue 42, defect 6): gtpo.sampling.decode reads the host every
``sync_every`` tokens; the model's own mask code must not add a read per forward (transformers 5.x's
``_ignore_causal_mask_sdpa`` evaluates ``bool(padding_mask.sum() == numel)`` for every 2-D mask).

A host read of a tensor (``.item()``, ``bool(t)``, ``int(t)``, ``.tolist()`` of a 0-d tensor) lowers to
``aten._local_scalar_dense``; a TorchDispatchMode counts them during a CPU decoding run."""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import PROMPTS

HOST_READS = ("aten._local_scalar_dense", "aten.equal", "aten.nonzero")


class HostReads(TorchDispatchMode):
    """Counts the aten calls that read tensor data on the host (device syncs on an accelerator)."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).rsplit(".", 1)[0]
        if name in HOST_READS:
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model_and_tokenizer(request, tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32,
                                                 attn_implementation=request.param).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_path)


def _decode_reads(model, tokenizer, *, tokens, sync_every, static=False):
    from transformers import GenerationConfig

    from gtpo.sampling.decode import decode, prefill
    from gtpo.sampling.padding import left_pad
    from gtpo.sampling.rollout import encode_prompts

    ids, mask = left_pad(encode_prompts(tokenizer, PROMPTS + ["a"]), tokenizer.pad_token_id)  # padded rows
    assert not bool(mask.all())
    # EOS out of reach (min_new_tokens): every row decodes all the tokens, the batch never shrinks
    config = GenerationConfig(do_sample=True, max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=[0],
                              pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.no_grad():
        cache = prefill(model, ids, mask)
        with HostReads() as reads:
            out = decode(model, ids, mask, cache, config, eos_ids=[0], pad_id=tokenizer.pad_token_id,
                         sync_every=sync_every, static=static)
    assert out.shape == (ids.shape[0], tokens)
    return sum(reads.calls.values()), reads.calls


@pytest.mark.parametrize("static", [False, True])
def test_decode_loop_reads_the_host_only_every_sync_every_tokens(model_and_tokenizer, static):
    # sync_every=8, 32 tokens: reads at tokens 8, 16, 24 (is every distribution sound? did a row end?)
    # and after the loop (soundness, the longest completion): 2 * 3 + 2 = 8. A read per forward from
    # the model's mask code would add 32. The static-cache step (decode_compile) reads no more.
    model, tokenizer = model_and_tokenizer
    total, calls = _decode_reads(model, tokenizer, tokens=32, sync_every=8, static=static)
    assert total <= 2 * (32 // 8) + 2, calls


def test_host_read_count_catches_a_read_per_token(model_and_tokenizer):
    # the same count can fail: sync_every=1 reads the host every token
    model, tokenizer = model_and_tokenizer
    total, calls = _decode_reads(model, tokenizer, tokens=32, sync_every=1)
    assert total > 2 * (32 // 8) + 2 and total >= 32, calls
