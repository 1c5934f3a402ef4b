"""A launcher's mixed precision (``accelerate launch --mixed_precision``, ``ACCELERATE_MIXED_PRECISION``, a default
accelerate config) never changes a run: the run's ``dtype`` decides (issue 42, defect 1); the bf16 reference model
is built without a float32 copy of the master weights (issue 42, defect 8a)."""

import copy
import logging

import pytest
import torch
from accelerate.state import AcceleratorState

from gtpo import GTPOConfig, GTPOTrainer
from helpers import PROMPTS


def token_reward(completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def losses(path, tmp_path, name):
    AcceleratorState._reset_state()  # a fresh accelerator state, as in a new process (the process state is kept)
    cfg = GTPOConfig(output_dir=str(tmp_path / name), group_size=4, prompts_per_step=2, max_steps=2,
                     max_completion_length=8, learning_rate=1e-2, save_steps=0, disable_tqdm=True, seed=3,
                     lr_scheduler_type="constant", dtype="float32", entropy_filter=False)
    trainer = GTPOTrainer(path, token_reward, [{"prompt": p} for p in PROMPTS[:4]], args=cfg)
    out = [trainer.step()["loss"] for _ in range(2)]
    return trainer, out


def test_float32_run_ignores_launcher_bf16(tiny_model_path, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    _, plain = losses(tiny_model_path, tmp_path, "plain")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    with caplog.at_level(logging.WARNING, logger="gtpo"):
        trainer, launched = losses(tiny_model_path, tmp_path, "launched")
    assert launched == plain  # bitwise: no autocast behind the run's dtype
    assert trainer.accelerator.mixed_precision == "no"
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "ACCELERATE_MIXED_PRECISION=bf16" in text and "dtype=float32" in text, text


def test_matching_launcher_setting_is_quiet(tiny_model_path, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    with caplog.at_level(logging.WARNING, logger="gtpo"):
        trainer, _ = losses(tiny_model_path, tmp_path, "no")
    assert trainer.accelerator.mixed_precision == "no"
    assert "ACCELERATE_MIXED_PRECISION" not in caplog.text


def test_trl_engine_float32_run_ignores_launcher_bf16(tiny_model_path, tmp_path, monkeypatch, caplog):
    """``engine: trl``: transformers' TrainingArguments take ACCELERATE_MIXED_PRECISION when neither ``bf16`` nor
    ``fp16`` is set, and TRL's Trainer builds its Accelerator from that: gtpo's mapping of a float32 run turns it
    off with the same warning."""
    pytest.importorskip("trl")
    from datasets import Dataset

    from gtpo.integrations.trl import TRLGTPOConfig, TRLGTPOTrainer

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    cfg = GTPOConfig(output_dir=str(tmp_path / "trl"), group_size=4, prompts_per_step=2, max_steps=1,
                     max_completion_length=8, dtype="float32", save_steps=0)
    with caplog.at_level(logging.WARNING, logger="gtpo"):
        args = TRLGTPOConfig.from_gtpo_config(cfg, use_cpu=True)
    assert (args.bf16, args.fp16, args.mixed_precision) == (False, False, "no")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "ACCELERATE_MIXED_PRECISION=bf16" in text and "dtype=float32" in text, text
    trainer = TRLGTPOTrainer(model=tiny_model_path, reward_funcs=token_reward, args=args,
                             train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"]}))
    assert trainer.accelerator.mixed_precision == "no"
    assert next(trainer.model.parameters()).dtype == torch.float32
    # a bf16 run is not a conflict: TRL's own bf16 flag decides, quietly
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gtpo"):
        bf16 = TRLGTPOConfig.from_gtpo_config(cfg.replace(dtype="bfloat16"), use_cpu=True)
    assert bf16.mixed_precision == "bf16" and "ACCELERATE_MIXED_PRECISION" not in caplog.text


# ----------------------------------------------------------------------------- the reference model (defect 8a)
class Float32Allocations(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the bytes of the new float32 tensors that aten ops produce (copies, casts, clones) while active;
    views of an input (``detach``, ``view``) share its storage and allocate nothing."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and \
                    t.untyped_storage().data_ptr() not in inputs:
                self.bytes += t.numel() * t.element_size()
        return out


def test_bf16_reference_model_is_built_without_a_float32_copy(tiny_model_path):
    """Full fine-tuning in bf16 holds float32 master weights; its KL reference is a bf16 copy. It equals the
    deep copy cast to bf16 (values, dtypes, device, frozen, eval, tied head) and is built without a float32
    copy of the weights (+4 bytes per parameter at the peak: 32 GB for an 8B model)."""
    from gtpo.run.build import Precision, build_reference_model
    from gtpo.run.models import load_model

    base = load_model(tiny_model_path, dtype=torch.float32)
    cfg = GTPOConfig(loss_type="grpo", beta=0.04, dtype="bfloat16")
    precision = Precision(compute=torch.bfloat16, load=torch.float32)
    weights = sum(p.numel() * p.element_size() for p in base.parameters())
    with Float32Allocations() as counted:
        ref = build_reference_model(base, cfg, adapter=False, precision=precision)
    assert counted.bytes < weights / 10, (counted.bytes, weights)  # before: the whole float32 model was copied

    want = copy.deepcopy(base).eval().requires_grad_(False).to(torch.bfloat16)
    got_state, want_state = ref.state_dict(), want.state_dict()
    assert got_state.keys() == want_state.keys()
    for name, value in want_state.items():
        assert got_state[name].dtype == value.dtype and got_state[name].device == value.device, name
        assert torch.equal(got_state[name], value), name
    for (name, p), (_, q) in zip(ref.named_buffers(), want.named_buffers()):
        assert p.dtype == q.dtype and torch.equal(p, q), name
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
    assert ref.get_output_embeddings().weight is ref.get_input_embeddings().weight  # still tied
    assert all(p.dtype == torch.float32 and p.requires_grad for p in base.parameters())  # the policy untouched
    assert not any(p.data_ptr() == q.data_ptr() for p in ref.parameters() for q in base.parameters())
