"""Tests of the optimised paths the benchmarks measure (``gtpo.sampling.rollout``: one prompt prefill per
group in ``generate``, one prompt forward per group in ``completion_hidden_states``).

Every fast path is compared with the plain computation it replaces, on tiny
random Llama (EOS == PAD) and Qwen2 (separate PAD) models with left-padded prompts of different
lengths and right-padded completions.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from gtpo.sampling.policy import completion_hidden_states  # noqa: E402
from gtpo.sampling.rollout import generate  # noqa: E402
from gtpo.sampling.shared_prefix import prompt_groups  # noqa: E402

PROMPTS = ["What is 1 + 2?", "hi", "What is 12 + 7? think step by step"]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_and_tokenizer(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gtpo.testing import build_tiny_model

    arch = request.param
    path = build_tiny_model(tmp_path_factory.mktemp(arch), arch=arch, eos_equals_pad=arch == "llama", seed=3)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    return model, AutoTokenizer.from_pretrained(path)


class CallShapes:
    """Records the ``input_ids`` shape of every call of a module (forward pre-hook)."""

    def __init__(self, module):
        self.shapes = []
        self.handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# ----------------------------------------------------------------------------- prompt_groups
def test_prompt_groups_golden():
    # rows a a b b b c (prompt-major, G varies at the edges like a micro-batch cut)
    a, b, c = [5, 6, 7], [0, 8, 9], [1, 2, 3]
    ids = torch.tensor([a, a, b, b, b, c])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1]])
    first, inverse = prompt_groups(ids, mask)
    assert first.tolist() == [0, 2, 5]
    assert inverse.tolist() == [0, 0, 1, 1, 1, 2]
    assert torch.equal(ids[first][inverse], ids)


def test_prompt_groups_none_when_nothing_is_shared():
    ids = torch.tensor([[1, 2], [1, 3], [1, 2]])  # equal rows that are not consecutive are not merged
    assert prompt_groups(ids, torch.ones_like(ids)) is None
    assert prompt_groups(ids[:1], torch.ones_like(ids[:1])) is None


def test_prompt_groups_compare_masks_too():
    # the same ids with different masks are different prompts (EOS == PAD: a real token may equal the pad id)
    ids = torch.tensor([[2, 5], [2, 5]])
    assert prompt_groups(ids, torch.tensor([[1, 1], [0, 1]])) is None


# ----------------------------------------------------------------------------- training forward
def _batch(model, tokenizer, g=3, t=7, seed=0):
    """Prompt-major rows of 3 prompts x g completions; completion 1 of prompt 0 ends early (EOS)."""
    from gtpo.sampling.padding import left_pad

    rows = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(g)]
    prompt_ids, prompt_mask = left_pad(rows, tokenizer.pad_token_id)
    gen = torch.Generator().manual_seed(seed)
    completion = torch.randint(3, model.config.vocab_size, (len(rows), t), generator=gen)
    completion_mask = torch.ones_like(completion)
    completion[1, 2] = tokenizer.eos_token_id
    completion[1, 3:] = tokenizer.pad_token_id
    completion_mask[1, 3:] = 0
    ids = torch.cat([prompt_ids, completion], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    return ids, mask, completion_mask.bool(), t


def _hidden_and_grads(model, fn):
    model.zero_grad(set_to_none=True)
    hidden = fn()
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1), dtype=hidden.dtype)
    (hidden * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return hidden.detach(), grads


def test_shared_prompt_forward_equals_the_full_forward(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    model.train()
    decoder = model.get_decoder()
    ids, mask, cmask, t = _batch(model, tokenizer)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)

    def reference():  # what the trainer's PolicyForward computed: the full forward, sliced
        out = decoder(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False)
        return out.last_hidden_state[:, -t - 1:-1] * cmask[..., None]

    with CallShapes(decoder) as calls:
        h_shared, g_shared = _hidden_and_grads(
            model, lambda: completion_hidden_states(decoder, ids, mask, t) * cmask[..., None])
    s = ids.shape[1] - t
    assert calls.shapes == [(3, s - 1), (9, t)]  # one prompt forward per group, then every row
    h_ref, g_ref = _hidden_and_grads(model, reference)
    h_plain, g_plain = _hidden_and_grads(
        model, lambda: completion_hidden_states(decoder, ids, mask, t, share_prompts=False) * cmask[..., None])
    # float64 everywhere except transformers' RMSNorm, which computes in float32 for any input
    # dtype: values agree to float64 rounding; gradients differ by summation order (index-select
    # backward vs per-row GEMMs, ~1e-16) rounded to float32 at each norm, i.e. ~1e-7 relative
    torch.testing.assert_close(h_shared, h_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(h_plain, h_ref, rtol=0, atol=1e-10)
    assert g_shared.keys() == g_ref.keys() == g_plain.keys()
    for name, ref in g_ref.items():
        assert ref.norm() > 0, name
        assert (g_shared[name] - ref).norm() <= 1e-6 * ref.norm(), name
        assert (g_plain[name] - ref).norm() <= 1e-6 * ref.norm(), name
    # the last layer's parameters sit before any float32 rounding of the gradient: float64 agreement
    last = [n for n in g_ref if f"layers.{model.config.num_hidden_layers - 1}." in n]
    assert last
    for name in last:
        assert (g_shared[name] - g_ref[name]).norm() <= 1e-12 * g_ref[name].norm(), name


def test_shared_prompt_forward_on_a_micro_batch_that_cuts_groups(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    model.eval()
    decoder = model.get_decoder()
    ids, mask, cmask, t = _batch(model, tokenizer)
    rows = slice(2, 8)  # the last row of group 0, all of group 1, two rows of group 2
    with torch.no_grad(), CallShapes(decoder) as calls:
        shared = completion_hidden_states(decoder, ids[rows], mask[rows], t)
        plain = completion_hidden_states(decoder, ids[rows], mask[rows], t, share_prompts=False)
    assert calls.shapes[0][0] == 3  # three runs of identical prompts in the six rows
    m = cmask[rows][..., None]
    torch.testing.assert_close(shared * m, plain * m, rtol=0, atol=1e-10)


def test_shared_prompt_forward_falls_back_where_sharing_is_not_exact(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    decoder = model.get_decoder()
    ids, mask, _, t = _batch(model, tokenizer)
    model.eval()
    with torch.no_grad(), CallShapes(decoder) as calls:
        completion_hidden_states(decoder, ids, mask, t, share_prompts=False)  # switched off
        completion_hidden_states(decoder, ids[::3], mask[::3], t)  # no two rows share a prompt
    assert [n for n, _ in calls.shapes] == [9, 3]
    model.train()
    dropout_before = model.config.attention_dropout
    model.config.attention_dropout = 0.1  # active dropout: one mask per row, sharing would change it
    try:
        with CallShapes(decoder) as calls:
            completion_hidden_states(decoder, ids, mask, t)
        assert [n for n, _ in calls.shapes] == [9]
    finally:
        model.config.attention_dropout = dropout_before
    # transformers >= 5.2x renamed gradient checkpointing to activation checkpointing
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        disable = model.activation_checkpointing_disable
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        disable = model.gradient_checkpointing_disable
    try:
        with CallShapes(decoder) as calls:
            completion_hidden_states(decoder, ids, mask, t)
        assert [n for n, _ in calls.shapes] == [9]
    finally:
        disable()
    model.eval()


def test_completion_hidden_states_errors(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    decoder = model.get_decoder()
    ids, mask, _, t = _batch(model, tokenizer)
    with pytest.raises(ValueError, match="completion_length"):
        completion_hidden_states(decoder, ids, mask, ids.shape[1])  # no prompt token left
    with pytest.raises(ValueError, match="completion_length"):
        completion_hidden_states(decoder, ids, mask, 0)
    with pytest.raises(ValueError, match="attention_mask"):
        completion_hidden_states(decoder, ids, mask[:, 1:], t)


# ----------------------------------------------------------------------------- generation
@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("decode_loop", [True, False])
def test_generate_with_a_shared_prefill_samples_the_same_tokens(model_and_tokenizer, do_sample, decode_loop):
    model, tokenizer = model_and_tokenizer
    decoder = model.get_decoder()
    out = {}
    for share in (True, False):
        torch.manual_seed(7)
        with CallShapes(decoder) as calls:
            out[share] = generate(model, tokenizer, PROMPTS, num_samples=3, max_new_tokens=6, do_sample=do_sample,
                                  share_prompt_prefill=share, decode_loop=decode_loop)
        out[share, "calls"] = calls.shapes
    s = out[True].prompt_ids.shape[1]
    assert out[True, "calls"][:2] == [(3, s - 1), (9, 1)]  # one prefill per prompt, then the last prompt token
    # without sharing: every row prefilled (the decoding loop feeds the last prompt token on its own)
    assert out[False, "calls"][:2] == ([(9, s - 1), (9, 1)] if decode_loop else [(9, s), (9, 1)])
    # the same distribution, computed the same way up to float rounding: the same tokens for the same seed
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    assert torch.equal(out[True].completion_mask, out[False].completion_mask)
    assert out[True].texts == out[False].texts


def test_generate_returns_normal_tensors_usable_by_autograd(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    rollout = generate(model, tokenizer, PROMPTS[:2], num_samples=2, max_new_tokens=4)
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
        assert not getattr(rollout, name).is_inference(), name
    # completion ids are saved for backward by the chunked LM head: that must work
    from gtpo.maths.ops import token_logprobs_and_entropy

    hidden = torch.randn(*rollout.completion_ids.shape, model.config.hidden_size, dtype=torch.float64,
                         requires_grad=True)
    logp, _ = token_logprobs_and_entropy(hidden, model.get_output_embeddings().weight, rollout.completion_ids)
    logp.sum().backward()
    assert hidden.grad is not None


# ----------------------------------------------------------------------------- sampling settings
def _ranks_of_sampled_tokens(model, rollout):
    """Rank (0 = most likely) of every sampled token under the model's full distribution."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    t = rollout.completion_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -t - 1:-1]  # (N, T, V)
    chosen = logits.gather(-1, rollout.completion_ids[..., None])  # (N, T, 1)
    ranks = (logits > chosen).sum(-1)  # (N, T)
    return ranks[rollout.completion_mask.bool()]


