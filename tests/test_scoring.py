"""Reward functions as the trainer calls them (``gtpo.rewards.scoring``, TRL's contract): the values TRL accepts (numpy,
tensors, bools, None), errors that name the function, the prompt and the line that raised, values out of range or
of the wrong shape, ``async def`` functions (awaited concurrently, as TRL gathers them), sequence-classification
reward models (an object, a local directory, a hub id), TRL's reward names and dotted import paths; all on tiny
models. (The reward functions themselves: tests/test_rewards.py.)"""

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from gtpo import GTPOTrainer
from gtpo.errors import RewardFunctionError
from gtpo.rewards import resolve_reward
from gtpo.rewards.scoring import SequenceClassificationReward, is_async_reward
from helpers import PROMPTS, rows, tiny_config

ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]


def config(tmp_path, **kw):
    return tiny_config(tmp_path, **{"log_completions_steps": 1, "num_completions_to_print": 8, "entropy_filter": False,
                                    **kw})


def metrics(cfg):
    with open(os.path.join(cfg.output_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def digits(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def length(completion_ids, **kwargs):
    return [len(ids) / 6.0 for ids in completion_ids]


class Rendezvous:
    """Two async rewards that each wait for the other inside the same step: they finish only if awaited
    concurrently (a sequential await would time out)."""

    def __init__(self):
        self.barriers = {}

    async def meet(self, key):
        barrier = self.barriers.setdefault(key, asyncio.Barrier(2))
        await asyncio.wait_for(barrier.wait(), timeout=30)


def async_pair():
    rendezvous = Rendezvous()

    async def digits_async(completions, **kwargs):
        await rendezvous.meet(id(completions))
        return digits(completions)

    async def length_async(completions, completion_ids, **kwargs):
        await rendezvous.meet(id(completions))
        return length(completion_ids)

    return digits_async, length_async


def test_async_rewards_are_awaited_together_and_score_as_the_sync_ones(tiny_model_path, tmp_path):
    digits_async, length_async = async_pair()
    assert is_async_reward(digits_async) and not is_async_reward(digits)
    sync_cfg, async_cfg = config(tmp_path / "sync"), config(tmp_path / "async")
    GTPOTrainer(tiny_model_path, [digits, length], ROWS, args=sync_cfg).train()
    GTPOTrainer(tiny_model_path, [digits_async, length_async], ROWS, args=async_cfg).train()
    for a, b in zip(metrics(sync_cfg), metrics(async_cfg), strict=True):
        for key in ("reward", "loss", "grad_norm"):
            assert a[key] == b[key], key  # same samples, same rewards, same update
        assert a["rewards/digits/mean"] == b["rewards/digits_async/mean"]


def test_an_async_reward_that_raises_is_named_with_its_line(tiny_model_path, tmp_path):
    async def broken_async(completions, **kwargs):
        await asyncio.sleep(0)
        return [1.0 / 0 for _ in completions]

    trainer = GTPOTrainer(tiny_model_path, [digits, broken_async], ROWS, args=config(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=r"reward function 'broken_async' raised ZeroDivisionError: "
                                                  r"float division by zero at test_scoring.py:\d+ in "
                                                  r"broken_async .*fails on prompt index 0"):
        trainer.train()


def build_reward_model(path, seed=0):
    """A tiny random Llama sequence classifier (one label) with the tiny BPE tokenizer, saved at ``path``."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from gtpo.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(eos_equals_pad=False, seed=seed)
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=1, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory):
    return build_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm")


def logit_by_hand(path, text):
    """The classifier's logit on ``text`` alone (no padding): what the batched, right-padded call must give."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    ids = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        return float(model(**ids).logits[0, 0])


def test_reward_model_scores_prompt_plus_completion(reward_model_path):
    reward = resolve_reward(reward_model_path)
    assert isinstance(reward, SequenceClassificationReward) and reward.__name__ == "tiny-rm"
    prompts, completions = ["What is 2 + 2?", "What is 10 + 7?"], [" 4", " the answer is 17 so 17"]
    got = reward(prompts=prompts, completions=completions, completion_ids=[[1], [2]])
    want = [logit_by_hand(reward_model_path, p + c) for p, c in zip(prompts, completions)]
    assert got == pytest.approx(want, abs=1e-5)  # padding on the right does not change a row's logit
    # conversational prompts: the reward tokenizer's chat template of prompt + completion messages
    chat = [[{"role": "user", "content": "What is 2 + 2?"}]]
    (text,) = reward.texts(chat, [[{"role": "assistant", "content": "4"}]])
    assert text == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    assert reward(prompts=chat, completions=[[{"role": "assistant", "content": "4"}]]) == pytest.approx(
        [logit_by_hand(reward_model_path, text)], abs=1e-5)


def test_reward_model_in_training_as_a_path_and_as_an_object(tiny_model_path, reward_model_path, tmp_path):
    from transformers import AutoModelForSequenceClassification

    by_path = config(tmp_path / "path", max_steps=1)
    GTPOTrainer(tiny_model_path, [reward_model_path], ROWS, args=by_path).train()
    (line,) = metrics(by_path)
    with open(os.path.join(by_path.output_dir, "completions.jsonl")) as fh:
        samples = [json.loads(s) for s in fh]
    assert len(samples) == 8
    for s in samples:  # the logged reward of each sample is the classifier's logit on prompt + completion
        assert s["reward"] == pytest.approx(logit_by_hand(reward_model_path, s["prompt"] + s["completion"]),
                                            abs=1e-5)
    assert line["rewards/tiny-rm/mean"] == pytest.approx(line["reward"], abs=1e-6)
    # a loaded model object, as TRL takes it: the tokenizer comes from its path; the same rewards
    by_object = config(tmp_path / "object", max_steps=1)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_path, num_labels=1)
    GTPOTrainer(tiny_model_path, [model], ROWS, args=by_object).train()
    assert metrics(by_object)[0]["reward"] == pytest.approx(line["reward"], abs=1e-6)


def test_a_causal_lm_directory_is_not_a_reward_model(tiny_model_path):
    with pytest.raises(ValueError, match=r"expected a sequence-classification model \(architectures "
                                         r"\.\.\.ForSequenceClassification\), got \['LlamaForCausalLM'\]"):
        resolve_reward(tiny_model_path)


def test_reward_model_by_hub_id_offline_from_the_cache(reward_model_path, tmp_path):
    # the hub cache layout an online download leaves (refs/main -> snapshots/<revision>/files)
    revision = "0" * 40
    repo = tmp_path / "hub" / "models--someorg--tiny-rm"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name in os.listdir(reward_model_path):
        (snapshot / name).write_bytes(open(os.path.join(reward_model_path, name), "rb").read())
    code = textwrap.dedent("""
        from gtpo.rewards import resolve_reward
        reward = resolve_reward("someorg/tiny-rm")
        print(reward.__name__, reward(prompts=["What is 2 + 2?"], completions=[" 4"])[0])
    """)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    name, value = out.stdout.split()
    assert name == "tiny-rm"
    assert float(value) == pytest.approx(logit_by_hand(reward_model_path, "What is 2 + 2? 4"), abs=1e-5)


def test_trl_reward_names_and_dotted_paths(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    import trl.rewards

    assert resolve_reward("think_format_reward") is trl.rewards.think_format_reward
    assert resolve_reward("accuracy_reward") is trl.rewards.accuracy_reward
    punish = resolve_reward("get_soft_overlong_punishment")  # the values `trl grpo` uses: 1280 tokens, 256 cache
    assert punish(completion_ids=[[0] * 1024, [0] * 1280]) == pytest.approx([0.0, -1.0])
    (tmp_path / "my_rewards.py").write_text("def shout(completions, **kw):\n    return [1.0 for _ in completions]\n")
    monkeypatch.chdir(tmp_path)  # `trl grpo` imports dotted paths from the current directory
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    assert resolve_reward("my_rewards.shout")(completions=["a"]) == [1.0]
    assert resolve_reward("my_rewards:shout")(completions=["a"]) == [1.0]
    with pytest.raises(ValueError, match=r"reward 'my_rewards.whisper': 'my_rewards' has no attribute 'whisper'"):
        resolve_reward("my_rewards.whisper")


# ----------------------------------------------------------------------------- values and errors
def quiet_config(tmp_path, **kw):
    """No completion logs: what the values and errors below need."""
    return tiny_config(tmp_path, **{"entropy_filter": False, **kw})


def picky(prompts, completions, **kwargs):
    out = []
    for p, c in zip(prompts, completions):
        if "5 + 6" in p:
            raise ZeroDivisionError("no reward for this one")
        out.append(float(len(c)))
    return out


def test_reward_that_raises_names_function_prompt_index_and_line(tiny_model_path, tmp_path):
    trainer = GTPOTrainer(tiny_model_path, picky, rows(), args=quiet_config(tmp_path, prompts_per_step=8, max_steps=1))
    with pytest.raises(RewardFunctionError) as info:
        trainer.train()
    message = str(info.value)
    assert message.startswith("reward function 'picky' raised ZeroDivisionError: no reward for this one at "
                              "test_scoring.py:")
    assert " in picky (step 1, dataset rows [" in message
    step_rows = json.loads(re.search(r"dataset rows (\[[\d, ]+\])", message).group(1))
    row = PROMPTS.index("What is 5 + 6?")
    assert sorted(step_rows) == list(range(8))  # prompts_per_step=8: every row, in the sampler's order
    assert f"it fails on prompt index {step_rows.index(row)} (dataset row {row}: 'What is 5 + 6?')" in message
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_reward_without_kwargs_gets_a_hint(tiny_model_path, tmp_path):
    def positional_only(completions):
        return [1.0] * len(completions)

    trainer = GTPOTrainer(tiny_model_path, positional_only, rows(), args=quiet_config(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=r"'positional_only' raised TypeError: .*give the function a "
                                                  r"\*\*kwargs parameter"):
        trainer.train()


def test_reward_outputs_accepted_as_in_trl(tiny_model_path, tmp_path):
    """numpy arrays and scalars, tensors, bools (as 0/1) and None are accepted, like TRL does."""
    import numpy as np

    def as_numpy(completions, **kw):
        return np.array([1.0 if i % 2 else 0.0 for i in range(len(completions))], dtype=np.float32)

    def as_scalars(completions, **kw):
        return [np.float32(0.5), np.int64(1), torch.tensor(0.25), True, False, None, np.float64(2.0), 3][:len(completions)]

    def as_tensor(completions, **kw):
        return torch.full((len(completions),), 0.5)

    cfg = quiet_config(tmp_path, max_steps=1, prompts_per_step=2, group_size=4)
    GTPOTrainer(tiny_model_path, [as_numpy, as_scalars, as_tensor], rows(), args=cfg).train()
    m = metrics(cfg)[0]
    assert m["rewards/as_numpy/mean"] == 0.5
    assert m["rewards/as_scalars/mean"] == pytest.approx((0.5 + 1 + 0.25 + 1 + 0 + 2 + 3) / 7, abs=1e-6)
    assert m["rewards/as_tensor/mean"] == 0.5


@pytest.mark.parametrize("outputs, pattern", [
    (lambda n: [1e39] * n, r"'r' returned 1e\+39 for completion 0 .* beyond the float32 range"),
    (lambda n: torch.zeros(n, 1), r"'r' returned a Tensor of shape \(8, 1\) at step 1"),
    (lambda n: [[0.5]] * n, r"'r' returned \[0.5\] \(list\) for completion 0 \(prompt index 0, dataset row \d+, step 1\)"),
    (lambda n: [3e38, 3e38] * (n // 2), None),  # fine alone; the weighted sum overflows with weights [1, 1]
])
def test_reward_values_out_of_range_or_shape(tiny_model_path, tmp_path, outputs, pattern):
    def r(completions, **kw):
        return outputs(len(completions))

    funcs = [r] if pattern else [r, r]
    trainer = GTPOTrainer(tiny_model_path, funcs, rows(), args=quiet_config(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=pattern or r"the weighted sum of the rewards of completion 0 .* "
                                                             r"overflows float32"):
        trainer.train()
