"""Evaluation: pass@k, maj@k, format rate, completion length, MMLU, and ``gtpo eval``.

The GTPO paper (Simoni et al., TACL 2026, arXiv 2508.03772, Table 1) reports pass@k and maj@k with
k up to 32 in distribution (GSM8K, MATH test) and up to 64 out of distribution (AIME 2024,
AIME 2025, AMC 2023), and MMLU to check that other knowledge is kept. This module measures the
same things so that runs of this project can be compared with the paper and with each other.

Estimators (pure functions, no model needed):

* :func:`pass_at_k` -- the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
  Models Trained on Code", the ``HumanEval`` paper): with ``n`` samples of which ``c`` are correct,
  ``pass@k = 1 - C(n-c, k) / C(n, k)``, the probability that a random subset of ``k`` of the ``n``
  samples holds at least one correct one. Computed with exact integers and one correctly rounded
  division (equal to the product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` of their numpy code),
  so it is stable for any ``n``.
* :func:`maj_at_k` -- majority vote (self-consistency, Wang et al. 2023) over the extracted answers
  of ``k`` samples; the vote is correct when the winning answer class is the gold one.

  - Answer classes: answers are grouped by equivalence (``gtpo.rewards.answers_equivalent``,
    math-verify, so ``0.5``, ``\\frac{1}{2}`` and ``1/2`` are one answer). The samples judged
    correct form the gold class; the others are grouped greedily, each new answer joining the
    first class whose first answer (its representative) is equivalent to it (math-verify's
    equivalence is not guaranteed transitive; the greedy rule makes the grouping deterministic).
  - Unparsable samples (no extractable answer, ``None``): by default (``unparsable="abstain"``)
    they do not vote -- a vote among the samples that did answer -- and a subset in which no sample
    answered scores 0. With ``unparsable="vote"`` they form one extra class that can win the vote
    (and is never correct), so format failures lower maj@k.
  - ``estimator="expected"`` (default): the exact expectation over all ``C(n, k)`` subsets of size
    ``k`` of the ``n`` samples, the same idea as the unbiased pass@k estimator; a tie among ``t``
    classes, the gold one among them, counts ``1/t`` (ties broken uniformly at random, in
    expectation). Computed combinatorially from the class counts (a generating-function dynamic
    programme), never by enumerating subsets.
  - ``estimator="first"``: the vote of the first ``k`` samples only (as in many evaluation
    scripts); a tie is broken in favour of the class whose first sample comes earliest.

  With ``estimator="expected"``, maj@1 equals pass@1.

Other metrics: ``format_rate`` (share of completions with the paper's full
``<reasoning>...</reasoning><answer>...</answer>`` format, ``gtpo.rewards.paper_format_score == 10``),
``mean_length`` (completion tokens through the first EOS), ``truncated_frac`` (no EOS within
``max_new_tokens``), ``unparsable_frac`` (no answer could be extracted; such a sample counts as
wrong, never as an error).

Datasets are loaded by ``gtpo.data.load_task``: ``gsm8k`` (openai/gsm8k, main, test), ``math``
(EleutherAI/hendrycks_math, test), ``math500`` (HuggingFaceH4/MATH-500), ``aime24``
(HuggingFaceH4/aime_2024), ``aime25`` (yentinglin/aime_2025), ``amc23`` (math-ai/amc23), ``mmlu``
(cais/mmlu, all, test), any reasoning-gym task (``rg:<task>``), or a local ``.jsonl`` /
``.json`` / ``.parquet`` / ``.csv`` file with ``question`` (or ``prompt``) and ``answer`` columns
(``gtpo.data.HUB_IDS`` is the authoritative list; ``data_path=`` / ``--data-path`` reads a local
copy of a hub dataset in the hub's format, for machines without hub access). MMLU is scored by
:func:`evaluate_mmlu` from the log-likelihood of the answer letter, not by generation.

Usage::

    gtpo eval --model Qwen/Qwen2.5-3B-Instruct --adapter runs/gtpo/final --dataset aime24 \
        --n 64 --k 1,8,16,32,64 --temperature 1.0 --max-new-tokens 1500 --out aime24.json
    gtpo eval --rescore aime24.json --maj-estimator first     # re-score, no generation

    results = gtpo.evaluate("path/to/model", dataset="gsm8k", n=16, k=[1, 8, 16])
    results["metrics"]["pass@8"], results["metrics"]["maj@16"]

The JSON written by ``--out`` holds every sample (text, extracted answer, verdict, length,
truncation), so :func:`rescore` can recompute all metrics with other settings.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import types
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "pass_at_k",
    "maj_at_k",
    "group_answers",
    "majority_vote_score",
    "default_k_list",
    "score_samples",
    "aggregate_metrics",
    "evaluate",
    "rescore",
    "evaluate_mmlu",
    "mmlu_prompt",
    "mmlu_stem",
    "continuation_logprobs",
    "evaluate_during_training",
    "format_table",
]

PASS_AT_K_ESTIMATOR = (
    "unbiased estimator 1 - C(n-c, k)/C(n, k) (Chen et al. 2021), exact integer arithmetic"
)
MAJ_ESTIMATORS = ("expected", "first")
UNPARSABLE_MODES = ("abstain", "vote")
MAJ_ESTIMATOR_DOC = {
    "expected": "exact expectation over all size-k subsets of the n samples; a tie among t classes "
    "including the gold one counts 1/t",
    "first": "majority vote of the first k samples; a tie goes to the class whose first sample "
    "comes earliest",
}
UNPARSABLE_DOC = {
    "abstain": "samples without an extractable answer do not vote; a subset where none answered "
    "scores 0",
    "vote": "samples without an extractable answer form one class that can win and is never correct",
}


# --------------------------------------------------------------------------------------------
# Estimators (pure)
# --------------------------------------------------------------------------------------------


def _as_count(value: Any, name: str) -> int:
    """``value`` as a non-negative int (numpy ints accepted; floats and bools rejected)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    try:
        out = int(value.__index__())
    except (AttributeError, TypeError):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}") from None
    if out < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {out}")
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021).

    ``pass@k = 1 - C(n-c, k) / C(n, k)``: the probability that a subset of ``k`` samples drawn
    without replacement from the ``n`` holds at least one correct sample. Computed as
    ``(C(n, k) - C(n-c, k)) / C(n, k)`` with Python's exact integers and one correctly rounded
    division: it equals the product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` of Chen et al.'s
    numpy code (tested against it) without its rounding, and cannot overflow or cancel for any
    ``n`` (no float ever holds a binomial coefficient). When ``n - c < k`` every subset holds a
    correct sample and the value is exactly 1.

    Args:
        n: number of samples (>= 1).
        c: number of correct samples, ``0 <= c <= n``.
        k: subset size, ``1 <= k <= n``.

    Returns:
        A float in [0, 1]. Examples: ``pass_at_k(5, 2, 1) == 0.4``, ``pass_at_k(5, 2, 2) == 0.7``.

    Raises:
        ValueError: negative or non-integer arguments, ``n == 0``, ``k == 0``, ``c > n`` or ``k > n``.
    """
    n, c, k = _as_count(n, "n"), _as_count(c, "c"), _as_count(k, "k")
    if n == 0:
        raise ValueError("n (number of samples) must be >= 1, got 0")
    if k == 0:
        raise ValueError("k must be >= 1, got 0")
    if c > n:
        raise ValueError(f"c (correct samples) must be <= n={n}, got c={c}")
    if k > n:
        raise ValueError(f"k must be <= n (the number of samples): got k={k} > n={n}; sample more "
                         f"completions per problem or lower k")
    if n - c < k:
        return 1.0
    # Exact integers, one correctly rounded division: no overflow and no cancellation for any n.
    total = math.comb(n, k)
    return (total - math.comb(n - c, k)) / total


def _check_k(k: Any, n: int, what: str = "k") -> int:
    k = _as_count(k, what)
    if k == 0:
        raise ValueError(f"{what} must be >= 1, got 0")
    if k > n:
        raise ValueError(f"{what} must be <= n (the number of samples): got {what}={k} > n={n}; "
                         f"sample more completions per problem or lower {what}")
    return k


def majority_vote_score(
    class_ids: Sequence[int | None],
    gold_class: int | None,
    k: int,
    *,
    estimator: str = "expected",
    unparsable: str = "abstain",
) -> float:
    """maj@k of one problem from the answer class of each sample.

    Args:
        class_ids: ``(n,)`` the answer class of each sample, in sample order; ``None`` for a
            sample without an extractable answer (see ``unparsable``).
        gold_class: the class id of the correct answer, or ``None`` when no sample is correct
            (then the score is 0).
        k: samples per vote, ``1 <= k <= n``.
        estimator: ``"expected"`` (exact expectation over all size-``k`` subsets, a tie among
            ``t`` classes including the gold one counts ``1/t``) or ``"first"`` (the first ``k``
            samples; a tie goes to the class whose first sample comes earliest).
        unparsable: ``"abstain"`` (``None`` samples do not vote; a vote with no answer scores 0)
            or ``"vote"`` (``None`` samples form one class that can win and is never correct).

    Returns:
        A float in [0, 1].
    """
    if estimator not in MAJ_ESTIMATORS:
        raise ValueError(f"estimator must be one of {MAJ_ESTIMATORS}, got {estimator!r}")
    if unparsable not in UNPARSABLE_MODES:
        raise ValueError(f"unparsable must be one of {UNPARSABLE_MODES}, got {unparsable!r}")
    n = len(class_ids)
    if n == 0:
        raise ValueError("class_ids is empty: maj@k needs at least one sample")
    k = _check_k(k, n)
    # The unparsable class gets a key no real class can have.
    none_key: Any = object()
    ids = [none_key if c is None else c for c in class_ids]
    if gold_class is None or gold_class not in ids:
        return 0.0
    if estimator == "first":
        counts: dict[Any, int] = {}
        for c in ids[:k]:
            if c is none_key and unparsable == "abstain":
                continue
            counts[c] = counts.get(c, 0) + 1
        if not counts:
            return 0.0
        best = max(counts.values())
        # dicts keep insertion order = order of first occurrence: the earliest class wins a tie.
        winner = next(c for c, m in counts.items() if m == best)
        return 1.0 if winner == gold_class else 0.0

    counts = {}
    for c in ids:
        counts[c] = counts.get(c, 0) + 1
    m_gold = counts.pop(gold_class)
    m_abstain = counts.pop(none_key, 0) if unparsable == "abstain" else 0
    others = sorted(counts.values())
    return float(_expected_majority(n, k, m_gold, others, m_abstain))


def _expected_majority(n: int, k: int, m_gold: int, others: list[int], m_abstain: int) -> Fraction:
    """Exact E[score] of a majority vote over a uniformly random k-subset of n samples.

    The samples fall into the gold class (``m_gold``), competing classes (``others``, counts) and
    abstaining samples (``m_abstain``). For each number ``x >= 1`` of gold samples in the subset,
    the subsets in which no competitor has more than ``x`` samples and exactly ``j`` have ``x``
    are counted with the generating function
    ``prod_i (sum_{y<x} C(m_i, y) z^y + C(m_i, x) z^x u) * (1 + z)^{m_abstain}``:
    the coefficient of ``z^(k-x) u^j`` is that number of subsets, and the gold class wins such a
    tie with probability ``1/(j+1)``. Python integers keep every count exact.
    """
    total = Fraction(0)
    for x in range(1, min(m_gold, k) + 1):
        rest = k - x
        # poly[s][j]: ways to choose s samples among the classes processed so far, j of which tie.
        poly: list[dict[int, int]] = [dict() for _ in range(rest + 1)]
        poly[0][0] = 1
        for m in others:
            coeffs = [(y, 0, math.comb(m, y)) for y in range(0, min(x - 1, m) + 1)]
            if m >= x:
                coeffs.append((x, 1, math.comb(m, x)))
            new: list[dict[int, int]] = [dict() for _ in range(rest + 1)]
            for s, row in enumerate(poly):
                if not row:
                    continue
                for y, dj, cm in coeffs:
                    if s + y > rest:
                        break
                    target = new[s + y]
                    for j, v in row.items():
                        target[j + dj] = target.get(j + dj, 0) + cm * v
            poly = new
        if m_abstain:
            new = [dict() for _ in range(rest + 1)]
            for s, row in enumerate(poly):
                for y in range(0, min(m_abstain, rest - s) + 1):
                    cm = math.comb(m_abstain, y)
                    target = new[s + y]
                    for j, v in row.items():
                        target[j] = target.get(j, 0) + cm * v
            poly = new
        ways = sum((Fraction(v, j + 1) for j, v in poly[rest].items()), Fraction(0))
        total += math.comb(m_gold, x) * ways
    return total / math.comb(n, k)


def maj_at_k(
    answers: Sequence[str | None],
    gold: str,
    k: int,
    *,
    estimator: str = "expected",
    unparsable: str = "abstain",
    correct: Sequence[bool] | None = None,
    equivalent: Callable[[str, str], bool] | None = None,
) -> float:
    """maj@k of one problem: is the majority answer of ``k`` samples the gold one?

    Args:
        answers: ``(n,)`` the extracted answer of each sample in sample order; ``None`` (or an
            empty string) when none could be extracted.
        gold: the gold answer.
        k: samples per vote, ``1 <= k <= n``.
        estimator: ``"expected"`` (default; exact expectation over all size-``k`` subsets, a tie
            among ``t`` classes including the gold one counts ``1/t``) or ``"first"`` (the first
            ``k`` samples; a tie goes to the class whose first sample comes earliest).
        unparsable: ``"abstain"`` (default; unparsable samples do not vote) or ``"vote"`` (they
            form one class that can win and is never correct). See the module docstring.
        correct: ``(n,)`` optional per-sample correctness (e.g. from a task's own scorer); the
            samples marked correct form the gold class. Default: ``equivalent(answer, gold)``.
        equivalent: answer equivalence, default ``gtpo.rewards.answers_equivalent``
            (math-verify; ``0.5``, ``\\frac{1}{2}`` and ``1/2`` are one class).

    Returns:
        A float in [0, 1].

    Raises:
        ValueError: ``k`` outside ``[1, n]``, an unknown ``estimator``/``unparsable``, or
            ``correct`` of the wrong length.
    """
    class_ids, gold_class = group_answers(answers, gold, correct=correct, equivalent=equivalent)
    return majority_vote_score(class_ids, gold_class, k, estimator=estimator, unparsable=unparsable)


def group_answers(
    answers: Sequence[str | None],
    gold: str | None,
    *,
    correct: Sequence[bool] | None = None,
    equivalent: Callable[[str, str], bool] | None = None,
) -> tuple[list[int | None], int | None]:
    """Group the answers of one problem's samples into equivalence classes.

    The samples judged correct (``correct``, else ``equivalent(answer, gold)``) form class 0, the
    gold class. Every other answer joins the first existing class whose representative (its
    first answer) is ``equivalent`` to it, else opens a new class; identical strings (after
    whitespace normalisation) share a class without a call to ``equivalent``, and each distinct
    pair is compared at most once. Unparsable answers (``None`` or empty) get ``None``.

    Args:
        answers: ``(n,)`` extracted answers.
        gold: the gold answer (``None``: no sample is correct unless ``correct`` says so).
        correct: ``(n,)`` optional per-sample correctness.
        equivalent: answer equivalence, default ``gtpo.rewards.answers_equivalent``.

    Returns:
        ``(class_ids, gold_class)``: ``class_ids (n,)`` ints (or ``None``), ``gold_class`` 0 when
        some sample is correct, else ``None``.
    """
    if equivalent is None:
        from gtpo.rewards import answers_equivalent as equivalent
    n = len(answers)
    if correct is not None and len(correct) != n:
        raise ValueError(f"correct has {len(correct)} entries but answers has {n}")
    keys = [None if a is None or not str(a).strip() else " ".join(str(a).split()) for a in answers]
    if correct is None:
        verdict: dict[str, bool] = {}
        flags = []
        for key in keys:
            if key is None or gold is None:
                flags.append(False)
                continue
            if key not in verdict:
                verdict[key] = bool(equivalent(key, str(gold)))
            flags.append(verdict[key])
    else:
        flags = [bool(c) for c in correct]
    class_of_key: dict[str, int] = {}
    representatives: list[str] = []  # representative of class i + 1
    class_ids: list[int | None] = []
    for key, ok in zip(keys, flags):
        if ok:
            class_ids.append(0)
            continue
        if key is None:
            class_ids.append(None)
            continue
        if key not in class_of_key:
            found = next(
                (i + 1 for i, rep in enumerate(representatives) if equivalent(rep, key)), None
            )
            if found is None:
                representatives.append(key)
                found = len(representatives)
            class_of_key[key] = found
        class_ids.append(class_of_key[key])
    return class_ids, (0 if any(flags) else None)


def default_k_list(n: int) -> list[int]:
    """The paper's k values that fit ``n`` samples: 1, 8, 16, 32, 64, ... up to ``n``, and ``n``.

    ``n = 64`` gives ``[1, 8, 16, 32, 64]`` (Table 1 of the paper); ``n = 4`` gives ``[1, 4]``.
    """
    n = _as_count(n, "n")
    if n == 0:
        raise ValueError("n must be >= 1, got 0")
    ks = {1, n}
    k = 8
    while k <= n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def _parse_k_list(value: Any, n: int, what: str) -> list[int]:
    """A list of k values from ``None`` (the default list), an int, a "1,8,16" string or a list."""
    if value is None:
        return default_k_list(n)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        try:
            value = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{what}: expected comma-separated integers such as '1,8,16', "
                             f"got {value!r}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    ks = sorted({_check_k(k, n, what) for k in value})
    if not ks:
        raise ValueError(f"{what}: expected at least one value, got {value!r}")
    return ks


# --------------------------------------------------------------------------------------------
# Scoring stored samples and aggregating metrics (no model needed; shared by rescore)
# --------------------------------------------------------------------------------------------

#: A score counts as correct at full marks: reasoning-gym scorers give 1.0 for a right answer
#: (some give partial credit below it) and correctness rewards give 1.0 / 0.0.
CORRECT_SCORE = 1.0


def _is_rg(problem: dict) -> bool:
    return bool(problem.get("rg_entry"))


def _string_equal(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def score_samples(
    texts: Sequence[str],
    problem: dict,
    *,
    answer_from: str = "auto",
    reward_fn: Callable[..., list] | str | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
    correct_threshold: float = CORRECT_SCORE,
) -> list[dict]:
    """Extract and judge the answer of each completion of one problem.

    The scorer is chosen per problem: ``reward_fn`` when given (a correctness reward with TRL's
    contract, or a ``gtpo.rewards.resolve_reward`` spec, called with the problem's columns);
    else the reasoning-gym task's own scorer (``gtpo.rewards.reasoning_gym_reward``)
    when the problem has an ``rg_entry``; else math-verify against the gold answer
    (``gtpo.rewards.correctness_reward``). A reply with no extractable answer is wrong, never
    an error. A sample is correct when its score is ``>= correct_threshold`` (default 1.0, full
    marks; a ``None`` score counts as 0).

    Args:
        texts: ``(n,)`` completion texts.
        problem: the problem's row (``answer``; ``rg_entry``/``task``/``rg_config`` for
            reasoning-gym; any other columns for ``reward_fn``).
        answer_from: where the answer is read (``gtpo.rewards.extract_final_answer``).
        reward_fn: optional correctness reward (e.g. ``"correctness"``; a reward on another
            scale, such as the paper's [0, 20] one, needs its own ``correct_threshold``).
        completion_ids: ``(n,)`` token ids of the completions, passed to ``reward_fn``.
        correct_threshold: the score at which a sample counts as correct.

    Returns:
        ``n`` dicts with ``answer`` (str or None), ``correct`` (bool), ``score`` (float, the
        scorer's raw value) and ``format`` (bool, the paper's full format).
    """
    from gtpo.rewards import (
        ANSWER_FROM,
        correctness_reward,
        extract_final_answer,
        paper_format_score,
        reasoning_gym_reward,
    )

    if answer_from not in ANSWER_FROM:
        raise ValueError(f"answer_from: expected one of {ANSWER_FROM}, got {answer_from!r}")
    n = len(texts)
    texts = list(texts)
    answers = []
    for text in texts:
        answer = extract_final_answer(text, answer_from)
        answers.append(answer if answer is not None and answer.strip() else None)
    if reward_fn is not None:
        if isinstance(reward_fn, str):
            from gtpo.rewards import resolve_reward

            reward_fn = resolve_reward(reward_fn)
        columns = {k: [v] * n for k, v in problem.items()
                   if k not in ("prompt", "completions", "completion_ids", "prompts")}
        prompt = problem.get("prompt", problem.get("question"))
        ids = [list(x) for x in completion_ids] if completion_ids is not None else None
        scores = reward_fn(prompts=[prompt] * n, completions=texts, completion_ids=ids, **columns)
        if scores is None:
            raise ValueError("reward_fn returned None instead of a list of scores")
        scores = list(scores)
    elif _is_rg(problem):
        scores = reasoning_gym_reward(
            completions=texts,
            rg_entry=[problem["rg_entry"]] * n,
            task=[problem.get("task")] * n,
            rg_config=[problem.get("rg_config")] * n,
            answer_from=answer_from,
        )
    else:
        gold = problem.get("answer")
        if gold is None or not str(gold).strip():
            raise ValueError("a problem has no gold 'answer' (columns: "
                             f"{sorted(problem)}); give the dataset an 'answer' column or pass "
                             "a reward_fn that scores completions")
        scores = correctness_reward(completions=texts, answer=[gold] * n, answer_from=answer_from)
    if len(scores) != n:
        raise ValueError(f"the scorer returned {len(scores)} values for {n} completions")
    out = []
    for text, answer, score in zip(texts, answers, scores):
        value = 0.0 if score is None else float(score)
        out.append({
            "answer": answer,
            "correct": value >= correct_threshold,
            "score": value,
            "format": paper_format_score(text) >= 10.0,
        })
    return out


def _problem_scores(
    problem: dict, ks: Sequence[int], maj_ks: Sequence[int], *, maj_estimator: str, unparsable: str
) -> dict:
    """pass@k and maj@k of one scored problem (``problem["samples"]`` judged)."""
    samples = problem["samples"]
    n = len(samples)
    c = sum(bool(s["correct"]) for s in samples)
    answers = [s["answer"] for s in samples]
    correct = [bool(s["correct"]) for s in samples]
    equivalent = _string_equal if _is_rg(problem) else None
    class_ids, gold_class = group_answers(
        answers, problem.get("gold"), correct=correct, equivalent=equivalent
    )
    return {
        "n_correct": c,
        "pass@k": {str(k): pass_at_k(n, c, k) for k in ks},
        "maj@k": {
            str(k): majority_vote_score(class_ids, gold_class, k, estimator=maj_estimator,
                                        unparsable=unparsable)
            for k in maj_ks
        },
    }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def aggregate_metrics(problems: Sequence[dict], ks: Sequence[int], maj_ks: Sequence[int]) -> dict:
    """Dataset metrics from scored problems: means over problems (pass@k, maj@k) and samples.

    Returns a flat dict: ``pass@<k>``, ``maj@<k>`` (means over problems), ``accuracy`` (share of
    correct samples; equals pass@1), ``mean_score`` (mean scorer value; partial credit for
    reasoning-gym), ``format_rate``, ``mean_length`` (tokens), ``truncated_frac``,
    ``unparsable_frac`` (over all samples), ``n_problems``, ``n_samples``.
    """
    samples = [s for p in problems for s in p["samples"]]
    metrics: dict[str, float] = {}
    for k in ks:
        metrics[f"pass@{k}"] = _mean([p["pass@k"][str(k)] for p in problems])
    for k in maj_ks:
        metrics[f"maj@{k}"] = _mean([p["maj@k"][str(k)] for p in problems])
    metrics["accuracy"] = _mean([float(s["correct"]) for s in samples])
    metrics["mean_score"] = _mean([float(s["score"]) for s in samples])
    metrics["format_rate"] = _mean([float(s["format"]) for s in samples])
    lengths = [s["length"] for s in samples if s.get("length") is not None]
    metrics["mean_length"] = _mean([float(x) for x in lengths])
    truncated = [s["truncated"] for s in samples if s.get("truncated") is not None]
    metrics["truncated_frac"] = _mean([float(x) for x in truncated])
    metrics["unparsable_frac"] = _mean([float(s["answer"] is None) for s in samples])
    metrics["n_problems"] = len(problems)
    metrics["n_samples"] = len(samples)
    return metrics


def _estimator_settings(maj_estimator: str, unparsable: str) -> dict:
    return {
        "pass_estimator": PASS_AT_K_ESTIMATOR,
        "maj_estimator": maj_estimator,
        "maj_estimator_rule": MAJ_ESTIMATOR_DOC[maj_estimator],
        "unparsable": unparsable,
        "unparsable_rule": UNPARSABLE_DOC[unparsable],
        "correct_rule": "math-verify equivalence of the extracted answer with the gold answer; "
        "reasoning-gym tasks: the task's scorer gives full marks (1.0)",
    }


def _score_and_aggregate(
    problems: list[dict],
    *,
    n: int,
    ks: list[int],
    maj_ks: list[int],
    maj_estimator: str,
    unparsable: str,
    answer_from: str,
) -> dict:
    """Judge every stored sample of ``problems`` in place and return the dataset metrics."""
    for problem in problems:
        texts = [s["text"] for s in problem["samples"]]
        if len(texts) != n:
            raise ValueError(f"problem {problem.get('index')} has {len(texts)} samples, "
                             f"expected n={n}")
        judged = score_samples(texts, _scoring_row(problem), answer_from=answer_from)
        for sample, verdict in zip(problem["samples"], judged):
            sample.update(verdict)
        problem.update(_problem_scores(problem, ks, maj_ks, maj_estimator=maj_estimator,
                                       unparsable=unparsable))
    return aggregate_metrics(problems, ks, maj_ks)


def _scoring_row(problem: dict) -> dict:
    """The dataset-row view of a stored problem (what :func:`score_samples` reads)."""
    row = {"answer": problem.get("gold"), "question": problem.get("question")}
    for key in ("rg_entry", "task", "rg_config"):
        if problem.get(key) is not None:
            row[key] = problem[key]
    return row


# --------------------------------------------------------------------------------------------
# Models, datasets and generation
# --------------------------------------------------------------------------------------------


def _load_model(model: Any, tokenizer: Any, adapter: str | None, *, dtype: Any, device: Any):
    """``(model, tokenizer, model_name)`` from a spec string or a loaded model (+ peft adapter)."""
    import torch

    name = None
    if isinstance(model, (str, os.PathLike)):
        from gtpo.models import load_model, load_tokenizer

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
        from gtpo.models import load_tokenizer

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


def _dtype_of(name: str, device) -> Any:
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
    return name.lower() == "mmlu" or all("choices" in r and "subject" in r for r in rows)


@contextlib.contextmanager
def _seeded(seed: int):
    """Seed torch inside the block and restore the global RNG state on exit.

    Evaluation is reproducible for a given ``seed`` and never shifts the random stream of a
    training run that calls it.
    """
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _generate_samples(
    model, tokenizer, rows: list[dict], *, n: int, temperature: float, top_p: float, top_k: int,
    max_new_tokens: int, batch_size: int | None, max_prompt_length: int | None, progress: bool,
    keep_ids: bool = False,
) -> list[list[dict]]:
    """``n`` sampled completions of every row: per row, ``n`` dicts (text, length, truncated,
    and with ``keep_ids`` the completion's token ids under ``"ids"``)."""
    from gtpo.rollout import generate

    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i, row in enumerate(rows):
        if "prompt" not in row:
            raise ValueError(f"dataset row {i} has no 'prompt' column (columns: {sorted(row)})")
    per_call = max(1, (batch_size or 64) // n)
    chunks = range(0, len(rows), per_call)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc="generating", unit="chunk", file=sys.stderr)
    out: list[list[dict]] = []
    greedy = temperature <= 0
    for start in chunks:
        part = rows[start:start + per_call]
        rollout = generate(
            model, tokenizer, [r["prompt"] for r in part], num_samples=n,
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            do_sample=not greedy, batch_size=batch_size, max_prompt_length=max_prompt_length,
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


def _problem_record(index: int, row: dict, samples: list[dict]) -> dict:
    record = {"index": index, "question": row.get("question"), "gold": row.get("answer")}
    for key in ("task", "rg_entry", "rg_config"):
        if row.get(key) is not None:
            record[key] = row[key]
    record["samples"] = samples
    return record


def _write_json(path: str | os.PathLike, data: dict) -> None:
    """Write ``data`` as JSON (``gtpo.checkpoint.atomic_write``), creating its directory."""
    from gtpo.checkpoint import atomic_write

    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1, ensure_ascii=False, allow_nan=True) + "\n")


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for package in ("gtpo", "torch", "transformers", "math-verify", "reasoning-gym", "peft"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            pass
    return out


# --------------------------------------------------------------------------------------------
# evaluate / rescore
# --------------------------------------------------------------------------------------------


def _check_choice(value: Any, choices: Sequence[str], name: str) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")


def evaluate(
    model: Any,
    tokenizer: Any = None,
    dataset: Any = "gsm8k",
    *,
    adapter: str | None = None,
    n: int = 64,
    k: Any = None,
    maj_k: Any = None,
    maj_estimator: str = "expected",
    unparsable: str = "abstain",
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 1024,
    max_prompt_length: int | None = None,
    batch_size: int | None = 64,
    answer_from: str = "auto",
    out: str | os.PathLike | None = None,
    split: str = "test",
    template: str = "paper",
    system_prompt: str | None = None,
    size: int | None = None,
    seed: int = 0,
    data_path: str | None = None,
    columns: dict | None = None,
    task_kwargs: dict | None = None,
    dtype: Any = None,
    device: Any = None,
    mmlu_chat_template: bool = False,
    progress: bool = False,
) -> dict:
    """Evaluate a model on a dataset: pass@k, maj@k, format rate, lengths (MMLU: accuracy).

    Generates ``n`` completions per problem (``gtpo.rollout.generate``), extracts and judges
    each answer (:func:`score_samples`: math-verify against the gold answer, or the
    reasoning-gym task's scorer), and computes per-problem pass@k (:func:`pass_at_k`) and maj@k
    (:func:`majority_vote_score`) and their means over problems. For ``"mmlu"`` (or rows with
    ``choices`` and ``subject``) it dispatches to :func:`evaluate_mmlu`.

    Args:
        model: a path, hub id, ``.gguf`` file or ``"smollm2-135m-instruct"`` (loaded with
            ``gtpo.models``; bfloat16 on GPU, float32 on CPU unless ``dtype``), or a loaded
            causal LM.
        tokenizer: the tokenizer (default: loaded from ``model`` when it is a path/id).
        dataset: a task name of ``gtpo.data.load_task`` (``gsm8k``, ``math``, ``math500``,
            ``aime24``, ``aime25``, ``amc23``, ``mmlu``, any reasoning-gym task as
            ``rg:<task>`` or bare name), a local ``.jsonl``/``.json``/``.parquet``/``.csv`` file
            (columns ``question`` or ``prompt``, and ``answer``, unless ``columns`` maps them),
            or loaded rows (a ``datasets.Dataset`` or a list of dicts with ``prompt`` and
            ``answer``).
        adapter: a peft adapter directory applied on top of ``model``.
        n: completions per problem.
        k: pass@k values: a list, an int, a ``"1,8,16"`` string, or None for
            :func:`default_k_list` (the paper's 1, 8, 16, 32, 64 up to ``n``). Each ``<= n``.
        maj_k: maj@k values, same forms; None uses ``k``.
        maj_estimator: ``"expected"`` or ``"first"`` (module docstring).
        unparsable: ``"abstain"`` or ``"vote"``: how samples without an answer take part in
            the majority vote (module docstring).
        temperature, top_p, top_k, max_new_tokens, max_prompt_length: generation settings
            (``temperature=0``: greedy decoding, only with ``n=1``).
        batch_size: completions per ``generate`` call (whole problems per call:
            ``max(1, batch_size // n)``).
        answer_from: ``"auto"``, ``"tag"``, ``"boxed"`` or ``"last_number"``
            (``gtpo.rewards.extract_final_answer``).
        out: write the results as JSON there (atomically).
        split, template, system_prompt, size, seed, data_path, columns, task_kwargs: passed to
            ``gtpo.data.load_task`` (``data_path`` is its ``path=``: a local copy of a hub
            dataset in the hub's format). ``seed`` also seeds sampling (the caller's RNG state
            is restored afterwards).
        dtype, device: for a model given as a path (``dtype`` also ``"auto"``, ``"bfloat16"``,
            ...); ``device`` moves a loaded model too.
        mmlu_chat_template: MMLU only, see :func:`evaluate_mmlu`.
        progress: show a progress bar on stderr.

    Returns:
        ``{"dataset", "model", "adapter", "settings", "metrics", "problems"}``: ``metrics`` as
        :func:`aggregate_metrics` (``pass@<k>``, ``maj@<k>``, ``format_rate``, ``mean_length``,
        ``truncated_frac``, ``unparsable_frac``, ...), ``problems`` one record per problem
        (``question``, ``gold``, ``n_correct``, ``pass@k``, ``maj@k``, and ``samples``: ``text``,
        ``answer``, ``correct``, ``score``, ``format``, ``length``, ``truncated``), enough for
        :func:`rescore` to recompute everything without generating again.

    Raises:
        ValueError: an unknown dataset (listing the known ones), ``k > n``, bad settings.
    """
    n = _as_count(n, "n")
    if n == 0:
        raise ValueError("n (completions per problem) must be >= 1, got 0")
    ks = _parse_k_list(k, n, "k")
    maj_ks = ks if maj_k is None else _parse_k_list(maj_k, n, "maj_k")
    _check_choice(maj_estimator, MAJ_ESTIMATORS, "maj_estimator")
    _check_choice(unparsable, UNPARSABLE_MODES, "unparsable")
    from gtpo.rewards import ANSWER_FROM

    _check_choice(answer_from, ANSWER_FROM, "answer_from")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0 and n > 1:
        raise ValueError(f"temperature=0 decodes greedily and gives n={n} identical samples; "
                         "use n=1 for greedy accuracy or a temperature > 0 for pass@k")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")

    rows, name = _load_rows(dataset, split=split, size=size, seed=seed, template=template,
                            system_prompt=system_prompt, data_path=data_path, columns=columns,
                            task_kwargs=task_kwargs)
    model, tokenizer, model_name = _load_model(model, tokenizer, adapter, dtype=dtype,
                                               device=device)
    if _is_mmlu(rows, name):
        results = evaluate_mmlu(model, tokenizer, rows, batch_size=batch_size or 8,
                                chat_template=mmlu_chat_template, progress=progress)
        results.update({"dataset": name, "model": model_name, "adapter": adapter})
        results["settings"].update({"split": split, "size": size, "seed": seed,
                                    "data_path": data_path, "versions": _versions()})
        results = {key: results[key] for key in
                   ("dataset", "model", "adapter", "settings", "metrics", "problems")}
        if out is not None:
            _write_json(out, results)
        return results

    with _seeded(seed):
        generated = _generate_samples(
            model, tokenizer, rows, n=n, temperature=temperature, top_p=top_p, top_k=top_k,
            max_new_tokens=max_new_tokens, batch_size=batch_size,
            max_prompt_length=max_prompt_length, progress=progress,
        )
    problems = [_problem_record(i, row, samples)
                for i, (row, samples) in enumerate(zip(rows, generated))]
    metrics = _score_and_aggregate(problems, n=n, ks=ks, maj_ks=maj_ks,
                                   maj_estimator=maj_estimator, unparsable=unparsable,
                                   answer_from=answer_from)
    settings = {
        "n": n, "k": ks, "maj_k": maj_ks, "temperature": temperature, "top_p": top_p,
        "top_k": top_k, "max_new_tokens": max_new_tokens, "max_prompt_length": max_prompt_length,
        "batch_size": batch_size, "answer_from": answer_from, "split": split,
        "template": template, "system_prompt": system_prompt, "size": size, "seed": seed,
        "data_path": data_path, "columns": columns, "task_kwargs": task_kwargs,
        **_estimator_settings(maj_estimator, unparsable), "versions": _versions(),
    }
    results = {"dataset": name, "model": model_name, "adapter": adapter, "settings": settings,
               "metrics": metrics, "problems": problems}
    if out is not None:
        _write_json(out, results)
    return results


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
        data["metrics"] = _mmlu_metrics(problems)
    else:
        n = int(settings["n"])
        ks = _parse_k_list(settings["k"] if k is None else k, n, "k")
        maj_ks = _parse_k_list(settings["maj_k"] if maj_k is None else maj_k, n, "maj_k")
        maj_estimator = maj_estimator or settings.get("maj_estimator", "expected")
        unparsable = unparsable or settings.get("unparsable", "abstain")
        answer_from = answer_from or settings.get("answer_from", "auto")
        _check_choice(maj_estimator, MAJ_ESTIMATORS, "maj_estimator")
        _check_choice(unparsable, UNPARSABLE_MODES, "unparsable")
        data["metrics"] = _score_and_aggregate(problems, n=n, ks=ks, maj_ks=maj_ks,
                                               maj_estimator=maj_estimator,
                                               unparsable=unparsable, answer_from=answer_from)
        settings.update({"k": ks, "maj_k": maj_ks, "answer_from": answer_from,
                         **_estimator_settings(maj_estimator, unparsable)})
    if out is not None:
        _write_json(out, data)
    return data


# --------------------------------------------------------------------------------------------
# MMLU: answer-letter log-likelihood
# --------------------------------------------------------------------------------------------

_LETTERS = "ABCDEFGHIJ"


def mmlu_stem(question: str, choices: Sequence[str]) -> str:
    """The bare question of an MMLU row.

    ``gtpo.data.load_task("mmlu")`` writes ``question`` as the stem, a blank line, the
    ``A. ...`` choice lines and an instruction (for generation-based use); the stem is the text
    before the ``"\\n\\nA. <first choice>"`` block. A question without that block is returned
    as it is (rows built by hand).
    """
    if choices:
        marker = f"\n\nA. {choices[0]}"
        index = question.rfind(marker)
        if index >= 0:
            return question[:index].strip()
    return question.strip()


def mmlu_prompt(question: str, choices: Sequence[str], subject: str | None = None) -> str:
    """The standard 0-shot MMLU prompt (Hendrycks et al. 2021, their ``evaluate.py``).

    ``"The following are multiple choice questions (with answers) about <subject>.\\n\\n"``
    (when the subject is known; underscores become spaces), then the question, one
    ``"A. <choice>"`` line per choice, and ``"Answer:"``. The answer is scored as the
    continuation ``" A"``, ``" B"``, ... (lm-evaluation-harness uses the same format).
    """
    header = ""
    if subject:
        header = ("The following are multiple choice questions (with answers) about "
                  f"{subject.replace('_', ' ')}.\n\n")
    lines = [question.strip()]
    lines += [f"{_LETTERS[i]}. {choice}" for i, choice in enumerate(choices)]
    lines.append("Answer:")
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
    explicit position ids, and only the last positions' logits are computed when the model
    supports ``logits_to_keep``.
    """
    import torch

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
                width = max(len(ids) for ids, _ in batch)
                ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for b, (seq, _) in enumerate(batch):
                    ids[b, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
                    mask[b, width - len(seq):] = 1
                positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
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


def _mmlu_metrics(problems: Sequence[dict]) -> dict:
    """Accuracy overall (micro), as the mean over subjects (macro), and per subject."""
    by_subject: dict[str, list[float]] = {}
    for p in problems:
        finite = [x for x in p["logprobs"] if x is not None and math.isfinite(x)]
        pred = None
        if finite:
            best = max(finite)
            pred = _LETTERS[p["logprobs"].index(best)]
        p["pred"] = pred
        p["correct"] = pred is not None and pred == p["gold"]
        by_subject.setdefault(p.get("subject") or "unknown", []).append(float(p["correct"]))
    subjects = {s: {"accuracy": _mean(v), "n": len(v)} for s, v in sorted(by_subject.items())}
    return {
        "accuracy": _mean([float(p["correct"]) for p in problems]),
        "accuracy_macro": _mean([v["accuracy"] for v in subjects.values()]),
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
        dataset: MMLU rows (``gtpo.data.load_task("mmlu")``: ``question``, ``choices``,
            ``subject``, ``answer`` the gold letter), a ``datasets.Dataset`` or a list of dicts.
        batch_size: sequences per forward pass.

    Returns:
        ``{"settings", "metrics": {"accuracy", "accuracy_macro", "n_problems", "by_subject":
        {subject: {"accuracy", "n"}}}, "problems": [{index, subject, question, choices, gold,
        logprobs, pred, correct}]}``.
    """
    from gtpo.rollout import prompt_text

    rows = dataset.to_list() if hasattr(dataset, "to_list") else [dict(r) for r in dataset]
    if not rows:
        raise ValueError("dataset: MMLU evaluation needs at least one row")
    contexts, conts, problems = [], [], []
    for i, row in enumerate(rows):
        missing = [c for c in ("question", "choices", "answer") if c not in row]
        if missing:
            raise ValueError(f"MMLU row {i}: missing column(s) {missing}; columns: {sorted(row)}")
        choices = list(row["choices"])
        if not 2 <= len(choices) <= len(_LETTERS):
            raise ValueError(f"MMLU row {i}: expected 2-{len(_LETTERS)} choices, got {choices!r}")
        gold = row["answer"]
        if isinstance(gold, int) and not isinstance(gold, bool):
            gold = _LETTERS[gold]
        gold = str(gold).strip().upper()
        if gold not in _LETTERS[:len(choices)]:
            raise ValueError(f"MMLU row {i}: answer must be a letter A-{_LETTERS[len(choices) - 1]}"
                             f" or a choice index, got {row['answer']!r}")
        stem = mmlu_stem(str(row["question"]), choices)
        text = mmlu_prompt(stem, choices, row.get("subject"))
        letters = list(_LETTERS[:len(choices)])
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
    metrics = _mmlu_metrics(problems)
    settings = {"kind": "mmlu", "prompt": "0-shot, Hendrycks et al. 2021 format",
                "scoring": "log-likelihood of the answer letter", "chat_template": chat_template,
                "batch_size": batch_size}
    return {"settings": settings, "metrics": metrics, "problems": problems}


# --------------------------------------------------------------------------------------------
# Evaluation during training
# --------------------------------------------------------------------------------------------


def evaluate_during_training(
    model,
    tokenizer,
    dataset: Any,
    *,
    n: int = 1,
    k_list: Sequence[int] = (1,),
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    batch_size: int | None = 64,
    reward_fn: Callable[..., list] | str | None = None,
    correct_threshold: float = CORRECT_SCORE,
    top_p: float = 1.0,
    answer_from: str = "auto",
    max_prompt_length: int | None = None,
    maj_estimator: str = "expected",
    unparsable: str = "abstain",
    seed: int = 0,
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
        reward_fn: optional correctness reward (TRL's contract, called with the row's columns
            and ``completion_ids``; or a ``gtpo.rewards.resolve_reward`` spec); a sample counts
            as correct when it returns ``>= correct_threshold`` (default 1.0: use a correctness
            reward, or set the threshold, e.g. 20 for the paper's [0, 20] reward). Default: the
            reasoning-gym scorer for rows with ``rg_entry``, else math-verify against
            ``answer``.
        Others: as :func:`evaluate`.

    Returns:
        ``{"eval/<metric>": float}``.
    """
    rows = dataset.to_list() if hasattr(dataset, "to_list") else [dict(r) for r in dataset]
    if not rows:
        raise ValueError("eval dataset: it has no rows")
    greedy = temperature <= 0
    n = 1 if greedy else _as_count(n, "n")
    if n == 0:
        raise ValueError("n must be >= 1, got 0")
    ks = [1] if greedy else _parse_k_list(list(k_list), n, "k_list")
    maj_ks = [] if greedy else [k for k in ks if k > 1]
    with _seeded(seed):
        generated = _generate_samples(
            model, tokenizer, rows, n=n, temperature=max(temperature, 0.0), top_p=top_p, top_k=0,
            max_new_tokens=max_new_tokens, batch_size=batch_size,
            max_prompt_length=max_prompt_length, progress=False, keep_ids=reward_fn is not None,
        )
    if isinstance(reward_fn, str):
        from gtpo.rewards import resolve_reward

        reward_fn = resolve_reward(reward_fn)
    problems = []
    for i, (row, samples) in enumerate(zip(rows, generated)):
        texts = [s["text"] for s in samples]
        ids = [s.pop("ids") for s in samples] if reward_fn is not None else None
        verdicts = score_samples(texts, row, answer_from=answer_from, reward_fn=reward_fn,
                                 completion_ids=ids, correct_threshold=correct_threshold)
        for sample, verdict in zip(samples, verdicts):
            sample.update(verdict)
        problem = _problem_record(i, row, samples)
        problem.update(_problem_scores(problem, ks, maj_ks, maj_estimator=maj_estimator,
                                       unparsable=unparsable))
        problems.append(problem)
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


# --------------------------------------------------------------------------------------------
# Command line: gtpo eval
# --------------------------------------------------------------------------------------------


def _percent(value: float) -> str:
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


class _CallableModule(types.ModuleType):
    """Lets ``gtpo.evaluate(...)`` work even after ``import gtpo.evaluate`` bound the module.

    ``gtpo.evaluate`` is both this module and its :func:`evaluate` function (the lazy
    top-level export); importing the submodule rebinds the package attribute to the module, so
    the module forwards calls to the function.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return evaluate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