def test_top_k_zero_samples_from_the_full_vocabulary(model_and_tokenizer):
    # top_k=0 means "off". Left unset, transformers would fill in its default top_k=50: with a
    # near-uniform random model over 512 tokens, ~90 % of sampled tokens rank beyond 50, so 54
    # samples all within the top 50 would happen with probability ~1e-54.
    model, tokenizer = model_and_tokenizer
    torch.manual_seed(0)
    rollout = generate(model, tokenizer, PROMPTS, num_samples=3, max_new_tokens=6, top_k=0)
    assert int(_ranks_of_sampled_tokens(model, rollout).max()) >= 50
    torch.manual_seed(0)
    rollout = generate(model, tokenizer, PROMPTS, num_samples=3, max_new_tokens=6, top_k=5)
    assert int(_ranks_of_sampled_tokens(model, rollout).max()) < 5


@pytest.mark.parametrize("lora", [False, True])
def test_policy_forward_equals_full_logits(model_and_tokenizer, lora):
    # the trainer's forward (shared prompt prefix + chunked head) against log_softmax of the full
    # (N, S+T, V) logits of the plain model call, for values and LoRA/base gradients
    from gtpo.sampling.policy import PolicyForward

    model, tokenizer = model_and_tokenizer
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    model.train()
    ids, mask, cmask, t = _batch(model, tokenizer)
    completion = ids[:, -t:]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        logp, entropy = PolicyForward(model, chunk_size=7)(ids, mask, completion, temperature=0.7)
        g_fast = torch.autograd.grad((logp * cmask).sum(), params)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, -t - 1:-1]
        logp_all = torch.log_softmax(logits.double() / 0.7, dim=-1)
        ref = logp_all.gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        ref_h = -(logp_all.exp() * logp_all).sum(-1)
        g_ref = torch.autograd.grad((ref * cmask).sum(), params)
    finally:
        if lora:
            model.unload()
    torch.testing.assert_close(logp * cmask, ref * cmask, rtol=0, atol=1e-9)
    torch.testing.assert_close(entropy * cmask, ref_h.detach() * cmask, rtol=0, atol=1e-9)
    assert not entropy.requires_grad
    for a, b in zip(g_fast, g_ref):
        assert (a - b).norm() <= 1e-6 * b.norm() + 1e-12


