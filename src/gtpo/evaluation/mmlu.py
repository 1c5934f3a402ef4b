"""MMLU: accuracy from the log-likelihood of the answer letter, overall and by subject.

The GTPO paper checks with MMLU that RL fine-tuning keeps the model's other knowledge. Each
question is scored 0-shot in the format of Hendrycks et al. 2021 and lm-evaluation-harness
(:func:`mmlu_prompt`): the continuations ``" A"``, ``" B"``, ... are scored after the prompt
(:func:`continuation_logprobs`) and the most likely letter is the prediction; nothing is
generated.

* :func:`evaluate_mmlu` -- the evaluation of loaded rows (``gtpo.data.load_task("mmlu")``);
* :func:`mmlu_metrics` -- accuracy (micro and macro over subjects) and per subject, from the
  stored log-likelihoods (also what :func:`gtpo.evaluation.rescore` recomputes);
* :func:`mmlu_prompt`, :func:`mmlu_stem` -- the prompt, and the bare question of a row;
* :func:`continuation_logprobs` -- batched ``log p(continuation | context)`` for any causal LM.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from gtpo.data import MMLU_LETTERS, mmlu_choice_lines

from .scoring import mean_or_nan

__all__ = [
    "mmlu_prompt",
    "mmlu_stem",
    "continuation_logprobs",
    "mmlu_metrics",
    "evaluate_mmlu",
]

def mmlu_stem(question: str, choices: Sequence[str]) -> str:
    """The bare question in the ``question`` text of an MMLU row that has no ``stem`` column.

    ``gtpo.data.load_task("mmlu")`` keeps the stem as data (``stem``) and writes ``question`` as
    the stem, a blank line, the ``A. ...`` choice lines (``gtpo.data.mmlu_choice_lines``) and an
    instruction (for generation-based use). For rows without ``stem`` (built by hand, or saved
    before that column existed) the stem is the text before the ``"\\n\\nA. <first choice>"``
    block; a question without that block is returned as it is.

    Args:
        question: the row's question text.
        choices: its choices (``(C,)`` strings).

    Returns:
        The stem, stripped.
    """
    if choices:
        marker = "\n\n" + mmlu_choice_lines(choices[:1])[0]
        index = question.rfind(marker)
        if index >= 0:
            return question[:index].strip()
    return question.strip()


def mmlu_prompt(question: str, choices: Sequence[str], subject: str | None = None) -> str:
    """The standard 0-shot MMLU prompt (Hendrycks et al. 2021, their ``evaluate.py``).

    ``"The following are multiple choice questions (with answers) about <subject>.\\n\\n"``
    (when the subject is known; underscores become spaces), then the question, one
    ``"A. <choice>"`` line per choice (``gtpo.data.mmlu_choice_lines``), and ``"Answer:"``.
    The answer is scored as the continuation ``" A"``, ``" B"``, ... (lm-evaluation-harness
    uses the same format).
    """
    header = ""
    if subject:
        header = ("The following are multiple choice questions (with answers) about "
                  f"{subject.replace('_', ' ')}.\n\n")
    lines = [question.strip(), *mmlu_choice_lines(choices), "Answer:"]
    return header + "\n".join(lines)


def _continuation_ids(tokenizer, context_ids: list[int], context: str, continuation: str,
                      add_special_tokens: bool) -> list[int]:
    """Token ids of ``continuation`` as the tokenizer splits it after ``context``.

    Encoding ``context + continuation`` and removing the context's ids keeps merges across the
    boundary right (``" A"`` is usually one token); when the context's ids are not a prefix of
    the joint encoding, the continuation is encoded alone.
    """
    full = tokenizer(context + continuation, add_special_tokens=add_special_tokens)["input_ids"]
    if full[:len(context_ids)] == context_ids and len(full) > len(context_ids):
        return full[len(context_ids):]
    ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"the tokenizer gives no token for the continuation {continuation!r}")
    return ids


def _accepts_logits_to_keep(model) -> bool:
    """Whether the (base) model's ``forward`` takes ``logits_to_keep`` (recent transformers)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def continuation_logprobs(
    model,
    tokenizer,
    contexts: Sequence[str],
    continuations: Sequence[Sequence[str]],
    *,
    add_special_tokens: bool = True,
    batch_size: int = 8,
    progress: bool = False,
) -> list[list[float]]:
    """``log p(continuation | context)`` of every candidate continuation of every context.

    Args:
        model: a causal LM.
        tokenizer: its tokenizer.
        contexts: ``Q`` context strings.
        continuations: ``Q`` lists of candidate continuations (e.g. ``[" A", " B", " C", " D"]``).
        add_special_tokens: add the tokenizer's special tokens (BOS) to the context; False for
            text that went through a chat template.
        batch_size: sequences per forward pass.

    Returns:
        ``Q`` lists of summed log-probabilities (natural log), one per continuation.

    When every continuation of a context is a single token (the usual case for answer
    letters), one forward pass over the context scores all of them; otherwise each
    ``context + continuation`` is a sequence of its own. Sequences are left-padded with
    explicit position ids (``gtpo.sampling.padding.left_pad``, ``gtpo.sampling.padding.position_ids``), and only
    the last positions' logits are computed when the model supports ``logits_to_keep``.
    """
    import torch

    from gtpo.sampling.padding import left_pad, position_ids

    if len(contexts) != len(continuations):
        raise ValueError(f"contexts ({len(contexts)}) and continuations ({len(continuations)}) "
                         "must have the same length")
    # sequences: (ids, [(question, choice, n_inside, tokens)]); the query's tokens are the last
    # n_inside ids of the sequence, or follow it when n_inside == 0 (one token).
    sequences: list[tuple[list[int], list[tuple[int, int, int, list[int]]]]] = []
    for q, (context, conts) in enumerate(zip(contexts, continuations)):
        context_ids = tokenizer(context, add_special_tokens=add_special_tokens)["input_ids"]
        cont_ids = [_continuation_ids(tokenizer, context_ids, context, c, add_special_tokens)
                    for c in conts]
        if all(len(ids) == 1 for ids in cont_ids):
            sequences.append((context_ids, [(q, j, 0, ids) for j, ids in enumerate(cont_ids)]))
        else:
            for j, ids in enumerate(cont_ids):
                sequences.append((context_ids + ids, [(q, j, len(ids), ids)]))
    out: list[list[float]] = [[float("nan")] * len(c) for c in continuations]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    starts = range(0, len(order), max(1, batch_size))
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="scoring", unit="batch", file=sys.stderr)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    keep_supported = _accepts_logits_to_keep(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in starts:
                batch = [sequences[i] for i in order[start:start + max(1, batch_size)]]
                ids, mask = left_pad([seq for seq, _ in batch], pad_id)  # (B, S) each
                positions = position_ids(mask)  # (B, S)
                keep = max(max(qn for _, _, qn, _ in queries) for _, queries in batch) + 1
                kwargs = {"logits_to_keep": keep} if keep_supported else {}
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                               position_ids=positions.to(device), **kwargs).logits
                logp = torch.log_softmax(logits[:, -keep:, :].float(), dim=-1)  # (B, keep, V)
                for b, (_, queries) in enumerate(batch):
                    for q, j, n_inside, tokens in queries:
                        rows = torch.arange(len(tokens), device=logp.device) + keep - n_inside - 1
                        toks = torch.tensor(tokens, dtype=torch.long, device=logp.device)
                        out[q][j] = float(logp[b, rows, toks].sum())
    finally:
        model.train(was_training)
    return out


