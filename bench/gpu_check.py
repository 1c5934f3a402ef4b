"""The GPU check (issue 29 section 3): what users of 3B-8B models hit, on one GPU in about 5 minutes.

Nothing is downloaded there: the models are random-weight Qwen2.5-3B and Llama-3.1-8B, their
architectures built in code (:data:`ARCHS`). Run it through ``scripts/gpu-check.sh`` (which prepares
the wheels the GPU machine lacks and prints the one command that runs it); ``--cpu --quick`` runs the
same code on tiny models of the same architectures (tests/test_dtype_device.py, in CI).

(a) **correctness at real shapes**

* ``head``: the chunked log-prob/entropy head (:func:`gtpo.maths.ops.token_logprobs_and_entropy`) against a
  plain ``log_softmax`` of the full logits, bf16, Llama-3.1-8B's head (V = 128,256, D = 4,096): the
  largest log-prob, entropy and gradient differences, time and peak memory of each, at the CPU's and
  the accelerator's chunk sizes;
* ``shared_prefix``: the update's forward with each group's prompt run once
  (:func:`gtpo.sampling.policy.completion_hidden_states`) against the plain forward, left-padded prompts of
  different lengths, SDPA, Qwen2.5-3B, float32 and bf16 log-probs;
* ``decode``: gtpo's decoding loop against transformers ``generate``, greedy, float32 (TF32 off), the
  share of rows whose tokens are identical, and both speeds;
* ``qlora_grad``: a 4-bit NF4 base (Llama-3.1-8B widths, 2 layers) loaded by the trainer from a path
  (``device_map`` of this process), LoRA on every linear layer: after two updates every adapter
  tensor has moved (the gradient crossed every 4-bit layer);
* ``dtypes``: the contract of docs/gpu.md on the trainers of (b): weights, trainable parameters,
  optimizer state, the vLLM engine's dtype.

(b) **steps**: two steps each of bf16 LoRA (Qwen2.5-3B), QLoRA (Llama-3.1-8B, 4-bit) and full
fine-tuning (Qwen2.5-3B, float32 master weights, bf16 autocast) with gradient checkpointing, one
prompt x G = 8 completions of exactly T = 512 tokens, as the paper configs; one more step of the full
fine-tuning at T = 1500 for its peak memory. Sampled tokens/s, update time, peak memory.

(c) **trl_vs_ours**: one update on the same fixed batch (prompts, completions, rewards) through gtpo's
trainer and through TRL's engine (:class:`gtpo.integrations.trl.TRLGTPOTrainer`), float32: the loss and
the largest gradient difference (skipped where trl or datasets cannot be imported).

(d) **what users need** (issue 42), run first:

* ``environment``: versions (torch, CUDA, transformers, accelerate, peft, trl, datasets, bitsandbytes, ...) and one
  8192^3 bf16 matmul's TFLOP/s;
* ``resume``: step 2 after resuming from the step-1 checkpoint against the uninterrupted step 2 (loss, every
  weight: bitwise on a CPU; on CUDA within the differences its atomics allow);
* ``sampling_sync``: the decoding loop with EOS on, host reads every token against every 8: identical greedy
  tokens, both speeds;
* ``decode_compile`` (issue 46): the decoding loop with its steps compiled (``GTPOConfig.decode_compile``: static
  cache, CUDA graphs) against the eager loop on a Qwen2.5-0.5B shape, 32 rows x 128 tokens, float32 greedy: identical
  tokens, tokens/s of each, the compilation time;
* ``reward_model``: a sequence-classification reward model given by path scores on the run's device;
* ``bf16_learning``: at lr 1e-6 the share of weights that move in a bf16 run (float32 master weights) and of
  their bf16 values; ten updates on one fixed batch in bf16 and float32 (the log-prob margin of the positively
  over the negatively rewarded completions grows in both); a token reward over 15 sampled steps (slope and p,
  reported); the gradient cosine bf16 vs float32;
* ``sharded``: TRL's engine under TRL's shipped ``fsdp2.yaml``, ``zero2.yaml`` and ``zero3.yaml`` (one process): two
  GTPO steps, a checkpoint each, a resume; the losses against the plain run's (on CPU processes accelerate does not
  shard: the part checks that gtpo refuses each config before the model loads);
* ``throughput``: gtpo's trainer and TRL's ``GRPOTrainer`` on random-weight Qwen2.5-0.5B and -1.5B shapes, bf16
  LoRA and full fine-tuning, 1 prompt x 8 completions of exactly 128 tokens, no vLLM: rollout tokens/s, update
  time, step time, peak allocated and reserved memory, as ratios ours/TRL.

The parts run in order of value within ``--budget-s`` (default 450 s: one device call): a part whose estimated
time on one H200 no longer fits is ``skipped`` with the reason ``budget``.

Everything goes to ``$OUT/gpu_check.json`` (one JSON object) and a table; a part that raises is
recorded under ``failures`` and the others still run. ``parts`` gives each part's status: ``passed``,
``failed``, or ``skipped`` with the reason (a part that could not run checked nothing: never "ok");
``ok`` and the exit status (0 or 1) say whether every part that ran passed. Record the numbers in docs/performance.md
with the date and the GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import torch  # noqa: E402

#: The architectures of the paper's models (their configs on the Hub), built with random weights.
ARCHS = {
    "qwen2.5-3b": dict(model_type="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, vocab_size=151936, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
    "llama3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                        rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}
#: --quick: the same architectures at toy sizes (the CPU smoke run).
QUICK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=1024)
QUANT = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16",
         "bnb_4bit_use_double_quant": True}
LORA = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}
PROMPTS = [f"What is {a} + {b}? Think step by step and give the answer." for a, b in [(12, 7), (45, 19), (3, 88)]]


# ----------------------------------------------------------------------------- helpers
def skipped(reason: str) -> dict:
    """The result of a part that could not run: ``skipped`` with ``reason``, and no ``ok`` (it checked nothing)."""
    return {"status": "skipped", "reason": reason}


def part_status(value: dict | None, error: str | None) -> dict:
    """What a part's ``value`` (or its ``error``, when it raised) says: ``failed`` (it raised, or its check
    says ``ok: False``), ``skipped`` with the reason (it could not run), else ``passed`` (its check held, or a
    measuring part completed)."""
    if error is not None:
        return {"status": "failed", "error": error}
    if isinstance(value, dict) and value.get("status") == "skipped":
        return {"status": "skipped", "reason": value.get("reason", "?")}
    if isinstance(value, dict) and value.get("ok") is False:
        return {"status": "failed", "error": "its check failed (ok: false)"}
    return {"status": "passed"}


class Ctx:
    """The run's settings: device, sizes (full or --quick), scratch directory, the tokenizer."""

    def __init__(self, args):
        from gtpo.testing import build_tiny_tokenizer

        self.quick, self.device = args.quick, torch.device("cpu" if args.cpu else "cuda")
        self.cuda = self.device.type == "cuda"
        self.T = 8 if args.quick else args.length
        self.T_long = 12 if args.quick else args.long_length
        self.G = 4 if args.quick else 8
        # models are saved and loaded again (the 4-bit bases: the trainer quantizes while loading): in memory
        # (/dev/shm) where it has room for Llama-3.1-8B's 16 GB, else the disk
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 40 * 2**30 else None
        self.work = tempfile.mkdtemp(prefix="gtpo-gpu-check-", dir=shm if self.cuda else None)
        self.tokenizer = build_tiny_tokenizer(vocab_size=512, eos_equals_pad=True, seed=0)

    def arch(self, name: str, **changes) -> dict:
        values = dict(ARCHS[name])
        if self.quick:
            values.update(QUICK)
        values.update(changes)
        return values

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def reset_peak(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None

    def free(self):
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def build_model(ctx: Ctx, arch: dict, *, dtype=torch.bfloat16, length: int | None = None, device=None):
    """A random causal LM of ``arch`` (transformers' own initialisation) on ``device``, whose generation
    config forces exactly ``length`` new tokens (every trainer samples the same number of tokens)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    values = dict(arch)
    config = AutoConfig.for_model(values.pop("model_type"), **values, eos_token_id=ctx.tokenizer.eos_token_id,
                                  pad_token_id=ctx.tokenizer.pad_token_id, bos_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device or ctx.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if length is not None:
        model.generation_config = GenerationConfig(eos_token_id=ctx.tokenizer.eos_token_id,
                                                   pad_token_id=ctx.tokenizer.pad_token_id,
                                                   min_new_tokens=length, max_new_tokens=length)
    return model


def save_model(ctx: Ctx, model, name: str) -> str:
    path = os.path.join(ctx.work, name)
    model.save_pretrained(path)
    ctx.tokenizer.save_pretrained(path)
    return path


def reward(completions, **kwargs):
    """Share of digits, plus a little length: cheap, and it varies within a group."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) + 1e-3 * len(c) for c in completions]


def max_abs(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def timed(ctx: Ctx, fn):
    ctx.reset_peak()
    t0 = time.perf_counter()
    out = fn()
    ctx.sync()
    return out, time.perf_counter() - t0, ctx.peak_gib()


# ----------------------------------------------------------------------------- (a) correctness
def check_head(ctx: Ctx) -> dict:
    from gtpo.maths.ops import default_chunk_rows, token_logprobs_and_entropy

    V, D = (ctx.arch("llama3.1-8b")["vocab_size"], ctx.arch("llama3.1-8b")["hidden_size"])
    rows = 64 if ctx.quick else 4096  # 8 completions x 512 tokens
    g = torch.Generator(device=ctx.device).manual_seed(0)
    hidden = (torch.randn(rows, D, generator=g, device=ctx.device) * 2).to(torch.bfloat16).requires_grad_(True)
    weight = (torch.randn(V, D, generator=g, device=ctx.device) / math.sqrt(D)).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, V, (rows,), generator=g, device=ctx.device)
    upstream = torch.randn(rows, generator=g, device=ctx.device)

    def plain():
        logp_all = torch.log_softmax((hidden @ weight.T).float(), dim=-1)
        logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
        gh, gw = torch.autograd.grad((logp * upstream).sum(), (hidden, weight))
        return logp.detach(), ent.detach(), gh, gw

    def chunked(chunk):
        logp, ent = token_logprobs_and_entropy(hidden, weight, targets, chunk_size=chunk)
        gh, gw = torch.autograd.grad((logp * upstream).sum(), (hidden, weight))
        return logp.detach(), ent.detach(), gh, gw

    ref, t_plain, m_plain = timed(ctx, plain)
    out = {"V": V, "D": D, "rows": rows, "plain_s": t_plain, "plain_peak_gib": m_plain}
    ok = True
    for label, device in (("cpu_chunk", "cpu"), ("default_chunk", ctx.device)):
        chunk = default_chunk_rows(V, device)
        got, t, m = timed(ctx, lambda: chunked(chunk))
        diffs = {"logp": max_abs(got[0], ref[0]), "entropy": max_abs(got[1], ref[1]),
                 "grad_hidden": max_abs(got[2], ref[2]) / max(float(ref[2].abs().max()), 1e-12),
                 "grad_weight": max_abs(got[3], ref[3]) / max(float(ref[3].abs().max()), 1e-12)}
        out[label] = {"chunk_rows": chunk, "s": t, "peak_gib": m, **diffs}
        # bf16 matmul, fp32 softmax on both sides: only the summation order of the bf16 products differs
        ok &= diffs["logp"] < 0.05 and diffs["entropy"] < 0.05 and diffs["grad_hidden"] < 0.02 \
            and diffs["grad_weight"] < 0.02
    out["ok"] = bool(ok)
    return out


def _batch(ctx: Ctx, model, n_prompts: int, completion: int, seed: int = 0):
    """Left-padded prompts of different lengths (G rows each) followed by random completions."""
    from gtpo.sampling.padding import left_pad

    g = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    prompts = [torch.randint(3, min(V, 500), (int(l),), generator=g).tolist() for l in (5 + 7 * torch.arange(n_prompts))]
    rows = [p for p in prompts for _ in range(ctx.G)]
    ids, mask = left_pad(rows, ctx.tokenizer.pad_token_id)
    comp = torch.randint(3, V, (len(rows), completion), generator=g)
    return (torch.cat([ids, comp], 1).to(ctx.device), torch.cat([mask, torch.ones_like(comp)], 1).to(ctx.device),
            comp.to(ctx.device))


def check_shared_prefix(ctx: Ctx) -> dict:
    from gtpo.sampling.policy import completion_hidden_states
    from gtpo.maths.ops import token_logprobs_and_entropy

    out, ok = {}, True
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(ctx, ctx.arch("qwen2.5-3b", **({} if ctx.quick else {"num_hidden_layers": 8})),
                            dtype=dtype)
        model.eval()
        ids, mask, comp = _batch(ctx, model, 3, 16 if ctx.quick else 128)
        head = model.get_output_embeddings().weight
        res = {}
        with torch.no_grad():
            for share in (True, False):  # each side once untimed first: CUDA's warm-up is in neither time
                completion_hidden_states(model.get_decoder(), ids, mask, comp.shape[1], share_prompts=share)
            for share in (True, False):
                h, t, m = timed(ctx, lambda: completion_hidden_states(model.get_decoder(), ids, mask, comp.shape[1],
                                                                      share_prompts=share))
                logp, _ = token_logprobs_and_entropy(h, head, comp)
                res[share] = (logp, t, m)
        diff = max_abs(res[True][0], res[False][0])
        name = str(dtype).removeprefix("torch.")
        out[name] = {"max_logp_diff": diff, "shared_s": res[True][1], "plain_s": res[False][1],
                     "shared_peak_gib": res[True][2], "plain_peak_gib": res[False][2]}
        ok &= diff < (1e-3 if dtype == torch.float32 else 0.15)
        model = None
        ctx.free()
    out["ok"] = bool(ok)
    return out


def check_decode(ctx: Ctx) -> dict:
    from gtpo.sampling.rollout import generate

    if ctx.cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = build_model(ctx, ctx.arch("qwen2.5-3b"), dtype=torch.float32)
    new = 8 if ctx.quick else 64
    rows = {}
    for loop in (True, False):  # each side once untimed first: CUDA's warm-up is in neither time
        generate(model, ctx.tokenizer, PROMPTS[:1], num_samples=2, max_new_tokens=4, temperature=0.0, decode_loop=loop)
    for loop in (True, False):
        r, t, m = timed(ctx, lambda: generate(model, ctx.tokenizer, PROMPTS, num_samples=ctx.G // 2, max_new_tokens=new,
                                              temperature=0.0, decode_loop=loop))
        rows[loop] = (r.completion_ids, t)
    a, b = rows[True][0], rows[False][0]
    width = min(a.shape[1], b.shape[1])
    same = (a[:, :width] == b[:, :width]).all(dim=1).float().mean().item()
    n_tokens = a.shape[0] * new
    out = {"rows": a.shape[0], "new_tokens": new, "identical_rows": same,
           "decode_loop_tok_s": n_tokens / rows[True][1], "generate_tok_s": n_tokens / rows[False][1],
           "ok": same >= 0.9}
    model = None
    ctx.free()
    return out


def _trainer(ctx: Ctx, model, *, out_dir: str, peft=None, T: int, reward_funcs=None, **cfg):
    from peft import LoraConfig

    from gtpo import GTPOConfig, GTPOTrainer

    args = GTPOConfig(output_dir=out_dir, overwrite_output_dir=True, group_size=ctx.G, prompts_per_step=1,
                      max_steps=10, max_completion_length=T, max_prompt_length=64, learning_rate=1e-6,
                      lr_scheduler_type="constant", save_steps=0, log_completions_steps=0, disable_tqdm=True,
                      seed=0, entropy_threshold=100.0, **cfg)
    return GTPOTrainer(model, reward_funcs or reward, [{"prompt": p} for p in PROMPTS], args=args,
                       processing_class=ctx.tokenizer,
                       peft_config=None if peft is None else LoraConfig(**peft))


def check_qlora_grad(ctx: Ctx) -> dict:
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return skipped("bitsandbytes is not installed")
    model = build_model(ctx, ctx.arch("llama3.1-8b", num_hidden_layers=2, vocab_size=32000 if not ctx.quick else 1024),
                        dtype=torch.bfloat16, length=8, device="cpu")
    path = save_model(ctx, model, "qlora-grad")
    del model
    trainer = _trainer(ctx, path, out_dir=os.path.join(ctx.work, "qlora-grad-run"), peft=LORA, T=8,
                       model_init_kwargs={"dtype": "bfloat16", "quantization_config": QUANT})
    model = trainer.unwrapped_model
    kinds = {type(m).__name__ for m in model.modules()}
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer.step()  # LoRA's B starts at 0: the first update moves B only, the second A as well
    trainer.step()
    frozen = [n for n, p in model.named_parameters() if n in before and torch.equal(before[n], p)]
    devices = sorted({str(p.device) for p in model.parameters()})
    dev = trainer.accelerator.device
    want = str(torch.device("cuda", torch.cuda.current_device()) if dev.type == "cuda" and dev.index is None else dev)
    out = {"adapters": len(before), "unchanged": frozen[:5], "n_unchanged": len(frozen), "devices": devices,
           "process_device": want, "linear4bit": "Linear4bit" in kinds,
           "ok": not frozen and "Linear4bit" in kinds and devices == [want]}
    del trainer, model
    ctx.free()
    return out


def _dtypes(trainer) -> dict:
    model = trainer.unwrapped_model
    name = lambda d: str(d).removeprefix("torch.")  # noqa: E731
    opt = trainer.optimizer.optimizer
    state = {name(v.dtype) for s in opt.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")}
    return {"compute": name(trainer.precision.compute),
            "frozen": sorted({name(p.dtype) for p in model.parameters() if not p.requires_grad}),
            "trainable": sorted({name(p.dtype) for p in model.parameters() if p.requires_grad}),
            "adam_state": sorted(state), "vllm": trainer.vllm_engine_kwargs()["dtype"],
            "optimizer": type(opt).__name__}


# ----------------------------------------------------------------------------- (b) steps
def _metric(metrics: dict, *names: str) -> float:
    """The first of ``names`` the step's metrics hold (the trainer's metric names: TRL's and gtpo/)."""
    return next(metrics[n] for n in names if n in metrics)


def _timed_step(ctx: Ctx, trainer) -> tuple[dict, float, float]:
    """One ``trainer.step()`` with the peak memory reset before it: (its metrics, wall seconds, generation seconds)."""
    ctx.reset_peak()
    t0 = time.perf_counter()
    metrics = trainer.step()
    ctx.sync()
    return metrics, time.perf_counter() - t0, _metric(metrics, "gtpo/generation_time", "generation_time_s")


def run_steps(ctx: Ctx, name: str, *, arch: str, peft, quantized: bool, steps: int, T: int, **cfg) -> dict:
    import importlib.util

    if quantized and importlib.util.find_spec("bitsandbytes") is None:
        return skipped("bitsandbytes is not installed")
    if quantized:  # the trainer loads it from a path, as a user's run does (4-bit on this process's device)
        model = build_model(ctx, ctx.arch(arch), dtype=torch.bfloat16, length=T, device="cpu" if ctx.quick else None)
        source = save_model(ctx, model, name.replace(" ", "-"))
        del model
        ctx.free()
        cfg["model_init_kwargs"] = {"dtype": "bfloat16", "quantization_config": QUANT}
    else:
        source = build_model(ctx, ctx.arch(arch), dtype=torch.bfloat16 if peft else torch.float32, length=T)
        cfg["dtype"] = "bfloat16"
    ctx.reset_peak()
    trainer = _trainer(ctx, source, out_dir=os.path.join(ctx.work, name.replace(" ", "-") + "-run"), peft=peft, T=T,
                       gradient_checkpointing=True, **cfg)
    load_peak = ctx.peak_gib()
    records = []
    for _ in range(steps):
        metrics, wall, gen = _timed_step(ctx, trainer)
        records.append({"step_s": wall, "generation_s": gen,
                        "update_s": _metric(metrics, "gtpo/update_time", "update_time_s"),
                        "sampled_tokens_per_s": ctx.G * T / gen, "peak_gib": ctx.peak_gib(),
                        "loss": metrics["loss"], "grad_norm": metrics["grad_norm"]})
    last = records[-1]
    out = {"arch": arch, "T": T, "G": ctx.G, "steps": records, "load_peak_gib": load_peak,
           "tokens_per_s": last["sampled_tokens_per_s"], "update_s": last["update_s"], "peak_gib": last["peak_gib"],
           "dtypes": _dtypes(trainer),
           "params_b": sum(p.numel() for p in trainer.unwrapped_model.parameters()) / 1e9}
    del trainer
    ctx.free()
    return out


def dtype_contract(steps: dict) -> dict:
    """Section 2's table on the trainers of (b)."""
    want = {"bf16 LoRA": {"compute": "bfloat16", "frozen": ["bfloat16"], "trainable": ["float32"],
                          "adam_state": ["float32"], "vllm": "bfloat16"},
            "QLoRA": {"compute": "bfloat16", "trainable": ["float32"], "vllm": "bfloat16"},
            "full fine-tuning": {"compute": "bfloat16", "frozen": [], "trainable": ["float32"],
                                 "adam_state": ["float32"], "vllm": "bfloat16"}}
    out, ok = {}, True
    for name, expected in want.items():
        got = steps.get(name, {}).get("dtypes")
        if got is None:
            continue
        bad = {k: got.get(k) for k, v in expected.items() if got.get(k) != v}
        if name == "QLoRA" and set(got["frozen"]) - {"bfloat16", "uint8"}:
            bad["frozen"] = got["frozen"]
        out[name] = {"got": got, "mismatch": bad}
        ok &= not bad
    if not out:
        return skipped("no step of (b) ran: --only, or each was skipped or failed")
    out["ok"] = bool(ok)
    return out


# ----------------------------------------------------------------------------- (c) TRL's engine vs ours
def trl_vs_ours(ctx: Ctx) -> dict:
    try:
        from datasets import Dataset

        from gtpo.integrations.trl import TRLGTPOConfig, TRLGTPOTrainer
    except ImportError as err:
        return skipped(f"{type(err).__name__}: {err}")

    from gtpo import GTPOConfig, GTPOTrainer
    from gtpo.maths.advantages import group_advantages
    from gtpo.sampling.padding import completion_mask_from_ids, left_pad
    from gtpo.sampling.rollout import Rollout

    if ctx.cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    G, P, eos = 4, 2, ctx.tokenizer.eos_token_id
    model = build_model(ctx, ctx.arch("qwen2.5-3b", **({} if ctx.quick else {"num_hidden_layers": 4})),
                        dtype=torch.float32, device="cpu")
    path = save_model(ctx, model, "trl-vs-ours")
    del model
    g = torch.Generator().manual_seed(1)
    prompt_ids = {"p0": [30, 31, 32, 33], "p1": [40, 41]}
    shared = torch.randint(3, 500, (3,), generator=g).tolist()
    C = [shared + torch.randint(3, 500, (int(n),), generator=g).tolist() + [eos] for n in (4, 7, 2, 9, 5, 3, 8, 6)]
    R = [2.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 3.0]
    row = {tuple(c): i for i, c in enumerate(C)}
    fields = dict(group_size=G, prompts_per_step=P, micro_batch_size=2, max_grad_norm=0.0, entropy_threshold=100.0,
                  learning_rate=1e-6, disable_tqdm=True, log_completions_steps=0, save_steps=0, seed=0)

    def fixed_reward(completion_ids, **kwargs):
        return [R[row[tuple(c)]] for c in completion_ids]

    ours = GTPOTrainer(path, fixed_reward, [{"prompt": "p0"}, {"prompt": "p1"}],
                       args=GTPOConfig(output_dir=os.path.join(ctx.work, "ours"), **fields))
    prompts, p_mask = left_pad([prompt_ids[f"p{i // G}"] for i in range(P * G)], eos)
    T = max(len(c) for c in C)
    comp = torch.tensor([c + [eos] * (T - len(c)) for c in C])
    c_mask, truncated = completion_mask_from_ids(comp, [eos])
    rollout = Rollout(prompts, p_mask, comp, c_mask, truncated, [""] * len(C))
    adv = group_advantages(torch.tensor(R), G, scale=ours.args.resolved_scale_rewards)
    captured = {}
    ours.optimizer.step = lambda *a, **k: captured.update(
        {n: p.grad.detach().float().cpu().clone() for n, p in ours.unwrapped_model.named_parameters()
         if p.grad is not None})
    result = ours.update(rollout, adv, ours.gtpo_inputs(rollout, adv))

    def fixed_rollout(prompts_, trainer):
        n = len(prompts_)
        return {"prompt_ids": [prompt_ids[p] for p in prompts_],
                "completion_ids": [list(C[i]) for i in range(n)], "logprobs": None}

    args = TRLGTPOConfig(output_dir=os.path.join(ctx.work, "trl"), use_cpu=not ctx.cuda, report_to="none", bf16=False,
                         save_strategy="no", disable_tqdm=True, seed=0, per_device_train_batch_size=2,
                         gradient_accumulation_steps=4, steps_per_generation=4, num_generations=G,
                         max_completion_length=T, entropy_threshold=100.0, learning_rate=1e-6)
    trl = TRLGTPOTrainer(model=path, reward_funcs=fixed_reward, args=args, processing_class=ctx.tokenizer,
                         train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"] * 4}), rollout_func=fixed_rollout)
    model = trl.model
    model.train()
    trl.current_gradient_accumulation_steps = 4
    model.zero_grad(set_to_none=True)
    total = 0.0
    for k in range(4):
        trl._step = k
        batch = trl._prepare_inputs([{"prompt": f"p{i // G}"} for i in range(P * G)])
        loss = trl.compute_loss(model, batch)
        loss.backward()
        total += float(loss)
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    diff = max(float((grads[n] - captured[n]).abs().max()) for n in grads)
    scale = max(1.0, max(float(v.abs().max()) for v in captured.values()))
    out = {"loss_ours": float(result.loss), "loss_trl": total, "max_grad_diff": diff, "grad_scale": scale,
           "same_params": set(grads) == set(captured),
           "ok": set(grads) == set(captured) and abs(total - float(result.loss)) < 1e-4 and diff < 1e-4 * scale}
    ours = trl = model = None
    ctx.free()
    return out


# ----------------------------------------------------------------------------- (d) what users need (issue 42)
#: Qwen2.5-0.5B and -1.5B (their configs on the Hub): the throughput comparison with TRL's GRPOTrainer
SMALL_ARCHS = {
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
}
ARCHS.update(SMALL_ARCHS)


def check_environment(ctx: Ctx) -> dict:
    """Versions (peft, trl, datasets and bitsandbytes where importable) and one large matmul's TFLOP/s in bf16 on
    the GPU (float32 on a CPU: its training dtype)."""
    import importlib

    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "accelerate", "peft", "trl", "datasets", "bitsandbytes", "huggingface_hub",
                 "safetensors", "tokenizers"):
        try:
            versions[name] = importlib.import_module(name).__version__
        except Exception as err:  # noqa: BLE001 -- recorded: absent or broken
            versions[name] = f"not importable ({type(err).__name__})"
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    n = 256 if ctx.quick else 8192
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    a @ b  # warm-up (kernel selection)
    ctx.sync()
    reps = 3 if ctx.quick else 20
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    ctx.sync()
    secs = (time.perf_counter() - t0) / reps
    out = {"versions": versions, "matmul_dtype": str(dtype).removeprefix("torch."), "matmul_n": n,
           "matmul_tflops": 2 * n**3 / secs / 1e12}
    if ctx.cuda:
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, gpu_memory_gib=props.total_memory / 2**30, capability=f"{props.major}.{props.minor}")
    return out


def check_sampling_sync(ctx: Ctx) -> dict:
    """gtpo's decoding loop with EOS on, host reads every token against every 8 tokens (the accelerator's
    default): greedy, so the tokens must be identical; both speeds. EOS is a token the model produces early in
    some rows (read off a first run without EOS), so rows end at different steps."""
    from transformers import GenerationConfig

    from gtpo.sampling.decode import decode, decode_loop_config, prefill
    from gtpo.sampling.padding import left_pad

    if ctx.cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(ctx, ctx.arch("qwen2.5-0.5b"), dtype=torch.float32).eval()
    new = 12 if ctx.quick else 64
    rows = [ctx.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS] * (ctx.G // 2)
    pad = ctx.tokenizer.pad_token_id
    ids, mask = left_pad(rows, pad)
    ids, mask = ids.to(ctx.device), mask.to(ctx.device)

    def run(eos: int, every: int):
        config = decode_loop_config(model, GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=eos,
                                                            pad_token_id=pad))
        with torch.inference_mode():
            cache = prefill(model, ids, mask)
            return timed(ctx, lambda: decode(model, ids, mask, cache, config, eos_ids=[eos], pad_id=pad,
                                             sync_every=every))

    free_run, _, _ = run(-1 % 2**31, 1)  # an id the model never samples: no row ends
    eos = int(free_run[0, min(3, free_run.shape[1] - 1)])  # row 0 ends at its 4th token, others later or never
    (a, ta, _), (b, tb, _) = run(eos, 1), run(eos, 8)
    width = max(a.shape[1], b.shape[1])
    a = torch.nn.functional.pad(a, (0, width - a.shape[1]), value=pad)
    b = torch.nn.functional.pad(b, (0, width - b.shape[1]), value=pad)
    ended = (a == eos).any(dim=1)
    n_tokens = int(((a != pad) | (a == eos)).sum())
    out = {"rows": a.shape[0], "max_new_tokens": new, "rows_ending_with_eos": int(ended.sum()),
           "identical": bool(torch.equal(a, b)), "sync1_tok_s": n_tokens / ta, "sync8_tok_s": n_tokens / tb,
           "sync8_over_sync1_speed": ta / tb, "ok": bool(torch.equal(a, b)) and bool(ended.any())}
    model = None
    ctx.free()
    return out


def check_decode_compile(ctx: Ctx) -> dict:
    """Issue 46: gtpo's decoding loop with its steps compiled (``GTPOConfig.decode_compile``: a static key/value
    cache, ``torch.compile`` with CUDA graphs, ``mode="reduce-overhead"``) against the eager loop, on a
    random-weight Qwen2.5-0.5B shape (all its layers), float32 (TF32 off), greedy, rows ending at different steps:
    the share of rows with identical tokens, tokens/s of each (after one warm-up call; the compiled side's first
    call, compilation included, reported apart) and compiled / eager speed. ``decode_compile: auto`` is on for CUDA
    until this part says otherwise. On ``--cpu --quick`` the step goes through dynamo's ``eager`` backend (the
    code path, not inductor's compile time)."""
    from transformers import GenerationConfig

    from gtpo.sampling.decode import decode, decode_compile_options, decode_loop_config, prefill
    from gtpo.sampling.padding import left_pad

    if ctx.cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(ctx, ctx.arch("qwen2.5-0.5b"), dtype=torch.float32).eval()
    new = 12 if ctx.quick else 128
    rows = [ctx.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS] * (2 if ctx.quick else 16)
    pad = ctx.tokenizer.pad_token_id
    ids, mask = left_pad(rows, pad)
    ids, mask = ids.to(ctx.device), mask.to(ctx.device)
    options = decode_compile_options(True, ctx.device) if ctx.cuda else {"backend": "eager"}

    def run(eos: int, compiled: bool):
        config = decode_loop_config(model, GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=eos,
                                                            pad_token_id=pad))
        with torch.inference_mode():
            cache = prefill(model, ids, mask)
            return timed(ctx, lambda: decode(model, ids, mask, cache, config, eos_ids=[eos], pad_id=pad,
                                             compile_options=options if compiled else None))

    free_run, _, _ = run(-1 % 2**31, False)  # an id the model never samples: no row ends
    eos = int(free_run[0, min(3, free_run.shape[1] - 1)])  # row 0 ends at its 4th token, others later or never
    _, first_s, _ = run(eos, True)  # compiles (once per shape bucket)
    (a, ta, _), (b, tb, _) = run(eos, False), run(eos, True)
    width = max(a.shape[1], b.shape[1])
    a = torch.nn.functional.pad(a, (0, width - a.shape[1]), value=pad)
    b = torch.nn.functional.pad(b, (0, width - b.shape[1]), value=pad)
    n_tokens = int(((a != pad) | (a == eos)).sum())
    same = float((a == b).all(dim=1).float().mean())
    out = {"rows": a.shape[0], "max_new_tokens": new, "options": options,
           "rows_ending_with_eos": int((a == eos).any(dim=1).sum()), "same_tokens": same,
           "eager_tok_s": n_tokens / ta, "compiled_tok_s": n_tokens / tb, "compiled_over_eager_speed": ta / tb,
           "first_compiled_call_s": first_s, "ok": same == 1.0}
    model = None
    ctx.free()
    return out