# ----------------------------------------------------------------------------- decoding loop
def _config(**kw):
    from transformers import GenerationConfig

    return GenerationConfig(**kw)


@pytest.fixture
def multinomial_draws(monkeypatch):
    """The decoding loop drawing with torch.multinomial, as generate does: the same random stream,
    so the loop's mechanics (cache, mask, positions, processors) can be compared token for token."""
    import gtpo.sampling.decode

    monkeypatch.setattr(gtpo.sampling.decode, "sample_categorical",
                        lambda probs, **kwargs: torch.multinomial(probs, num_samples=1).squeeze(1))


@pytest.fixture
def forced_length(model_and_tokenizer):
    """The model's own generation config forces max_new_tokens (as the benchmark model does):
    ``generate`` and the decoding loop must both honour it."""
    model, _ = model_and_tokenizer
    model.generation_config.min_new_tokens = 9  # = max_new_tokens of the test
    yield
    model.generation_config.min_new_tokens = None


@pytest.mark.parametrize("settings", [dict(temperature=1.0, top_p=1.0, top_k=0),
                                      dict(temperature=0.7, top_p=0.9, top_k=5),
                                      dict(do_sample=False)])
@pytest.mark.parametrize("lora", [False, True])
def test_decode_loop_samples_the_tokens_of_generate(model_and_tokenizer, forced_length, multinomial_draws, settings,
                                                    lora):
    # no row ends early (EOS suppressed) and the loop draws with multinomial: its random stream is
    # generate's, so the same seed gives the same tokens, with and without the shared prefill, LoRA
    model, tokenizer = model_and_tokenizer
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                 init_lora_weights=False))
    calls = []
    original = type(model).generate

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    try:
        out = {}
        for loop in (True, False):
            for share in (True, False):
                torch.manual_seed(11)
                type(model).generate = counting
                try:
                    out[loop, share] = generate(model, tokenizer, PROMPTS, num_samples=3, max_new_tokens=9,
                                                share_prompt_prefill=share, decode_loop=loop, **settings)
                finally:
                    type(model).generate = original
            if loop:
                assert not calls  # the loop ran, not transformers' generate
    finally:
        if lora:
            model.unload()
    assert len(calls) == 2
    ref = out[False, False]
    assert ref.completion_ids.shape == (9, 9) and not bool(ref.completion_mask.eq(0).any())  # forced length
    for key, rollout in out.items():
        assert torch.equal(rollout.completion_ids, ref.completion_ids), key
        assert torch.equal(rollout.completion_mask, ref.completion_mask), key
        assert rollout.texts == ref.texts, key


