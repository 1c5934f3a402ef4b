"""Real precision and quantization (issue 15): bf16 weights end to end on CPU, a 4-bit base with LoRA
(QLoRA through bitsandbytes, on CPU), float32 log-probs from low-precision hidden states, and the
accelerate setups the trainer refuses."""

import json
import os

import pytest
import torch

from gtpo import GTPOConfig, GTPOTrainer
from helpers import PROMPTS, tiny_config
from helpers import digit_length_reward as digit_reward

ROWS = [{"prompt": p} for p in PROMPTS[:4]]


def config(tmp_path, **kw):
    return tiny_config(tmp_path, **{"entropy_threshold": 100.0, **kw})


def test_bf16_weights_end_to_end(tiny_model_path, tmp_path):
    """A bf16 run (model_init_kwargs.dtype bfloat16) trains, keeps float32 master weights (docs/gpu.md; the
    dtypes of every part are checked in tests/test_dtype_device.py) and saves the model it trained in bfloat16."""
    from safetensors import safe_open

    trainer = GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=config(tmp_path, model_init_kwargs={"dtype": "bfloat16"}))
    model = trainer.unwrapped_model
    assert trainer.precision.compute == torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # float32 master weights
    seen = []
    real = trainer.loss_fn

    def spy(logp, *args, **kwargs):
        seen.append(logp.dtype)
        return real(logp, *args, **kwargs)

    trainer.loss_fn = spy
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = trainer.train()
    assert seen and set(seen) == {torch.float32}  # log-probs (and entropies) in float32 from bf16 hidden states
    assert all(v == v for k, v in metrics.items() if isinstance(v, float))  # no NaN
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    with safe_open(os.path.join(trainer.args.output_dir, "model.safetensors"), "pt") as fh:
        # the run's dtype (save_dtype auto, issue 42; float32 master weights: tests/test_saved_dtype.py)
        assert {fh.get_slice(k).get_dtype() for k in fh.keys()} == {"BF16"}


def test_qlora_4bit_base_on_cpu(tiny_model_path, tmp_path):
    pytest.importorskip("bitsandbytes")
    from peft import LoraConfig

    quant = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16",
             "bnb_4bit_use_double_quant": True}
    cfg = config(tmp_path, model_init_kwargs={"dtype": "bfloat16", "quantization_config": quant})
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=cfg, peft_config=lora)
    model = trainer.unwrapped_model
    q_proj = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    assert type(q_proj).__name__ == "Linear4bit" and q_proj.weight.dtype == torch.uint8  # a 4-bit base
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    trainer.train()  # samples (eval mode, no grad) before every update: bitsandbytes must not repack for CPU
    assert not getattr(q_proj.weight.quant_state, "packing_format_for_cpu", False)
    for n, p in model.named_parameters():
        if n in adapters:  # every adapter learns: the gradient crosses every 4-bit layer
            assert not torch.equal(adapters[n], p), f"adapter parameter {n} did not change"
    saved = json.load(open(os.path.join(cfg.output_dir, "adapter_config.json")))
    assert saved["r"] == 4


def test_quantized_base_needs_an_adapter(tiny_model_path, tmp_path):
    pytest.importorskip("bitsandbytes")
    cfg = config(tmp_path, model_init_kwargs={"quantization_config": {"load_in_4bit": True}})
    with pytest.raises(ValueError, match="only an adapter can be trained"):
        GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=cfg)


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "bf16"}, r"model_init_kwargs.dtype must be one of \['auto', 'bfloat16', 'float16', 'float32'\]"),
    ({"torch_dtype": "bfloat16"}, "use 'dtype'"),
    ({"quantization_config": "4bit"}, "quantization_config must be a mapping"),
    ("bfloat16", "must be a mapping of from_pretrained arguments"),
])
def test_model_init_kwargs_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GTPOConfig(model_init_kwargs=kwargs)


def test_yaml_model_init_kwargs_reach_from_pretrained(tiny_model_path, tmp_path):
    from gtpo.app import split_spec
    from gtpo.run.models import load_model

    _run, cfg = split_spec({"model_init_kwargs": {"dtype": "bfloat16", "attn_implementation": "eager"}}, source="x")
    model = load_model(tiny_model_path, **cfg.model_init_kwargs)
    assert model.dtype == torch.bfloat16 and model.config._attn_implementation == "eager"
    assert load_model(tiny_model_path).dtype == torch.float32  # the default: CPU training


@pytest.mark.parametrize("kind", ["FSDP", "DEEPSPEED"])
def test_sharded_setups_are_refused_pointing_to_the_trl_engine(kind):
    from accelerate.utils import DistributedType

    from gtpo.trainer import check_distributed_type

    with pytest.raises(ValueError, match=rf"does not support accelerate's {kind}.*engine: trl"):
        check_distributed_type(getattr(DistributedType, kind))
    check_distributed_type(DistributedType.MULTI_CPU)  # DDP: supported
    check_distributed_type(DistributedType.NO)


def test_paper_configs_load_a_4bit_base():
    from gtpo.app import load_yaml, split_spec
    from gtpo.run.models import model_init_kwargs

    root = os.path.join(os.path.dirname(__file__), "..", "configs", "paper")
    for name in sorted(os.listdir(root)):
        _run, cfg = split_spec(load_yaml(os.path.join(root, name)), source=name)
        kwargs = model_init_kwargs(cfg.model_init_kwargs)
        assert kwargs["dtype"] == torch.bfloat16, name
        quant = kwargs["quantization_config"]
        assert quant.load_in_4bit and quant.bnb_4bit_quant_type == "nf4", name
        assert quant.bnb_4bit_compute_dtype == torch.bfloat16, name
