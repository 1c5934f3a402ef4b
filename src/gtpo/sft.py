"""Supervised fine-tuning: the paper's SFT baseline and a format warm-up before RL.

Small instruct models (SmolLM2-135M-Instruct) almost never write the paper's
``<reasoning>...</reasoning><answer>...</answer>`` tags unprompted (docs/environment.md: 0 of
64 samples), so format rewards give GRPO/GTPO no signal at first. A short SFT run on
prompt -> paper-format targets teaches the format; the resulting model directory is the
starting ``model`` of ``gtpo train``. SFT on the same data is also the baseline the GTPO paper
(Simoni et al., TACL 2026, arXiv 2508.03772) compares RL against.

Training is TRL's ``SFTTrainer`` (TRL 1.16), not a hand-written loop. Rows become TRL
*prompt-completion* examples (:func:`build_sft_dataset`), for which TRL computes the loss on
the completion tokens only (``completion_only_loss``, the default for that format): the prompt
tokens get label ``-100`` during TRL's dataset preparation. Conversational prompts (a list of
chat messages, the ``"paper"`` template of :func:`gtpo.data.load_task`) get a conversational
completion ``[{"role": "assistant", "content": target}]``, so TRL renders both with the
tokenizer's chat template and the trained completion ends with the template's end-of-turn token
(``<|im_end|>`` for ChatML): the model learns to stop.

The module imports ``torch``/``transformers``/``trl`` lazily, inside the functions that need
them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping

from .data.sources import gsm8k_reasoning
from .run.checkpoint import atomic_write, save_model_atomically

__all__ = [
    "GENERIC_REASONING",
    "METRICS_FILE",
    "format_target",
    "reasoning_from_row",
    "build_sft_dataset",
    "SFTArgs",
    "build_sft_trainer",
    "run_sft",
]

#: File (inside ``output_dir``) with TRL's log history, one JSON object per logged step.
METRICS_FILE = "sft_metrics.jsonl"

#: The reasoning line of a target when the row has no worked solution to derive one from.
GENERIC_REASONING = "I work out the answer step by step; the final answer is {answer}."

def format_target(answer: Any, reasoning: str | None = None) -> str:
    """The paper-format completion of one example, the SFT target.

    ``"<reasoning>\\n{reasoning}\\n</reasoning>\\n<answer>\\n{answer}\\n</answer>"``: the layout
    the paper's system prompt asks for (``gtpo.data.SYSTEM_PROMPT``) with each block's content on
    its own lines, as in the format skeleton of ``gtpo.data.FORMAT_SYSTEM_PROMPT``. It earns the
    full format score of ``gtpo.rewards.paper_format_score`` (the answer block ends the text) and
    ``paper_correctness_score`` reads the answer with surrounding whitespace stripped.
    (``gtpo.data.format_paper_completion`` writes ``<answer>{answer}</answer>`` on one line, the
    reference code's layout; both earn the same paper rewards.)

    Args:
        answer: the gold final answer (converted with ``str`` and stripped; must not be empty).
        reasoning: worked reasoning text, e.g. GSM8K's rationale or a MATH solution. GSM8K
            calculator annotations ``<<...>>`` and a trailing ``"#### answer"`` are removed
            (see :func:`reasoning_from_row` for where rows' reasoning comes from). ``None`` or
            blank: the generic line :data:`GENERIC_REASONING`, which still teaches the format.

    Examples (worked by hand):
        ``format_target("7", "3 + 4 = 7")`` ->
        ``"<reasoning>\\n3 + 4 = 7\\n</reasoning>\\n<answer>\\n7\\n</answer>"``;
        ``format_target(72, "48/2 = <<48/2=24>>24 clips.\\n#### 72")`` has reasoning
        ``"48/2 = 24 clips."``.

    Raises:
        ValueError: ``answer`` empty, or ``reasoning`` not a string or None.
    """
    answer_text = "" if answer is None else str(answer).strip()
    if not answer_text:
        raise ValueError(f"answer: expected a non-empty gold answer, got {answer!r}")
    if reasoning is not None and not isinstance(reasoning, str):
        raise ValueError(f"reasoning: expected a string or None, got {type(reasoning).__name__} {reasoning!r}")
    text = gsm8k_reasoning(reasoning) if reasoning is not None else ""
    if not text:
        text = GENERIC_REASONING.format(answer=answer_text)
    return f"<reasoning>\n{text}\n</reasoning>\n<answer>\n{answer_text}\n</answer>"


def _reasoning_from_rg_entry(entry: Mapping[str, Any], answer: str) -> str | None:
    """Reasoning derived from a reasoning-gym entry's ``metadata``, or None.

    * arithmetic tasks (``basic_arithmetic``, ``chain_sum``, ``products``, ... whose metadata
      holds ``expression``): the expression with its result, ``"3 + 4 = 7"``;
    * ``gsm_symbolic`` (metadata ``answer_cot``): its worked rationale.
    """
    metadata = entry.get("metadata") if isinstance(entry, Mapping) else None
    if not isinstance(metadata, Mapping):
        return None
    expression = metadata.get("expression")
    if isinstance(expression, str) and expression.strip():
        return f"{expression.strip()} = {answer}"
    cot = metadata.get("answer_cot")
    if isinstance(cot, str) and cot.strip():
        return cot
    return None


def reasoning_from_row(row: Mapping[str, Any]) -> str | None:
    """The worked reasoning available for one dataset row, or None.

    In order: the row's ``solution`` (GSM8K's rationale, MATH's solution, a local file's
    column) when it is a non-empty string; else, for reasoning-gym rows, what their ``rg_entry``
    (JSON) gives (:func:`_reasoning_from_rg_entry`: ``"expression = result"`` for arithmetic
    tasks, the rationale for ``gsm_symbolic``); else None (:func:`format_target` then writes
    :data:`GENERIC_REASONING`).

    Raises:
        ValueError: ``rg_entry`` is present but not valid JSON.
    """
    solution = row.get("solution")
    if isinstance(solution, str) and solution.strip():
        return solution
    raw = row.get("rg_entry")
    if isinstance(raw, str) and raw.strip():
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"rg_entry: expected a JSON reasoning-gym entry, could not parse it: {err}") from err
        return _reasoning_from_rg_entry(entry, str(row.get("answer", "")).strip())
    if isinstance(raw, Mapping):
        return _reasoning_from_rg_entry(raw, str(row.get("answer", "")).strip())
    return None


def _check_rows(dataset, argument: str) -> None:
    """ValueError unless ``dataset`` is a non-empty ``datasets.Dataset`` with the columns SFT needs."""
    import datasets

    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"{argument}: expected a datasets.Dataset, got {type(dataset).__name__}")
    if len(dataset) == 0:
        raise ValueError(f"{argument}: the dataset is empty; SFT needs at least one row")
    columns = dataset.column_names
    needed = ("prompt", "completion") if "completion" in columns else ("prompt", "answer")
    for column in needed:
        if column not in columns:
            raise ValueError(
                f"{argument}: missing column {column!r}; SFT rows need 'prompt' and 'answer' "
                f"(optionally 'solution' / 'rg_entry'), columns found: {columns}"
            )


def build_sft_dataset(dataset):
    """Turn task rows into TRL prompt-completion examples with paper-format targets.

    Args:
        dataset: a ``datasets.Dataset`` with columns ``prompt`` (a string, or a list of
            ``{"role", "content"}`` chat messages) and ``answer``; optional ``solution`` /
            ``rg_entry`` give the reasoning (:func:`reasoning_from_row`). The rows of
            ``gtpo.data.load_task`` have this shape.

    Returns:
        A ``datasets.Dataset`` with exactly two columns, one row per input row, in order:

        * conversational (``prompt`` is a message list): ``prompt`` = the messages unchanged,
          ``completion`` = ``[{"role": "assistant", "content": target}]``;
        * standard (``prompt`` is a string): ``prompt`` unchanged, ``completion`` = ``target``,
          preceded by ``"\\n"`` when the prompt does not already end in whitespace (so that
          ``"Question: ...\\nAnswer:"`` is followed by the tags on their own line; TRL
          concatenates the two strings and appends the EOS token).

        ``target`` is :func:`format_target` of the row's answer and reasoning. TRL computes the
        loss on the completion only for this format.

    Raises:
        ValueError: not a Dataset, empty, a missing ``prompt``/``answer`` column (named), or a
            row with an empty answer or a prompt that is neither a string nor a message list
            (row index named).
    """
    import datasets

    _check_rows(dataset, "dataset")
    if "answer" not in dataset.column_names:
        raise ValueError(
            f"dataset: missing column 'answer' (it already has 'completion': pass it to run_sft "
            f"as is); columns found: {dataset.column_names}"
        )
    prompts, completions = [], []
    for i, row in enumerate(dataset):
        prompt = row["prompt"]
        try:
            target = format_target(row["answer"], reasoning_from_row(row))
        except ValueError as err:
            raise ValueError(f"dataset row {i}: {err}") from err
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError(f"dataset row {i}: column 'prompt' is an empty string")
            completions.append(target if prompt[-1].isspace() else "\n" + target)
        elif isinstance(prompt, list) and prompt and all(
            isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt
        ):
            prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
            completions.append([{"role": "assistant", "content": target}])
        else:
            raise ValueError(
                f"dataset row {i}: column 'prompt' must be a non-empty string or a list of "
                f"{{'role', 'content'}} messages, got {prompt!r}"
            )
        prompts.append(prompt)
    return datasets.Dataset.from_dict({"prompt": prompts, "completion": completions})


def _check_positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")


def _log_rows(log_history: list[dict]) -> list[dict]:
    """TRL's ``trainer.state.log_history`` as metrics rows: one per logged training step.

    Keeps the entries that have a ``loss`` (the end-of-training summary has ``train_loss``
    instead and is dropped) and puts ``step``, ``loss``, ``learning_rate`` first. Every key is
    kept as TRL logs it (``grad_norm``, ``entropy``, ``mean_token_accuracy``, ``num_tokens``,
    ``epoch``): the names ``gtpo report`` reads (:mod:`gtpo.run.metric_names`).
    """
    rows = []
    for entry in log_history:
        if "loss" not in entry:
            continue
        row = {"step": entry.get("step"), "loss": entry["loss"], "learning_rate": entry.get("learning_rate")}
        row.update({k: v for k, v in entry.items() if k not in ("step", "loss", "learning_rate")})
        rows.append(row)
    return rows


def _json_value(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _sft_field(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class SFTArgs:
    """Settings of a supervised fine-tuning run (:func:`run_sft`); ``gtpo sft --help`` lists them."""

    output_dir: str = _sft_field("runs/sft", "Where the final model, tokenizer, sft_metrics.jsonl and any TRL "
                                             "checkpoints go; created if missing.")
    max_steps: int = _sft_field(100, "Optimiser steps (the data is cycled through as many epochs as needed).")
    learning_rate: float = _sft_field(2e-4, "Peak AdamW learning rate (2e-4 is the usual LoRA value; TRL's default "
                                            "for full fine-tuning is 2e-5).")
    batch_size: int = _sft_field(8, "Examples per device and micro-batch (per_device_train_batch_size).")
    gradient_accumulation_steps: int = _sft_field(1, "Micro-batches per optimiser step.")
    max_length: int | None = _sft_field(512, "Tokens per example (prompt + completion, after the chat template); "
                                             "longer ones are cut at the end. null: no truncation.")
    seed: int = _sft_field(42, "Seed of the data order and of the adapter initialisation.")
    logging_steps: int = _sft_field(1, "Log (and write a sft_metrics.jsonl row) every this many steps.")
    save_steps: int = _sft_field(0, "Save a TRL checkpoint every this many steps (0: none; the final model is "
                                    "always saved).")
    lr_scheduler_type: str = _sft_field("cosine", "A transformers scheduler name (cosine, linear, constant, ...).")
    warmup_ratio: float = _sft_field(0.0, "Fraction of max_steps with a linear warm-up, in [0, 1).")
    report_to: str | list[str] = _sft_field("none", "transformers integrations (none, tensorboard, wandb, ...).")
    bf16: bool = _sft_field(False, "bf16 mixed precision (TRL defaults it to true; off here for CPU runs).")
    gradient_checkpointing: bool = _sft_field(False, "Recompute activations in the backward pass to save memory.")

    def __post_init__(self) -> None:
        if not isinstance(self.output_dir, (str, os.PathLike)) or not str(self.output_dir):
            raise ValueError(f"output_dir: expected a directory path, got {self.output_dir!r}")
        for name in ("max_steps", "batch_size", "gradient_accumulation_steps", "logging_steps"):
            _check_positive_int(name, getattr(self, name))
        _check_positive_int("save_steps", self.save_steps, minimum=0)
        if self.max_length is not None:
            _check_positive_int("max_length", self.max_length)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")
        lr = self.learning_rate
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"learning_rate: expected a positive finite number, got {lr!r}")
        w = self.warmup_ratio
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < 1.0:
            raise ValueError(f"warmup_ratio: expected a number in [0, 1), got {w!r}")
        self.output_dir = str(self.output_dir)

    @classmethod
    def field_help(cls) -> dict[str, str]:
        return {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}


def _sft_args(args: SFTArgs | None, fields: dict[str, Any]) -> SFTArgs:
    if args is not None and fields:
        raise ValueError(f"give either args=SFTArgs(...) or keyword settings, not both (got {sorted(fields)})")
    if args is not None:
        return args
    unknown = sorted(set(fields) - set(SFTArgs.field_help()))
    if unknown:
        raise ValueError(f"unknown SFT setting(s) {unknown}; known: {sorted(SFTArgs.field_help())}")
    return SFTArgs(**fields)


def build_sft_trainer(model, tokenizer, train_dataset, args: SFTArgs | None = None, *, peft_config=None, **fields):
    """The configured TRL ``SFTTrainer`` of :func:`run_sft`, before training.

    Same arguments as :func:`run_sft`. Useful to inspect what TRL will train on: its
    ``train_dataset`` holds the tokenized examples (``input_ids``, ``labels`` with ``-100`` on
    the prompt tokens) and ``data_collator`` pads them into batches.

    Returns:
        ``trl.SFTTrainer`` (``SFTConfig``: ``completion_only_loss=True``, no checkpointing unless
        ``save_steps > 0``, warm-up ``warmup_ratio`` given as ``warmup_steps``).
    """
    from gtpo.run.models import clear_quantization_state, load_model_and_tokenizer

    _check_rows(train_dataset, "train_dataset")
    a = _sft_args(args, fields)
    if not isinstance(model, (str, os.PathLike)) and tokenizer is None:
        raise ValueError("tokenizer: required when model is a model object (None only with a model spec string)")

    if "completion" not in train_dataset.column_names:
        train_dataset = build_sft_dataset(train_dataset)
    if isinstance(model, (str, os.PathLike)):
        loaded_model, loaded_tokenizer = load_model_and_tokenizer(str(model))
        model, tokenizer = loaded_model, (tokenizer if tokenizer is not None else loaded_tokenizer)
    if getattr(model, "hf_quantizer", None) is not None:  # a GGUF-loaded model: train/save as float
        clear_quantization_state(model)

    import torch
    from trl import SFTConfig, SFTTrainer

    os.makedirs(a.output_dir, exist_ok=True)
    config = SFTConfig(
        output_dir=a.output_dir,
        max_steps=a.max_steps,
        learning_rate=float(a.learning_rate),
        per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.gradient_accumulation_steps,
        max_length=a.max_length,
        completion_only_loss=True,
        seed=a.seed,
        logging_steps=a.logging_steps,
        save_strategy="steps" if a.save_steps > 0 else "no",
        save_steps=a.save_steps if a.save_steps > 0 else 500,
        lr_scheduler_type=a.lr_scheduler_type,
        warmup_steps=float(a.warmup_ratio),
        report_to=a.report_to,
        bf16=a.bf16,
        activation_checkpointing=a.gradient_checkpointing,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    return SFTTrainer(
        model=model,
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )


def run_sft(model, tokenizer, train_dataset, args: SFTArgs | None = None, *, peft_config=None, **fields) -> str:
    """Supervised fine-tuning with TRL's ``SFTTrainer``; saves a plain HF model directory.

    Args:
        model: a ``transformers`` causal LM (trained in place; with ``peft_config`` its modules
            get LoRA layers, which are merged back at the end), or a model spec string for
            ``gtpo.run.models.load_model_and_tokenizer`` (hub id, local dir, ``.gguf`` file,
            ``"smollm2-135m-instruct"``). A GGUF-loaded model's quantization state is cleared
            (``gtpo.run.models.clear_quantization_state``) so that it trains and saves as a float model.
        tokenizer: its tokenizer (``None`` only when ``model`` is a spec string). Prompts that are
            message lists are rendered with its chat template.
        train_dataset: ``datasets.Dataset``; either task rows (``prompt`` + ``answer``, optional
            ``solution``/``rg_entry``: converted by :func:`build_sft_dataset`) or rows that
            already have TRL's ``prompt`` + ``completion`` columns (used as they are).
        args: the settings, an :class:`SFTArgs` (each field documented there: ``output_dir``,
            ``max_steps``, ``learning_rate``, ``batch_size``, ``max_length``, ...), or give its
            fields as keyword arguments (``run_sft(model, tok, rows, output_dir="out", max_steps=50)``).
        peft_config: a ``peft.PeftConfig`` (e.g. ``LoraConfig``) passed to ``SFTTrainer``, or
            None for full fine-tuning. A LoRA adapter is merged into the base weights
            (``merge_and_unload``) before saving.

    Returns:
        ``output_dir``, which then holds a normal Hugging Face model directory (``config.json``,
        weights, tokenizer files, no adapter files) that ``AutoModelForCausalLM.from_pretrained``
        and ``gtpo train`` load, and ``sft_metrics.jsonl``: one JSON object per logged step with
        keys ``step``, ``loss`` (mean completion-token NLL), ``lr``, ``grad_norm``, ``entropy``,
        ``mean_token_accuracy``, ``num_tokens``, ``epoch`` (TRL's log history; see
        :func:`_log_rows`).

    Raises:
        ValueError: an empty dataset, a missing ``prompt``/``answer`` column, a bad argument
            (named), or ``tokenizer`` None with a model object.
    """
    trainer = build_sft_trainer(model, tokenizer, train_dataset, args, peft_config=peft_config, **fields)
    trainer.train()

    trained = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(trained, "merge_and_unload"):  # a peft model: fold the adapter into the base weights
        trained = trained.merge_and_unload()
    output_dir = trainer.args.output_dir
    save_model_atomically(trained, trainer.processing_class, output_dir)
    lines = "".join(json.dumps(row, default=_json_value) + "\n" for row in _log_rows(trainer.state.log_history))
    atomic_write(os.path.join(output_dir, METRICS_FILE), lines)
    return output_dir
