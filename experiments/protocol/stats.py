"""The protocol's tests, on ``scipy.stats``; written out here only where scipy has no exact equivalent.

Every function returns plain floats (dicts of them); ``experiments/test_protocol.py`` checks each one
against hand-computed values and textbook examples, and the tied-rank exact tests against a brute-force
enumeration, so a change of scipy's defaults cannot silently change a p-value.

* :func:`wilcoxon_signed_rank` — paired differences, two-sided. Zero differences are dropped first
  (Wilcoxon's method). For n <= ``exact_max`` (20) non-zero differences the p-value is exact: without
  tied ranks ``scipy.stats.wilcoxon(method="exact")``; with tied ranks, where scipy's ``"exact"`` uses the
  untied distribution with the statistic rounded (conservative, not exact; gh-19872) and its
  ``"auto"`` falls back to the normal approximation above n = 13, the exact conditional distribution
  of W+ over all 2^n sign flips of the tied (average) ranks, enumerated by ``scipy.stats.permutation_test``
  (``n_resamples=inf``). Above ``exact_max``: scipy's normal approximation with the tie correction and a
  continuity correction.
* :func:`mann_whitney` — two independent samples, two-sided. For n1 + n2 <= ``exact_max``: without ties
  ``scipy.stats.mannwhitneyu(method="exact")``; with ties (scipy's ``"exact"`` ignores them) the exact
  distribution over all C(n1 + n2, n1) splits of the pooled tied ranks (``permutation_test``), counting
  splits with |U - n1 n2 / 2| at least the observed one. Above: scipy's normal approximation with the tie
  and continuity corrections.
* :func:`fisher_exact` — 2x2 table, two-sided (``scipy.stats.fisher_exact``).
* :func:`mcnemar_exact` — paired binary outcomes: the exact binomial test on the discordant pairs
  (``scipy.stats.binomtest``), two-sided.
* :func:`logrank` — k-group log-rank test (right-censored times), optionally **stratified** (O - E and
  their covariances summed over strata); chi-square with k - 1 degrees of freedom. Neither scipy
  (``scipy.stats.logrank``: two groups, no strata) nor lifelines (no stratified log-rank) provides it, so
  the sums are written out; the tests check it equals ``scipy.stats.logrank`` where that applies.
* :func:`bootstrap_ci` — percentile bootstrap interval (``scipy.stats.bootstrap``).
* :func:`paired_t` — paired t-test (``scipy.stats.ttest_1samp`` on the differences).
* :func:`spearman` — rank correlation (``scipy.stats.spearmanr``).
* :func:`mdd_paired`, :func:`mdd_two_sample` — minimum detectable differences from Student's t quantiles.
* :func:`logrank_power` — power of the two-group log-rank test for a hazard ratio (Schoenfeld's approximation);
  :func:`min_detectable_hazard_ratio` — the same solved for the ratio.
* :func:`min_differing_pairs`, :func:`seeds_for_differing_pairs` — power of an exact paired test (sign test, exact
  McNemar) when only some pairs can differ.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats as _st


# ------------------------------------------------------------------ distributions
def norm_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return float(_st.norm.sf(z))


def norm_ppf(p: float) -> float:
    """Inverse of the standard normal CDF."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"norm_ppf: p must be in (0, 1), got {p!r}")
    return float(_st.norm.ppf(p))


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for a chi-square with ``df`` degrees of freedom."""
    return float(_st.chi2.sf(x, df)) if x > 0 else 1.0


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    return float(_st.t.sf(t, df))


def t_ppf(p: float, df: float) -> float:
    """Inverse CDF of Student's t."""
    return float(_st.t.ppf(p, df))


def rankdata(values: Sequence[float]) -> list[float]:
    """Average ranks (1-based), ties share the mean of their ranks."""
    return [float(r) for r in _st.rankdata(values, method="average")]


def statistics_median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


def _has_ties(values: Sequence[float]) -> bool:
    return len(set(values)) < len(values)


