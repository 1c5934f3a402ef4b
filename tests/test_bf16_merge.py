"""LoRA merged into bfloat16 weights for vLLM (issue 42, defect 5): ``round_bf16(W + d)`` drops a delta
below half of bf16's spacing at ``W``; gtpo.sampling.lora_merge.MergeRounding counts what is dropped and
VLLMEngine.update_weights warns once (tested with a stand-in for vLLM's LLM: no vLLM needed)."""

import logging
import math

import pytest
import torch

peft = pytest.importorskip("peft")

from gtpo.sampling.lora_merge import MergeRounding, lora_merged_weight  # noqa: E402
from gtpo.sampling.vllm_engine import VLLMEngine  # noqa: E402

# bf16 keeps 8 significant bits: between 1 and 2 its spacing is 2^-7 = 0.0078125, half of it 2^-8 = 0.00390625
SPACING = 2.0 ** -7
SMALL, LARGE = 0.003, 0.005  # below and above SPACING / 2


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(2, 2, bias=False)


def lora_layer(dtype):
    """A peft LoRA layer over ``W = ones (2, 2)`` in ``dtype`` whose delta ``scale * B @ A`` is
    ``[[SMALL, SMALL], [LARGE, LARGE]]`` (float32 adapter, scale 1)."""
    from peft import LoraConfig, get_peft_model

    base = Tiny()
    with torch.no_grad():
        base.proj.weight.fill_(1.0)
    base = base.to(dtype)
    model = get_peft_model(base, LoraConfig(r=1, lora_alpha=1, target_modules=["proj"]))
    layer = model.base_model.model.proj
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(torch.tensor([[1.0, 1.0]]))
        layer.lora_B["default"].weight.copy_(torch.tensor([[SMALL], [LARGE]]))
    assert layer.get_delta_weight("default").dtype == torch.float32
    return model, layer


def test_bf16_merge_drops_a_delta_below_half_the_spacing_and_keeps_one_above():
    _, layer = lora_layer(torch.bfloat16)
    rounding = MergeRounding("test")
    merged = lora_merged_weight(layer, rounding)
    assert merged.dtype == torch.bfloat16
    assert merged[0].tolist() == [1.0, 1.0]  # 1 + 0.003 rounds back to 1: lost
    assert merged[1].tolist() == [1.0 + SPACING] * 2  # 1 + 0.005 rounds up to 1 + 2^-7: kept (as 0.0078125)
    assert (rounding.entries, rounding.lost) == (4, 2)
    assert rounding.lost_fraction == 0.5
    expected = math.sqrt(2 * SMALL ** 2 / (2 * SMALL ** 2 + 2 * LARGE ** 2))
    assert rounding.lost_norm_fraction == pytest.approx(expected, rel=1e-6)


def test_float32_merge_keeps_the_delta_and_counts_nothing():
    _, layer = lora_layer(torch.float32)
    rounding = MergeRounding("test")
    merged = lora_merged_weight(layer, rounding)
    assert torch.allclose(merged, torch.tensor([[1 + SMALL] * 2, [1 + LARGE] * 2]), rtol=0, atol=1e-7)
    assert (rounding.entries, rounding.lost) == (0, 0) and not rounding.warn_once()


class FakeLLM:
    """Stands in for vllm.LLM in update_weights: keeps the weights it was sent."""

    def __init__(self):
        self.weights = {}

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights"
        self.weights = {name: t.clone() for name, t in kwargs["weights_iterator"]}

    def reset_prefix_cache(self):
        pass


def engine():
    return VLLMEngine(FakeLLM(), None, directory=None, max_model_len=16, logprobs_mode="processed_logprobs",
                      device="cpu")


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and "loses small updates" in r.getMessage()]


def test_vllm_sync_warns_once_for_a_bf16_merge(caplog):
    model, _ = lora_layer(torch.bfloat16)
    eng = engine()
    with caplog.at_level(logging.WARNING, logger="gtpo.sampling.lora_merge"):
        eng.update_weights(model)
        eng.update_weights(model)
    sent = eng.llm.weights["proj.weight"]
    assert sent.dtype == torch.bfloat16 and sent[0].tolist() == [1.0, 1.0]
    found = _warnings(caplog)
    assert len(found) == 1 and eng.merge_rounding_warned
    message = found[0].getMessage()
    assert "use_vllm" in message and "bfloat16" in message and "50.0 % of the 4" in message


def test_vllm_sync_does_not_warn_for_a_float32_merge(caplog):
    model, _ = lora_layer(torch.float32)
    eng = engine()
    with caplog.at_level(logging.WARNING, logger="gtpo.sampling.lora_merge"):
        eng.update_weights(model)
    assert not _warnings(caplog) and not eng.merge_rounding_warned
    assert eng.llm.weights["proj.weight"][0, 0].item() == pytest.approx(1 + SMALL, abs=1e-7)
