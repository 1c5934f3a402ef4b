"""``gtpo.sampling.rollout.SamplingParams``: the sampling settings built once from a GTPOConfig and passed as one object to
every sampler (gtpo's decoding loop, transformers generate, vLLM, the in-training evaluation)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gtpo import GTPOConfig
from gtpo.sampling.rollout import SamplingParams, generate

PROMPTS = ["What is 1 + 2?", "hi"]


@pytest.fixture(scope="module")
def tiny(tiny_qwen_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(tiny_qwen_path, dtype=torch.float32),
            AutoTokenizer.from_pretrained(tiny_qwen_path))


def test_built_once_from_the_config():
    config = GTPOConfig(max_completion_length=48, temperature=0.9, top_p=0.95, top_k=20, repetition_penalty=1.1,
                        eval_temperature=0.6, eval_max_new_tokens=None)
    assert SamplingParams.for_rollout(config) == SamplingParams(max_new_tokens=48, temperature=0.9, top_p=0.95,
                                                                top_k=20, repetition_penalty=1.1)
    # the evaluation: eval_max_new_tokens (None: max_completion_length) at eval_temperature, no truncation
    assert SamplingParams.for_evaluation(config) == SamplingParams(max_new_tokens=48, temperature=0.6)
    assert SamplingParams.for_evaluation(config.replace(eval_max_new_tokens=7)).max_new_tokens == 7
    assert SamplingParams(temperature=0.0).greedy and SamplingParams(do_sample=False).greedy
    assert not SamplingParams().greedy
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 2.0  # frozen: one object passed around, never changed on the way


def test_keywords_or_the_object_not_both():
    assert SamplingParams.given(None, {"max_new_tokens": 3}, "f") == SamplingParams(max_new_tokens=3)
    params = SamplingParams(top_k=4)
    assert SamplingParams.given(params, {}, "f") is params
    with pytest.raises(TypeError, match="not both"):
        SamplingParams.given(params, {"temperature": 0.5}, "generate")
    with pytest.raises(TypeError, match=r"generate\(\) got unexpected keyword arguments \['temprature'\]"):
        SamplingParams.given(None, {"temprature": 0.5}, "generate")


def test_the_object_samples_the_tokens_its_keywords_do(tiny):
    model, tok = tiny
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=5)
    torch.manual_seed(11)
    by_object = generate(model, tok, PROMPTS, sampling=params, num_samples=3)
    torch.manual_seed(11)
    by_keywords = generate(model, tok, PROMPTS, num_samples=3, max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=5)
    assert torch.equal(by_object.completion_ids, by_keywords.completion_ids)
    assert by_object.completion_ids.shape[0] == 6 and by_object.completion_ids.shape[1] <= 6


def test_every_setting_reaches_transformers_generate(tiny):
    """Without gtpo's decoding loop and prompt sharing, :func:`generate` is ``model.generate`` with a generation
    config of the object's settings: the same tokens under the same seed (repetition penalty included)."""
    from transformers import GenerationConfig

    from gtpo.sampling.padding import completion_mask_from_ids, left_pad
    from gtpo.sampling.rollout import encode_prompts, eos_token_ids

    model, tok = tiny
    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=7, repetition_penalty=1.3)
    torch.manual_seed(5)
    rollout = generate(model, tok, PROMPTS, sampling=params, num_samples=2, decode_loop=False,
                       share_prompt_prefill=False, merge_lora=False)
    ids, mask = left_pad([p for p in encode_prompts(tok, PROMPTS) for _ in range(2)], tok.pad_token_id)
    eos = eos_token_ids(tok, model)
    config = GenerationConfig(max_new_tokens=5, do_sample=True, temperature=0.7, top_p=0.9, top_k=7,
                              repetition_penalty=1.3, eos_token_id=eos, pad_token_id=tok.pad_token_id,
                              bos_token_id=tok.bos_token_id)
    torch.manual_seed(5)
    with torch.inference_mode():
        expected = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]
    expected_mask, _ = completion_mask_from_ids(expected, eos)
    width = rollout.completion_ids.shape[1]
    assert torch.equal(rollout.completion_mask, expected_mask[:, :width])
    assert torch.equal(rollout.completion_ids[rollout.completion_mask.bool()],
                       expected[:, :width][expected_mask[:, :width].bool()])


def test_in_training_evaluation_takes_the_object(tiny):
    from gtpo.evaluation import evaluate_during_training

    model, tok = tiny
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}, {"prompt": "What is 2 + 3?", "answer": "5"}]
    sampled = SamplingParams(max_new_tokens=4, temperature=1.0)
    by_object = evaluate_during_training(model, tok, rows, sampling=sampled, n=2, k_list=[1, 2], seed=3)
    by_keywords = evaluate_during_training(model, tok, rows, n=2, k_list=[1, 2], seed=3, max_new_tokens=4,
                                           temperature=1.0)
    assert by_object == by_keywords and "eval/pass@2" in by_object
    # neither given: greedy (the function's default), as with temperature=0.0
    assert evaluate_during_training(model, tok, rows, max_new_tokens=4) == \
        evaluate_during_training(model, tok, rows, sampling=SamplingParams(max_new_tokens=4, temperature=0.0))
    with pytest.raises(TypeError, match="not both"):
        evaluate_during_training(model, tok, rows, sampling=sampled, temperature=0.5)
