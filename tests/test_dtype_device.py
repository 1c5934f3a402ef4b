"""The dtype and device contract of docs/gpu.md, one test per row, and the GPU-path defects of issue 29 that a
CPU can observe (bf16 runs on these CPUs, bitsandbytes 4-bit too): which dtype each part of a run uses, which
kwargs reach from_pretrained, which device a process asks for, whether bf16 weights move."""

import json
import os
import subprocess
import sys

import pytest
import torch

from gtpo import GTPOConfig, GTPOTrainer
from gtpo.run import build as gsetup
from helpers import PROMPTS, tiny_config
from helpers import digit_length_reward as digit_reward

ROWS = [{"prompt": p} for p in PROMPTS[:4]]
QUANT = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16",
         "bnb_4bit_use_double_quant": True}


def config(tmp_path, **kw):
    return tiny_config(tmp_path, **{"max_steps": 1, "entropy_threshold": 100.0, **kw})


def lora(r=4):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM")


class Seen:
    """Records the dtypes a run uses: every Linear's output during sampling and during the training forward,
    the hidden states and weight reaching the chunked head, the log-probs reaching the loss and the loss."""

    def __init__(self, trainer, monkeypatch):
        import gtpo.sampling.policy

        self.sampling, self.training, self.head, self.logp, self.loss = set(), set(), set(), set(), set()
        model = trainer.unwrapped_model
        self.phase = None

        def hook(module, args, output):
            if self.phase is not None and isinstance(output, torch.Tensor):
                getattr(self, self.phase).add(output.dtype)

        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and not hasattr(m, "base_layer"):
                m.register_forward_hook(hook)
        real_head = gtpo.sampling.policy.token_logprobs_and_entropy

        def head(hidden, weight, *args, **kwargs):
            self.head.add((hidden.dtype, weight.dtype))
            return real_head(hidden, weight, *args, **kwargs)

        monkeypatch.setattr(gtpo.sampling.policy, "token_logprobs_and_entropy", head)
        real_rollout, real_update, real_loss = trainer.sample_rollout, trainer.update, trainer.loss_fn

        def sample_rollout(rows):
            self.phase = "sampling"
            try:
                return real_rollout(rows)
            finally:
                self.phase = None

        def update(*args, **kwargs):
            self.phase = "training"
            try:
                return real_update(*args, **kwargs)
            finally:
                self.phase = None

        def loss_fn(logp, *args, **kwargs):
            self.logp.add(logp.dtype)
            out = real_loss(logp, *args, **kwargs)
            self.loss.add(out.loss.dtype)
            return out

        trainer.sample_rollout, trainer.update, trainer.loss_fn = sample_rollout, update, loss_fn


def _adam_state_dtypes(trainer):
    return {v.dtype for state in trainer.optimizer.state.values() for k, v in state.items()
            if k in ("exp_avg", "exp_avg_sq")}


def _run_and_record(trainer, monkeypatch):
    seen = Seen(trainer, monkeypatch)
    trainer.train()
    return seen


# ----------------------------------------------------------------------------- the table, row by row
def test_row_float32_is_the_default_and_uses_no_autocast(tiny_model_path, tmp_path, monkeypatch):
    trainer = GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=config(tmp_path))
    assert trainer.precision == gsetup.Precision(torch.float32, torch.float32)
    assert not trainer.precision.autocast and trainer.accelerator.mixed_precision == "no"
    assert {p.dtype for p in trainer.unwrapped_model.parameters()} == {torch.float32}
    seen = _run_and_record(trainer, monkeypatch)
    assert seen.sampling == seen.training == {torch.float32}
    assert seen.head == {(torch.float32, torch.float32)} and seen.logp == seen.loss == {torch.float32}
    assert _adam_state_dtypes(trainer) == {torch.float32}
    assert trainer.vllm_engine_kwargs()["dtype"] == "float32"


