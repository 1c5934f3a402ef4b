"""Judging completions and aggregating the dataset metrics: no model needed.

Shared by :func:`gtpo.evaluation.evaluate` (fresh samples), :func:`gtpo.evaluation.rescore`
(samples stored in a results file) and :func:`gtpo.evaluation.evaluate_during_training`.

* :func:`score_samples` -- extract and judge the answer of each completion of one problem
  (math-verify against the gold answer, the reasoning-gym task's scorer, or a reward function).
* :func:`problem_scores` -- pass@k and maj@k of one judged problem
  (``gtpo.evaluation.estimators``).
* :func:`score_problems` -- both for every problem record, then :func:`aggregate_metrics`.
* :func:`aggregate_metrics` -- the dataset metrics: means over problems of pass@k and maj@k;
  ``accuracy``, ``mean_score``, ``format_rate`` (share of completions with the paper's full
  ``<reasoning>...</reasoning><answer>...</answer>`` format,
  ``gtpo.rewards.paper_format_score == 10``), ``mean_length`` (completion tokens through the
  first EOS), ``truncated_frac`` (no EOS within ``max_new_tokens``) and ``unparsable_frac`` (no
  answer could be extracted; such a sample counts as wrong, never as an error) over samples.
* :func:`problem_record` / :func:`scoring_row` -- a dataset row as the problem record stored in
  the results (``index``, ``question``, ``gold``, reasoning-gym columns, ``samples``), and back.

A problem record's ``samples`` are dicts with ``text`` (and ``length``, ``truncated`` from
generation); judging adds ``answer`` (str or None), ``correct`` (bool), ``score`` (float) and
``format`` (bool), and the record gets ``n_correct``, ``pass@k`` and ``maj@k``
(``{str(k): float}``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .estimators import group_answers, majority_vote_score, pass_at_k

__all__ = [
    "CORRECT_SCORE",
    "score_samples",
    "problem_scores",
    "score_problems",
    "aggregate_metrics",
    "problem_record",
    "scoring_row",
    "mean_or_nan",
]

#: A score counts as correct at full marks: reasoning-gym scorers give 1.0 for a right answer
#: (some give partial credit below it) and correctness rewards give 1.0 / 0.0.
CORRECT_SCORE = 1.0

#: The reasoning-gym columns of a dataset row that a problem record keeps (for the task's scorer).
_RG_COLUMNS = ("task", "rg_entry", "rg_config")


def _is_rg(problem: dict) -> bool:
    """Whether a row or record is a reasoning-gym problem (scored by the task's own scorer)."""
    return bool(problem.get("rg_entry"))


def _string_equal(a: str, b: str) -> bool:
    """Equality up to whitespace: the answer equivalence of reasoning-gym answers."""
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


def problem_scores(
    problem: dict, ks: Sequence[int], maj_ks: Sequence[int], *, maj_estimator: str, unparsable: str
) -> dict:
    """pass@k and maj@k of one judged problem.

    Args:
        problem: a problem record whose ``samples`` (``n`` dicts) are judged (``answer``,
            ``correct``); ``gold`` and, for reasoning-gym, ``rg_entry`` are read.
        ks, maj_ks: the k values of pass@k and maj@k, each in ``[1, n]``.
        maj_estimator, unparsable: see ``gtpo.evaluation.estimators``.

    Returns:
        ``{"n_correct": int, "pass@k": {str(k): float}, "maj@k": {str(k): float}}``.
    """
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


def mean_or_nan(values: Sequence[float]) -> float:
    """The mean of ``values`` as a float; NaN for an empty sequence."""
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
        metrics[f"pass@{k}"] = mean_or_nan([p["pass@k"][str(k)] for p in problems])
    for k in maj_ks:
        metrics[f"maj@{k}"] = mean_or_nan([p["maj@k"][str(k)] for p in problems])
    metrics["accuracy"] = mean_or_nan([float(s["correct"]) for s in samples])
    metrics["mean_score"] = mean_or_nan([float(s["score"]) for s in samples])
    metrics["format_rate"] = mean_or_nan([float(s["format"]) for s in samples])
    lengths = [s["length"] for s in samples if s.get("length") is not None]
    metrics["mean_length"] = mean_or_nan([float(x) for x in lengths])
    truncated = [s["truncated"] for s in samples if s.get("truncated") is not None]
    metrics["truncated_frac"] = mean_or_nan([float(x) for x in truncated])
    metrics["unparsable_frac"] = mean_or_nan([float(s["answer"] is None) for s in samples])
    metrics["n_problems"] = len(problems)
    metrics["n_samples"] = len(samples)
    return metrics


def score_problems(
    problems: Sequence[dict],
    *,
    ks: Sequence[int],
    maj_ks: Sequence[int],
    maj_estimator: str = "expected",
    unparsable: str = "abstain",
    answer_from: str = "auto",
    rows: Sequence[dict] | None = None,
    reward_fn: Callable[..., list] | str | None = None,
    correct_threshold: float = CORRECT_SCORE,
    n: int | None = None,
) -> dict:
    """Judge every sample of every problem in place, score each problem, aggregate.

    The one scoring loop of :func:`gtpo.evaluation.evaluate`, :func:`gtpo.evaluation.rescore`
    and :func:`gtpo.evaluation.evaluate_during_training`: each problem's samples go through
    :func:`score_samples` (each sample dict gets ``answer``, ``correct``, ``score``,
    ``format``), the problem gets :func:`problem_scores` (``n_correct``, ``pass@k``, ``maj@k``).

    Args:
        problems: ``P`` problem records (:func:`problem_record`); ``samples`` holds dicts with
            ``text`` and, when ``reward_fn`` is to get them, ``ids`` (the completion's token ids,
            removed from the sample here).
        ks, maj_ks: the k values of pass@k and maj@k.
        maj_estimator, unparsable: see ``gtpo.evaluation.estimators``.
        answer_from: where answers are read (``gtpo.rewards.extract_final_answer``).
        rows: ``P`` dataset rows handed to the scorer, every column reaching ``reward_fn``;
            default: :func:`scoring_row` of each record (what a results file keeps).
        reward_fn, correct_threshold: see :func:`score_samples` (a spec string is resolved
            once).
        n: when given, every problem must have ``n`` samples (ValueError otherwise).

    Returns:
        :func:`aggregate_metrics` of the judged problems.
    """
    if rows is not None and len(rows) != len(problems):
        raise ValueError(f"rows has {len(rows)} entries but problems has {len(problems)}")
    if isinstance(reward_fn, str):
        from gtpo.rewards import resolve_reward

        reward_fn = resolve_reward(reward_fn)
    for i, problem in enumerate(problems):
        samples = problem["samples"]
        if n is not None and len(samples) != n:
            raise ValueError(f"problem {problem.get('index')} has {len(samples)} samples, "
                             f"expected n={n}")
        ids = [s.pop("ids") for s in samples] if samples and "ids" in samples[0] else None
        row = scoring_row(problem) if rows is None else rows[i]
        judged = score_samples([s["text"] for s in samples], row, answer_from=answer_from,
                               reward_fn=reward_fn, completion_ids=ids,
                               correct_threshold=correct_threshold)
        for sample, verdict in zip(samples, judged):
            sample.update(verdict)
        problem.update(problem_scores(problem, ks, maj_ks, maj_estimator=maj_estimator,
                                      unparsable=unparsable))
    return aggregate_metrics(problems, ks, maj_ks)


def problem_record(index: int, row: dict, samples: list[dict]) -> dict:
    """The results' record of problem ``index``: ``index``, ``question``, ``gold`` (the row's
    ``answer``), the row's reasoning-gym columns (``task``, ``rg_entry``, ``rg_config``) when
    set, and ``samples`` (the list itself, not a copy)."""
    record = {"index": index, "question": row.get("question"), "gold": row.get("answer")}
    for key in _RG_COLUMNS:
        if row.get(key) is not None:
            record[key] = row[key]
    record["samples"] = samples
    return record


def scoring_row(problem: dict) -> dict:
    """The dataset-row view of a stored problem (what :func:`score_samples` reads)."""
    row = {"answer": problem.get("gold"), "question": problem.get("question")}
    for key in _RG_COLUMNS:
        if problem.get(key) is not None:
            row[key] = problem[key]
    return row