def check_reward_model(ctx: Ctx) -> dict:
    """A sequence-classification reward model given by path to gtpo's trainer scores on the run's device (the
    GPU), not on the host where rollouts live (issue 42 defect 2): its parameters' device after one step."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    values = dict(ctx.arch("qwen2.5-0.5b", num_hidden_layers=2))
    config = AutoConfig.for_model(values.pop("model_type"), **values, num_labels=1,
                                  pad_token_id=ctx.tokenizer.pad_token_id)
    torch.manual_seed(0)
    rm_path = save_model(ctx, AutoModelForSequenceClassification.from_config(config), "reward-model")
    policy = build_model(ctx, ctx.arch("qwen2.5-0.5b", num_hidden_layers=2), dtype=torch.float32, length=8)
    trainer = _trainer(ctx, policy, out_dir=os.path.join(ctx.work, "rm-run"), T=8, reward_funcs=rm_path)
    metrics = trainer.step()
    rm = trainer.scorer.funcs[0].model
    device = str(next(rm.parameters()).device)
    want = str(trainer.accelerator.device)
    out = {"reward_model_device": device, "run_device": want, "reward_mean": metrics.get("reward"),
           "ok": torch.device(device).type == torch.device(want).type}
    del trainer, rm
    ctx.free()
    return out


def _peaks(ctx: Ctx) -> dict:
    if not ctx.cuda:
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    return {"peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}


def _ours_steps(ctx: Ctx, path: str, *, peft, T: int, steps: int, out_dir: str) -> list[dict]:
    trainer = _trainer(ctx, path, out_dir=out_dir, peft=peft, T=T, dtype="bfloat16")
    records = []
    for _ in range(steps):
        _, wall, gen = _timed_step(ctx, trainer)
        records.append({"step_s": wall, "generation_s": gen, "update_s": wall - gen, **_peaks(ctx)})
    del trainer
    ctx.free()
    return records


def _trl_steps(ctx: Ctx, path: str, *, peft, T: int, steps: int, out_dir: str) -> list[dict]:
    """TRL's ``GRPOTrainer`` matched to :func:`_trainer`: one prompt x G completions per step of exactly T tokens
    (the model's generation config), the same reward and prompts, GRPO (TRL has no GTPO), no KL, no vLLM, bf16
    (TRL's ``bf16``; LoRA on a bf16-loaded base as ours), no gradient checkpointing on either side."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    records: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            ctx.reset_peak()
            self.t0, self.gen = time.perf_counter(), len(gen_times)

        def on_step_end(self, args, state, control, **kw):
            ctx.sync()
            wall = time.perf_counter() - self.t0
            gen = sum(gen_times[self.gen:])
            records.append({"step_s": wall, "generation_s": gen, "update_s": wall - gen, **_peaks(ctx)})

    args = GRPOConfig(output_dir=out_dir, loss_type="grpo", beta=0.0, num_generations=ctx.G,
                      per_device_train_batch_size=ctx.G, gradient_accumulation_steps=1, num_iterations=1,
                      max_completion_length=T, temperature=1.0, top_p=1.0, top_k=0, use_vllm=False,
                      learning_rate=1e-6, lr_scheduler_type="constant", max_steps=steps, logging_steps=10**9,
                      save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
                      log_completions=False, use_cpu=not ctx.cuda, seed=0, bf16=True, gradient_checkpointing=False,
                      model_init_kwargs={"dtype": "bfloat16" if peft else "float32"})
    trainer = GRPOTrainer(model=path, reward_funcs=reward, args=args, processing_class=ctx.tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
                          peft_config=None if peft is None else LoraConfig(**peft), callbacks=[Clock()])
    gen_times: list[float] = []
    sample = trainer._generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = sample(*a, **kw)
        ctx.sync()
        gen_times.append(time.perf_counter() - t0)
        return out

    trainer._generate = timed_generate
    trainer.train()
    del trainer
    ctx.free()
    return records


def throughput_vs_trl(ctx: Ctx, arch: str) -> dict:
    """gtpo's trainer and TRL's ``GRPOTrainer`` side by side on one random-weight model of ``arch``: bf16 LoRA
    and full fine-tuning, the same batch shape (1 prompt x G completions of exactly T tokens): rollout tokens/s,
    update time, step time, peak allocated and reserved memory, and the ratios ours/TRL (the last step of each
    after a warm-up step)."""
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as err:
        return skipped(f"{type(err).__name__}: {err}")
    T = 8 if ctx.quick else 128
    steps = 2 if ctx.quick else 3
    model = build_model(ctx, ctx.arch(arch), dtype=torch.float32, length=T, device="cpu")
    path = save_model(ctx, model, f"throughput-{arch}")
    del model
    out = {"arch": arch, "T": T, "G": ctx.G, "steps_each": steps}
    for mode, peft in (("lora", LORA), ("full", None)):
        sides = {}
        for side, fn in (("ours", _ours_steps), ("trl", _trl_steps)):
            recs = fn(ctx, path, peft=peft, T=T, steps=steps, out_dir=os.path.join(ctx.work, f"tp-{arch}-{mode}-{side}"))
            last = recs[-1]
            sides[side] = {"steps": recs, "step_s": last["step_s"], "update_s": last["update_s"],
                           "rollout_tok_s": ctx.G * T / max(last["generation_s"], 1e-9),
                           "update_tok_s": ctx.G * T / max(last["update_s"], 1e-9),
                           "peak_allocated_gib": last["peak_allocated_gib"],
                           "peak_reserved_gib": last["peak_reserved_gib"]}
        o, t = sides["ours"], sides["trl"]
        ratios = {"step_s": o["step_s"] / t["step_s"], "rollout_tok_s": o["rollout_tok_s"] / t["rollout_tok_s"],
                  "update_s": o["update_s"] / t["update_s"]}
        if ctx.cuda:
            ratios.update(peak_allocated=o["peak_allocated_gib"] / t["peak_allocated_gib"],
                          peak_reserved=o["peak_reserved_gib"] / t["peak_reserved_gib"])
        out[mode] = {**sides, "ours_over_trl": ratios}
    return out


def _fixed_batch(ctx: Ctx, trainer, G: int = 4, P: int = 2):
    """A fixed rollout (2 prompts x 4 completions sharing a prefix) and its advantages for ``trainer``."""
    from gtpo.maths.advantages import group_advantages
    from gtpo.sampling.padding import completion_mask_from_ids, left_pad
    from gtpo.sampling.rollout import Rollout

    eos = ctx.tokenizer.eos_token_id
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, 500, (3,), generator=g).tolist()
    C = [shared + torch.randint(3, 500, (int(n),), generator=g).tolist() + [eos] for n in (4, 7, 2, 9, 5, 3, 8, 6)]
    R = torch.tensor([2.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 3.0])
    prompts, p_mask = left_pad([[30, 31, 32, 33] if i < G else [40, 41] for i in range(P * G)], eos)
    T = max(len(c) for c in C)
    comp = torch.tensor([c + [eos] * (T - len(c)) for c in C])
    c_mask, truncated = completion_mask_from_ids(comp, [eos])
    rollout = Rollout(prompts, p_mask, comp, c_mask, truncated, [""] * len(C))
    return rollout, group_advantages(R, G, scale=trainer.args.resolved_scale_rewards)


def _gradient(ctx: Ctx, path: str, dtype: str, name: str) -> dict:
    """Every parameter's gradient of one update on :func:`_fixed_batch` in the run dtype ``dtype``."""
    from gtpo import GTPOConfig, GTPOTrainer

    trainer = GTPOTrainer(path, reward, [{"prompt": "p0"}, {"prompt": "p1"}], processing_class=ctx.tokenizer,
                          args=GTPOConfig(output_dir=os.path.join(ctx.work, name), group_size=4, prompts_per_step=2,
                                          micro_batch_size=8, max_grad_norm=0.0, entropy_threshold=100.0,
                                          learning_rate=1e-6, disable_tqdm=True, log_completions_steps=0,
                                          save_steps=0, seed=0, dtype=dtype))
    rollout, adv = _fixed_batch(ctx, trainer)
    grads = {}
    trainer.optimizer.step = lambda *a, **k: grads.update(
        {n: p.grad.detach().float().cpu().clone() for n, p in trainer.unwrapped_model.named_parameters()
         if p.grad is not None})
    trainer.update(rollout, adv, trainer.gtpo_inputs(rollout, adv))
    del trainer
    ctx.free()
    return grads


def _fixed_batch_learning(ctx: Ctx, path: str, dtype: str, updates: int = 10) -> list[float]:
    """The mean per-token log-prob of :func:`_fixed_batch`'s positively rewarded completions minus that of the
    negatively rewarded ones (float32 forward of the trainable weights), before and after each of ``updates``
    updates on that batch in the run dtype ``dtype`` (lr 1e-4, constant)."""
    from gtpo import GTPOConfig, GTPOTrainer

    trainer = GTPOTrainer(path, reward, [{"prompt": "p0"}, {"prompt": "p1"}], processing_class=ctx.tokenizer,
                          args=GTPOConfig(output_dir=os.path.join(ctx.work, f"fixed-{dtype}"), group_size=4,
                                          prompts_per_step=2, micro_batch_size=8, entropy_threshold=100.0,
                                          learning_rate=1e-4, lr_scheduler_type="constant", disable_tqdm=True,
                                          log_completions_steps=0, save_steps=0, seed=0, dtype=dtype))
    rollout, adv = _fixed_batch(ctx, trainer)
    model = trainer.unwrapped_model
    device = next(model.parameters()).device
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1).to(device)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1).to(device)
    S, cm = rollout.prompt_ids.shape[1], rollout.completion_mask.to(device).float()

    def margin() -> float:
        was = model.training
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits[:, S - 1:-1].float()
        model.train(was)
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, S:, None])[..., 0]
        per_row = (logp * cm).sum(1) / cm.sum(1)
        a = adv.to(device)
        return float(per_row[a > 0].mean() - per_row[a < 0].mean())

    margins = [margin()]
    for _ in range(updates):
        trainer.update(rollout, adv, trainer.gtpo_inputs(rollout, adv))
        margins.append(margin())
    del trainer, model
    ctx.free()
    return margins