def _greedy_reference(model, ids, mask, t):
    """``(N, t)`` greedy tokens of transformers' generate with no EOS in reach."""
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=_config(
            do_sample=False, max_new_tokens=t, min_new_tokens=t, eos_token_id=[0], pad_token_id=0))
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("all_finish", [False, True])
def test_decode_loop_drops_finished_rows_and_matches_generate(model_and_tokenizer, all_finish):
    # EOS chosen from the greedy tokens so that rows end at different steps: the loop drops each
    # finished row from its batch (cache, mask, positions); the rows left must still get exactly
    # the logits of generate's full batch (greedy: the same argmax at every step)
    from gtpo.sampling.decode import decode, prefill as _prefill
    from gtpo.sampling.padding import left_pad
    from gtpo.sampling.rollout import encode_prompts

    model, tokenizer = model_and_tokenizer
    prompts = PROMPTS + ["a b c", "12 + 30 = ", "think"]
    ids, mask = left_pad(encode_prompts(tokenizer, prompts), tokenizer.pad_token_id)
    t = 12
    greedy = _greedy_reference(model, ids, mask, t)  # (6, 12)
    eos = {int(greedy[0, 1]), int(greedy[2, 4])}
    if all_finish:
        eos |= {int(row[-3]) for row in greedy}  # every row ends by step 10
    else:
        eos -= set(greedy[1].tolist())  # row 1 never ends
        assert eos, "the random model's greedy rows share every token: pick other rows"
    eos_ids = sorted(eos)
    pad = tokenizer.pad_token_id
    config = _config(do_sample=False, max_new_tokens=t, eos_token_id=eos_ids, pad_token_id=pad)
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]
        got = decode(model, ids, mask, _prefill(model, ids, mask), config, eos_ids=eos_ids, pad_id=pad)
    is_eos = torch.isin(ref, torch.tensor(eos_ids))
    ends = [int(row.nonzero()[0]) if row.any() else None for row in is_eos]
    assert ends[0] is not None and ends[0] <= 1  # rows end at different steps: the pruning ran
    if all_finish:
        assert all(e is not None for e in ends) and ref.shape[1] < t
    else:
        assert ends[1] is None and ref.shape[1] == t
    assert torch.equal(got, ref)


