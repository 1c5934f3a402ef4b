"""End-to-end trainer tests on tiny random models (CPU, offline)."""

import json
import math
import os

import pytest
import torch

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.errors import RewardFunctionError
from helpers import PROMPTS


def digit_reward(completions, **kwargs):
    """Share of digit characters in the completion: dense, so a tiny model can learn it fast."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(sum(ch.isdigit() for ch in text) / max(len(text), 1))
    return out


def length_reward(completion_ids, **kwargs):
    return [len(ids) / 8.0 for ids in completion_ids]


def make_config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "run"), group_size=4, prompts_per_step=2, max_steps=2,
        max_completion_length=8, learning_rate=1e-2, save_steps=0, log_completions_steps=1,
        disable_tqdm=True, seed=0, lr_scheduler_type="constant",
    )
    base.update(kw)
    return GTPOConfig(**base)


def dataset(n=8):
    return [{"prompt": p, "answer": str(i)} for i, p in enumerate(PROMPTS[:n])]


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("loss_type", ["gtpo", "grpo", "dr_grpo", "dapo"])
def test_every_loss_type_updates_every_trainable_parameter(tiny_model_path, tmp_path, loss_type):
    cfg = make_config(tmp_path, loss_type=loss_type, entropy_filter=False)
    trainer = GTPOTrainer(tiny_model_path, [digit_reward, length_reward], dataset(), args=cfg)
    before = snapshot(trainer.unwrapped_model)
    trainer.train()
    after = snapshot(trainer.unwrapped_model)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, f"{loss_type}: parameters did not change: {unchanged}"


@pytest.mark.parametrize("decode_loop", [True, False])
def test_decode_loop_setting_picks_the_sampler(tiny_model_path, tmp_path, monkeypatch, decode_loop):
    # decode_loop=True samples with gtpo.sampling.rollout.decode, False with transformers generate; both train
    import gtpo.sampling.rollout

    calls = {"decode": 0, "generate": 0}
    decode = gtpo.sampling.rollout.decode

    def counting_decode(*args, **kwargs):
        calls["decode"] += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(gtpo.sampling.rollout, "decode", counting_decode)
    cfg = make_config(tmp_path, max_steps=2, decode_loop=decode_loop, entropy_filter=False)
    trainer = GTPOTrainer(tiny_model_path, [digit_reward, length_reward], dataset(), args=cfg)
    model_cls = type(trainer.unwrapped_model)
    original = model_cls.generate

    def counting_generate(self, *args, **kwargs):
        calls["generate"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(model_cls, "generate", counting_generate)
    before = snapshot(trainer.unwrapped_model)
    trainer.train()
    assert calls == ({"decode": 2, "generate": 0} if decode_loop else {"decode": 0, "generate": 2})
    after = snapshot(trainer.unwrapped_model)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_metrics_jsonl_has_documented_keys(tiny_model_path, tmp_path):
    cfg = make_config(tmp_path, max_steps=2, entropy_filter=False)
    GTPOTrainer(tiny_model_path, [digit_reward, length_reward], dataset(), args=cfg).train()
    lines = [json.loads(l) for l in open(os.path.join(cfg.output_dir, "metrics.jsonl"))]
    assert [l["step"] for l in lines] == [1, 2]
    required = [
        "step", "loss", "reward", "reward_std", "rewards/digit_reward/mean", "rewards/length_reward/mean",
        "frac_reward_zero_std", "completions/mean_length", "completions/max_length", "completions/clipped_ratio",
        "entropy", "gtpo/conflict_frac", "gtpo/filtered_frac", "clip_ratio/region_mean", "grad_norm", "learning_rate",
        "step_time", "gtpo/tokens_per_s", "gtpo/skipped_steps",
    ]
    for key in required:
        assert key in lines[0], key
        assert math.isfinite(lines[0][key]), key
    # random tiny model: entropy close to ln(V) (V = 512) and above ln 2
    assert 3.0 < lines[0]["entropy"] <= math.log(512) + 1e-4
    assert os.path.isfile(os.path.join(cfg.output_dir, "completions.jsonl"))
    assert os.path.isfile(os.path.join(cfg.output_dir, "config.json"))  # final model saved in output_dir


def test_final_model_loads_with_from_pretrained(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = make_config(tmp_path, max_steps=1, entropy_filter=False)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, dataset(), args=cfg)
    trainer.train()
    loaded = AutoModelForCausalLM.from_pretrained(cfg.output_dir)
    for (name, p), q in zip(trainer.unwrapped_model.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), name


def test_lora_trains_only_the_adapter(tiny_model_path, tmp_path):
    from peft import LoraConfig

    cfg = make_config(tmp_path, max_steps=2, entropy_filter=False)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GTPOTrainer(tiny_model_path, digit_reward, dataset(), args=cfg, peft_config=lora)
    model = trainer.unwrapped_model
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = snapshot(model)
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(frozen[n], p), f"frozen parameter {n} changed"
        else:
            assert not torch.equal(trainable[n], p), f"adapter parameter {n} did not change"
    assert os.path.isfile(os.path.join(cfg.output_dir, "adapter_model.safetensors"))


def test_conversational_dataset(tiny_qwen_path, tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "Answer."}, {"role": "user", "content": p}], "answer": "1"}
            for p in PROMPTS]
    seen = {}

    def reward(prompts, completions, answer, **kw):
        seen["completion"] = completions[0]
        seen["answer"] = answer[0]
        return digit_reward(completions)

    cfg = make_config(tmp_path, max_steps=1, entropy_filter=False)
    GTPOTrainer(tiny_qwen_path, reward, rows, args=cfg).train()
    assert isinstance(seen["completion"], list) and seen["completion"][0]["role"] == "assistant"
    assert seen["answer"] == "1"


def test_resume_is_exact(tiny_model_path, tmp_path):
    """6 steps straight == 3 steps, resume, 3 more: identical weights (CPU, fixed seed)."""
    common = dict(max_steps=6, save_steps=3, entropy_filter=True, entropy_threshold=100.0)
    straight = make_config(tmp_path / "a", **common)
    t1 = GTPOTrainer(tiny_model_path, [digit_reward, length_reward], dataset(), args=straight)
    t1.train()

    part = make_config(tmp_path / "b", **common)
    t2 = GTPOTrainer(tiny_model_path, [digit_reward, length_reward], dataset(), args=part.replace(max_steps=3))
    t2.train()
    assert os.path.isdir(os.path.join(part.output_dir, "checkpoint-3"))
    # a fresh trainer object continues the finished 3-step run from its checkpoint, into a new output_dir (a finished
    # run is not resumed over its final model: tests/test_checkpoint.py)
    more = part.replace(output_dir=str(tmp_path / "c"))
    t3 = GTPOTrainer(tiny_model_path, [digit_reward, length_reward], dataset(), args=more)
    t3.train(resume_from_checkpoint=os.path.join(part.output_dir, "checkpoint-3"))
    a, b = snapshot(t1.unwrapped_model), snapshot(t3.unwrapped_model)
    for n in a:
        assert torch.equal(a[n], b[n]), n
    steps = [json.loads(l)["step"] for l in open(os.path.join(more.output_dir, "metrics.jsonl"))]
    assert steps == [4, 5, 6]


def test_toy_reward_rises(tmp_path):
    """A ~1M-parameter model learns to write digits: the dense reward rises clearly."""
    from gtpo.testing import build_tiny_model

    path = build_tiny_model(tmp_path / "m", hidden_size=128, num_layers=2, seed=3)
    cfg = make_config(tmp_path, max_steps=30, group_size=8, prompts_per_step=2, learning_rate=3e-3,
                      max_completion_length=8, entropy_filter=False, gamma=0.0, log_completions_steps=0)
    trainer = GTPOTrainer(path, digit_reward, dataset(), args=cfg)
    trainer.train()
    rewards = [json.loads(l)["reward"] for l in open(os.path.join(cfg.output_dir, "metrics.jsonl"))]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2 and last > 2 * first, (first, last)


# ----------------------------------------------------------------------------- bad input
def test_reward_function_that_raises_names_function_and_row(tiny_model_path, tmp_path):
    def broken(completions, **kw):
        raise KeyError("boom")

    trainer = GTPOTrainer(tiny_model_path, broken, dataset(), args=make_config(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=r"'broken' raised KeyError.*dataset rows"):
        trainer.train()


@pytest.mark.parametrize(
    "bad, pattern",
    [
        (lambda completions, **kw: [0.0] * (len(completions) - 1), "returned 7 values for 8 completions"),
        (lambda completions, **kw: [float("nan")] * len(completions), "must be finite"),
        (lambda completions, **kw: ["1"] * len(completions), "expected a float or None"),
        (lambda completions, **kw: [None] * len(completions), "every reward function returned None"),
        (lambda completions, **kw: 1.0, "expected a list"),
    ],
)
def test_bad_reward_outputs(tiny_model_path, tmp_path, bad, pattern):
    trainer = GTPOTrainer(tiny_model_path, bad, dataset(), args=make_config(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=pattern):
        trainer.train()


def test_dataset_errors(tiny_model_path, tmp_path):
    cfg = make_config(tmp_path)
    with pytest.raises(ValueError, match="no 'prompt' column"):
        GTPOTrainer(tiny_model_path, digit_reward, [{"question": "x"}], args=cfg)
    with pytest.raises(ValueError, match="empty"):
        GTPOTrainer(tiny_model_path, digit_reward, [], args=cfg)
    with pytest.raises(ValueError, match="longer than max_prompt_length=2"):
        GTPOTrainer(tiny_model_path, digit_reward, dataset(), args=cfg.replace(max_prompt_length=2))


def test_group_size_below_two(tmp_path):
    with pytest.raises(ValueError, match="group_size must be an integer >= 2"):
        make_config(tmp_path, group_size=1)


def test_tokenizer_without_pad_token_uses_eos(tiny_model_path, tmp_path, caplog):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.pad_token = None
    with caplog.at_level("WARNING", logger="gtpo"):
        trainer = GTPOTrainer(tiny_model_path, digit_reward, dataset(), args=make_config(tmp_path), processing_class=tok)
    assert trainer.tokenizer.pad_token == tok.eos_token
    assert "no pad token" in caplog.text


def test_output_dir_with_another_run_is_refused(tiny_model_path, tmp_path):
    cfg = make_config(tmp_path, max_steps=1, entropy_filter=False)
    GTPOTrainer(tiny_model_path, digit_reward, dataset(), args=cfg).train()
    with pytest.raises(ValueError, match="already holds a run"):
        GTPOTrainer(tiny_model_path, digit_reward, dataset(), args=cfg).train()
    GTPOTrainer(tiny_model_path, digit_reward, dataset(), args=cfg.replace(overwrite_output_dir=True)).train()