def bf16_learning(ctx: Ctx) -> dict:
    """Does a bf16 run learn? (1) after one step at lr 1e-6 of full fine-tuning in ``dtype: bfloat16`` the share
    of weights that moved (float32 master weights: all with a gradient) and the share whose bf16 value (what the
    forward computes with) changed; (2a) ten updates on one fixed batch in bf16 and in float32: the log-prob
    margin of the positively over the negatively rewarded completions grows in both, bf16's gain at least half of
    float32's; (2b) the reward of 15 sampled steps of bf16 full fine-tuning on a token reward (the share of even
    token ids), with its slope and p-value (reported, not asserted); (3) the cosine between
    the gradient of one update in bf16 and in float32 on the same fixed batch."""
    from gtpo import GTPOConfig, GTPOTrainer

    arch = ctx.arch("qwen2.5-0.5b", **({} if ctx.quick else {"num_hidden_layers": 4}))
    model = build_model(ctx, arch, dtype=torch.float32, length=16 if not ctx.quick else 8, device="cpu")
    path = save_model(ctx, model, "bf16-learning")
    del model
    # (1) lr 1e-6, full fine-tuning, bf16
    trainer = _trainer(ctx, path, out_dir=os.path.join(ctx.work, "bf16-move"), T=8, dtype="bfloat16")
    params = {n: p for n, p in trainer.unwrapped_model.named_parameters() if p.requires_grad}
    before = {n: p.detach().float().clone() for n, p in params.items()}
    trainer.step()
    total = sum(p.numel() for p in params.values())
    moved = sum(int((p.detach().float() != before[n]).sum()) for n, p in params.items())
    moved_bf16 = sum(int((p.detach().to(torch.bfloat16) != before[n].to(torch.bfloat16)).sum())
                     for n, p in params.items())
    master = sorted({str(p.dtype).removeprefix("torch.") for p in params.values()})
    del trainer, params, before
    ctx.free()

    # (2a) learning on a fixed batch: 10 updates, bf16 against float32, the log-prob margin of the positively
    # rewarded completions over the negatively rewarded ones must grow in both
    fixed = {dtype: _fixed_batch_learning(ctx, path, dtype) for dtype in ("float32", "bfloat16")}
    gain32 = fixed["float32"][-1] - fixed["float32"][0]
    gain16 = fixed["bfloat16"][-1] - fixed["bfloat16"][0]

    # (2b) 15 sampled steps of bf16 full fine-tuning on a token reward (the share of completion tokens with an even
    # id): reported with its least-squares slope and p-value, not asserted (a random-weight model's reward moves
    # slowly and noisily)
    def even_share(completions, completion_ids, **kwargs):
        return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]

    args = GTPOConfig(output_dir=os.path.join(ctx.work, "bf16-reward"), group_size=16, prompts_per_step=3,
                      max_steps=15, max_completion_length=16 if not ctx.quick else 8, max_prompt_length=64,
                      learning_rate=5e-5 if not ctx.quick else 1e-3, lr_scheduler_type="constant", save_steps=0,
                      log_completions_steps=0, disable_tqdm=True, seed=0, entropy_threshold=100.0, dtype="bfloat16")
    trainer = GTPOTrainer(path, even_share, [{"prompt": p} for p in PROMPTS], args=args,
                          processing_class=ctx.tokenizer)
    rewards = [float(_metric(trainer.step(), "reward")) for _ in range(15)]
    del trainer
    ctx.free()
    try:  # scipy is not on every GPU machine: the slope without it, the p-value with it
        from scipy.stats import linregress

        fit = linregress(range(len(rewards)), rewards)
        slope, slope_p = float(fit.slope), float(fit.pvalue)
    except ImportError:
        x = torch.arange(len(rewards), dtype=torch.float64)
        y = torch.tensor(rewards, dtype=torch.float64)
        slope, slope_p = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()), None

    # (3) gradient cosine, bf16 against float32, the same fixed batch
    g32, g16 = _gradient(ctx, path, "float32", "grad-fp32"), _gradient(ctx, path, "bfloat16", "grad-bf16")
    names = sorted(set(g32) & set(g16))
    # in float64: torch's float32 cosine_similarity printed 1.028 on the H200 run of 2026-12-04, impossible for a
    # cosine (its float32 reductions over ~10^8 entries; on a CPU 6e7 entries whose float64 cosine is 0.99995 give 1.0027)
    a = torch.cat([g32[n].flatten() for n in names]).double()
    b = torch.cat([g16[n].flatten() for n in names]).double()
    cosine = float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))
    out = {"lr": 1e-6, "master_dtype": master, "moved_share": moved / total, "moved_share_in_bf16": moved_bf16 / total,
           "fixed_batch_margin": fixed, "margin_gain_fp32": gain32, "margin_gain_bf16": gain16,
           "token_reward": rewards, "token_reward_slope": slope, "token_reward_slope_p": slope_p,
           "grad_cosine_bf16_fp32": cosine, "same_params": set(g32) == set(g16),
           "ok": moved / total > 0.5 and gain32 > 0 and gain16 > 0.5 * gain32 and cosine > 0.99
           and set(g32) == set(g16)}
    return out