def test_decode_loop_samples_the_tokens_of_generate_until_a_row_ends(model_and_tokenizer, multinomial_draws):
    # sampling with 64 of the 512 tokens as EOS: rows end after a few tokens. Until the first row
    # ends, the loop and generate draw the same random numbers for the same rows: equal tokens.
    # After it, the loop draws for fewer rows (its stream differs); every row still ends at its
    # first EOS and is padded after it.
    from gtpo.sampling.decode import decode, prefill as _prefill
    from gtpo.sampling.padding import left_pad
    from gtpo.sampling.rollout import encode_prompts

    model, tokenizer = model_and_tokenizer
    rows = [p for p in encode_prompts(tokenizer, PROMPTS) for _ in range(4)]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    eos_ids = list(range(3, 515, 8))
    pad = tokenizer.pad_token_id
    config = _config(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=30,
                     eos_token_id=eos_ids, pad_token_id=pad)
    with torch.no_grad():
        torch.manual_seed(5)
        ref = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]
        torch.manual_seed(5)
        got = decode(model, ids, mask, _prefill(model, ids, mask), config, eos_ids=eos_ids, pad_id=pad)
    eos = torch.tensor(eos_ids)
    first_end = int(torch.isin(ref, eos).any(dim=0).nonzero()[0])
    assert first_end < 10
    assert torch.equal(got[:, :first_end + 1], ref[:, :first_end + 1])
    for row in got:
        ended = torch.isin(row, eos).nonzero()
        if len(ended):
            assert bool((row[int(ended[0]) + 1:] == pad).all())


@pytest.mark.parametrize("setting", ["repetition_penalty", "no_repeat_ngram_size", "suppress_tokens", "min_p"])
def test_decode_loop_leaves_settings_it_does_not_cover_to_generate(model_and_tokenizer, setting):
    from gtpo.sampling.decode import decode_loop_config

    model, tokenizer = model_and_tokenizer
    plain = dict(do_sample=True, max_new_tokens=5, temperature=0.7, top_k=0, top_p=0.9, repetition_penalty=1.0)
    assert decode_loop_config(model, _config(**plain)) is not None
    own = model.generation_config
    if setting == "repetition_penalty":
        assert decode_loop_config(model, _config(**{**plain, "repetition_penalty": 1.2})) is None
        torch.manual_seed(2)
        a = generate(model, tokenizer, PROMPTS, num_samples=2, max_new_tokens=5, repetition_penalty=1.2)
        torch.manual_seed(2)
        b = generate(model, tokenizer, PROMPTS, num_samples=2, max_new_tokens=5, repetition_penalty=1.2,
                     decode_loop=False)
        assert torch.equal(a.completion_ids, b.completion_ids)
        return
    value = {"no_repeat_ngram_size": 2, "suppress_tokens": [5, 6], "min_p": 0.1}[setting]
    setattr(own, setting, value)  # set in the model's own generation config: generate would apply it
    try:
        assert decode_loop_config(model, _config(**plain)) is None
    finally:
        setattr(own, setting, None)
    assert decode_loop_config(model, _config(**plain)) is not None


# ----------------------------------------------------------------------------- sample_categorical
def test_sample_categorical_matches_the_distribution():
    # 200,000 draws per row from fixed weights (one row unnormalised): every frequency within
    # 5 standard errors of its probability; zero-probability entries never drawn
    from gtpo.sampling.decode import sample_categorical

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.25, 0.125, 0.125],
                          [3.0, 0.0, 1.0, 0.0, 0.0, 4.0],
                          [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    expected = probs / probs.sum(1, keepdim=True)
    torch.manual_seed(0)
    n = 200_000
    draws = sample_categorical(probs.repeat(n, 1)).view(n, 3)  # row r of every block of 3
    for r in range(3):
        freq = torch.bincount(draws[:, r], minlength=6).double() / n
        se = (expected[r] * (1 - expected[r]) / n).sqrt()
        assert bool(((freq - expected[r]).abs() <= 5 * se + 1e-12).all()), (r, freq, expected[r])
        assert bool((freq[expected[r] == 0] == 0).all())


def test_sample_categorical_agrees_with_multinomial_on_random_rows():
    # fast (inverse CDF) vs torch.multinomial on random softmax rows with top-k-like zeros: the
    # mean of each token's indicator over 20,000 draws agrees within 5 standard errors
    from gtpo.sampling.decode import sample_categorical

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 40, generator=g) * 2
    logits[:, ::3] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    n = 20_000
    torch.manual_seed(2)
    fast = sample_categorical(probs.repeat(n, 1)).view(n, 4)
    slow = torch.multinomial(probs, n, replacement=True).T  # (n, 4)
    for r in range(4):
        f = torch.bincount(fast[:, r], minlength=40).double() / n
        m = torch.bincount(slow[:, r], minlength=40).double() / n
        se = (2 * probs[r].double() * (1 - probs[r].double()) / n).sqrt()
        assert bool(((f - m).abs() <= 5 * se + 1e-12).all())
        assert bool((f[probs[r] == 0] == 0).all())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0])
