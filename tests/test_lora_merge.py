"""gtpo.sampling.lora_merge: LoRA layers swapped for merged plain linears while sampling, the model unchanged after."""

import pytest
import torch

peft = pytest.importorskip("peft")

from gtpo.sampling.lora_merge import lora_merged_weight, mergeable_lora_layers, merged_lora_layers  # noqa: E402
from gtpo.sampling.rollout import generate  # noqa: E402


def lora_model(path, dtype=torch.float64, **lora):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False, **lora)
    return get_peft_model(base, config).eval()


def ids(n=3, width=7, vocab=200):
    return torch.randint(5, vocab, (n, width), generator=torch.Generator().manual_seed(0))


def test_merged_layers_compute_the_lora_layers_logits_and_leave_the_model_as_it_was(tiny_model_path):
    model = lora_model(tiny_model_path)
    names = mergeable_lora_layers(model)
    lora_layers = {n: m for n, m in model.named_modules() if n in names}
    assert names and all(type(m) is peft.tuners.lora.Linear for m in lora_layers.values())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = ids()
    with torch.no_grad():
        expected = model(input_ids=x).logits
        with merged_lora_layers(model) as replaced:
            assert replaced == len(names)
            inside = dict(model.named_modules())
            assert all(type(inside[n]) is torch.nn.Linear for n in names)
            assert not any(isinstance(m, peft.tuners.lora.LoraLayer) for m in model.modules())
            merged = model(input_ids=x).logits
        after = model(input_ids=x).logits
    # float64: the sum formed in the weights instead of the activations, rounding only
    torch.testing.assert_close(merged, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(after, expected)
    now = dict(model.named_modules())
    assert all(now[n] is layer for n, layer in lora_layers.items())  # the very same modules are back
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_merged_weight_is_the_lora_layers_delta_added(tiny_model_path):
    model = lora_model(tiny_model_path)
    name = mergeable_lora_layers(model)[0]
    layer = model.get_submodule(name)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # (r, in), (out, r)
    expected = layer.get_base_layer().weight + layer.scaling["default"] * b @ a  # scaling = alpha / r = 2
    assert layer.scaling["default"] == 2.0
    torch.testing.assert_close(lora_merged_weight(layer), expected, rtol=0, atol=1e-14)
    with merged_lora_layers(model):
        torch.testing.assert_close(model.get_submodule(name).weight, expected, rtol=0, atol=1e-14)


def test_an_exception_inside_the_block_puts_the_lora_layers_back(tiny_model_path):
    model = lora_model(tiny_model_path)
    before = dict(model.named_modules())
    with pytest.raises(RuntimeError, match="boom"):
        with merged_lora_layers(model):
            raise RuntimeError("boom")
    after = dict(model.named_modules())
    assert before.keys() == after.keys() and all(after[n] is m for n, m in before.items())


def test_two_active_adapters_are_both_merged(tiny_model_path):
    model = lora_model(tiny_model_path)
    model.add_adapter("second", peft.LoraConfig(r=2, lora_alpha=2, target_modules="all-linear",
                                                init_lora_weights=False))
    model.base_model.set_adapter(["default", "second"])
    x = ids()
    with torch.no_grad():
        expected = model(input_ids=x).logits
        with merged_lora_layers(model) as replaced:
            assert replaced > 0
            merged = model(input_ids=x).logits
    torch.testing.assert_close(merged, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["bfloat16", "dora", "disabled", "plain"])
def test_layers_it_cannot_merge_faithfully_keep_their_lora_path(tiny_model_path, case):
    from transformers import AutoModelForCausalLM

    if case == "plain":
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    elif case == "bfloat16":  # bf16 keeps 8 significant bits: W + delta would round back towards W
        model = lora_model(tiny_model_path, dtype=torch.bfloat16)
    elif case == "dora":
        model = lora_model(tiny_model_path, use_dora=True)
    else:
        model = lora_model(tiny_model_path)
    before = dict(model.named_modules())
    context = model.disable_adapter() if case == "disabled" else torch.no_grad()
    with context, merged_lora_layers(model) as replaced:
        assert replaced == 0
        assert all(dict(model.named_modules())[n] is m for n, m in before.items())


def count_merges(monkeypatch):
    """Patch gtpo.sampling.rollout's merged_lora_layers to record how many layers each call replaced."""
    import contextlib

    import gtpo.sampling.rollout

    counts = []

    @contextlib.contextmanager
    def counting(model, *args, **kwargs):
        with merged_lora_layers(model, *args, **kwargs) as replaced:
            counts.append(replaced)
            yield replaced

    monkeypatch.setattr(gtpo.sampling.rollout, "merged_lora_layers", counting)
    return counts


@pytest.mark.parametrize("do_sample", [False, True])
def test_generate_samples_the_same_tokens_merged_or_not(tiny_model_path, do_sample, monkeypatch):
    from transformers import AutoTokenizer

    counts = count_merges(monkeypatch)
    model = lora_model(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    out = {}
    for merge in (False, True):
        torch.manual_seed(3)
        out[merge] = generate(model, tokenizer, ["12 plus 7", "3 times 4"], num_samples=3, max_new_tokens=12,
                              temperature=1.0, do_sample=do_sample, merge_lora=merge)
    assert counts == [len(mergeable_lora_layers(model))] and counts[0] > 0  # only merge_lora=True merged
    # float64 logits agree to ~1e-15: the same draws from the same random stream
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    assert out[True].texts == out[False].texts
    assert all(isinstance(m, peft.tuners.lora.LoraLayer) for n, m in model.named_modules()
               if n.endswith("q_proj"))


@pytest.mark.parametrize("merge", [True, False])
def test_trainer_setting_merges_for_rollouts_and_evaluation(tiny_model_path, tmp_path, monkeypatch, merge):
    from peft import LoraConfig

    from gtpo import GTPOConfig, GTPOTrainer

    counts = count_merges(monkeypatch)
    rows = [{"prompt": p, "answer": "1"} for p in ("1 plus 1", "2 plus 3", "4 minus 1", "5 times 1")]
    cfg = GTPOConfig(output_dir=str(tmp_path / "run"), max_steps=2, group_size=2, prompts_per_step=2,
                     max_completion_length=6, learning_rate=1e-3, report_to="none", save_steps=0, logging_steps=1,
                     eval_steps=2, eval_max_new_tokens=4, entropy_filter=False, merge_lora_for_sampling=merge)
    trainer = GTPOTrainer(tiny_model_path, lambda completions, **kw: [float("1" in c) for c in completions], rows,
                          args=cfg, eval_dataset=rows[:2],
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainer.train()
    layers = len(mergeable_lora_layers(trainer.unwrapped_model))
    assert layers > 0
    # two rollouts and one evaluation, each merging every adapted layer, or none of them
    assert counts == ([layers] * 3 if merge else [])
    assert all(isinstance(m, peft.tuners.lora.LoraLayer) for n, m in trainer.unwrapped_model.named_modules()
               if n.endswith("q_proj"))