def check_resume(ctx: Ctx) -> dict:
    """Step 2 after resuming from the step-1 checkpoint equals the uninterrupted step 2: the loss and every
    weight (float32, gtpo's trainer; the same kernels in the same order on one machine)."""
    from gtpo import GTPOConfig, GTPOTrainer
    from safetensors.torch import load_file

    model = build_model(ctx, ctx.arch("qwen2.5-0.5b", num_hidden_layers=2), dtype=torch.float32, length=8,
                        device="cpu")
    path = save_model(ctx, model, "resume")
    del model

    def run(name: str, steps: int, resume=None):
        out_dir = os.path.join(ctx.work, name)
        args = GTPOConfig(output_dir=out_dir, group_size=ctx.G, prompts_per_step=1, max_steps=steps,
                          max_completion_length=8, max_prompt_length=64, learning_rate=1e-5, save_steps=1,
                          lr_scheduler_type="constant",  # the 1-step run's schedule is the 2-step run's
                          log_completions_steps=0, disable_tqdm=True, seed=0, entropy_threshold=100.0,
                          report_to="none")
        GTPOTrainer(path, reward, [{"prompt": p} for p in PROMPTS], args=args,
                    processing_class=ctx.tokenizer).train(resume_from_checkpoint=resume)
        ctx.free()
        with open(os.path.join(out_dir, "metrics.jsonl")) as fh:
            losses = {r["step"]: r["loss"] for r in map(json.loads, fh) if "loss" in r}
        weights = load_file(os.path.join(out_dir, "model.safetensors"))
        return losses, weights

    whole, w_whole = run("resume-whole", 2)
    run("resume-first", 1)
    resumed, w_resumed = run("resume-second", 2, os.path.join(ctx.work, "resume-first", "checkpoint-1"))
    diff = max(float((w_whole[k].float() - w_resumed[k].float()).abs().max()) for k in w_whole)
    differing = sum(int((w_whole[k] != w_resumed[k]).sum()) for k in w_whole) / sum(v.numel() for v in w_whole.values())
    l_whole, l_resumed = whole.get(2), resumed.get(2)
    same = set(w_whole) == set(w_resumed) and l_whole is not None and l_resumed is not None
    if ctx.cuda:  # CUDA's embedding backward accumulates with atomics: bitwise only under deterministic algorithms
        same = same and abs(l_whole - l_resumed) <= 1e-5 * max(1.0, abs(l_whole)) and differing < 0.01 and diff <= 2e-5
    else:
        same = same and l_whole == l_resumed and diff == 0.0
    return {"loss_step2_whole": l_whole, "loss_step2_resumed": l_resumed, "max_weight_diff": diff,
            "share_of_weights_differing": differing, "rule": "bitwise" if not ctx.cuda else "tolerance (CUDA atomics)",
            "ok": bool(same)}