def test_row_bf16_full_finetuning_keeps_float32_master_weights(tiny_model_path, tmp_path, monkeypatch):
    # model_init_kwargs.dtype as the paper configs and earlier versions set it: the run's dtype
    trainer = GTPOTrainer(tiny_model_path, digit_reward, ROWS,
                          args=config(tmp_path, model_init_kwargs={"dtype": "bfloat16"}))
    model = trainer.unwrapped_model
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # master weights
    assert all(p.requires_grad for p in model.parameters())
    seen = _run_and_record(trainer, monkeypatch)
    assert seen.sampling == {torch.bfloat16} and seen.training == {torch.bfloat16}  # autocast in both forwards
    assert seen.head == {(torch.bfloat16, torch.bfloat16)}  # the head's matmul in bf16 ...
    assert seen.logp == seen.loss == {torch.float32}  # ... its log-probs and the loss in float32
    assert _adam_state_dtypes(trainer) == {torch.float32}
    assert trainer.vllm_engine_kwargs()["dtype"] == "bfloat16"  # not the float32 of the master weights


def test_row_bf16_lora_holds_the_base_in_bf16_and_the_adapter_in_float32(tiny_model_path, tmp_path, monkeypatch):
    trainer = GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=config(tmp_path, dtype="bfloat16"),
                          peft_config=lora())
    model = trainer.unwrapped_model
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    trainable = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and set(trainable.values()) == {torch.float32}
    assert all("lora_" in n for n in trainable)
    seen = _run_and_record(trainer, monkeypatch)
    assert seen.sampling == {torch.bfloat16} and seen.training == {torch.bfloat16}
    assert seen.head == {(torch.bfloat16, torch.bfloat16)} and seen.logp == seen.loss == {torch.float32}
    assert _adam_state_dtypes(trainer) == {torch.float32}
    assert trainer.vllm_engine_kwargs()["dtype"] == "bfloat16"


