"""Exact and standard tests, written out (scipy is not installed in the project's environment).

Every function returns plain floats; tests in ``experiments/test_protocol.py`` check them against
hand-computed values and textbook examples.

* :func:`wilcoxon_signed_rank` — paired differences; exact (all 2^n sign flips of the ranks, ties
  given average ranks) for n <= 20 non-zero differences, else the normal approximation with the tie
  correction and a continuity correction. Zero differences are dropped (Wilcoxon's method).
* :func:`mann_whitney` — two independent samples; exact (all splits) for n1 + n2 <= 20, else normal.
* :func:`fisher_exact` — 2x2 table, two-sided (sum of the tables no more likely than the observed).
* :func:`mcnemar_exact` — paired binary outcomes (binomial on the discordant pairs), two-sided.
* :func:`logrank` — k-group log-rank test (right-censored times), optionally stratified; chi-square
  with k - 1 degrees of freedom.
* :func:`bootstrap_ci` — percentile bootstrap interval of a statistic.
* :func:`paired_t` — paired t-test (Student's t survival function via the incomplete beta).
* :func:`mdd_paired` — the minimum detectable difference of a paired comparison (two-sided alpha,
  power 1 - beta) from the standard deviation of the differences.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Callable, Sequence


# ------------------------------------------------------------------ distributions
def norm_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def norm_ppf(p: float) -> float:
    """Inverse of the standard normal CDF (Acklam's rational approximation + one Newton step)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    a = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00]
    b = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01]
    c = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00]
    lo, hi = 0.02425, 1 - 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    elif p <= hi:
        q = p - 0.5
        r = q * q
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    else:
        q = math.sqrt(-2 * math.log(1 - p))
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    e = 0.5 * math.erfc(-x / math.sqrt(2)) - p  # one Newton step
    return x - e * math.sqrt(2 * math.pi) * math.exp(x * x / 2)


def _gammainc_lower_reg(s: float, x: float) -> float:
    """Regularized lower incomplete gamma P(s, x) (series / continued fraction, Numerical Recipes)."""
    if x <= 0:
        return 0.0
    if x < s + 1:
        term = total = 1.0 / s
        n = s
        for _ in range(10000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * math.exp(-x + s * math.log(x) - math.lgamma(s))
    # continued fraction for Q
    tiny = 1e-300
    b = x + 1 - s
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - s)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    q = math.exp(-x + s * math.log(x) - math.lgamma(s)) * h
    return 1.0 - q


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for a chi-square with ``df`` degrees of freedom."""
    if x <= 0:
        return 1.0
    return max(0.0, 1.0 - _gammainc_lower_reg(df / 2.0, x / 2.0))


def _betainc_reg(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (continued fraction, Numerical Recipes)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x))
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc_reg(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (tiny if abs(d) < tiny else d)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        num = m * (b - m) * x / ((a + m2 - 1) * (a + m2))
        d = 1 + num * d
        d = 1 / (tiny if abs(d) < tiny else d)
        c = 1 + num / c
        c = tiny if abs(c) < tiny else c
        h *= d * c
        num = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))
        d = 1 + num * d
        d = 1 / (tiny if abs(d) < tiny else d)
        c = 1 + num / c
        c = tiny if abs(c) < tiny else c
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return front * h / a


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    x = df / (df + t * t)
    half = 0.5 * _betainc_reg(df / 2.0, 0.5, x)
    return half if t >= 0 else 1.0 - half


def t_ppf(p: float, df: float) -> float:
    """Inverse CDF of Student's t (bisection on :func:`t_sf`)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1 - t_sf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def binom_pmf(k: int, n: int, p: float) -> float:
    return math.comb(n, k) * p ** k * (1 - p) ** (n - k)