def test_sample_categorical_refuses_non_finite_or_empty_rows(bad):
    from gtpo.sampling.decode import sample_categorical

    probs = torch.tensor([[0.5, 0.5], [bad, 0.0 if bad == 0.0 else 1.0]])
    with pytest.raises(RuntimeError, match="inf, nan"):
        sample_categorical(probs)


def test_sample_categorical_records_instead_of_raising_when_given_a_flag():
    # valid=...: no host read, the check is ANDed into the flag (decode reads it when it syncs)
    from gtpo.sampling.decode import sample_categorical

    valid = torch.ones((), dtype=torch.bool)
    sample_categorical(torch.tensor([[0.5, 0.5]]), valid=valid)
    assert bool(valid)
    sample_categorical(torch.tensor([[float("nan"), 1.0]]), valid=valid)
    assert not bool(valid)
    sample_categorical(torch.tensor([[0.5, 0.5]]), valid=valid)
    assert not bool(valid)  # stays false


# ----------------------------------------------------------------------------- the loop's cache and attention
def test_growing_layer_holds_what_a_dynamic_layer_holds():
    # the same keys/values after a prefill, single-position updates and row selections, and the same
    # tensors returned by update (views of the buffers)
    from transformers.cache_utils import DynamicLayer

    from gtpo.sampling.decode import GrowingLayer

    g = torch.Generator().manual_seed(0)
    plain = DynamicLayer()
    plain.update(torch.randn(5, 2, 4, 3, generator=g, dtype=torch.float64),
                 torch.randn(5, 2, 4, 3, generator=g, dtype=torch.float64))
    grown = GrowingLayer.from_layer(plain, capacity=6)
    assert grown.get_seq_length() == 4 and torch.equal(grown.keys, plain.keys)
    for step, keep in enumerate([None, torch.tensor([0, 2, 3, 4]), None, torch.tensor([1, 3]), None]):
        if keep is not None:
            plain.batch_select_indices(keep)
            grown.batch_select_indices(keep)
        n = plain.keys.shape[0]
        k, v = torch.randn(n, 2, 1, 3, generator=g, dtype=torch.float64), torch.randn(n, 2, 1, 3, generator=g,
                                                                                    dtype=torch.float64)
        a, b = plain.update(k, v), grown.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), step
        assert grown.get_seq_length() == plain.get_seq_length() == 5 + step
    grown.update(*(torch.randn(2, 2, 1, 3, dtype=torch.float64),) * 2)  # the 6th and last position
    with pytest.raises(RuntimeError, match="exceed"):
        grown.update(*(torch.randn(2, 2, 1, 3, dtype=torch.float64),) * 2)


def test_grow_cache_leaves_other_caches_alone(model_and_tokenizer):
    from transformers.cache_utils import DynamicCache

    from gtpo.sampling.decode import GrowingLayer, grow_cache, prefill

    model, tokenizer = model_and_tokenizer
    assert not grow_cache(DynamicCache(config=model.config), 4)  # empty layers (one-token prompts)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    cache = prefill(model, ids, torch.ones_like(ids))
    assert grow_cache(cache, 4) and all(type(layer) is GrowingLayer for layer in cache.layers)
    assert not grow_cache(cache, 4)  # already grown: not a plain DynamicLayer