# ------------------------------------------------------------------ tests
def wilcoxon_signed_rank(diffs: Sequence[float], *, exact_max: int = 20) -> dict:
    """Wilcoxon signed-rank test of paired differences (H0: symmetric about 0), two-sided.

    Returns ``n`` (non-zero differences), ``w_plus`` (sum of the ranks of positive differences),
    ``z`` (the normal statistic, tie-corrected, without continuity correction; positive when the
    differences lean positive: a description of direction, whatever ``method``), ``p`` (two-sided; exact
    for n <= exact_max, see the module docstring), ``method`` (``exact``, ``exact-ties`` or ``normal``),
    ``median`` (of all differences, zeros included), ``frac_positive`` (of the non-zero ones).
    """
    all_d = [float(d) for d in diffs]
    d = [x for x in all_d if x != 0.0]
    n = len(d)
    med = statistics_median(all_d) if all_d else float("nan")
    if n == 0:
        return {"n": 0, "w_plus": 0.0, "z": 0.0, "p": 1.0, "method": "none", "median": med, "frac_positive": float("nan")}
    absd = [abs(x) for x in d]
    ranks = rankdata(absd)
    w_plus = sum(r for r, x in zip(ranks, d) if x > 0)
    mean = n * (n + 1) / 4.0
    _, counts = np.unique(np.asarray(ranks), return_counts=True)
    var = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(counts ** 3 - counts)) / 48.0
    z = (w_plus - mean) / math.sqrt(var) if var > 0 else 0.0
    x = np.asarray(d)
    if n <= exact_max and not _has_ties(absd):
        p, method = float(_st.wilcoxon(x, method="exact").pvalue), "exact"
    elif n <= exact_max:
        # exact conditional distribution: every one of the 2^n sign flips of these tied ranks. This is
        # scipy.stats.wilcoxon(x, method=PermutationMethod(n_resamples=inf)): the same permutation test of the
        # same W+, with W+ of a whole batch of flips at once (the ranks of |x| do not change under a flip, so
        # W+ is a masked sum of the fixed ranks; scipy's wilcoxon ranks each flip again, one at a time)
        r = np.asarray(ranks)

        def w_plus_of(flipped, axis):
            return np.sum(np.where(flipped > 0, r, 0.0), axis=axis)

        res = _st.permutation_test((x,), w_plus_of, permutation_type="samples", vectorized=True,
                                   n_resamples=np.inf, alternative="two-sided", batch=4096)
        p, method = float(res.pvalue), "exact-ties"
    else:
        p, method = float(_st.wilcoxon(x, method="asymptotic", correction=True).pvalue), "normal"
    return {"n": n, "w_plus": w_plus, "z": z, "p": min(1.0, p), "method": method, "median": med,
            "frac_positive": sum(1 for v in d if v > 0) / n}


def mann_whitney(x: Sequence[float], y: Sequence[float], *, exact_max: int = 20) -> dict:
    """Mann-Whitney U test, two-sided. ``u`` = U of ``x`` (pairs with x > y, ties 1/2); exact when
    len(x) + len(y) <= exact_max (tied ranks: every split of the pooled ranks), else normal with the tie
    and continuity corrections. ``method``: ``exact``, ``exact-ties`` or ``normal``."""
    n1, n2 = len(x), len(y)
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    pooled = list(x) + list(y)
    mean = n1 * n2 / 2.0
    u = float(sum(rankdata(pooled)[:n1]) - n1 * (n1 + 1) / 2.0)
    if n1 + n2 <= exact_max and not _has_ties(pooled):
        p, method = float(_st.mannwhitneyu(xa, ya, alternative="two-sided", method="exact").pvalue), "exact"
    elif n1 + n2 <= exact_max:
        def dist_from_mean(a, b, axis):
            r = _st.rankdata(np.concatenate([a, b], axis=axis), axis=axis)
            return np.abs(np.sum(r[..., :a.shape[axis]], axis=axis) - n1 * (n1 + 1) / 2.0 - mean)

        res = _st.permutation_test((xa, ya), dist_from_mean, permutation_type="independent", vectorized=True,
                                   n_resamples=np.inf, alternative="greater", batch=4096)
        p, method = float(res.pvalue), "exact-ties"
    else:
        p = float(_st.mannwhitneyu(xa, ya, alternative="two-sided", method="asymptotic", use_continuity=True).pvalue)
        method = "normal"
    return {"u": u, "p": min(1.0, p), "method": method, "n1": n1, "n2": n2}


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact p for the table [[a, b], [c, d]] (tables no more likely than the observed)."""
    return float(_st.fisher_exact([[a, b], [c, d]], alternative="two-sided").pvalue)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: ``b`` pairs (yes, no) and ``c`` pairs (no, yes)."""
    if b + c == 0:
        return 1.0
    return float(_st.binomtest(min(b, c), b + c, 0.5, alternative="two-sided").pvalue)


