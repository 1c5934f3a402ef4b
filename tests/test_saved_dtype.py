"""The dtype of the saved model (issue 42, defect 7): a bfloat16 full fine-tuning run trains float32 master weights
and writes its final model in bfloat16, as a TRL or transformers Trainer run loaded in bfloat16 does
(``save_dtype: auto``), or in float32 with ``save_dtype: float32``; checkpoints keep float32 (what an exact resume
loads); LoRA adapters are saved as trained (float32). One step of the session's tiny model, bf16 on the CPU."""

import json
import os
import struct

import pytest
import torch

from gtpo import GTPOConfig, GTPOTrainer
from helpers import digit_reward, rows, tiny_config


def safetensors_dtypes(path):
    """``{tensor name: dtype}`` from a safetensors file's header (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def train(tiny_model_path, tmp_path, **kw):
    args = tiny_config(tmp_path, max_steps=1, entropy_filter=False, dtype="bfloat16", **kw)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=args)
    trainer.train()
    return trainer, args.output_dir


def saved_state(directory):
    from safetensors.torch import load_file

    return load_file(os.path.join(directory, "model.safetensors"))


def test_a_bf16_full_finetuning_run_saves_bf16_and_checkpoints_float32(tiny_model_path, tmp_path):
    trainer, out = train(tiny_model_path, tmp_path, save_steps=1)
    master = trainer.unwrapped_model.state_dict()
    assert {p.dtype for p in trainer.unwrapped_model.parameters()} == {torch.float32}  # trained in float32
    dtypes = safetensors_dtypes(os.path.join(out, "model.safetensors"))
    assert set(dtypes.values()) == {"BF16"}, dtypes
    with open(os.path.join(out, "config.json")) as fh:
        assert json.load(fh)["dtype"] == "bfloat16"
    saved = saved_state(out)
    assert set(saved) <= set(master) and saved  # the same tensors (a tied head stays tied: not written twice)
    for name, tensor in saved.items():  # the trained master weights, rounded to bfloat16
        assert torch.equal(tensor, master[name].to(torch.bfloat16)), name
    # the checkpoint holds the master weights as trained: a resume loads them exactly
    ckpt = os.path.join(out, "checkpoint-1")
    assert set(safetensors_dtypes(os.path.join(ckpt, "model.safetensors")).values()) == {"F32"}
    for name, tensor in saved_state(ckpt).items():
        assert torch.equal(tensor, master[name]), name
    # transformers loads the final model in bfloat16 (its config's dtype)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16


def test_save_dtype_float32_keeps_the_master_weights(tiny_model_path, tmp_path):
    trainer, out = train(tiny_model_path, tmp_path, save_dtype="float32")
    assert set(safetensors_dtypes(os.path.join(out, "model.safetensors")).values()) == {"F32"}
    master = trainer.unwrapped_model.state_dict()
    for name, tensor in saved_state(out).items():
        assert torch.equal(tensor, master[name]), name


def test_lora_adapters_are_saved_as_trained(tiny_model_path, tmp_path):
    peft = pytest.importorskip("peft")
    args = tiny_config(tmp_path, max_steps=1, entropy_filter=False, dtype="bfloat16")
    trainer = GTPOTrainer(tiny_model_path, digit_reward, rows(), args=args,
                          peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainer.train()
    dtypes = safetensors_dtypes(os.path.join(args.output_dir, "adapter_model.safetensors"))
    assert set(dtypes.values()) == {"F32"}  # float32, as PEFT saves an adapter it upcast (and as TRL's run does)


def test_save_dtype_choices(tmp_path):
    GTPOConfig(output_dir=str(tmp_path), save_dtype="float32").validate()
    with pytest.raises(ValueError, match=r"GTPOConfig.save_dtype must be one of \['auto', 'float32'\]"):
        GTPOConfig(output_dir=str(tmp_path), save_dtype="bfloat16").validate()
