"""pass@k and maj@k estimators and k lists: pure functions of counts and answer classes.

No model and no tensors here (no torch or transformers import): the functions take sample
counts, answer strings or answer-class ids and return Python floats, computed exactly.

* :func:`pass_at_k` -- the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
  Models Trained on Code", the ``HumanEval`` paper): with ``n`` samples of which ``c`` are correct,
  ``pass@k = 1 - C(n-c, k) / C(n, k)``, the probability that a random subset of ``k`` of the ``n``
  samples holds at least one correct one. Computed with exact integers and one correctly rounded
  division (equal to the product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` of their numpy code),
  so it is stable for any ``n``.
* :func:`maj_at_k` -- majority vote (self-consistency, Wang et al. 2023) over the extracted answers
  of ``k`` samples; the vote is correct when the winning answer class is the gold one.

  - Answer classes (:func:`group_answers`): answers are grouped by equivalence
    (``gtpo.rewards.answers_equivalent``, math-verify, so ``0.5``, ``\\frac{1}{2}`` and ``1/2`` are
    one answer). The samples judged correct form the gold class; the others are grouped greedily,
    each new answer joining the first class whose first answer (its representative) is
    equivalent to it (math-verify's equivalence is not guaranteed transitive; the greedy rule
    makes the grouping deterministic).
  - Unparsable samples (no extractable answer, ``None``): by default (``unparsable="abstain"``)
    they do not vote -- a vote among the samples that did answer -- and a subset in which no sample
    answered scores 0. With ``unparsable="vote"`` they form one extra class that can win the vote
    (and is never correct), so format failures lower maj@k.
  - ``estimator="expected"`` (default): the exact expectation over all ``C(n, k)`` subsets of size
    ``k`` of the ``n`` samples, the same idea as the unbiased pass@k estimator; a tie among ``t``
    classes, the gold one among them, counts ``1/t`` (ties broken uniformly at random, in
    expectation). Computed combinatorially from the class counts (a generating-function dynamic
    programme, :func:`_expected_majority`), never by enumerating subsets.
  - ``estimator="first"``: the vote of the first ``k`` samples only (as in many evaluation
    scripts); a tie is broken in favour of the class whose first sample comes earliest.

  With ``estimator="expected"``, maj@1 equals pass@1.

* :func:`default_k_list` -- the paper's k values (1, 8, 16, 32, 64, ... up to ``n``);
  :func:`parse_k_list` reads the ``k`` / ``maj_k`` arguments (``None``, an int, ``"1,8,16"`` or a
  list).

The constants (:data:`MAJ_ESTIMATORS`, :data:`UNPARSABLE_MODES`) and their one-line rules
(:data:`PASS_AT_K_ESTIMATOR`, :data:`MAJ_ESTIMATOR_DOC`, :data:`UNPARSABLE_DOC`) are the ones the
results JSON records and ``gtpo eval`` offers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "PASS_AT_K_ESTIMATOR",
    "MAJ_ESTIMATORS",
    "UNPARSABLE_MODES",
    "MAJ_ESTIMATOR_DOC",
    "UNPARSABLE_DOC",
    "pass_at_k",
    "maj_at_k",
    "majority_vote_score",
    "group_answers",
    "default_k_list",
    "parse_k_list",
    "as_count",
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


def as_count(value: Any, name: str) -> int:
    """``value`` as a non-negative int (numpy ints accepted; floats and bools rejected).

    Raises:
        ValueError: naming ``name``, for anything else.
    """
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
    n, c, k = as_count(n, "n"), as_count(c, "c"), as_count(k, "k")
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
    """``k`` as an int in ``[1, n]``; a ValueError naming ``what`` otherwise."""
    k = as_count(k, what)
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
    n = as_count(n, "n")
    if n == 0:
        raise ValueError("n must be >= 1, got 0")
    ks = {1, n}
    k = 8
    while k <= n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def parse_k_list(value: Any, n: int, what: str) -> list[int]:
    """The sorted, distinct k values of a ``k`` / ``maj_k`` argument.

    Args:
        value: ``None`` (:func:`default_k_list` of ``n``), an int, a ``"1,8,16"`` string or a
            sequence of ints.
        n: samples per problem; every k must be in ``[1, n]``.
        what: the argument's name, for error messages (``"k"``, ``"maj_k"``, ``"k_list"``).

    Returns:
        ``list[int]``, ascending, without duplicates, non-empty.

    Raises:
        ValueError: a value that is not an integer, ``k < 1``, ``k > n`` or an empty list.
    """
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