def test_row_bf16_qlora_keeps_the_non_quantized_weights_in_bf16(tiny_model_path, tmp_path, monkeypatch):
    """Issue 29 item 4: peft's k-bit preparation upcast embeddings, norms and the LM head to float32, so the head
    ran in float32 (2 GB more at Llama-8B's 128k x 4096) and sampling outside autocast in float32."""
    pytest.importorskip("bitsandbytes")
    cfg = config(tmp_path, model_init_kwargs={"dtype": "bfloat16", "quantization_config": QUANT})
    trainer = GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=cfg, peft_config=lora())
    model = trainer.unwrapped_model
    base = model.get_base_model()
    assert type(base.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"
    float_frozen = {n: p.dtype for n, p in model.named_parameters() if not p.requires_grad and p.dtype.is_floating_point}
    assert float_frozen and set(float_frozen.values()) == {torch.bfloat16}, float_frozen
    assert base.get_output_embeddings().weight.dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    seen = _run_and_record(trainer, monkeypatch)
    assert torch.float32 not in seen.sampling and torch.float32 not in seen.training  # bf16 (the 4-bit kernels'
    assert seen.head == {(torch.bfloat16, torch.bfloat16)} and seen.logp == seen.loss == {torch.float32}  # dtype)
    assert _adam_state_dtypes(trainer) == {torch.float32}
    assert trainer.vllm_engine_kwargs()["dtype"] == "bfloat16"


def test_row_trl_engine_loads_what_the_config_says():
    """Issue 29 item 1: from_gtpo_config dropped model_init_kwargs, so --engine trl trained a float32 LoRA
    instead of the paper configs' 4-bit QLoRA."""
    from gtpo.app import load_yaml, split_spec
    from gtpo.integrations.trl import TRLGTPOConfig

    root = os.path.join(os.path.dirname(__file__), "..", "configs", "paper")
    for name in sorted(os.listdir(root)):
        _run, cfg = split_spec(load_yaml(os.path.join(root, name)), source=name)
        args = TRLGTPOConfig.from_gtpo_config(cfg.replace(output_dir="/tmp/unused", report_to="none"))
        kwargs = args.model_init_kwargs
        assert kwargs["dtype"] == "bfloat16", name
        assert kwargs["quantization_config"]["load_in_4bit"] is True, name
        assert kwargs["quantization_config"]["bnb_4bit_compute_dtype"] == "bfloat16", name
        assert args.bf16 and args.optim == "paged_adamw_8bit", name
        json.dumps(kwargs)  # TRL logs its config as JSON (report_to tensorboard)
    full = TRLGTPOConfig.from_gtpo_config(GTPOConfig(output_dir="/tmp/unused", dtype="bfloat16"))
    assert full.model_init_kwargs["dtype"] == "float32" and full.bf16  # full fine-tuning: fp32 master weights
    lora_ = TRLGTPOConfig.from_gtpo_config(GTPOConfig(output_dir="/tmp/unused", dtype="bfloat16"), adapter=True)
    assert lora_.model_init_kwargs["dtype"] == "bfloat16"
    default = TRLGTPOConfig.from_gtpo_config(GTPOConfig(output_dir="/tmp/unused"))
    assert default.model_init_kwargs == {"dtype": "float32"} and not default.bf16  # TRL's own default


def test_row_vllm_engine_runs_in_the_run_dtype_not_the_embeddings():
    """Issue 29 item 3: vllm_dtype 'auto' was read from the input embeddings, float32 after the k-bit preparation
    or with float32 master weights: an 8B engine of 32 GB against a 0.3 memory budget."""
    bf16 = gsetup.precision_for(torch.bfloat16, adapter=False)
    assert bf16.load == torch.float32 and gsetup.vllm_dtype_name("auto", bf16) == "bfloat16"
    assert gsetup.vllm_dtype_name("float32", bf16) == "float32"  # an explicit vllm_dtype wins
    assert gsetup.vllm_dtype_name("auto", gsetup.precision_for(torch.float32, adapter=True)) == "float32"


def test_row_each_process_loads_onto_its_own_device(tiny_model_path):
    """Issue 29 item 2: bitsandbytes places a 4-bit base on torch.cuda.current_device() at load time (GPU 0 for
    every process before the process group exists); the trainer now asks for the process's own device."""
    bf16 = gsetup.precision_for(torch.bfloat16, adapter=True)
    kwargs = gsetup.policy_load_kwargs({"quantization_config": QUANT}, bf16, torch.device("cuda", 3))
    assert kwargs["device_map"] == {"": 3} and kwargs["dtype"] == torch.bfloat16
    assert kwargs["quantization_config"].load_in_4bit
    assert gsetup.policy_load_kwargs({"device_map": "auto"}, bf16, torch.device("cuda", 1))["device_map"] == "auto"
    cpu = gsetup.policy_load_kwargs(None, gsetup.precision_for(torch.float32, adapter=False), torch.device("cpu"))
    assert cpu == {"dtype": torch.float32}  # CPU: what from_pretrained always got
    no_compute = gsetup.policy_load_kwargs({"quantization_config": {"load_in_4bit": True}}, bf16, torch.device("cpu"))
    assert no_compute["quantization_config"].bnb_4bit_compute_dtype == torch.bfloat16  # the run's dtype by default


def test_a_run_that_loads_its_model_first_asks_for_the_trainers_dtypes_and_device():
    """gtpo.app loads the model before the trainer: run_precision (then passed to the trainer) gives it what the
    trainer would load."""

    def run_load_kwargs(cfg, *, adapter, device):
        precision = gsetup.run_precision(cfg, "a-model", adapter=adapter, device=device)
        return gsetup.policy_load_kwargs(cfg.model_init_kwargs, precision, device)

    cfg = GTPOConfig(model_init_kwargs={"dtype": "bfloat16", "quantization_config": QUANT})
    kwargs = run_load_kwargs(cfg, adapter=True, device=torch.device("cuda", 2))
    assert kwargs["dtype"] == torch.bfloat16 and kwargs["device_map"] == {"": 2}
    assert run_load_kwargs(GTPOConfig(dtype="bfloat16"), adapter=False, device=torch.device("cpu")) == \
        {"dtype": torch.float32}  # full fine-tuning: float32 master weights
    assert run_load_kwargs(GTPOConfig(), adapter=True, device=torch.device("cpu")) == {"dtype": torch.float32}


def test_a_quantized_model_on_another_device_is_refused_and_accelerate_sees_it(tiny_model_path):
    pytest.importorskip("bitsandbytes")
    from gtpo.run.models import load_model
    from gtpo.sampling.policy import PolicyForward

    model = load_model(tiny_model_path, dtype="bfloat16", quantization_config={"load_in_4bit": True})
    with pytest.raises(ValueError, match=r"4-bit/8-bit base is on \['cpu'\] but this process trains on cuda:1"):
        gsetup.check_quantized_placement(model, torch.device("cuda", 1))
    gsetup.check_quantized_placement(model, torch.device("cpu"))
    # accelerate checks a 4-bit model's placement instead of moving it with .to(): it must see the flag
    assert PolicyForward(model).is_loaded_in_4bit is True
    assert not hasattr(PolicyForward(load_model(tiny_model_path)), "is_loaded_in_4bit")


# ----------------------------------------------------------------------------- item 5: bf16 weights move
def _real_magnitude_model(src: str, dst) -> str:
    """The tiny Llama with every weight at least 0.05 in magnitude (a real model's scale: bf16's spacing there
    is ~2.4e-4, so an AdamW step of ~1e-6 rounds away on a bfloat16 weight)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.where(p >= 0, 1.0, -1.0) * p.abs().clamp(min=0.05))
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return str(dst)


@pytest.mark.parametrize("kwargs", [{"model_init_kwargs": {"dtype": "bfloat16"}}, {"dtype": "bfloat16"},
                                    {"bf16": True}])
def test_bf16_full_finetuning_at_the_papers_learning_rate_moves_the_weights(tiny_model_path, tmp_path, kwargs):
    """Issue 29 item 5: with bfloat16 weights and no float32 master copy, 3 GRPO steps at lr 1e-6 moved 0.0 % of
    the weight elements (99 % in float32). Measured here with the master weights: 100 % (as float32)."""
    path = _real_magnitude_model(tiny_model_path, tmp_path / "model")
    cfg = config(tmp_path, loss_type="grpo", learning_rate=1e-6, max_steps=3, max_completion_length=8, **kwargs)
    trainer = GTPOTrainer(path, digit_reward, ROWS, args=cfg)
    before = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters()}
    trainer.train()
    assert trainer.precision.compute == torch.bfloat16
    after = dict(trainer.unwrapped_model.named_parameters())
    moved = sum(int((before[n] != after[n]).sum()) for n in before)
    total = sum(p.numel() for p in before.values())
    assert moved / total > 0.9, f"{moved / total:.1%} of the weights moved"


# ----------------------------------------------------------------------------- precision rules
@pytest.mark.parametrize("flags, vendor, want", [
    ({"avx512f", "avx512_bf16"}, "AuthenticAMD", torch.bfloat16),  # Zen 4: bf16 matmuls ~4x MKL's float32
    ({"avx512f", "avx512_bf16"}, "GenuineIntel", torch.float32),  # Intel without AMX: bf16 slower than MKL's float32
    ({"avx512_bf16", "amx_tile", "amx_bf16"}, "GenuineIntel", torch.bfloat16),
    ({"amx_bf16"}, "AuthenticAMD", torch.bfloat16),
    ({"avx2", "avx512f"}, "AuthenticAMD", torch.float32), (set(), "", torch.float32)])
def test_auto_picks_bf16_only_on_cpus_whose_bf16_matmuls_are_faster(flags, vendor, want):
    assert gsetup.resolve_dtype("auto", torch.device("cpu"), flags=flags, vendor=vendor) == want
    assert gsetup.resolve_dtype("float32", torch.device("cpu"), flags=flags, vendor=vendor) == torch.float32
    assert gsetup.resolve_dtype("bfloat16", torch.device("cpu"), flags=flags, vendor=vendor) == torch.bfloat16


def test_cpu_flags_and_vendor_are_read_from_cpuinfo():
    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx512f avx512_bf16\n\n"
            "processor\t: 1\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx512f avx512_bf16\n")
    assert gsetup.cpu_flags(text) == {"fpu", "avx512f", "avx512_bf16"}
    assert gsetup.cpu_vendor(text) == "AuthenticAMD"
    assert gsetup.cpu_flags("") == frozenset() and gsetup.cpu_vendor("") == ""


def test_float16_is_refused_by_gtpos_trainer_with_what_to_do():
    with pytest.raises(ValueError, match="no loss scaling.*bfloat16"):
        gsetup.resolve_dtype("float16", torch.device("cpu"))


def test_a_loaded_bf16_model_without_a_dtype_trains_in_bf16(tiny_model_path):
    from gtpo.run.models import load_model

    model = load_model(tiny_model_path, dtype="bfloat16")
    assert gsetup.requested_dtype(GTPOConfig(), model) == "bfloat16"
    assert gsetup.requested_dtype(GTPOConfig(dtype="float32"), model) == "float32"
    assert gsetup.requested_dtype(GTPOConfig(), tiny_model_path) == "float32"


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "float16"}, r"dtype must be None or one of \['auto', 'float32', 'bfloat16'\]"),
    ({"dtype": "float32", "model_init_kwargs": {"dtype": "bfloat16"}}, "disagree"),
    ({"bf16": True, "dtype": "float32"}, "bf16 is true but dtype is 'float32'"),
    ({"optim": "adam"}, r"optim must be one of \['adamw_torch_fused', 'adamw_torch', 'adamw_8bit'"),
])
def test_precision_fields_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GTPOConfig(**kwargs)


# ----------------------------------------------------------------------------- optim (issue 32)
@pytest.mark.parametrize("optim", ["adamw_torch_fused", "adamw_torch", "adamw_8bit", "paged_adamw_8bit"])
def test_every_optim_trains_and_resumes(tiny_model_path, tmp_path, optim):
    if "8bit" in optim:
        pytest.importorskip("bitsandbytes")
    cfg = config(tmp_path, optim=optim, max_steps=2, save_steps=1, weight_decay=0.1, adam_beta1=0.999999,
                 adam_beta2=0.999999)
    trainer = GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=cfg, peft_config=lora())
    opt = trainer.optimizer.optimizer
    want = {"adamw_torch_fused": "AdamW", "adamw_torch": "AdamW", "adamw_8bit": "AdamW8bit",
            "paged_adamw_8bit": "PagedAdamW8bit"}[optim]
    assert type(opt).__name__ == want
    if optim.startswith("adamw_torch"):
        assert opt.defaults["fused"] == (True if optim == "adamw_torch_fused" else None)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    before = {n: p.detach().clone() for n, p in trainer.unwrapped_model.named_parameters() if p.requires_grad}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.unwrapped_model.named_parameters() if n in before)
    resumed = GTPOTrainer(tiny_model_path, digit_reward, ROWS, peft_config=lora(),
                          args=cfg.replace(max_steps=3, output_dir=str(tmp_path / "resumed")))
    resumed.train(resume_from_checkpoint=os.path.join(cfg.output_dir, "checkpoint-2"))
    assert resumed.global_step == 3


def test_8bit_optim_without_bitsandbytes_says_what_to_install(monkeypatch, tiny_model_path):
    import builtins

    real = builtins.__import__

    def no_bnb(name, *args, **kwargs):
        if name == "bitsandbytes":
            raise ImportError("no bitsandbytes")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    params = [torch.nn.Parameter(torch.zeros(2, 2))]
    with pytest.raises(ValueError, match="optim='adamw_8bit' needs bitsandbytes.*pip install bitsandbytes"):
        gsetup.build_optimizer(params, GTPOConfig(optim="adamw_8bit"), torch.device("cpu"))


# ----------------------------------------------------------------------------- item 6: resume, map_location
def test_resume_loads_optimizer_state_onto_this_process_device(tiny_model_path, tmp_path):
    """Issue 29 item 6: torch.load without map_location put every process's copy of the optimizer state on the
    device it was saved from (the main process's GPU). A checkpoint written on a GPU is simulated by tagging the
    saved tensors with cuda:1; without map_location loading it here fails (no such device)."""
    from gtpo.run.checkpoint import load_torch_file

    cfg = config(tmp_path, max_steps=1, save_steps=1)
    GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=cfg, peft_config=lora()).train()
    ckpt = os.path.join(cfg.output_dir, "checkpoint-1")
    path = os.path.join(ckpt, "optimizer.pt")
    state = load_torch_file(path)

    def tag_cuda(storage):  # torch.save records this as each storage's device
        return "cuda:1"

    torch.serialization.register_package(-1, tag_cuda, lambda obj, location: None)
    try:
        torch.save(state, path)
    finally:
        torch.serialization._package_registry[:] = [e for e in torch.serialization._package_registry
                                                   if e[1] is not tag_cuda]
    with pytest.raises(RuntimeError):  # what a load without map_location does with it here
        torch.load(path, weights_only=True)
    resumed = GTPOTrainer(tiny_model_path, digit_reward, ROWS, peft_config=lora(),
                          args=cfg.replace(max_steps=2, output_dir=str(tmp_path / "resumed")))
    resumed.train(resume_from_checkpoint=ckpt)
    assert resumed.global_step == 2
    assert {v.device.type for s in resumed.optimizer.state.values() for v in s.values()
            if isinstance(v, torch.Tensor)} == {"cpu"}


# ----------------------------------------------------------------------------- item 8: TRL guard
def test_trl_guard_checks_what_the_integration_uses():
    """Issue 29 item 8: only method names were checked; a TRL without add_fused_lm_head passed and failed at
    construction."""
    import types

    from gtpo.integrations.trl import TESTED_TRL, missing_trl_api

    assert missing_trl_api() == []
    empty = types.SimpleNamespace()
    found = missing_trl_api(modules={"trl.trainer.utils": empty})
    assert "trl.trainer.utils.add_fused_lm_head" in found

    def old_head(model, temperature=1.0):  # a signature without the keyword arguments passed
        return model

    found = missing_trl_api(modules={"trl.trainer.utils": types.SimpleNamespace(add_fused_lm_head=old_head)})
    assert "trl.trainer.utils.add_fused_lm_head(cast_lm_head_to_fp32=)" in found
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    pinned = f"trl>={TESTED_TRL[0]},<{TESTED_TRL[1]}"
    assert all(pinned in deps for name, deps in extras.items() if any(d.startswith("trl") for d in deps)), extras


def test_vllm_versions_outside_the_supported_range_are_refused():
    from gtpo.sampling.vllm_engine import SUPPORTED_VLLM, check_vllm_version

    check_vllm_version("0.32.0")
    check_vllm_version(SUPPORTED_VLLM[0] + ".0")
    check_vllm_version(None)
    for old in ("0.10.2", "0.21.9", "0.33.0"):
        with pytest.raises(ImportError, match=r"supports vLLM >= 0.22, < 0.33"):
            check_vllm_version(old)
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm>={SUPPORTED_VLLM[0]},<{SUPPORTED_VLLM[1]}"]


def test_sleep_mode_is_refused_on_cpu(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="no sleep mode on CPU"):
        GTPOTrainer(tiny_model_path, digit_reward, ROWS, args=config(tmp_path, use_vllm=True,
                                                                     vllm_enable_sleep_mode=True))


# ----------------------------------------------------------------------------- item 9: chunk sizes
def test_head_chunks_are_larger_on_accelerators():
    from gtpo.maths.ops import default_chunk_rows

    assert default_chunk_rows(128256, "cpu") == 64 * 2**20 // (4 * 128256)  # 130 rows, as before
    assert default_chunk_rows(128256, "cuda") == 512 * 2**20 // (4 * 128256)
    assert default_chunk_rows(10**9, "cpu") == 1


# ----------------------------------------------------------------------------- item 10: multi-node
def test_deepspeed_zero3_config_parses_and_fits_the_trl_path():
    """configs/accelerate/deepspeed_zero3.yaml: the multi-node recipe of docs/gpu.md for TRL's engine (gtpo's own
    trainer refuses DeepSpeed and says to use it)."""
    import yaml
    from accelerate.utils import DistributedType

    from gtpo.integrations.trl import TRLGTPOConfig
    from gtpo.trainer import check_distributed_type

    root = os.path.join(os.path.dirname(__file__), "..", "configs", "accelerate")
    with open(os.path.join(root, "deepspeed_zero3.yaml")) as fh:
        acc = yaml.safe_load(fh)
    assert acc["distributed_type"] == "DEEPSPEED" and acc["deepspeed_config"]["zero_stage"] == 3
    assert acc["deepspeed_config"]["zero3_init_flag"] and acc["deepspeed_config"]["zero3_save_16bit_model"]
    assert (acc["num_machines"], acc["num_processes"]) == (4, 32)  # 4 nodes x 8 GPUs (accelerate counts them all)
    with pytest.raises(ValueError, match="engine: trl"):
        check_distributed_type(getattr(DistributedType, acc["distributed_type"]))
    # the accelerate config's precision is what the TRL config of a bf16 run says, and the batch splits evenly
    cfg = GTPOConfig(output_dir="/tmp/unused", prompts_per_step=32, group_size=8, dtype="bfloat16", micro_batch_size=4)
    args = TRLGTPOConfig.from_gtpo_config(cfg, num_processes=acc["num_processes"], adapter=False)
    assert acc["mixed_precision"] == ("bf16" if args.bf16 else "no")
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * 32 == 32 * 8


# ----------------------------------------------------------------------------- the GPU check's CPU path
@pytest.mark.slow
@pytest.mark.gpuversions
def test_gpu_check_runs_on_cpu_quick(tmp_path):
    """bench/gpu_check.py runs on a lent GPU (scripts/gpu-check.sh); its code path is kept working here. CI runs it
    in .venv-gpuversions (scripts/test-gpu-versions.sh): the GPU machine's versions, DeepSpeed for its ZeRO parts."""
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_check.py")
    env = {**os.environ, "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, script, "--cpu", "--quick"], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert not result["failures"], result["failures"]
    for name in ("head", "shared_prefix", "decode", "qlora_grad", "dtypes"):
        assert result["correctness"][name]["ok"], (name, result["correctness"][name])
    for name in ("bf16 LoRA", "QLoRA", "full fine-tuning"):
        assert result["steps"][name]["tokens_per_s"] > 0, name
    assert result["trl_vs_ours"]["ok"], result["trl_vs_ours"]
    # issue 42's parts: each ran and checked what it says
    c = result["correctness"]
    assert result["environment"]["versions"]["peft"] and result["environment"]["matmul_tflops"] > 0
    assert c["resume"]["ok"] and c["resume"]["max_weight_diff"] == 0.0, c["resume"]
    assert c["sampling_sync"]["identical"] and c["sampling_sync"]["rows_ending_with_eos"] > 0, c["sampling_sync"]
    assert c["reward_model"]["reward_model_device"] == "cpu", c["reward_model"]
    comp = c["decode_compile"]
    assert comp["same_tokens"] == 1.0 and comp["rows_ending_with_eos"] > 0 and comp["compiled_tok_s"] > 0, comp
    learn = c["bf16_learning"]
    assert learn["ok"] and learn["master_dtype"] == ["float32"] and learn["grad_cosine_bf16_fp32"] > 0.99, learn
    for arch in ("qwen2.5-0.5b", "qwen2.5-1.5b"):
        for mode in ("lora", "full"):
            ratios = result["throughput"][f"throughput {arch}"][mode]["ours_over_trl"]
            assert all(v > 0 for v in ratios.values()), (arch, mode, ratios)
    # every part ran here (bitsandbytes, trl installed), so each says passed
    assert result["ok"] is True and {v["status"] for v in result["parts"].values()} == {"passed"}, result["parts"]


def _gpu_check_module():
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_check.py")
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("decode_ok", [True, False])
def test_gpu_check_skipped_parts_say_skipped_and_do_not_count(tmp_path, monkeypatch, decode_ok):
    """A part that could not run (bitsandbytes or gtpo's TRL engine missing, no step for the dtype table) is
    ``skipped`` with its reason, never ``ok``; the exit status says whether every part that ran passed."""
    gpu_check = _gpu_check_module()
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)          # find_spec: not installed
    monkeypatch.setitem(sys.modules, "gtpo.integrations.trl", None)  # import raises ImportError
    monkeypatch.setattr(gpu_check, "check_decode", lambda ctx: {"same_tokens": 1.0, "ok": decode_ok})
    code = gpu_check.main(["--cpu", "--quick", "--only", "decode,qlora_grad,trl"])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    for name, value in [("qlora_grad", result["correctness"]["qlora_grad"]),
                        ("trl_vs_ours", result["trl_vs_ours"]), ("dtypes", result["correctness"]["dtypes"])]:
        assert "ok" not in value and value["status"] == "skipped" and value["reason"], (name, value)
        assert result["parts"][name]["status"] == "skipped" and result["parts"][name]["reason"], name
    assert "bitsandbytes" in result["parts"]["qlora_grad"]["reason"]
    assert "gtpo.integrations.trl" in result["parts"]["trl_vs_ours"]["reason"]
    assert result["parts"]["decode"]["status"] == ("passed" if decode_ok else "failed")
    assert result["ok"] is decode_ok and code == (0 if decode_ok else 1)


def test_gpu_check_parts_past_the_budget_are_skipped_with_the_reason(tmp_path, monkeypatch):
    """--budget-s: a part whose estimated GPU time no longer fits is skipped with the reason 'budget' (on the
    GPU; --quick runs every part whatever the budget, so the CPU path is exercised without it)."""
    gpu_check = _gpu_check_module()
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(gpu_check, "check_environment", lambda ctx: {"versions": {}})
    monkeypatch.setattr(gpu_check, "check_head", lambda ctx: {"ok": True})
    monkeypatch.setattr(gpu_check.Ctx, "__init__", lambda self, args: (
        setattr(self, "quick", False), setattr(self, "cuda", False), setattr(self, "device", gpu_check.torch.device("cpu")),
        setattr(self, "T", 8), setattr(self, "T_long", 8), setattr(self, "G", 4),
        setattr(self, "work", str(tmp_path / "scratch")))[0])
    code = gpu_check.main(["--cpu", "--only", "environment,head,trl", "--budget-s", "10"])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["parts"]["environment"]["status"] == "passed" and result["parts"]["head"]["status"] == "passed"
    assert result["parts"]["trl_vs_ours"] == {"status": "skipped", "reason": result["parts"]["trl_vs_ours"]["reason"]}
    assert result["parts"]["trl_vs_ours"]["reason"].startswith("budget:")
    assert code == 0