# ------------------------------------------------------------------ ranks
def rankdata(values: Sequence[float]) -> list[float]:
    """Average ranks (1-based), ties share the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


# ------------------------------------------------------------------ tests
def wilcoxon_signed_rank(diffs: Sequence[float], *, exact_max: int = 20) -> dict:
    """Wilcoxon signed-rank test of paired differences (H0: symmetric about 0), two-sided.

    Returns ``n`` (non-zero differences), ``w_plus`` (sum of the ranks of positive differences),
    ``z`` (normal statistic, tie-corrected; positive when the differences lean positive), ``p``
    (two-sided; exact for n <= exact_max), ``method``, ``median`` (of all differences),
    ``frac_positive`` (of the non-zero ones).
    """
    all_d = [float(d) for d in diffs]
    d = [x for x in all_d if x != 0.0]
    n = len(d)
    med = statistics_median(all_d) if all_d else float("nan")
    if n == 0:
        return {"n": 0, "w_plus": 0.0, "z": 0.0, "p": 1.0, "method": "none", "median": med, "frac_positive": float("nan")}
    ranks = rankdata([abs(x) for x in d])
    w_plus = sum(r for r, x in zip(ranks, d) if x > 0)
    mean = n * (n + 1) / 4.0
    ties: dict[float, int] = {}
    for r in ranks:
        ties[r] = ties.get(r, 0) + 1
    var = n * (n + 1) * (2 * n + 1) / 24.0 - sum(t ** 3 - t for t in ties.values()) / 48.0
    z = (w_plus - mean) / math.sqrt(var) if var > 0 else 0.0
    if n <= exact_max:
        # exact null distribution of W+ over all 2^n sign assignments of these (tied) ranks
        dist: dict[float, int] = {0.0: 1}
        for r in ranks:
            new: dict[float, int] = {}
            for s, c in dist.items():
                new[s] = new.get(s, 0) + c
                new[s + r] = new.get(s + r, 0) + c
            dist = new
        total = 2 ** n
        dev = abs(w_plus - mean)
        p = sum(c for s, c in dist.items() if abs(s - mean) >= dev - 1e-9) / total
        method = "exact"
    else:
        cc = 0.5 if abs(w_plus - mean) >= 0.5 else 0.0
        zc = (abs(w_plus - mean) - cc) / math.sqrt(var) if var > 0 else 0.0
        p = min(1.0, 2 * norm_sf(zc))
        method = "normal"
    return {"n": n, "w_plus": w_plus, "z": z, "p": min(1.0, p), "method": method, "median": med,
            "frac_positive": sum(1 for x in d if x > 0) / n}


def statistics_median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2.0


def mann_whitney(x: Sequence[float], y: Sequence[float], *, exact_max: int = 20) -> dict:
    """Mann-Whitney U test, two-sided. ``u`` = U of ``x`` (pairs with x > y, ties 1/2); exact over all
    splits of the pooled ranks when len(x) + len(y) <= exact_max, else normal with tie correction."""
    n1, n2 = len(x), len(y)
    pooled = list(x) + list(y)
    ranks = rankdata(pooled)
    r1 = sum(ranks[:n1])
    u = r1 - n1 * (n1 + 1) / 2.0
    mean = n1 * n2 / 2.0
    if n1 + n2 <= exact_max:
        count = extreme = 0
        dev = abs(u - mean)
        for idx in itertools.combinations(range(n1 + n2), n1):
            uu = sum(ranks[i] for i in idx) - n1 * (n1 + 1) / 2.0
            count += 1
            if abs(uu - mean) >= dev - 1e-9:
                extreme += 1
        return {"u": u, "p": extreme / count, "method": "exact", "n1": n1, "n2": n2}
    ties: dict[float, int] = {}
    for r in ranks:
        ties[r] = ties.get(r, 0) + 1
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - sum(t ** 3 - t for t in ties.values()) / (n * (n - 1)))
    z = (abs(u - mean) - 0.5) / math.sqrt(var) if var > 0 else 0.0
    return {"u": u, "p": min(1.0, 2 * norm_sf(max(z, 0.0))), "method": "normal", "n1": n1, "n2": n2}


def _hypergeom_pmf(k: int, row1: int, col1: int, n: int) -> float:
    return math.comb(col1, k) * math.comb(n - col1, row1 - k) / math.comb(n, row1)


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact p for the table [[a, b], [c, d]] (tables no more likely than the observed)."""
    row1, col1, n = a + b, a + c, a + b + c + d
    lo, hi = max(0, row1 + col1 - n), min(row1, col1)
    p_obs = _hypergeom_pmf(a, row1, col1, n)
    return min(1.0, sum(p for k in range(lo, hi + 1)
                        if (p := _hypergeom_pmf(k, row1, col1, n)) <= p_obs * (1 + 1e-7)))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: ``b`` pairs (yes, no) and ``c`` pairs (no, yes)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    return min(1.0, 2 * sum(binom_pmf(i, n, 0.5) for i in range(k + 1)))