# ----------------------------------------------------------------------------- (e) FSDP and DeepSpeed (issue 43)
SHARDED_CONFIGS = ("fsdp2.yaml", "zero2.yaml", "zero3.yaml")  # as TRL ships them (trl/accelerate_configs/)


def _sharded_run(ctx: Ctx, model_path: str, name: str, *, config: str | None, resume: str | None = None,
                 max_steps: int = 2, deepspeed_cpu: bool = False) -> tuple[int, str, dict]:
    """``gtpo train`` on TRL's engine (``engine: trl``), two steps of GTPO with a checkpoint each step, under
    ``accelerate launch --config_file config --num_processes 1`` (one process is enough to exercise the wrapping and
    the sharded state dicts) or plainly (``config`` None); (exit status, stderr, {step: loss})."""
    import subprocess

    import yaml

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = os.path.join(ctx.work, "sharded-train.jsonl")
    with open(data, "w") as fh:
        fh.writelines(json.dumps({"question": p, "answer": "1"}) + "\n" for p in PROMPTS * 2)
    out = os.path.join(ctx.work, f"sharded-{name}")
    spec = {"model": model_path, "engine": "trl", "dataset": {"name": data, "template": "plain"},
            "reward_funcs": [f"{os.path.abspath(__file__)}:reward"], "output_dir": out, "group_size": 4,
            "prompts_per_step": 2, "max_steps": max_steps, "max_completion_length": 8, "save_steps": 1,
            "log_completions_steps": 0, "disable_tqdm": True, "learning_rate": 1e-5, "lr_scheduler_type": "constant",
            "seed": 0, "entropy_threshold": 100.0, "dtype": "bfloat16" if ctx.cuda else "float32"}
    if deepspeed_cpu:  # DeepSpeed's CPU accelerator: TRL's use_cpu false (gtpo sets it true without GPUs)
        spec["use_cpu"] = False
    cfg = os.path.join(ctx.work, f"sharded-{name}.yaml")
    with open(cfg, "w") as fh:
        yaml.safe_dump(spec, fh)
    command = [sys.executable, "-m", "gtpo.cli", "train", cfg]
    if resume is not None:
        command += ["--resume_from_checkpoint", resume]
    if config is not None:
        accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
        launcher = [accelerate] if os.path.exists(accelerate) else [sys.executable, "-m", "accelerate.commands.launch"]
        command = launcher + (["launch"] if launcher[0] == accelerate else []) + [
            "--config_file", config, "--num_processes", "1", "--num_machines", "1", "--main_process_port", "0"] + (
            [] if ctx.cuda else ["--mixed_precision", "no"]) + [  # on CPU the float32 run (TRL's configs say bf16)
            "-m", "gtpo.cli", "train", cfg] + command[5:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in [os.path.join(root, "src"), os.environ.get("PYTHONPATH")] if p)}
    if deepspeed_cpu:
        env["DS_ACCELERATOR"] = "cpu"
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=600)
    losses = {}
    if os.path.exists(os.path.join(out, "metrics.jsonl")):
        with open(os.path.join(out, "metrics.jsonl")) as fh:
            losses = {r["step"]: r["loss"] for r in map(json.loads, fh) if "loss" in r and "step" in r}
    return proc.returncode, proc.stderr, losses