def mmlu_metrics(problems: Sequence[dict]) -> dict:
    """Accuracy overall (micro), as the mean over subjects (macro), and per subject.

    Args:
        problems: MMLU problem records with ``logprobs`` (one float per choice, None or
            non-finite for a choice that could not be scored), ``gold`` (a letter) and
            ``subject``; each gets ``pred`` (the letter of the highest log-likelihood, the first
            on a tie; None when no choice is finite) and ``correct`` (bool), in place.

    Returns:
        ``{"accuracy", "accuracy_macro", "n_problems", "by_subject": {subject: {"accuracy",
        "n"}}}``, subjects sorted; a missing subject counts as ``"unknown"``.
    """
    by_subject: dict[str, list[float]] = {}
    for p in problems:
        finite = [x for x in p["logprobs"] if x is not None and math.isfinite(x)]
        pred = None
        if finite:
            best = max(finite)
            pred = MMLU_LETTERS[p["logprobs"].index(best)]
        p["pred"] = pred
        p["correct"] = pred is not None and pred == p["gold"]
        by_subject.setdefault(p.get("subject") or "unknown", []).append(float(p["correct"]))
    subjects = {s: {"accuracy": mean_or_nan(v), "n": len(v)} for s, v in sorted(by_subject.items())}
    return {
        "accuracy": mean_or_nan([float(p["correct"]) for p in problems]),
        "accuracy_macro": mean_or_nan([v["accuracy"] for v in subjects.values()]),
        "n_problems": len(problems),
        "by_subject": subjects,
    }