def logrank(times: Sequence[float], events: Sequence[int], groups: Sequence, strata: Sequence | None = None) -> dict:
    """Log-rank test of equal hazards across ``groups`` (k >= 2), events 1 = observed, 0 = censored
    at that time; with ``strata`` the stratified test (O - E and their covariances summed over strata).
    Returns ``chi2``, ``df``, ``p``, and per group ``observed`` / ``expected``."""
    labels = sorted(set(groups), key=str)
    k = len(labels)
    if k < 2:
        raise ValueError(f"logrank needs at least two groups, got {labels!r}")
    t_all = np.asarray(times, dtype=float)
    e_all = np.asarray(events, dtype=bool)
    g_all = np.asarray([labels.index(g) for g in groups])
    s_all = list(strata) if strata is not None else [0] * len(times)
    obs, exp, cov = np.zeros(k), np.zeros(k), np.zeros((k, k))
    for s in sorted(set(s_all), key=str):
        sel = np.asarray([v == s for v in s_all])
        t, e, g = t_all[sel], e_all[sel], g_all[sel]
        for tt in np.unique(t[e]):
            at_risk = np.bincount(g[t >= tt], minlength=k).astype(float)
            died = np.bincount(g[(t == tt) & e], minlength=k).astype(float)
            n_t, d_t = at_risk.sum(), died.sum()
            obs += died
            exp += d_t * at_risk / n_t
            if n_t > 1:  # hypergeometric covariance of the deaths at this time
                cov += d_t * (n_t - d_t) / (n_t * n_t * (n_t - 1)) * (n_t * np.diag(at_risk) - np.outer(at_risk, at_risk))
    u, v = (obs - exp)[:k - 1], cov[:k - 1, :k - 1]  # chi2 = u' V^-1 u on the first k - 1 groups
    try:
        chi2 = float(u @ np.linalg.solve(v, u)) if np.linalg.cond(v) < 1e12 else 0.0
    except np.linalg.LinAlgError:
        chi2 = 0.0
    return {"chi2": chi2, "df": k - 1, "p": chi2_sf(chi2, k - 1), "groups": labels,
            "observed": obs.tolist(), "expected": exp.tolist()}