def logrank(times: Sequence[float], events: Sequence[int], groups: Sequence, strata: Sequence | None = None) -> dict:
    """Log-rank test of equal hazards across ``groups`` (k >= 2), events 1 = observed, 0 = censored
    at that time; with ``strata`` the stratified test (O - E and their covariances summed over strata).
    Returns ``chi2``, ``df``, ``p``, and per group ``observed`` / ``expected``."""
    labels = sorted(set(groups), key=str)
    k = len(labels)
    if k < 2:
        raise ValueError("logrank needs at least two groups")
    strata = list(strata) if strata is not None else [0] * len(times)
    o_minus_e = [0.0] * k
    obs = [0.0] * k
    exp = [0.0] * k
    cov = [[0.0] * k for _ in range(k)]
    for s in sorted(set(strata), key=str):
        idx = [i for i in range(len(times)) if strata[i] == s]
        event_times = sorted({times[i] for i in idx if events[i]})
        for t in event_times:
            at_risk = [sum(1 for i in idx if groups[i] == g and times[i] >= t) for g in labels]
            died = [sum(1 for i in idx if groups[i] == g and times[i] == t and events[i]) for g in labels]
            n_t, d_t = sum(at_risk), sum(died)
            if n_t == 0:
                continue
            for j in range(k):
                e = d_t * at_risk[j] / n_t
                obs[j] += died[j]
                exp[j] += e
                o_minus_e[j] += died[j] - e
            if n_t > 1:
                f = d_t * (n_t - d_t) / (n_t * n_t * (n_t - 1))
                for j in range(k):
                    for l in range(k):
                        cov[j][l] += f * ((n_t if j == l else 0) * at_risk[j] - at_risk[j] * at_risk[l])
    # chi2 = u' V^- u on the first k-1 groups
    m = k - 1
    u = o_minus_e[:m]
    v = [row[:m] for row in cov[:m]]
    chi2 = _quad_inv(u, v)
    return {"chi2": chi2, "df": m, "p": chi2_sf(chi2, m), "groups": labels, "observed": obs, "expected": exp}


def _quad_inv(u: list[float], v: list[list[float]]) -> float:
    """u' V^{-1} u by Gauss-Jordan elimination (V symmetric positive definite); 0 when V is singular."""
    n = len(u)
    a = [row[:] + [u[i]] for i, row in enumerate(v)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12:
            return 0.0
        a[col], a[piv] = a[piv], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                for c in range(col, n + 1):
                    a[r][c] -= f * a[col][c]
    x = [a[i][n] / a[i][i] for i in range(n)]
    return sum(ui * xi for ui, xi in zip(u, x))


def bootstrap_ci(data: Sequence, stat: Callable[[list], float], *, n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over resamples (with replacement) of ``data``;
    resamples where ``stat`` is undefined (None or NaN) are skipped."""
    rng = random.Random(seed)
    data = list(data)
    vals = []
    for _ in range(n_boot):
        v = stat([data[rng.randrange(len(data))] for _ in data])
        if v is not None and v == v:
            vals.append(v)
    if not vals:
        return (float("nan"), float("nan"))
    vals.sort()
    lo = vals[int(math.floor((1 - level) / 2 * (len(vals) - 1)))]
    hi = vals[int(math.ceil((1 + level) / 2 * (len(vals) - 1)))]
    return (lo, hi)


def paired_t(diffs: Sequence[float]) -> dict:
    """Paired t-test of mean(diffs) = 0, two-sided."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1)) if n > 1 else float("nan")
    if not sd or sd != sd:
        return {"n": n, "mean": mean, "sd": sd, "t": float("nan"), "p": float("nan")}
    t = mean / (sd / math.sqrt(n))
    return {"n": n, "mean": mean, "sd": sd, "t": t, "p": min(1.0, 2 * t_sf(abs(t), n - 1))}


def mdd_paired(sd_diff: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable mean difference of a two-sided paired t-test with ``n`` pairs whose
    differences have standard deviation ``sd_diff``: (t_{1-alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n)."""
    return (t_ppf(1 - alpha / 2, n - 1) + t_ppf(power, n - 1)) * sd_diff / math.sqrt(n)


def mdd_two_sample(sd: float, n_per_arm: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable difference of means of two independent arms of ``n_per_arm`` each with a
    common standard deviation ``sd`` (two-sided t-test, df = 2n - 2)."""
    df = 2 * n_per_arm - 2
    return (t_ppf(1 - alpha / 2, df) + t_ppf(power, df)) * sd * math.sqrt(2.0 / n_per_arm)