def check_sharded(ctx: Ctx) -> dict:
    """TRL's engine under TRL's shipped ``fsdp2.yaml``, ``zero2.yaml`` and ``zero3.yaml`` (one process): two steps
    of GTPO with a checkpoint each, then a resume from ``checkpoint-1`` into a new directory; each step's loss
    against the plain run's (bf16 on the GPU: within 2 % of the loss scale, bf16's rounding of the same batch in
    another layout), and the resumed step 2 against the uninterrupted one. On a CPU, ZeRO-2/3 run on DeepSpeed's CPU
    accelerator (``DS_ACCELERATOR=cpu``, TRL's ``use_cpu: false``; float32, within 1e-4 of the loss scale) where
    deepspeed is installed; FSDP does not shard on CPU processes: gtpo refuses it before the model loads, which this
    part checks there."""
    import importlib.util

    try:
        import trl
    except ImportError as err:
        return skipped(f"{type(err).__name__}: {err}")
    model = build_model(ctx, ctx.arch("qwen2.5-0.5b", **({} if ctx.quick else {"num_hidden_layers": 4})),
                        dtype=torch.float32, length=8, device="cpu")
    path = save_model(ctx, model, "sharded-model")
    del model
    code, err, plain = _sharded_run(ctx, path, "plain", config=None)
    if code != 0:
        return {"plain": {"error": err[-2000:]}, "ok": False}
    out, ok = {"plain_losses": plain}, True
    shipped = os.path.join(os.path.dirname(trl.__file__), "accelerate_configs")
    for name in SHARDED_CONFIGS:
        config = os.path.join(shipped, name)
        key = name.removesuffix(".yaml")
        if key.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
            out[key] = skipped("deepspeed is not installed")
            continue
        ds_cpu = not ctx.cuda and key.startswith("zero")  # DeepSpeed runs ZeRO on CPU with its CPU accelerator
        code, err, losses = _sharded_run(ctx, path, key, config=config, deepspeed_cpu=ds_cpu)
        if not ctx.cuda and not ds_cpu:
            asked = "FSDP" if key.startswith("fsdp") else "DEEPSPEED"
            refused = code != 0 and not losses and any("gtpo train: error:" in line and asked in line.upper()
                                                       for line in err.splitlines())
            out[key] = {"status": "refused on CPU (accelerate shards only on accelerators)", "refused": refused,
                        "message": next((line for line in err.splitlines() if "gtpo train: error:" in line), "")[:400]}
            ok &= refused
            continue
        if code != 0:
            out[key] = {"error": err[-2000:], "ok": False}
            ok = False
            continue
        code_r, err_r, resumed = _sharded_run(ctx, path, key + "-resumed", config=config, deepspeed_cpu=ds_cpu,
                                              resume=os.path.join(ctx.work, f"sharded-{key}", "checkpoint-1"))
        scale = max(1.0, max(abs(v) for v in plain.values()))
        tol = (0.02 if ctx.cuda else 1e-4) * scale  # bf16 in another layout on the GPU; float32 on CPU
        diffs = {step: abs(losses[step] - plain[step]) for step in plain if step in losses}
        res = {"losses": losses, "max_loss_diff_vs_plain": max(diffs.values()) if diffs else None,
               "resumed_exit": code_r, "resumed_losses": resumed,
               "resume_step2_diff": abs(resumed[2] - losses[2]) if 2 in resumed and 2 in losses else None}
        res["ok"] = (len(diffs) == len(plain) and max(diffs.values()) <= tol and code_r == 0
                     and res["resume_step2_diff"] is not None and res["resume_step2_diff"] <= tol)
        if ds_cpu:
            res["where"] = "CPU, DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu, use_cpu: false)"
        if code_r != 0:
            res["resume_error"] = err_r[-2000:]
        out[key] = res
        ok &= res["ok"]
    out["ok"] = bool(ok)
    return out