@pytest.fixture
def matmul_attention_in_float64(monkeypatch):
    """decode_attention computes float64 queries itself (it leaves float32/float64 to SDPA by
    default): its maths can then be checked at float64 precision."""
    import gtpo.sampling.decode

    monkeypatch.setattr(gtpo.sampling.decode, "MATMUL_ATTENTION_DTYPES", (torch.bfloat16, torch.float16, torch.float64))


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_decode_attention_is_sdpa_for_one_query(kv_heads, mask_kind, matmul_attention_in_float64):
    # float64: softmax(q k^T * s + mask) v with grouped query heads equals torch's SDPA over repeated
    # key/value heads (query head h reads key/value head h // (heads / kv_heads), as repeat_kv)
    import torch.nn.functional as F

    from gtpo.sampling.decode import decode_attention

    g = torch.Generator().manual_seed(1)
    n, heads, length, dim = 3, 4, 7, 5
    q = torch.randn(n, heads, 1, dim, generator=g, dtype=torch.float64)
    k = torch.randn(n, kv_heads, length, dim, generator=g, dtype=torch.float64)
    v = torch.randn(n, kv_heads, length, dim, generator=g, dtype=torch.float64)
    keep = torch.ones(n, 1, 1, length, dtype=torch.bool)
    keep[0, ..., :3] = False  # left padding of row 0
    keep[2, ..., :1] = False
    mask = {"none": None, "bool": keep,
            "float": torch.zeros(n, 1, 1, length, dtype=torch.float64).masked_fill(~keep, float("-inf"))}[mask_kind]
    rep = heads // kv_heads
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1),
                                         attn_mask=mask, scale=0.3).transpose(1, 2)  # (n, 1, heads, dim)
    module = torch.nn.Module()
    module.num_key_value_groups = rep
    got, weights = decode_attention(module, q, k, v, mask, scaling=0.3)
    assert weights is None and got.shape == (n, 1, heads, dim)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    # bfloat16: the same up to bfloat16 rounding of the inputs, scores and weights
    low, _ = decode_attention(module, q.bfloat16(), k.bfloat16(), v.bfloat16(),
                              mask if mask is None or mask.dtype == torch.bool else mask.bfloat16(), scaling=0.3)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), ref, rtol=0, atol=0.05)


def test_decode_attention_leaves_float32_to_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from gtpo.sampling.decode import decode_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 1, 5, generator=g), torch.randn(2, 2, 6, 5, generator=g),
               torch.randn(2, 2, 6, 5, generator=g))
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    assert torch.equal(decode_attention(module, q, k, v, None, scaling=0.4)[0],
                       sdpa_attention_forward(module, q, k, v, None, scaling=0.4)[0])


def test_decode_attention_leaves_other_calls_to_sdpa(monkeypatch):
    # several query positions (a prompt), dropout or soft-capping go to transformers' SDPA function
    import transformers.integrations.sdpa_attention as sdpa
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from gtpo.sampling.decode import decode_attention

    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 3, 5, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 3, 5, generator=g, dtype=torch.float64)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    got, _ = decode_attention(module, q, k, v, None, scaling=0.4)
    ref, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.4)
    assert torch.equal(got, ref)
    # a soft-capped decoding step goes there too, as the model's own SDPA attention would take it (transformers 5.25
    # refuses softcap there; 5.17, the GPU machine's, ignores it): a spy, not SDPA's refusal, says where it went
    calls = []
    monkeypatch.setattr(sdpa, "sdpa_attention_forward", lambda *a, **kw: calls.append(kw) or ("sdpa", None))
    assert decode_attention(module, q[:, :, :1], k, v, None, scaling=0.4, softcap=30.0)[0] == "sdpa"
    assert calls == [{"dropout": 0.0, "scaling": 0.4, "softcap": 30.0}]


def test_decode_loop_with_matmul_attention_gives_the_greedy_tokens_of_generate(model_and_tokenizer,
                                                                               matmul_attention_in_float64):
    # the whole model attending through decode_attention's matmuls (float64), rows ending at different
    # steps (their cache rows dropped from the growing buffers): exactly generate's greedy tokens
    test_decode_loop_drops_finished_rows_and_matches_generate(model_and_tokenizer, all_finish=False)