def evaluate_mmlu(
    model,
    tokenizer,
    dataset: Any,
    *,
    batch_size: int = 8,
    chat_template: bool = False,
    progress: bool = False,
) -> dict:
    """MMLU accuracy from the log-likelihood of the answer letter, overall and by subject.

    For each question the standard 0-shot prompt (:func:`mmlu_prompt`: subject header, question,
    ``A. ...`` lines, ``Answer:``) is scored with each continuation ``" A"``, ``" B"``, ...; the
    prediction is the letter with the highest log-likelihood (the first one on a tie). This is
    the format of Hendrycks et al. 2021 and of lm-evaluation-harness's ``mmlu`` task, so numbers
    are comparable with published 0-shot ones; no text is generated.

    Chat template: off by default (``chat_template=False``), as in lm-evaluation-harness's
    default and the published MMLU numbers of instruct models, and because log-likelihood
    scoring does not need the model to follow a conversation. With ``chat_template=True`` the
    prompt is the user message of a chat (the tokenizer's template, generation prompt added)
    and the continuations are the bare letters ``"A"``, ``"B"``, ... opening the reply.

    Args:
        model, tokenizer: a loaded causal LM and its tokenizer.
        dataset: MMLU rows (``gtpo.data.load_task("mmlu")``: ``stem``, ``choices``,
            ``subject``, ``answer`` the gold letter or a choice index, and ``question``, whose
            stem :func:`mmlu_stem` reads when a row has no ``stem``), a ``datasets.Dataset``
            or a list of dicts.
        batch_size: sequences per forward pass.

    Returns:
        ``{"settings", "metrics": {"accuracy", "accuracy_macro", "n_problems", "by_subject":
        {subject: {"accuracy", "n"}}}, "problems": [{index, subject, question, choices, gold,
        logprobs, pred, correct}]}``.
    """
    from gtpo.sampling.rollout import prompt_text

    rows = dataset.to_list() if hasattr(dataset, "to_list") else [dict(r) for r in dataset]
    if not rows:
        raise ValueError("dataset: MMLU evaluation needs at least one row")
    contexts, conts, problems = [], [], []
    for i, row in enumerate(rows):
        missing = [c for c in ("question", "choices", "answer") if c not in row]
        if missing:
            raise ValueError(f"MMLU row {i}: missing column(s) {missing}; columns: {sorted(row)}")
        choices = list(row["choices"])
        if not 2 <= len(choices) <= len(MMLU_LETTERS):
            raise ValueError(f"MMLU row {i}: expected 2-{len(MMLU_LETTERS)} choices, "
                             f"got {choices!r}")
        gold = row["answer"]
        if isinstance(gold, int) and not isinstance(gold, bool):
            gold = MMLU_LETTERS[gold]
        gold = str(gold).strip().upper()
        if gold not in MMLU_LETTERS[:len(choices)]:
            raise ValueError(f"MMLU row {i}: answer must be a letter "
                             f"A-{MMLU_LETTERS[len(choices) - 1]} or a choice index, "
                             f"got {row['answer']!r}")
        stem = row.get("stem") or mmlu_stem(str(row["question"]), choices)
        text = mmlu_prompt(stem, choices, row.get("subject"))
        letters = list(MMLU_LETTERS[:len(choices)])
        if chat_template:
            contexts.append(prompt_text(tokenizer, [{"role": "user", "content": text}]))
            conts.append(letters)
        else:
            contexts.append(text)
            conts.append([" " + letter for letter in letters])
        problems.append({"index": i, "subject": row.get("subject"), "question": stem,
                         "choices": choices, "gold": gold})
    logprobs = continuation_logprobs(model, tokenizer, contexts, conts,
                                     add_special_tokens=not chat_template,
                                     batch_size=batch_size, progress=progress)
    for problem, values in zip(problems, logprobs):
        problem["logprobs"] = values
    metrics = mmlu_metrics(problems)
    settings = {"kind": "mmlu", "prompt": "0-shot, Hendrycks et al. 2021 format",
                "scoring": "log-likelihood of the answer letter", "chat_template": chat_template,
                "batch_size": batch_size}
    return {"settings": settings, "metrics": metrics, "problems": problems}