# ----------------------------------------------------------------------------- main
def write_result(result: dict) -> str:
    """``result`` as one JSON line, written to ``$OUT/gpu_check.json`` when ``OUT`` names a directory."""
    line = json.dumps(result, default=str)
    out = os.environ.get("OUT")
    if out and os.path.isdir(out):
        with open(os.path.join(out, "gpu_check.json"), "w") as fh:
            fh.write(line + "\n")
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU (the smoke run of this script)")
    parser.add_argument("--quick", action="store_true", help="tiny models of the same architectures, 1 step each")
    parser.add_argument("--length", type=int, default=512, help="completion tokens of the steps (T)")
    parser.add_argument("--long-length", type=int, default=1500, help="T of the peak-memory step")
    parser.add_argument("--only", default=None, help="comma-separated parts to run (environment, head, trl, resume, "
                        "sampling_sync, decode_compile, reward_model, bf16_learning, throughput, qlora_grad, decode, "
                        "shared_prefix, sharded, steps, long)")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="seconds the whole check may take: a part whose estimate (on one H200) no longer fits "
                             "is skipped with the reason 'budget' (default 450: one device call of ~8 minutes)")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine (scripts/gpu-check.sh) or with --cpu --quick")
        return 2
    if args.cpu:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    ctx = Ctx(args)
    only = None if args.only is None else set(args.only.split(","))
    started = time.perf_counter()
    where = torch.cuda.get_device_name(0) if ctx.cuda else "CPU"
    import transformers

    result = {"date": time.strftime("%Y-%m-%d"), "device": where, "torch": torch.__version__,
              "cuda": torch.version.cuda, "transformers": transformers.__version__, "quick": ctx.quick,
              "T": ctx.T, "G": ctx.G, "correctness": {}, "steps": {}, "throughput": {}, "trl_vs_ours": {}, "failures": {},
              "parts": {}}
    print(f"gpu_check on {where}: torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
          f"{transformers.__version__}; {'toy sizes' if ctx.quick else 'Qwen2.5-3B / Llama-3.1-8B architectures'}",
          flush=True)

    steps = 1 if ctx.quick else 2
    # ordered by value: what a user needs to know first; (estimated GPU seconds) for the budget
    plan = [  # (part, group of --only, function, where its result goes, estimated seconds on the GPU)
        ("environment", "environment", lambda: check_environment(ctx), result, 5),
        ("head", "head", lambda: check_head(ctx), result["correctness"], 5),
        ("trl_vs_ours", "trl", lambda: trl_vs_ours(ctx), result, 30),
        ("resume", "resume", lambda: check_resume(ctx), result["correctness"], 30),
        ("sampling_sync", "sampling_sync", lambda: check_sampling_sync(ctx), result["correctness"], 20),
        ("decode_compile", "decode_compile", lambda: check_decode_compile(ctx), result["correctness"], 120),
        ("reward_model", "reward_model", lambda: check_reward_model(ctx), result["correctness"], 15),
        ("bf16_learning", "bf16_learning", lambda: bf16_learning(ctx), result["correctness"], 60),
        ("throughput qwen2.5-0.5b", "throughput", lambda: throughput_vs_trl(ctx, "qwen2.5-0.5b"), result["throughput"],
         60),
        ("throughput qwen2.5-1.5b", "throughput", lambda: throughput_vs_trl(ctx, "qwen2.5-1.5b"), result["throughput"],
         80),
        ("qlora_grad", "qlora_grad", lambda: check_qlora_grad(ctx), result["correctness"], 40),
        ("decode", "decode", lambda: check_decode(ctx), result["correctness"], 15),
        ("shared_prefix", "shared_prefix", lambda: check_shared_prefix(ctx), result["correctness"], 15),
        ("sharded", "sharded", lambda: check_sharded(ctx), result["correctness"], 120),
        ("bf16 LoRA", "steps", lambda: run_steps(ctx, "bf16 LoRA", arch="qwen2.5-3b", peft=LORA, quantized=False,
                                                 steps=steps, T=ctx.T), result["steps"], 100),
        ("full fine-tuning", "steps", lambda: run_steps(ctx, "full fine-tuning", arch="qwen2.5-3b", peft=None,
                                                        quantized=False, steps=steps, T=ctx.T), result["steps"], 45),
        ("QLoRA", "steps", lambda: run_steps(ctx, "QLoRA", arch="llama3.1-8b", peft=LORA, quantized=True, steps=steps,
                                             T=ctx.T, optim="paged_adamw_8bit"), result["steps"], 155),
        ("full fine-tuning T long", "long", lambda: run_steps(ctx, "full fine-tuning T long", arch="qwen2.5-3b",
                                                              peft=None, quantized=False, steps=1, T=ctx.T_long),
         result["steps"], 170),
    ]
    for key, group, fn, bucket, estimate in plan:
        if only is not None and group not in only:
            continue
        t0 = time.perf_counter()
        error = None
        used = t0 - started
        if used + (estimate if not ctx.quick else 0) > args.budget_s:
            bucket[key] = skipped(f"budget: {used:.0f} s of --budget-s {args.budget_s:.0f} used, this part needs "
                                  f"about {estimate} s on one H200")
            result["parts"][key] = part_status(bucket[key], None)
            print(f"[{used:6.1f} s] {key}: skipped (budget)", flush=True)
            write_result(result)
            continue
        try:
            bucket[key] = fn()
        except Exception as err:  # noqa: BLE001 -- recorded; the other parts still run
            result["failures"][key] = error = f"{type(err).__name__}: {err}"
            traceback.print_exc()
            ctx.free()
        result["parts"][key] = part_status(bucket.get(key), error)
        print(f"[{time.perf_counter() - started:6.1f} s] {key} ({time.perf_counter() - t0:.1f} s): "
              f"{json.dumps(bucket.get(key), default=str)[:800]}", flush=True)
        result["wall_s"] = time.perf_counter() - started
        write_result(result)  # after every part: a run stopped at its time limit keeps what it measured
    result["correctness"]["dtypes"] = dtype_contract(result["steps"])
    result["parts"]["dtypes"] = part_status(result["correctness"]["dtypes"], None)
    result["wall_s"] = time.perf_counter() - started
    ran = {k: v for k, v in result["parts"].items() if v["status"] != "skipped"}
    result["ok"] = all(v["status"] == "passed" for v in ran.values())  # every part that ran passed

    rows = [(k, v) for k, v in result["steps"].items() if "steps" in v]
    print(f"\n{'variant':26} {'params B':>8} {'T':>5} {'sampled tok/s':>13} {'update s':>9} {'peak GiB':>9}")
    for name, v in rows:
        peak = "-" if v["peak_gib"] is None else f"{v['peak_gib']:.1f}"
        print(f"{name:26} {v['params_b']:8.2f} {v['T']:5d} {v['tokens_per_s']:13.0f} {v['update_s']:9.2f} {peak:>9}")
    print("parts:", ", ".join(f"{k} {v['status'].upper() if v['status'] == 'failed' else v['status']}"
                              + (f" ({v['reason']})" if v["status"] == "skipped" else "")
                              for k, v in result["parts"].items()))
    tp = [(k, mode, v[mode]) for k, v in result["throughput"].items() for mode in ("lora", "full") if mode in v]
    if tp:
        print(f"\n{'throughput vs TRL':26} {'mode':5} {'step s ours/TRL':>15} {'rollout tok/s ours/TRL':>22} "
              f"{'update s ours/TRL':>17} {'peak alloc ours/TRL':>19}")
        for k, mode, v in tp:
            r = v["ours_over_trl"]
            alloc = f"{r['peak_allocated']:.2f}" if "peak_allocated" in r else "-"
            print(f"{k:26} {mode:5} {r['step_s']:15.2f} {r['rollout_tok_s']:22.2f} {r['update_s']:17.2f} {alloc:>19}")
    if result["failures"]:
        print("failures:", json.dumps(result["failures"]))
    print(f"{len(ran)} of {len(result['parts'])} parts ran; "
          + ("every one passed" if result["ok"] else "NOT every one passed"))
    print(write_result(result))
    shutil.rmtree(ctx.work, ignore_errors=True)  # the saved random models (GBs on the GPU)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