def test_decode_loop_attends_through_decode_attention_on_cpu(model_and_tokenizer, monkeypatch):
    # every decoding step (one query) of every layer goes through decode_attention; the model's own
    # attention implementation is back to sdpa afterwards, also when the loop raises
    import gtpo.sampling.decode
    from transformers import AttentionInterface

    model, tokenizer = model_and_tokenizer
    assert model.config._attn_implementation == "sdpa"
    queries = []

    def spy(module, query, *args, **kwargs):
        queries.append(query.shape[2])
        return gtpo.sampling.decode.decode_attention(module, query, *args, **kwargs)

    monkeypatch.setattr(gtpo.sampling.decode, "_register_decode_attention",
                        lambda: AttentionInterface.register(gtpo.sampling.decode.DECODE_ATTENTION, spy) or True)
    try:
        generate(model, tokenizer, PROMPTS, num_samples=2, max_new_tokens=4, temperature=1.0)
        assert model.config._attn_implementation == "sdpa"
        assert len(queries) == 4 * model.config.num_hidden_layers and set(queries) == {1}
        def broken(module, args, out):  # NaN logits: the sampled distribution is broken
            out.logits.fill_(float("nan"))

        handle = model.register_forward_hook(broken)
        try:
            with pytest.raises(RuntimeError, match="inf, nan"):
                generate(model, tokenizer, PROMPTS, num_samples=2, max_new_tokens=4, temperature=1.0)
        finally:
            handle.remove()
        assert model.config._attn_implementation == "sdpa"
    finally:
        gtpo.sampling.decode._register_decode_attention()


@pytest.mark.parametrize("every", [2, 5])
def test_decode_loop_reading_rows_every_few_tokens_gives_the_same_greedy_tokens(model_and_tokenizer, every):
    # sync_every > 1 (the accelerator default): rows that ended stay in the batch until the next
    # read, writing padding; greedy tokens do not depend on the batch, so they equal sync_every=1's,
    # and the result is trimmed to the longest completion
    from gtpo.sampling.decode import decode, prefill as _prefill
    from gtpo.sampling.padding import left_pad
    from gtpo.sampling.rollout import encode_prompts

    model, tokenizer = model_and_tokenizer
    prompts = PROMPTS + ["a b c", "12 + 30 = ", "think"]
    ids, mask = left_pad(encode_prompts(tokenizer, prompts), tokenizer.pad_token_id)
    greedy = _greedy_reference(model, ids, mask, 12)
    pad = tokenizer.pad_token_id
    for eos_ids in (sorted({int(greedy[0, 1]), int(greedy[2, 4])}), sorted({int(row[-3]) for row in greedy})):
        config = _config(do_sample=False, max_new_tokens=12, eos_token_id=eos_ids, pad_token_id=pad)
        with torch.no_grad():
            ref = decode(model, ids, mask, _prefill(model, ids, mask), config, eos_ids=eos_ids, pad_id=pad)
            got = decode(model, ids, mask, _prefill(model, ids, mask), config, eos_ids=eos_ids, pad_id=pad,
                         sync_every=every)
        assert torch.equal(got, ref), eos_ids


def test_decode_loop_reading_rows_every_few_tokens_ends_rows_at_their_first_eos(model_and_tokenizer):
    from gtpo.sampling.decode import decode, prefill as _prefill
    from gtpo.sampling.padding import left_pad
    from gtpo.sampling.rollout import encode_prompts

    model, tokenizer = model_and_tokenizer
    rows = [p for p in encode_prompts(tokenizer, PROMPTS) for _ in range(4)]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    eos_ids = list(range(3, 515, 8))
    pad = tokenizer.pad_token_id
    config = _config(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=60,
                     eos_token_id=eos_ids, pad_token_id=pad)
    torch.manual_seed(5)
    with torch.no_grad():
        got = decode(model, ids, mask, _prefill(model, ids, mask), config, eos_ids=eos_ids, pad_id=pad, sync_every=4)
    is_eos = torch.isin(got, torch.tensor(eos_ids))
    lengths = [int(row.nonzero()[0]) + 1 if row.any() else got.shape[1] for row in is_eos]
    assert got.shape[1] == max(lengths) and max(lengths) < 60  # trimmed to the longest completion
    for row, length in zip(got, lengths):
        assert bool((row[length:] == pad).all())
    with pytest.raises(ValueError, match="sync_every"):
        decode(model, ids, mask, _prefill(model, ids, mask), config, eos_ids=eos_ids, pad_id=pad, sync_every=0)