def bootstrap_ci(data: Sequence, stat: Callable[[list], float], *, n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` (a function of a list, defined on every resample) over
    resamples with replacement of ``data`` (``scipy.stats.bootstrap``, ``method="percentile"``)."""
    res = _st.bootstrap((np.asarray(data, dtype=float),), lambda xs: stat(list(xs)), n_resamples=n_boot,
                        confidence_level=level, method="percentile", vectorized=False, rng=seed)
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def paired_t(diffs: Sequence[float]) -> dict:
    """Paired t-test of mean(diffs) = 0, two-sided (``t`` and ``p`` NaN when the differences do not vary)."""
    n = len(diffs)
    mean = float(np.mean(diffs))
    sd = float(np.std(diffs, ddof=1)) if n > 1 else float("nan")
    if not sd or sd != sd:
        return {"n": n, "mean": mean, "sd": sd, "t": float("nan"), "p": float("nan")}
    r = _st.ttest_1samp(np.asarray(diffs, dtype=float), 0.0)
    return {"n": n, "mean": mean, "sd": sd, "t": float(r.statistic), "p": float(r.pvalue)}


def spearman(x: Sequence[float], y: Sequence[float]) -> dict:
    """Spearman's rank correlation ``rho`` and its two-sided ``p`` (``scipy.stats.spearmanr``; t approximation)."""
    r = _st.spearmanr(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    return {"rho": float(r.statistic), "p": float(r.pvalue), "n": len(x)}


def mdd_paired(sd_diff: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable mean difference of a two-sided paired t-test with ``n`` pairs whose
    differences have standard deviation ``sd_diff``: (t_{1-alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n)."""
    return (t_ppf(1 - alpha / 2, n - 1) + t_ppf(power, n - 1)) * sd_diff / math.sqrt(n)


def mdd_two_sample(sd: float, n_per_arm: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable difference of means of two independent arms of ``n_per_arm`` each with a
    common standard deviation ``sd`` (two-sided t-test, df = 2n - 2)."""
    df = 2 * n_per_arm - 2
    return (t_ppf(1 - alpha / 2, df) + t_ppf(power, df)) * sd * math.sqrt(2.0 / n_per_arm)


def logrank_power(events: float, hazard_ratio: float, *, alpha: float = 0.05, share: float = 0.5) -> float:
    """Power of the two-sided two-group log-rank test at ``alpha`` to detect ``hazard_ratio`` with ``events``
    observed events, ``share`` of the subjects in one group (Schoenfeld 1981):
    Phi(|ln HR| sqrt(D share (1 - share)) - z_{1 - alpha/2})."""
    if events <= 0:
        return float("nan")
    return float(_st.norm.cdf(abs(math.log(hazard_ratio)) * math.sqrt(events * share * (1 - share))
                              - _st.norm.ppf(1 - alpha / 2)))


def min_detectable_hazard_ratio(events: float, *, alpha: float = 0.05, power: float = 0.8, share: float = 0.5) -> float:
    """The hazard ratio (< 1) a two-sided two-group log-rank test at ``alpha`` detects with ``power`` from ``events``
    events (:func:`logrank_power` solved for the ratio): exp(-(z_{1-alpha/2} + z_power) / sqrt(D share (1 - share)))."""
    if events <= 0:
        return float("nan")
    return math.exp(-(norm_ppf(1 - alpha / 2) + norm_ppf(power)) / math.sqrt(events * share * (1 - share)))


def min_differing_pairs(alpha: float = 0.05) -> int:
    """The fewest non-zero paired differences (discordant pairs) with which an exact two-sided paired test -- the sign
    test, exact McNemar; Wilcoxon's smallest p is the same, all signs equal -- can reach p < ``alpha``: the least m
    with 2 x 0.5^m < alpha."""
    m = 1
    while 2 * 0.5 ** m >= alpha:
        m += 1
    return m


def seeds_for_differing_pairs(q: float, k: int, power: float = 0.8, n_max: int = 10_000) -> int | None:
    """The fewest pairs n with P(Binomial(n, q) >= k) >= ``power``: each pair differs with probability ``q`` (the
    others are equal by construction), ``k`` differing pairs needed (:func:`min_differing_pairs`); None above ``n_max``."""
    for n in range(k, n_max + 1):
        if float(_st.binom.sf(k - 1, n, q)) >= power:
            return n
    return None


def differing_pairs_power(n: int, q: float, k: int) -> float:
    """P(Binomial(n, q) >= k): the chance that at least ``k`` of ``n`` pairs differ when each does with probability
    ``q`` -- the power of an exact paired test needing ``k`` such pairs, for an effect of one sign in all of them."""
    return float(_st.binom.sf(k - 1, n, q))
