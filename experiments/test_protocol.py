"""Fast tests of the protocol's statistics and analysis (no training): hand-computed values."""

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.protocol import stats  # noqa: E402


def test_distributions():
    assert stats.norm_sf(0.0) == pytest.approx(0.5)
    assert stats.norm_ppf(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert stats.norm_ppf(0.01) == pytest.approx(-2.326348, abs=1e-6)
    assert stats.chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    assert stats.chi2_sf(5.991464547107979, 2) == pytest.approx(0.05, abs=1e-9)
    assert stats.chi2_sf(20.0, 2) == pytest.approx(math.exp(-10.0), rel=1e-9)  # df 2: exp(-x/2)
    assert stats.t_sf(2.228138851986274, 10) == pytest.approx(0.025, abs=1e-9)
    assert stats.t_sf(0.0, 3) == pytest.approx(0.5)
    assert stats.t_sf(1.0, 1) == pytest.approx(0.25, abs=1e-12)  # Cauchy: 1/2 - atan(1)/pi
    assert stats.t_ppf(0.975, 10) == pytest.approx(2.228139, abs=1e-5)


def test_rankdata_ties():
    assert stats.rankdata([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]


def test_wilcoxon_exact_by_hand():
    # n = 5, all positive: W+ = 15, only W+ in {0, 15} are as extreme: p = 2 / 32
    r = stats.wilcoxon_signed_rank([1, 2, 3, 4, 5])
    assert (r["w_plus"], r["method"]) == (15.0, "exact") and r["p"] == pytest.approx(2 / 32)
    # one negative of rank 2: W+ = 13; sums <= 2 or >= 13 have 3 + 3 of the 32 sign patterns
    r = stats.wilcoxon_signed_rank([1, -2, 3, 4, 5])
    assert r["w_plus"] == 13.0 and r["p"] == pytest.approx(6 / 32)
    # zeros are dropped
    assert stats.wilcoxon_signed_rank([0, 0, 1, 2, 3, 4, 5])["p"] == pytest.approx(2 / 32)
    assert stats.wilcoxon_signed_rank([0, 0])["p"] == 1.0


def test_wilcoxon_normal_by_hand():
    d = list(range(1, 31))  # n = 30 > 20: W+ = 465, mean 232.5, var = 30*31*61/24
    r = stats.wilcoxon_signed_rank(d)
    sd = math.sqrt(30 * 31 * 61 / 24)
    assert r["method"] == "normal"
    assert r["z"] == pytest.approx(232.5 / sd)
    assert r["p"] == pytest.approx(2 * stats.norm_sf(232.0 / sd))
    neg = stats.wilcoxon_signed_rank([-x for x in d])
    assert neg["z"] == pytest.approx(-r["z"]) and neg["p"] == pytest.approx(r["p"])


def _brute_wilcoxon(d):
    """Two-sided exact p by enumerating every sign pattern of the (tied, average) ranks of the non-zero |d|."""
    import itertools

    d = [x for x in d if x != 0]
    ranks = stats.rankdata([abs(x) for x in d])
    n, mean = len(d), len(d) * (len(d) + 1) / 4
    dev = abs(sum(r for r, x in zip(ranks, d) if x > 0) - mean)
    sums = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product((0, 1), repeat=n)]
    return sum(abs(s - mean) >= dev - 1e-9 for s in sums) / 2 ** n


def test_wilcoxon_tied_ranks_are_exact():
    """With tied |d| scipy's method='exact' rounds W+ onto the untied distribution (not exact): the module
    enumerates the sign flips of the tied ranks instead; a zero is dropped, not ranked."""
    from scipy.stats import wilcoxon

    d = [0.5, 0.5, -0.5, 1.0, 1.0, 1.5, -2.0, 2.0, 2.0, 3.0, 0.0, 0.25]
    r = stats.wilcoxon_signed_rank(d)
    assert r["method"] == "exact-ties" and r["n"] == 11
    assert r["p"] == pytest.approx(_brute_wilcoxon(d), rel=1e-12)
    assert wilcoxon([x for x in d if x], method="exact").pvalue != pytest.approx(r["p"], rel=1e-6)
    # 16 paired seeds, as in claim 7: pass@1 differences on a 1/4000 grid tie often
    rng = __import__("random").Random(3)
    d16 = [rng.choice([-3, -1, 1, 1, 2, 2, 4, 5]) / 4000 for _ in range(16)]
    r16 = stats.wilcoxon_signed_rank(d16)
    assert r16["method"] == "exact-ties" and r16["p"] == pytest.approx(_brute_wilcoxon(d16), rel=1e-12)
    # without ties the module's p is scipy's exact one
    assert stats.wilcoxon_signed_rank([0.1, -0.2, 0.3, 0.4, 0.5])["p"] == pytest.approx(6 / 32)


def test_wilcoxon_tied_ranks_p_is_scipys_permutation_test_bit_for_bit():
    """The vectorised sign-flip enumeration gives the very float scipy.stats.wilcoxon does with
    PermutationMethod(n_resamples=inf) (which ranks every flip again, one at a time: slow)."""
    from scipy.stats import PermutationMethod, wilcoxon

    rng = __import__("random").Random(5)
    for n in (6, 9, 12):
        for _ in range(3):
            d = [rng.choice([-3, -1, 1, 1, 2, 2, 4, 5]) / 4000 for _ in range(n)]
            r = stats.wilcoxon_signed_rank(d)
            assert r["method"] == "exact-ties"
            assert r["p"] == min(1.0, float(wilcoxon(d, method=PermutationMethod(n_resamples=float("inf"))).pvalue))


def test_mann_whitney_exact():
    r = stats.mann_whitney([1, 2, 3], [4, 5, 6])
    assert r["u"] == 0.0 and r["p"] == pytest.approx(2 / 20)
    assert stats.mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])["p"] == pytest.approx(2 / 252)


def test_mann_whitney_tied_ranks_are_exact():
    """Ties: every split of the pooled tied ranks, as extreme = |U - n1 n2 / 2| at least the observed."""
    import itertools

    x, y = [1, 2, 2, 3, 5], [2, 4, 4, 6, 7, 8]
    r = stats.mann_whitney(x, y)
    ranks = stats.rankdata(x + y)
    us = [sum(ranks[i] for i in idx) - 15 for idx in itertools.combinations(range(11), 5)]
    brute = sum(abs(u - 15) >= abs(r["u"] - 15) - 1e-9 for u in us) / len(us)
    assert (r["u"], r["method"]) == (5.0, "exact-ties") and r["p"] == pytest.approx(brute, rel=1e-12)
    assert r["p"] == pytest.approx(32 / 462)  # the previous hand-written enumeration's value


def test_mann_whitney_normal_by_hand():
    x, y = list(range(0, 24, 2)), list(range(1, 25, 2))  # 12 vs 12 (n > 20): U = 66, mean 72, var 300
    r = stats.mann_whitney(x, y)
    assert (r["u"], r["method"]) == (66.0, "normal")
    assert r["p"] == pytest.approx(2 * stats.norm_sf(5.5 / math.sqrt(300)), rel=1e-12)


def test_fisher_and_mcnemar():
    assert stats.fisher_exact(3, 0, 2, 1) == pytest.approx(1.0)  # "3/3 vs 2/3"
    assert stats.fisher_exact(3, 1, 1, 3) == pytest.approx(0.4857142857)  # tea tasting
    assert stats.fisher_exact(6, 0, 0, 6) == pytest.approx(2 / 924)
    assert stats.mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert stats.mcnemar_exact(3, 3) == pytest.approx(1.0)


def test_logrank_by_hand():
    # A dies at 1, 2, 3; B at 4, 5, 6. O_A = 3, E_A = 3/6 + 2/5 + 1/4 = 1.15,
    # V = 0.25 + 0.24 + 0.1875 = 0.6775, chi2 = 1.85^2 / 0.6775
    r = stats.logrank([1, 2, 3, 4, 5, 6], [1] * 6, ["A"] * 3 + ["B"] * 3)
    assert r["observed"][0] == 3 and r["expected"][0] == pytest.approx(1.15)
    assert r["chi2"] == pytest.approx(1.85 ** 2 / 0.6775)
    assert r["p"] == pytest.approx(stats.chi2_sf(1.85 ** 2 / 0.6775, 1))
    # censoring: B never dies (censored at 10): same first three event times, then nothing
    r2 = stats.logrank([1, 2, 3, 10, 10, 10], [1, 1, 1, 0, 0, 0], ["A"] * 3 + ["B"] * 3)
    assert r2["chi2"] == pytest.approx(r["chi2"])
    # stratified: two identical strata double O - E and V, so chi2 doubles
    r3 = stats.logrank([1, 2, 3, 4, 5, 6] * 2, [1] * 12, (["A"] * 3 + ["B"] * 3) * 2, strata=[0] * 6 + [1] * 6)
    assert r3["chi2"] == pytest.approx(2 * r["chi2"])


def test_logrank_equals_scipy_where_scipy_applies():
    """Two groups, no strata, censored times with tied events: chi2 = scipy.stats.logrank's z squared."""
    from scipy.stats import CensoredData
    from scipy.stats import logrank as sp_logrank

    ta, ea = [3, 5, 5, 8, 10, 12, 40, 40], [1, 1, 1, 1, 0, 1, 0, 0]
    tb, eb = [2, 3, 3, 4, 6, 6, 9, 40], [1, 1, 1, 0, 1, 1, 1, 0]
    r = stats.logrank(ta + tb, ea + eb, ["a"] * 8 + ["b"] * 8)

    def cens(t, e):
        return CensoredData(uncensored=[x for x, k in zip(t, e) if k], right=[x for x, k in zip(t, e) if not k])

    sp = sp_logrank(cens(ta, ea), cens(tb, eb))
    assert r["chi2"] == pytest.approx(sp.statistic ** 2, rel=1e-10)
    assert r["p"] == pytest.approx(sp.pvalue, rel=1e-10)
    # three groups: df 2, and relabelling the groups does not change the test
    r3 = stats.logrank(ta + tb + ta, ea + eb + eb, ["a"] * 8 + ["b"] * 8 + ["c"] * 8)
    r3b = stats.logrank(ta + tb + ta, ea + eb + eb, ["z"] * 8 + ["b"] * 8 + ["c"] * 8)
    assert r3["df"] == 2 and r3["chi2"] == pytest.approx(r3b["chi2"], rel=1e-10)


def test_bootstrap_and_t():
    assert stats.bootstrap_ci([2.0] * 10, lambda xs: sum(xs) / len(xs)) == (2.0, 2.0)
    lo, hi = stats.bootstrap_ci(list(range(100)), lambda xs: sum(xs) / len(xs), n_boot=500)
    assert lo < 49.5 < hi
    r = stats.paired_t([1.0, 2.0, 3.0])  # mean 2, sd 1, t = 2 sqrt(3)
    assert r["t"] == pytest.approx(2 * math.sqrt(3)) and r["p"] == pytest.approx(2 * stats.t_sf(2 * math.sqrt(3), 2))
    assert stats.mdd_paired(1.0, 10) == pytest.approx((2.262157 + 0.883330) / math.sqrt(10), abs=1e-4)


def test_spearman_by_hand():
    # ranks of x: 1 2 3 4 5, of y: 2 1 4 3 5; sum d^2 = 4, rho = 1 - 6 * 4 / (5 * 24) = 0.8
    r = stats.spearman([1, 2, 3, 4, 5], [20, 10, 40, 30, 50])
    assert r["rho"] == pytest.approx(0.8, rel=1e-12)
    t = 0.8 * math.sqrt(3 / (1 - 0.64))
    assert r["p"] == pytest.approx(2 * stats.t_sf(t, 3), rel=1e-9)


def test_collapse_criterion():
    from experiments.protocol.claim2 import collapse_step

    assert collapse_step([10.0] * 40) is None
    # the 5-step mean over steps 1-5 is 10; it first falls below 5 when the window holds three 0s
    r = [10.0] * 10 + [0.0] * 30
    assert collapse_step(r) == 13
    assert collapse_step([10.0] * 3) is None


def test_error_prompts():
    from experiments.protocol.startmodels import is_error_prompt

    assert is_error_prompt("What is 59 + 7 - 8?")
    assert not is_error_prompt("Compute 59 + 7 - 6.")
    assert is_error_prompt("How much is 10 + 2 - 9?")


def test_smol_detailed_greedy_matches_cli(tmp_path):
    """The SmolLM2 runner's per-problem evaluation is the CLI's greedy accuracy, with verdicts."""
    from gtpo.app import greedy_accuracy as _greedy_accuracy
    from gtpo.config import GTPOConfig
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.testing import build_tiny_model

    from experiments.protocol import smol

    path = build_tiny_model(tmp_path / "tiny", seed=0)
    model, tok = load_model_and_tokenizer(path)
    # a scorer that accepts whatever the tiny random model writes for half the problems
    rows = [{"prompt": f"Calculate {a} + {a}.", "answer": str(2 * a)} for a in range(6)]

    def reward(completions, answer, **kw):
        return [float(len(c) % 2 == 0) for c in completions]

    config = GTPOConfig(output_dir=str(tmp_path / "run"), max_completion_length=8)
    res = smol.detailed_greedy(model, tok, rows, reward, config)
    assert len(res["correct"]) == len(res["texts"]) == len(rows)
    assert res["correct"] == [int(len(t) % 2 == 0) for t in res["texts"]]
    assert res["accuracy"] == sum(res["correct"]) / len(rows)
    assert _greedy_accuracy(model, tok, rows, reward, config) == pytest.approx(res["accuracy"], abs=0)


def test_critical_lr_by_hand():
    """Collapse fractions 0 (x2), 1/4 (x4), 3/4 (x8): 1/2 is crossed halfway between x4 and x8 on a log
    scale, sqrt(4 * 8); a fraction >= 1/2 at the lowest rate returns that rate; never: None."""
    from experiments.protocol.report.claim2 import critical_lr

    def runs(arm, f, n_coll, n):
        return [{"arm": arm, "lr": f, "collapsed": i < n_coll} for i in range(n)]

    outc = runs("a", 2.0, 0, 2) + runs("a", 4.0, 1, 4) + runs("a", 8.0, 3, 4)
    assert critical_lr(outc, "a", [2.0, 4.0, 8.0]) == pytest.approx(math.sqrt(32.0), rel=1e-12)
    assert critical_lr(runs("b", 2.0, 1, 2) + runs("b", 4.0, 2, 2), "b", [2.0, 4.0]) == 2.0
    assert critical_lr(runs("c", 2.0, 0, 3) + runs("c", 4.0, 1, 3), "c", [2.0, 4.0]) is None


def test_critical_ratio_bootstrap():
    """Without seed noise (every seed of a rate collapses alike) the bootstrap has one value: arm b starts
    collapsing between x4 and x8 at sqrt(32), arm a at x2, ratio sqrt(32) / 2 exactly; a copy of an arm
    against itself contains 1; an arm that never collapses gives an upper end of +inf."""
    from experiments.protocol.report.claim2 import critical_ratio_ci

    def runs(arm, f, n_coll, n):
        return [{"arm": arm, "lr": f, "collapsed": i < n_coll} for i in range(n)]

    lrs = [2.0, 4.0, 8.0]
    ref = runs("a", 2.0, 4, 4) + runs("a", 4.0, 4, 4) + runs("a", 8.0, 4, 4)
    lo, hi = critical_ratio_ci(ref + runs("b", 2.0, 0, 4) + runs("b", 4.0, 0, 4) + runs("b", 8.0, 4, 4), "b", "a", lrs)
    assert lo == hi == pytest.approx(math.sqrt(32.0) / 2.0, rel=1e-12)
    noisy = runs("c", 2.0, 1, 6) + runs("c", 4.0, 3, 6) + runs("c", 8.0, 5, 6)
    twin = [dict(o, arm="d") for o in noisy]
    lo, hi = critical_ratio_ci(noisy + twin, "d", "c", lrs)
    assert lo < 1.0 < hi
    lo, hi = critical_ratio_ci(ref + runs("e", 2.0, 0, 4) + runs("e", 4.0, 0, 4) + runs("e", 8.0, 0, 4), "e", "a", lrs)
    assert lo == hi == math.inf


def test_report_regenerates_from_committed_data(tmp_path, monkeypatch):
    """docs/results.md is computed from experiments/data alone: regenerating it into a temporary place
    gives the committed document, byte for byte (every table and verdict; figures are not compared)."""
    from experiments.protocol.report import claim2, document, tables

    committed = open(tables.DOCS_MD).read()
    monkeypatch.setattr(tables, "DOCS_MD", str(tmp_path / "results.md"))
    monkeypatch.setattr(tables, "FIG_DIR", str(tmp_path / "results" / "protocol"))
    committed_readme = open(tables.README_MD).read()
    readme = tmp_path / "README.md"
    readme.write_text(committed_readme)
    monkeypatch.setattr(tables, "README_MD", str(readme))
    out = document.write_results()
    assert open(out).read() == committed
    assert readme.read_text() == committed_readme  # the README's generated row (claims 3-6) is the committed one
    for rep, png in (("a", "claim2_stress.png"), ("b", "claim2_stress_b.png")):
        if os.path.isfile(os.path.join(claim2.DATA, claim2.STRESS_FILES[rep])):
            assert (tmp_path / "results" / "protocol" / png).is_file()


def test_claim7_splits_are_disjoint():
    """Held-out (500) and validation (200) share no operands with each other or with the RL prompts; the
    held-out split starts with the suite's 200 test problems; gold answers are a + b - c."""
    import pretrain  # experiments/ (added to sys.path by startmodels.make_splits)

    from experiments.protocol import startmodels

    heldout, val, excluded = startmodels.make_splits()
    _, train, test = pretrain.make_splits(0)
    h, v, t = ({tuple(p["_ops"]) for p in xs} for xs in (heldout, val, train))
    assert (len(heldout), len(val)) == (startmodels.N_HELDOUT, startmodels.N_VAL) and len(h) == 500 and len(v) == 200
    assert not (h & v) and not (h & t) and not (v & t) and excluded == h | v
    assert [p["question"] for p in heldout[:200]] == [p["question"] for p in test]
    for p in heldout + val:
        a, b, c = p["_ops"]
        assert p["answer"] == str(a + b - c) and f"{a} + {b} - {c}" in p["question"]
    assert {p["origin"] for p in heldout} <= {"test", "never_seen", "pretrain_pool"}


def test_claim7_chosen_lr(tmp_path, monkeypatch):
    """The arm's rate is the highest mean validation pass@1 over the tuning seeds (ties: the smaller rate);
    None while a tuning run has no evaluation."""
    import dataclasses

    from experiments.protocol import claim7 as c7
    from experiments.protocol.common import write_json

    claim7 = dataclasses.replace(c7.FIRST, runs=str(tmp_path), tune_lrs=(1e-4, 2e-4, 4e-4), tune_seeds=(0, 1))
    scores = {1e-4: (0.25, 0.25), 2e-4: (0.375, 0.125), 4e-4: (0.3125, 0.125)}  # means 0.25, 0.25, 0.21875 (exact)
    for lr, vals in scores.items():
        for s, v in zip((0, 1), vals):
            if (lr, s) != (4e-4, 1):
                write_json(claim7.eval_path(claim7.run_dir("tune", "a", lr, s)), {"metrics": {"pass@1": v}})
    assert claim7.chosen_lr("a") is None
    write_json(claim7.eval_path(claim7.run_dir("tune", "a", 4e-4, 1)), {"metrics": {"pass@1": 0.125}})
    assert claim7.chosen_lr("a") == 1e-4
    write_json(claim7.eval_path(claim7.run_dir("tune", "a", 2e-4, 1)), {"metrics": {"pass@1": 0.25}})
    assert claim7.chosen_lr("a") == 2e-4


def _stress_start(**kw):
    base = {"error_rate_error_prompts": 0.851, "error_rate_other": 0.076, "entropy_other": 0.178}
    return {**base, **kw}


def test_stress_refuses_to_mix_two_models(tmp_path):
    import json

    from experiments.protocol import claim2
    from experiments.protocol.common import write_jsonl_gz

    model = tmp_path / "stress-model"
    model.mkdir()
    data = str(tmp_path / "stress.jsonl.gz")
    rep = claim2.Replicate("t", str(model), str(tmp_path / "runs"), data)
    write_jsonl_gz(data, [{"kind": "start", "build_seconds": 850.0, **_stress_start()}])
    # the same model built at another speed: the build keys do not count
    (model / "start.json").write_text(json.dumps({"build_seconds": 452.0, **_stress_start()}))
    # no model on this machine: export keeps the committed runs, nothing to mix
    claim2.check_same_model(claim2.Replicate("t", str(tmp_path / "not-built"), rep.runs, data))
    claim2.check_same_model(rep)
    (model / "start.json").write_text(json.dumps(_stress_start(error_rate_other=0.112)))
    with pytest.raises(SystemExit, match="error_rate_other"):
        claim2.check_same_model(rep)
    # no data file yet: nothing to mix
    claim2.check_same_model(claim2.Replicate("t", str(model), rep.runs, str(tmp_path / "none.jsonl.gz")))


def test_claim1_refuses_to_mix_two_states():
    import copy

    import torch

    from experiments.protocol import claim1

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    fp = claim1.state_fingerprint(model, opt)
    twin = copy.deepcopy(model)
    assert claim1.state_fingerprint(twin, torch.optim.AdamW(twin.parameters(), lr=0.1)) == fp
    with torch.no_grad():
        twin.bias[1] += 1e-6  # a tiny change of one weight
    assert claim1.state_fingerprint(twin, opt) != fp
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    moved = claim1.state_fingerprint(model, opt)
    assert moved != fp
    with torch.no_grad():  # the same weights with other optimizer moments: another state
        for p, q in zip(model.parameters(), twin.parameters()):
            q.copy_(p)
    assert claim1.state_fingerprint(model, torch.optim.AdamW(model.parameters())) != moved
    claim1.check_resume([], fp, "f.jsonl.gz")
    claim1.check_resume([{"try": 0}], fp, "f.jsonl.gz")  # written before fingerprints: cannot be checked
    claim1.check_resume([{"try": 0}, {"state_fingerprint": fp}], fp, "f.jsonl.gz")
    with pytest.raises(SystemExit, match="f.jsonl.gz .*new --label"):
        claim1.check_resume([{"state_fingerprint": fp}], moved, "f.jsonl.gz")


def test_stress_replicates_are_kept_apart():
    from experiments.protocol import claim2

    reps = list(claim2.REPLICATES.values())
    for field in ("model", "runs", "data"):
        assert len({getattr(r, field) for r in reps}) == len(reps), field
    assert claim2.argv_for(claim2.REPLICATES["b"], "grpo", 10.0, 3)[4].endswith("tiny-v3-s0-stress-b/model")


def test_stress_export_keeps_committed_runs(tmp_path):
    from experiments.protocol import claim2
    from experiments.protocol.common import read_jsonl_gz, write_jsonl_gz

    data = str(tmp_path / "stress.jsonl.gz")
    # no run directory on this machine
    rep = claim2.Replicate("t", str(tmp_path / "not-built"), str(tmp_path / "runs"), data)
    old = [{"kind": "start", **_stress_start()},
           {"kind": "run", "arm": "grpo", "lr_factor": 10.0, "lr": 1e-3, "seed": 3, "steps": [{"step": 1}]},
           {"kind": "run", "arm": "unknown_arm", "lr_factor": 10.0, "lr": 1e-3, "seed": 0, "steps": []}]
    write_jsonl_gz(data, old)
    claim2.export(rep)
    assert read_jsonl_gz(data) == old[:2]  # runs of arms no longer in the grid are not resurrected


def test_smol_export_keeps_committed_runs(tmp_path, monkeypatch):
    import json

    from experiments.protocol import smol
    from experiments.protocol.common import read_jsonl_gz, write_jsonl_gz

    monkeypatch.setattr(smol, "SMOL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(smol, "BEFORE_CACHE", str(tmp_path / "runs" / "before.json"))  # not on this machine
    data = str(tmp_path / "smol.jsonl.gz")
    before = {"kind": "before", "accuracy": 0.09}
    old = [before,
           {"kind": "run", "arm": "gtpo_lr3e-4_2threads", "seed": 0, "summary": {"accuracy_after": 0.5}},
           {"kind": "run", "arm": "retired_arm", "seed": 0, "summary": {}},
           {"kind": "run", "arm": "grpo_lr3e-4", "seed": 1, "summary": {"accuracy_after": 0.3}}]
    write_jsonl_gz(data, old)
    with pytest.raises(SystemExit, match="no finished runs"):  # nothing here: the file stays as it is
        smol.export(data)
    assert read_jsonl_gz(data) == old
    d = tmp_path / "runs" / "gtpo_lr3e-4_2threads" / "seed0"  # this run redone here, in its directory
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"accuracy_after": 0.17}))
    (d / "eval_after.json").write_text(json.dumps({"texts": []}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.25, "note": "text"}) + "\n")
    smol.export(data)
    recs = read_jsonl_gz(data)
    assert [(r["kind"], r.get("arm"), r.get("seed")) for r in recs] == [
        ("before", None, None), ("run", "grpo_lr3e-4", 1), ("run", "gtpo_lr3e-4_2threads", 0)]
    assert recs[0] == before
    assert recs[1] == old[3]
    assert recs[2]["summary"] == {"accuracy_after": 0.17} and recs[2]["steps"] == [{"step": 1, "reward/mean": 0.25}]
    assert recs[2]["argv"][:4] == ["--demo", "--seed", "0", "--learning_rate"]


def test_item5_is_judged_on_every_thread_count():
    from experiments.protocol.report import smol as report

    def runs(gains):
        return {s: {"gain": g, "collapsed": g < 0} for s, g in enumerate(gains)}

    good = runs([0.32, 0.26, 0.21, 0.36, 0.165])
    res = {"stats": {"gtpo_lr3e-4": good}}
    assert report._item5_state(res, "gtpo_lr3e-4").startswith("met: `gtpo_lr3e-4`")
    res["stats"]["gtpo_lr3e-4_2threads"] = runs([0.08, 0.2, 0.3, 0.15, 0.12])
    state = report._item5_state(res, "gtpo_lr3e-4")
    assert state.startswith("not met: ") and "4 of 5 gained ≥ 10 points (worst +8.0)" in state
    res["stats"]["gtpo_lr3e-4"] = runs([0.32, 0.26, 0.21, 0.36])  # four seeds are not the five asked
    res["stats"]["gtpo_lr3e-4_2threads"] = good
    assert report._item5_state(res, "gtpo_lr3e-4").startswith("not met: ")
    assert report._item5_state({"stats": {}}, "gtpo_lr3e-4") == "no runs of the default arm"


def test_smol_arms_pin_what_the_default_may_change():
    """Every arm names its learning rate and step count, so changing src/gtpo/configs/default.yaml (lr 3e-4
    over 30 steps -> 2e-4 over 40 on 2026-12-02) cannot change what a committed arm means; the default arm's
    overrides are exactly what the shipped default.yaml sets."""
    import yaml

    from experiments.protocol import smol
    from experiments.protocol.common import ROOT

    for arm, argv in smol.ARMS.items():
        assert "--learning_rate" in argv and "--max_steps" in argv, arm
    default = yaml.safe_load(open(os.path.join(ROOT, "src", "gtpo", "configs", "default.yaml")))
    over = dict(zip(smol.ARMS[smol.DEFAULT_ARM][::2], smol.ARMS[smol.DEFAULT_ARM][1::2]))
    assert float(over["--learning_rate"]) == default["learning_rate"]
    assert int(over["--max_steps"]) == default["max_steps"]
    assert set(over) == {"--learning_rate", "--max_steps"}  # nothing else differs from the shipped default
    assert smol.same_settings(smol.DEFAULT_ARM) == ("gtpo_lr2e-4_40",)
    assert smol.same_settings("gtpo_lr3e-4") == ("gtpo_lr3e-4_2threads",)


def test_claim7_attribution_order_and_rule():
    """The declared blocks in order; GTPO and GRPO reruns scored greedily (seed 0 also sampled); the rule."""
    from experiments.protocol.claim7 import ATTRIBUTION

    jobs = ATTRIBUTION.jobs()
    assert jobs[:4] == [("grpo_gamma", 0), ("gtpo_gamma0", 0), ("grpo_gamma", 1), ("gtpo_gamma0", 1)]
    assert len(jobs) == len(set(jobs)) == 12 * len(ATTRIBUTION.arms)
    assert ATTRIBUTION.jobs((4,)) == [(a, s) for s in range(6) for a in ("gtpo", "grpo")]
    assert ATTRIBUTION.modes("gtpo", 0) == ("sampled", "greedy") and ATTRIBUTION.modes("grpo", 3) == ("greedy",)
    assert ATTRIBUTION.modes("grpo_gamma", 3) == ("sampled", "greedy")
    a = ATTRIBUTION.alpha
    assert a == pytest.approx(0.05 / 7)
    assert ATTRIBUTION.attribution(a / 2, 0.02, 0.5, 0.01) == "the gamma shift carries the gain"
    assert ATTRIBUTION.attribution(0.5, 0.02, a / 2, 0.01).startswith("the rest of GTPO")
    assert ATTRIBUTION.attribution(a / 2, 0.02, a / 2, 0.01) == "both contribute"
    assert ATTRIBUTION.attribution(a / 2, -0.02, 0.5, 0.01) == "none identified"  # significant, but a loss


def test_claim2_released_pilot_and_main_grid():
    from experiments.protocol.claim2 import RELEASED as so

    full = len(so.arms) * len(so.pilot_seeds)
    none, every = [False] * full, [True] * full
    assert so.pilot_factors({}) == list(so.pilot_lrs)
    # nothing collapsed at the top: the next ladder factor above
    outc = {f: none for f in so.pilot_lrs}
    assert so.pilot_factors(outc) == [*so.pilot_lrs, 3200.0]
    # a collapse at the bottom: the next one below
    outc = {f: every for f in so.pilot_lrs}
    assert so.pilot_factors(outc) == [3.2, *so.pilot_lrs]
    # bracketed: lo = 32 (below the first collapse at 100), hi = 320 (first factor where all collapsed)
    outc = {10.0: none, 32.0: none, 100.0: [True] + none[1:], 320.0: every, 1000.0: every}
    assert so.pilot_factors(outc) == list(so.pilot_lrs)
    assert so.main_grid(outc) == [32.0, 100.0, 320.0]
    # no factor where every run collapsed: up to the top of the pilot
    outc = {10.0: none, 32.0: none, 100.0: [True] + none[1:], 320.0: [True] + none[1:], 1000.0: [True] + none[1:]}
    assert so.main_grid(outc) == [32.0, 180.0, 1000.0]
    with pytest.raises(ValueError, match="no pilot run collapsed"):
        so.main_grid({f: none for f in so.pilot_lrs})


def test_claim2_released_continued_workers_share_jobs_wait_and_stop(tmp_path, monkeypatch):
    """Two workers take the declared jobs in order, one each (lock files); a worker waits while the only job
    left runs in the other; none starts at or after the stop time."""
    import dataclasses
    import os as _os

    from experiments.protocol import claim2
    from experiments.protocol.startmodels import Replicate

    rep = Replicate("t", str(tmp_path / "model"), str(tmp_path / "runs"), str(tmp_path / "d.jsonl.gz"))
    cont = dataclasses.replace(claim2.RELEASED_CONTINUED, rep=rep)
    base = cont.base
    due = [("pilot", "grpo", 10.0, 100), ("pilot", "gtpo_official", 10.0, 100)]
    finished, ran, waits = set(), [], []
    monkeypatch.setattr(claim2.ReleasedContinued, "jobs", lambda self: list(due))
    monkeypatch.setattr(claim2.ReleasedContinued, "_done", lambda self, job: job in finished)

    def run_job(self, *job, rep, module):
        assert module == cont.module and _os.path.isfile(base.run_dir(*job, rep) + ".lock")
        ran.append(job)
        finished.add(job)

    monkeypatch.setattr(claim2.ReleasedOptimiser, "run_job", run_job)
    # the first job is running in another (live) worker: this one takes the second, then waits for the first
    lock0 = base.run_dir(*due[0], rep) + ".lock"
    _os.makedirs(_os.path.dirname(lock0))
    open(lock0, "w").write(str(_os.getppid()))

    def sleep(s):
        waits.append(s)
        finished.add(due[0])  # the other worker finishes

    cont.work(now=lambda: 0.0, sleep=sleep)
    assert ran == [due[1]] and waits == [cont.wait_s]
    assert not _os.path.exists(base.run_dir(*due[1], rep) + ".lock")
    # at the stop time nothing starts
    finished.clear()
    ran.clear()
    _os.remove(lock0)
    cont.work(now=lambda: cont.stop_at, sleep=sleep)
    assert ran == []


def test_claim2_released_continued_branch_grid_and_reproduction_check():
    """Branch A only on an equal start record; the continuation's grid is the first run's rule applied to its
    committed pilot; the reproduction check says where two runs' rewards part."""
    from experiments.protocol.report import claim2_optimiser as ro
    from experiments.protocol.claim2 import RELEASED, RELEASED_CONTINUED as cont
    from experiments.protocol.common import read_jsonl_gz

    first = read_jsonl_gz(RELEASED.data)
    start = next(r for r in first if r["kind"] == "start")
    assert cont.branch(dict(start, build_seconds=1.0)) == "A"
    assert cont.branch(dict(start, error_rate_other=0.102)) == "B"
    assert cont.committed_main_grid() == [3.2, 5.7, 10.0]
    j = cont.continuation_jobs()
    assert j[:2] == [("main", "grpo", 10.0, 0), ("main", "gtpo_official", 10.0, 0)] and len(j) == 2 + 6 * 3 * 2
    assert j[2] == ("main", "grpo", 3.2, 6) and j[-1] == ("main", "gtpo_official", 10.0, 11)

    def run(rewards):
        return {"phase": "main", "arm": "grpo", "lr_factor": 10.0, "seed": 0, "summary": {},
                "steps": [{"reward/mean": x, "entropy/mean": 0.2} for x in rewards]}

    base = [9.0] * 10
    assert "equal at all 10 steps; collapsed never there, never here" in ro._reproduction([run(base)], [run(base)])
    later = base[:3] + [0.0] * 7
    txt = ro._reproduction([run(base)], [run(later)])
    assert "equal for 3 steps, then different (mean reward at step 4: 9.000 there, 0.000 here)" in txt
    assert "collapsed never there, at step 7 here" in txt


def test_released_optimiser_pooled_test_stratifies_by_model_and_rate():
    """The pooled log-rank test compares runs only within (model, rate): a model where every run collapses at
    step 5 and one where none does carry no signal between arms."""
    from experiments.protocol.report import claim2_optimiser as ro

    def o(arm, lr, seed, t):
        return {"arm": arm, "lr": lr, "seed": seed, "collapsed": t < 40, "time": t}

    res_b = {"main": [o(a, 10.0, s, 5) for a in ("grpo", "gtpo_official") for s in range(6)]}
    res_c = {"main": [o(a, 10.0, s, 40) for a in ("grpo", "gtpo_official") for s in range(12)]}
    pl = ro.pooled(res_b, res_c)
    assert pl["seeds"] == {"b": 6, "c": 12} and pl["chi2"] == pytest.approx(0.0)
    gi = pl["groups"].index("gtpo_official")
    assert pl["observed"][gi] == 6 and pl["expected"][gi] == pytest.approx(6.0)
    # GTPO later within each model: the pooled test sees it
    res_c = {"main": [o("grpo", 10.0, s, 8) for s in range(12)] + [o("gtpo_official", 10.0, s, 30) for s in range(12)]}
    pl = ro.pooled(res_b, res_c)
    assert pl["p"] < 1e-4 and pl["observed"][gi] < pl["expected"][gi]
    assert ro.pooled(res_b, {}) is None


def test_declarations_are_checked():
    """A run that started before its declaration's commit is refused; so is one without a declaration."""
    from experiments.protocol import declare

    ok = [{"kind": "final", "arm": "a", "lr": 1e-4, "seed": s, "declared_in": "c" * 40, "declared_at": 1000,
           "started_at": 1000.5 + s} for s in range(3)]
    res = declare.check_runs(ok + [{"kind": "start"}], "f.jsonl.gz", use_git=False)
    assert res["n"] == 3 and res["declarations"] == {"c" * 40: (1000, 3)} and res["last_start"] == 1002.5
    assert "3 runs declared in `cccccccccc`" in declare.describe(res)
    early = dict(ok[0], started_at=999.0)
    with pytest.raises(SystemExit, match="f.jsonl.gz: run final a .* before its declaration cccccccccc"):
        declare.check_runs(ok + [early], "f.jsonl.gz", use_git=False)
    with pytest.raises(SystemExit, match="no declaration commit"):
        declare.check_runs([dict(ok[0], declared_in=None)], "f.jsonl.gz", use_git=False)


def test_declaration_commit_is_checked_against_git():
    """With git, the recorded commit must be in this branch's history with the recorded committer time."""
    import subprocess

    from experiments.protocol import declare

    if not declare.git_available():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=declare.ROOT, capture_output=True, text=True).stdout.strip()
    at = int(subprocess.run(["git", "show", "-s", "--format=%ct", head], cwd=declare.ROOT, capture_output=True,
                            text=True).stdout)
    run = {"kind": "tune", "arm": "a", "lr": 1.0, "seed": 0, "declared_in": head, "declared_at": at, "started_at": at + 1}
    assert declare.check_runs([run], "f", use_git=True)["git_checked"]
    with pytest.raises(SystemExit, match="committed at"):
        declare.check_runs([dict(run, declared_at=at - 5)], "f", use_git=True)
    with pytest.raises(SystemExit, match="not in this branch's history"):
        declare.check_runs([dict(run, declared_in="0" * 40)], "f", use_git=True)


def test_hand_written_verdicts_are_tied_to_their_data():
    """The hand-written prose renders only while its data files have the digests it was written against."""
    from experiments.protocol.report import verdicts

    now = verdicts.data_digests()
    assert now == verdicts.DIGESTS  # the committed prose was checked against the committed data
    verdicts.check_hand_written(now)
    with pytest.raises(SystemExit, match="claim7 changed .*claim7.jsonl.gz"):
        verdicts.check_hand_written(dict(now, **{"claim7.jsonl.gz": "0" * 16}))
    with pytest.raises(SystemExit, match="claim1, claim1_design changed"):
        verdicts.check_hand_written({k: v for k, v in now.items() if k != "onestep/tiny-start-natural.jsonl.gz"})


def test_claim1_verdict_follows_the_data():
    from experiments.protocol.report import verdicts

    def arm(median, p, n=200):
        return {"grpo": {"median": median, "frac_neg": 0.5, "n": n, "w0": {"p": p}, "kl": 1.0}}

    key = ("unit", "conflict_pos")
    res = {("tiny-a-short_neg", *key): arm(-8e-3, 1e-30), ("tiny-a-natural", *key): arm(-1e-5, 0.4),
           ("tiny-b-natural", *key): arm(+1e-3, 1e-9)}
    v = verdicts.claim1(res)
    assert verdicts.label(v) == ("reproduced under an induced premise (shorter wrong completions); in natural groups "
                                 "GRPO does not lower shared tokens here")
    res[("tiny-b-natural", *key)] = arm(-2e-4, 1e-4)  # a significant push down in a natural state
    assert "lowers shared tokens detectably in only 1 of 2 states, by at most 2.0e-04" in verdicts.claim1(res)
    res[("tiny-a-short_neg", *key)] = arm(-8e-3, 0.2)
    assert verdicts.label(verdicts.claim1(res)) == "not reproduced under the induced premise"


def test_attribution_pairs_only_seeds_with_both_evaluations():
    from experiments.protocol.report import claim7_attribution as ra

    def e(sampled=None, greedy=None):
        return {"sampled": None if sampled is None else {"pass@1": sampled},
                "greedy": None if greedy is None else {"pass@1": greedy}, "steps": [], "own": True}

    per = {"a": {0: e(0.40, 0.50), 1: e(0.42, None), 2: e(0.44, 0.52), 3: e(0.41, 0.55)},
           "b": {0: e(0.38, 0.50), 1: e(0.40, 0.51), 2: e(0.40, 0.50), 3: e(0.40, None)}}
    c = ra.paired(per, "a", "b", "sampled", "pass@1")
    assert c["seeds"] == [0, 1, 2, 3] and c["mean"] == pytest.approx(0.0225) and c["higher"] == 4
    assert ra.paired(per, "a", "b", "greedy", "pass@1") is None  # seeds 0 and 2 only: fewer than 3
    assert ra._seeds(per["a"], "greedy") == "0, 2, 3" and ra._seeds(per["b"], "sampled") == "0-3 (4)"


def test_stress_models_compare_by_their_records():
    from experiments.protocol.report.claim2_optimiser import same_model

    a = {"kind": "start", "error_rate_other": 0.112, "entropy_other": 0.175, "build_seconds": 452.0}
    assert same_model(a, dict(a, build_seconds=850.0, build_cpu_seconds=300.0))
    assert not same_model(a, dict(a, error_rate_other=0.076))
    assert not same_model(a, None)


def test_claim7_continued_blocks_branches_and_tuning_rule():
    """Branch A continues claim7b (its arguments, no (arm, seed) it holds, reruns greedy only); branch B
    reruns every arm; the tuning rule's choice and bracketing; the same-model test ignores build times."""
    from experiments.protocol.claim7 import ATTRIBUTION, CONTINUED

    a = CONTINUED.jobs("A")
    assert len(a) == len(set(a)) and a[0] == ("final", "gtpo", ATTRIBUTION.lr, 0)
    finals = [(arm, s) for kind, arm, _, s in a if kind == "final"]
    assert ("grpo", 0) not in finals and len(finals) == 7 + 10 + 30 + 20 + len(CONTINUED.jobs("A", (8,)))
    assert CONTINUED.modes("A", "final", "grpo", 3) == ("greedy",) and CONTINUED.modes("A", "final", "gtpo", 0) == (
        "sampled", "greedy")
    assert CONTINUED.modes("B", "final", "grpo", 3) == ATTRIBUTION.modes_all
    assert CONTINUED.modes("A", "tune", "grpo", 103) == ("validation",)
    assert CONTINUED.argv_for("grpo_masks", ATTRIBUTION.lr, 4) == ATTRIBUTION.argv_for("grpo_masks", 4)
    argv = CONTINUED.argv_for("grpo", 1.25e-5, 103)
    assert argv[argv.index("--learning_rate") + 1] == "1.25e-05" and argv[argv.index("--seed") + 1] == "103"
    tune = [(arm, lr, s) for kind, arm, lr, s in CONTINUED.jobs("A", (4,))]
    assert len(tune) == 2 * (6 + 9) and ("grpo", 2.5e-5, 100) not in tune  # the first design's tuning run
    assert len(CONTINUED.jobs("A", (6, 7))) == 3 * 3 * 6
    six = {lr: [0.3] * 6 for lr in CONTINUED.retune_lrs}
    assert CONTINUED.retuned_jobs({"gtpo": {**six, 5e-5: [0.4] * 6}, "grpo": six}) == [
        ("final", "grpo", 1.25e-5, s) for s in range(16)]  # GTPO at 5e-5 has finals; GRPO's tie goes to 1.25e-5
    assert CONTINUED.retuned_jobs({"grpo": {**six, 1e-4: [0.3] * 5}}) == []  # grid unfinished
    assert CONTINUED.modes("A", "final", "grpo", 3, 1.25e-5) == ATTRIBUTION.modes_all
    b = CONTINUED.jobs("B")
    assert len(b) == 16 * len(ATTRIBUTION.arms) and b[:5] == [("final", arm, ATTRIBUTION.lr, 0) for arm in ATTRIBUTION.arms]
    assert CONTINUED.chosen_rate({1e-5: [0.25, 0.25], 2e-5: [0.5, 0.0], 4e-5: [0.125]}) == (1e-5, False)  # tie: smaller
    assert CONTINUED.chosen_rate({1e-5: [0.3], 2e-5: [0.35], 4e-5: [0.1]}) == (2e-5, True)
    s = {"kind": "start", "heldout": {"pass@1": 0.263}, "build_seconds": 251.0}
    assert CONTINUED.branch(s, dict(s, build_seconds=1943.0, build_cpu_seconds=1.0)) == "A"
    assert CONTINUED.branch(s, dict(s, heldout={"pass@1": 0.27})) == "B"


def test_claim7_continued_tuning_joins_the_first_designs_seeds():
    """Re-tuning: a grid counts as complete only with six seeds per rate (three from the first design's tuning
    runs, three new), the rule then picks from all six, and an arm with no new tuning run is not shown."""
    from experiments.protocol.claim7 import CONTINUED
    from experiments.protocol.report import claim7_attribution as ra

    def tune(arm, lr, seed, p):
        return {"kind": "tune", "arm": arm, "lr": lr, "seed": seed, "validation": {"metrics": {"pass@1": p}}}

    runs = [tune("grpo", 1.25e-5, s, 0.30) for s in (*CONTINUED.old_tune_seeds, *CONTINUED.new_tune_seeds)]
    res: dict = {}
    ra.tuning(runs, res)
    assert res["tuned"] == {}  # 2.5e-5 .. 1e-4 have only the first design's three seeds
    runs += [tune("grpo", lr, s, 0.40 if lr == 2.5e-5 else 0.10) for lr in CONTINUED.retune_lrs[1:]
             for s in CONTINUED.new_tune_seeds]
    text = ra.tuning(runs, res)
    # means: 1.25e-5 30.0; 2.5e-5 (37.1 + 38.1 + 36.6 + 3 x 40) / 6 = 38.6; 5e-5 (40.8 + 31.9 + 27.4 + 3 x 10) / 6
    # = 21.7; 1e-4 (33.8 + 29.8 + 26.3 + 3 x 10) / 6 = 20.0 -> 2.5e-5, inside the grid
    assert res["tuned"] == {"grpo": (2.5e-5, True)}
    assert "| GRPO | 2.5e-05 | 100, 101, 102, 103, 104, 105 | 37.1 / 38.1 / 36.6 / 40.0 / 40.0 / 40.0 | 38.6 | **chosen** |" in text
    assert "GTPO (official preset) |" not in text
    assert "No finals exist" not in text and res.get("tuned_cmp") is None  # GTPO not re-tuned: no comparison


@pytest.mark.parametrize("claim, design", [("claim7", "ATTRIBUTION"), ("claim7", "CONTINUED"), ("claim2", "RELEASED"),
                                           ("claim2", "RELEASED_CONTINUED"),
                                           ("claim7_confirm", "CONFIRM"), ("engines", "ENGINES")])
def test_declared_designs_export_their_committed_runs_back(tmp_path, claim, design):
    """With no run directory on this machine, exporting a declared design's data file keeps every committed run: the
    file comes back with the same records (the claim-7 designs in the same order)."""
    import importlib
    import shutil

    from experiments.protocol.common import read_jsonl_gz

    d = getattr(importlib.import_module(f"experiments.protocol.{claim}"), design)
    out = str(tmp_path / os.path.basename(d.data))
    shutil.copy(d.data, out)
    d.export(out)
    committed, back = read_jsonl_gz(d.data), read_jsonl_gz(out)
    assert len(back) == len(committed) and sorted(map(repr, back)) == sorted(map(repr, committed))
    if claim == "claim7":
        assert back == committed


@pytest.mark.parametrize("claim, design", [("claim7_confirm", "CONFIRM"), ("engines", "ENGINES"),
                                           ("claim4", "HORIZON"), ("claim5", "ONLYNEG")])
def test_declared_design_workers_skip_committed_runs(tmp_path, monkeypatch, claim, design):
    """The one worker loop (common.Design.work_loop) on a fresh machine: every run in the committed data file is
    skipped (not run again), a job another live worker holds is skipped, the others run in jobs() order with their
    lock held, and a STOP file ends the worker before its next job."""
    import dataclasses
    import importlib
    import shutil

    from experiments.protocol.common import read_jsonl_gz, write_jsonl_gz

    mod = importlib.import_module(f"experiments.protocol.{claim}")
    d0 = getattr(mod, design)
    data = str(tmp_path / "data.jsonl.gz")
    if os.path.isfile(d0.data):
        shutil.copy(d0.data, data)
    d = dataclasses.replace(d0, data=data, runs=str(tmp_path / "runs"))
    jobs = d.jobs()
    if len(set(jobs) - d.committed()) < 3:  # a finished design: its last 3 jobs taken out of the copy
        write_jsonl_gz(data, [r for r in read_jsonl_gz(data) if (r.get("arm"), r.get("seed")) not in set(jobs[-3:])])
    if not d.committed():  # a design with no committed run yet: commit its first job
        write_jsonl_gz(data, [{"kind": "final", "arm": jobs[0][0], "seed": jobs[0][1], "started_at": 1.0}])
    committed = d.committed()
    assert committed and committed == {(r["arm"], r["seed"]) for r in read_jsonl_gz(data) if "started_at" in r}
    left = [j for j in jobs if j not in committed]
    held = left[0]  # another worker (this test's parent process, alive) runs it
    os.makedirs(os.path.dirname(d.run_dir(*held)), exist_ok=True)
    open(d.run_dir(*held) + ".lock", "w").write(str(os.getppid()))
    ran = []

    def run_job(self, arm, seed):
        assert os.path.isfile(self.run_dir(arm, seed) + ".lock")
        ran.append((arm, seed))
        if len(ran) == 2:
            open(os.path.join(self.runs, "STOP"), "w").close()

    monkeypatch.setattr(type(d), "run_job", run_job)
    monkeypatch.setattr(type(d), "done", lambda self, arm, seed: (arm, seed) in ran)
    d.work_loop()
    assert ran == left[1:3] and not set(ran) & committed
    assert not any(os.path.exists(d.run_dir(*j) + ".lock") for j in ran)


def test_exact_half_ranks_and_medians_print_exactly():
    """W+ with tied ranks and medians of integers print their exact value (issue 45 item 3), never rounded
    half-to-even (Python's f"{75.5:.0f}" is "76", f"{12.5:.0f}" is "12")."""
    from experiments.protocol.report.tables import fmt_half

    assert fmt_half(75.5) == "75.5" and fmt_half(12.5) == "12.5" and fmt_half(124.0) == "124" and fmt_half(0.5) == "0.5"
    w = stats.wilcoxon_signed_rank([1, 1, 2, 3, -3])  # ranks 1.5, 1.5, 3, 4.5, 4.5: W+ = 10.5
    assert fmt_half(w["w_plus"]) == "10.5"
    assert fmt_half(stats.statistics_median([10, 12, 13, 15])) == "12.5"


def test_logrank_power_by_hand():
    """Schoenfeld: Phi(|ln HR| sqrt(D/4) - z_0.975); 13 events and a halved hazard give about 24 %."""
    z = stats.norm_ppf(0.975)
    for d in (4, 13, 40):
        expect = 1 - stats.norm_sf(math.log(2) * math.sqrt(d / 4) - z)
        assert stats.logrank_power(d, 0.5) == pytest.approx(expect, rel=1e-12)
    assert 0.2 < stats.logrank_power(13, 0.5) < 0.3
    assert stats.logrank_power(100, 1.0) == pytest.approx(0.025, abs=1e-9)  # no effect: power = alpha / 2 per side
    assert math.isnan(stats.logrank_power(0, 0.5))


def test_claim7_confirm_temperature_and_verdict_rules():
    """The confirmation's declared rules on hand-made numbers (designs/claim7-confirm.md)."""
    from experiments.protocol.claim7_confirm import CONFIRM

    ch = CONFIRM.chosen_temperature
    assert ch({1.0: [0.30, 0.32], 0.6: [0.35, 0.37], 0.0: [0.33, 0.33]}) == 0.6
    assert ch({1.0: [0.40], 0.6: [0.35], 0.0: [0.39]}) == 1.0
    assert ch({1.0: [0.30], 0.6: [0.30], 0.0: [0.30]}) == 1.0  # ties: the higher temperature
    assert ch({1.0: [0.30], 0.6: [0.20], 0.0: [0.34]}) == 0.0  # greedy may win
    with pytest.raises(ValueError, match="chosen_temperature"):
        ch({1.0: []})
    v = CONFIRM.verdict
    assert CONFIRM.alpha == 0.05 and CONFIRM.alpha_secondary == 0.025
    assert v(0.01, 0.02, 0.001, 0.03) == "confirmed"
    assert v(0.30, 0.005, 0.001, 0.03) == "sharpening"  # the gain at T = 1 vanishes once temperature is matched
    assert v(0.01, -0.02, 0.001, 0.03) == "sharpening"  # a significant loss is no confirmation
    assert v(0.30, 0.005, 0.03, 0.03) == "not confirmed"  # T = 1 above its threshold 0.025
    assert v(0.30, 0.005, 0.001, -0.03) == "not confirmed"
    # 32 fresh seeds x 3 arms, paired seed by seed; six evaluations; the start model is the unpacked archive
    jobs = CONFIRM.jobs()
    assert len(jobs) == 96 and jobs[:3] == [("grpo", 200), ("grpo_masks", 200), ("gtpo", 200)]
    assert not set(CONFIRM.seeds) & (set(range(16)) | set(range(100, 106)))
    assert CONFIRM.evals() == (("validation", 1.0), ("validation", 0.6), ("validation", 0.0),
                               ("heldout", 1.0), ("heldout", 0.6), ("heldout", 0.0))
    argv = CONFIRM.argv_for("grpo_masks", 200)
    assert argv[argv.index("--model") + 1].endswith(os.path.join("claim7-confirm-start", "model"))
    assert "--conflict_masks" in argv and argv[argv.index("--learning_rate") + 1] == "5e-05"


def test_claim7_confirm_analysis_by_hand():
    """The report's analysis on hand-made runs: each arm's chosen temperature from the tuning split, the primary
    test at those temperatures, the T = 1.0 secondary, and the verdict from the rule."""
    from experiments.protocol.claim7_confirm import CONFIRM
    from experiments.protocol.report import claim7_confirm

    def run(arm, seed, val, held):
        r = {"kind": "final", "arm": arm, "seed": seed}
        for (split, t) in CONFIRM.evals():
            x = (val if split == "validation" else held)[t] + 0.001 * ((seed * 7 + len(arm)) % 5)
            r[CONFIRM.eval_name(split, t)] = {"metrics": {"pass@1": x}}
        return r

    runs = []
    for s in CONFIRM.seeds:
        jitter = 0.01 * ((s * 13) % 7) / 7
        runs.append(run("grpo", s, {1.0: 0.30, 0.6: 0.36, 0.0: 0.34}, {1.0: 0.30 + jitter, 0.6: 0.36 + jitter, 0.0: 0.34}))
        runs.append(run("grpo_masks", s, {1.0: 0.33, 0.6: 0.37, 0.0: 0.35}, {1.0: 0.33, 0.6: 0.36 + jitter / 2, 0.0: 0.35}))
        runs.append(run("gtpo", s, {1.0: 0.32, 0.6: 0.35, 0.0: 0.36}, {1.0: 0.32, 0.6: 0.35, 0.0: 0.36}))
    res = claim7_confirm.analyse(runs)
    assert res["chosen"] == {"grpo": 0.6, "grpo_masks": 0.6, "gtpo": 0.0}
    assert res[("grpo_masks", "grpo", "1.0")]["mean"] > 0.02 and res[("grpo_masks", "grpo", "1.0")]["wilcoxon"]["p"] < 0.025
    assert abs(res["primary"]["mean"]) < 0.01
    assert res["verdict"] == CONFIRM.verdict(res["primary"]["wilcoxon"]["p"], res["primary"]["mean"],
                                             res[("grpo_masks", "grpo", "1.0")]["wilcoxon"]["p"],
                                             res[("grpo_masks", "grpo", "1.0")]["mean"])


def test_claim7_confirm_descriptive_measures_by_hand():
    """The declared descriptive table: each arm's mean of greedy pass@1, pass@8 and maj@8 at both temperatures and
    the entropy of the last 10 % of the steps, and each arm minus GRPO paired over the seeds."""
    from experiments.protocol.report import claim7_confirm

    def run(arm, seed, base, entropy):
        metrics = {"pass@1": base, "pass@8": base + 0.5, "maj@8": base + 0.1}
        steps = [{"entropy/mean": 9.0}] * 18 + [{"entropy/mean": entropy}, {"entropy/mean": entropy + 0.2}]
        return {"kind": "final", "arm": arm, "seed": seed, "steps": steps,
                **{n: {"metrics": metrics} for n in ("heldout_t0", "heldout_t1", "heldout_t0.6")}}

    runs = [run("grpo", s, 0.30 + 0.01 * s, 0.5) for s in range(3)]
    runs += [run("grpo_masks", s, 0.30 + 0.01 * s + 0.02 * (s + 1), 0.3) for s in range(3)]
    runs += [run("gtpo", s, 0.30, 0.5) for s in range(3)]
    rows = {r["label"]: r for r in claim7_confirm.descriptive(runs)}
    greedy, ent = rows["held-out pass@1, greedy"], rows["token entropy, last 10 % of steps"]
    assert greedy["means"] == pytest.approx({"grpo": 0.31, "grpo_masks": 0.35, "gtpo": 0.30}, abs=1e-12)
    assert greedy["grpo_masks"]["mean"] == pytest.approx(0.04, abs=1e-12)  # differences 0.02, 0.04, 0.06
    assert greedy["gtpo"]["mean"] == pytest.approx(-0.01, abs=1e-12)  # 0, -0.01, -0.02
    assert greedy["grpo_masks"]["p"] == pytest.approx(0.25)  # exact Wilcoxon, 3 positive differences: 2 / 2^3
    assert rows["held-out pass@8, T=1"]["means"]["grpo"] == pytest.approx(0.81, abs=1e-12)
    assert rows["held-out maj@8, T=0.6"]["means"]["grpo_masks"] == pytest.approx(0.45, abs=1e-12)
    # the last 10 % of 20 steps: the last 2 (entropy, entropy + 0.2)
    assert ent["means"] == pytest.approx({"grpo": 0.6, "grpo_masks": 0.4, "gtpo": 0.6}, abs=1e-12)
    assert ent["grpo_masks"]["mean"] == pytest.approx(-0.2, abs=1e-12)


def test_claim7_confirm_task_splits_written_and_checked(tmp_path, monkeypatch):
    """The amendment: a machine without the tiny model's cache gets the declared training split (same bytes as the
    first run's), and a split that differs refuses the run."""
    from experiments import pretrain
    from experiments.protocol import claim7_confirm as cc

    monkeypatch.setattr(pretrain, "cache_dir", lambda seed=0: str(tmp_path / f"tiny-s{seed}"))
    data = cc.Confirm.task_splits()
    for name, digest in cc.TASK_SPLITS.items():
        assert cc._sha256(os.path.join(data, name)) == digest
    with open(os.path.join(data, "train.jsonl"), "a") as f:
        f.write("{}\n")
    with pytest.raises(SystemExit, match="train.jsonl has sha256"):
        cc.Confirm.task_splits()


# ------------------------------------------------------------------ claims 3-6 (issue 45 item 2)
def test_claims3to6_run_settings_from_argv():
    """The filter, tau, rule, scope, gamma and batch a run's argv sets: preset < YAML < overrides, the filter on by
    default for gtpo only, gamma 0.1 by default for gtpo only; the tiny YAML's 2 x 8 and the default run's 4 x 8."""
    from experiments.protocol.report.claims3to6 import run_settings

    tiny = "experiments/configs/tiny.yaml"
    off = run_settings([tiny, "--preset", "official", "--gamma", "0.0", "--seed", "3"])
    assert (off["filter"], off["tau"], off["rule"], off["scope"], off["gamma"], off["completions"]) == (
        True, 0.7, "fixed", "all", 0.0, 16)
    g = run_settings([tiny, "--preset", "grpo", "--gamma", "0.1"])
    assert (g["filter"], g["gamma"]) == (False, 0.1)
    fg = run_settings([tiny, "--preset", "grpo", "--entropy_filter", "true", "--gamma", "0.1", "--gtpo_ablation", "true"])
    assert (fg["filter"], fg["tau"], fg["rule"]) == (True, 0.7, "fixed")
    paper = run_settings([tiny, "--preset", "paper", "--entropy_filter_scope", "negative"])
    assert (paper["filter"], paper["tau"], paper["rule"], paper["scope"]) == (True, math.log(2), "initial", "negative")
    demo = run_settings(["--demo", "--seed", "0", "--learning_rate", "3e-4", "--entropy_rule", "fixed",
                         "--entropy_threshold", "0.7", "--log_policy_change", "true"])
    assert (demo["filter"], demo["tau"], demo["rule"], demo["gamma"], demo["completions"]) == (True, 0.7, "fixed", 0.1, 32)
    base = run_settings(["--demo", "--seed", "0", "--loss_type", "grpo", "--gamma", "0.0"])
    assert (base["filter"], base["gamma"], base["rule"]) == (False, 0.0, "initial")


def test_claims3to6_run_activity_by_hand():
    """Batch 16: filtered shares 0, 2/16, 1/16 -> 3 completions dropped in 2 steps, 2 of them before the collapse at
    step 3; step entropies 0.5, 0.8, 2.5 -> above ln 2: 2 steps, above 1.05: 1, above 2.0: 1."""
    from experiments.protocol.report.claims3to6 import LN2, run_activity

    run = {"argv": ["experiments/configs/tiny.yaml", "--preset", "official"],
           "steps": [{"step": 1, "entropy/mean": 0.5, "gtpo/filtered_frac": 0.0},
                     {"step": 2, "entropy/mean": 0.8, "gtpo/filtered_frac": 0.125},
                     {"step": 3, "entropy/mean": 2.5, "gtpo/filtered_frac": 0.0625}]}
    a = run_activity(run, collapse=3)
    assert (a["steps"], a["completions"], a["dropped"], a["steps_dropping"], a["dropped_before"]) == (3, 48, 3, 2, 2)
    assert a["max_entropy"] == 2.5 and a["above"] == {LN2: 2, 1.05: 1, 2.0: 1}
    assert a["above_before"] == {LN2: 1, 1.05: 0, 2.0: 0}  # step 3 is the collapse step, not before it
    assert run_activity(run)["dropped_before"] == 3  # no collapse: every step counts


def test_claims3to6_power_by_hand():
    """Exact paired test: 5 differing pairs give at best p = 2 x 0.5^5 = 0.0625, 6 give 0.031 (alpha 0.05 -> 6);
    alpha 0.01 -> 8 (2/128 = 0.0156, 2/256 = 0.0078). P(Bin(n, 1/2) >= 1) = 1 - 0.5^n >= 0.75 from n = 2; with q = 1
    every pair differs: n = k. Log-rank: D = 40 events detect HR exp(-(1.959964 + 0.841621) / sqrt(10)) = 0.41235
    with 80 % power, and logrank_power gives 0.8 back."""
    c = stats
    assert c.min_differing_pairs(0.05) == 6 and c.min_differing_pairs(0.01) == 8
    assert c.seeds_for_differing_pairs(0.5, 1, 0.75) == 2
    assert c.seeds_for_differing_pairs(1.0, 6, 0.8) == 6
    assert c.seeds_for_differing_pairs(0.1, 6, 0.8) == 78  # P(Bin(78, 0.1) >= 6) = 0.80..., Bin(77): < 0.8
    assert c.differing_pairs_power(12, 0.5, 6) == pytest.approx(2510 / 4096)  # (924 + 792 + 495 + 220 + 66 + 12 + 1) / 2^12
    assert c.differing_pairs_power(6, 1.0, 6) == 1.0
    hr = c.min_detectable_hazard_ratio(40)
    assert hr == pytest.approx(math.exp(-(1.959964 + 0.841621) / math.sqrt(10)), abs=1e-5)
    assert hr == pytest.approx(0.41235, abs=1e-4)
    assert stats.logrank_power(40, hr) == pytest.approx(0.8, abs=1e-9)


def test_replace_row(tmp_path):
    """The README's generated row replaces the one line with its prefix; none or two such lines are refused."""
    from experiments.protocol.report.tables import replace_row

    p = tmp_path / "r.md"
    p.write_text("| a | b |\n|---|---|\n| 3-6. x | old |\n| 7. y | z |\n")
    replace_row(str(p), "| 3-6. ", "| 3-6. x | new |")
    assert p.read_text() == "| a | b |\n|---|---|\n| 3-6. x | new |\n| 7. y | z |\n"
    with pytest.raises(ValueError, match="found 0"):
        replace_row(str(p), "| 8. ", "| 8. |")


def test_claim4_horizon_rules_by_hand(monkeypatch):
    """The declared rules: crossing ln 2 by a 5-step moving mean; the filter acted iff some filtered share > 0; the
    verdict (6 no-filter-only pairs: McNemar p = 2 x 0.5^6 = 0.03125 -> reproduced; none crossing -> not
    reproduced; 5 such pairs: p = 0.0625 -> not decided); the stopping rule (no-filter runs only where the GTPO
    run's filter acted, and on the check seed); 0 of 12: the crossing probability below 1 - 0.05^(1/12) = 0.2209."""
    from experiments.protocol import claim4
    from experiments.protocol.claim4 import HORIZON as H

    ln2 = math.log(2)
    assert H.crossed([0.1] * 4 + [ln2 + 0.5] * 4 + [0.1] * 4)  # best window (4 x 1.193 + 0.1) / 5 = 0.974 > ln 2
    assert not H.crossed([0.1] * 4 + [1.0] * 2 + [0.1] * 4)  # best window (2 x 1.0 + 3 x 0.1) / 5 = 0.46
    assert H.crossed([0.0, 0.0, 0.0, 0.0, 3.5]) is True  # 3.5 / 5 = 0.7 > 0.6931
    assert H.crossed([0.0, 0.0, 0.0, 0.0, 3.4]) is False  # 0.68 < ln 2
    assert H.crossed([0.9] * 4) is False  # fewer steps than the window
    assert H.acted([{"gtpo/filtered_frac": 0.0}, {"gtpo/filtered_frac": 0.0625}]) and not H.acted([{"gtpo/filtered_frac": 0.0}, {}])
    assert H.collapsed([10, 10, 10, 10, 10, 4, 4, 4, 4, 4]) and not H.collapsed([10] * 10) and H.collapsed([10] * 5, True)
    v, p = H.verdict([(False, True)] * 6 + [(False, False)] * 6)
    assert (v, p) == ("reproduced", pytest.approx(0.03125))
    assert H.verdict([(False, False)] * 12)[0] == "not reproduced"
    assert H.verdict([(False, True)] * 5 + [(False, False)] * 7) == ("not decided", pytest.approx(0.0625))
    assert H.verdict([(True, True)] * 12)[0] == "not decided"  # both cross: not the paper's contrast
    assert H.upper_bound(12) == pytest.approx(1 - 0.05 ** (1 / 12)) and H.upper_bound(12) == pytest.approx(0.2209, abs=1e-4)
    # the stopping rule, with seed 301's GTPO run acting and 302's not; 303 unfinished
    steps = {301: [{"gtpo/filtered_frac": 0.125}], 302: [{"gtpo/filtered_frac": 0.0}]}
    monkeypatch.setattr(claim4.Horizon, "done", lambda self, arm, seed: arm == "gtpo" and seed in (301, 302))
    monkeypatch.setattr("experiments.protocol.tinyruns.step_metrics", lambda d: steps[int(d.rsplit("seed", 1)[1])])
    assert [H.needs_nofilter(s) for s in (300, 301, 302, 303)] == [True, True, False, None]
    assert [j for j in H.jobs() if j[0] == "gtpo_nofilter"] == [("gtpo_nofilter", 300), ("gtpo_nofilter", 301)]
    assert H.argv_for("gtpo_nofilter", 305)[1:5] == ["--preset", "official", "--entropy_filter", "false"]
    assert "--max_steps" in H.argv_for("gtpo", 305) and H.argv_for("gtpo", 305)[H.argv_for("gtpo", 305).index("--max_steps") + 1] == "4500"


def test_claim5_onlyneg_verdict_by_hand():
    """OnlyNeg minus full filter: diffs 0.01, -0.01, 0.02, -0.02 -> mean 0, sd sqrt(0.001 / 3) = 0.018257, 95 % CI
    half-width t(0.975, 3) = 3.182446 x 0.018257 / 2 = 0.029052: p = 1 and the CI above -0.110 -> not reproduced;
    -0.3, 0.2, -0.25, 0.15 (mean -0.05, sd 0.2614, half-width 0.4159): not significant, CI reaches -0.466 -> not
    decided; all about -0.11: reproduced; all about +0.11: the opposite. The arms differ only in the scope."""
    from experiments.protocol.claim5 import ONLYNEG as O

    v, t = O.verdict([0.01, -0.01, 0.02, -0.02])
    assert v == "not reproduced" and t["mean"] == pytest.approx(0.0, abs=1e-12)
    assert t["sd"] == pytest.approx(math.sqrt(0.001 / 3)) and t["hi"] == pytest.approx(3.182446 * 0.0182574 / 2, abs=1e-5)
    v, t = O.verdict([-0.3, 0.2, -0.25, 0.15])
    assert v == "not decided" and t["mean"] == pytest.approx(-0.05) and t["lo"] == pytest.approx(-0.05 - 0.4159, abs=1e-3)
    assert O.verdict([-0.1, -0.12, -0.11, -0.1, -0.12, -0.11])[0] == "reproduced"
    assert O.verdict([0.1, 0.12, 0.11, 0.1, 0.12, 0.11])[0] == "the opposite"
    full, neg = O.argv_for("full", 100), O.argv_for("onlyneg", 100)
    def strip(a):
        return a[:a.index("--output_dir")]

    assert strip(neg) == strip(full)[:-4] + ["--entropy_filter_scope", "negative"] + strip(full)[-4:]
    assert full[:3] == ["--demo", "--seed", "100"] and len(O.jobs()) == 48 and O.jobs()[:2] == [("full", 100), ("onlyneg", 100)]


def test_claims3to6_design_analyses_on_synthetic_records():
    """The report's reading of the two declared designs' data: claim 4 -- seed 300 ran both arms (the filter never
    acted, identical steps: the check holds), seed 301's filter acted and only its no-filter run crossed ln 2,
    seed 302 ran GTPO only (filter never acted: its no-filter outcome is its GTPO run's); claim 5 -- three seeds,
    OnlyNeg minus full 0.01, -0.01, 0.0 (mean 0); neither tested before all its declared runs (the stopping
    rule), then tested on the completed synthetic sets."""
    from experiments.protocol.report import claims3to6 as c

    low = [{"entropy/mean": 0.1, "reward/mean": 10.0, "gtpo/filtered_frac": 0.0}] * 10
    acted = low[:5] + [{"entropy/mean": 0.1, "reward/mean": 10.0, "gtpo/filtered_frac": 0.0625}] + low[6:]
    high = low[:5] + [{"entropy/mean": 1.0, "reward/mean": 1.0, "gtpo/filtered_frac": 0.0}] * 5
    recs = [{"kind": "final", "arm": "gtpo", "seed": 300, "steps": low},
            {"kind": "final", "arm": "gtpo_nofilter", "seed": 300, "steps": low},
            {"kind": "final", "arm": "gtpo", "seed": 301, "steps": acted},
            {"kind": "final", "arm": "gtpo_nofilter", "seed": 301, "steps": high},
            {"kind": "final", "arm": "gtpo", "seed": 302, "steps": low}]
    h = c.horizon(None, recs)
    assert h["pairs"] == {300: (False, False), 301: (False, True), 302: (False, False)}
    assert h["collapsed"][301] == (False, True) and h["identical"] is True
    assert "verdict" not in h and h["running"] == {"gtpo": 3, "pairs": 3}  # the stopping rule: no test before all 12
    assert h["n"] == 12 and h["k"] == 6 and h["power"][0.5] == pytest.approx(2510 / 4096)
    full = c.horizon(None, recs + [{"kind": "final", "arm": "gtpo", "seed": s, "steps": low} for s in range(303, 312)])
    assert (full["verdict"], full["p"]) == ("not decided", 1.0) and "running" not in full  # 1 discordant pair: p = 1
    waiting = c.horizon(None, recs[:2] + [{"kind": "final", "arm": "gtpo", "seed": s, "steps": acted} for s in range(301, 312)])
    assert waiting["running"] == {"gtpo": 12, "pairs": 1}  # 11 no-filter runs the stopping rule asks for still missing
    assert c.horizon(None, recs[:1])["running"] == {"gtpo": 1, "pairs": 0}  # the check seed runs both arms
    accs = {100: (0.30, 0.31), 101: (0.40, 0.39), 102: (0.20, 0.20)}
    accs.update({s: (0.25, 0.25) for s in range(103, 124)})
    runs = [{"kind": "final", "arm": a, "seed": s, "summary": {"accuracy_after": acc}, "steps": []}
            for s, (f, o) in accs.items() for a, acc in (("full", f), ("onlyneg", o))]
    o = c.onlyneg(None, runs[:6])
    assert o["seeds"] == [100, 101, 102] and o["diffs"] == pytest.approx([0.01, -0.01, 0.0])
    assert "verdict" not in o and o["running"] == 3  # no test before all 24 pairs
    o = c.onlyneg(None, runs)
    assert len(o["seeds"]) == 24 and o["verdict"] == "not reproduced" and o["t"]["mean"] == pytest.approx(0.0, abs=1e-12)


def test_engines_rules_by_hand():
    """The two-engine design's declared rules (designs/engines.md) on hand-computed numbers: the verdict's paired t,
    90 % interval and labels, the power, the curve summaries, the step-time ratio, the run order and arguments."""
    from experiments.protocol.engines import ENGINES

    # diffs 2, -1, 3, 0 points: mean 1, SD sqrt(10/3) = 1.826, t = 1 / (1.826 / 2) = 1.095, df 3; the 90 % interval
    # 1 -+ t_0.95,3 (2.353363) x 0.9129 = -1.148 .. 3.148 points: inside +-10
    v = ENGINES.verdict([0.02, -0.01, 0.03, 0.00])
    assert v["mean"] == pytest.approx(0.01) and v["sd"] == pytest.approx(math.sqrt(10 / 3) / 100)
    assert v["t"]["t"] == pytest.approx(1.0954451, rel=1e-6)
    assert v["ci90"] == pytest.approx((0.01 - 2.3533634 * 0.0091287, 0.01 + 2.3533634 * 0.0091287), rel=1e-5)
    assert v["t"]["p"] > 0.05 and v["verdict"] == "agree within ±10 points"
    assert v["wilcoxon"]["w_plus"] == 5.0 and v["wilcoxon"]["n"] == 3  # the zero difference is dropped
    assert ENGINES.verdict([0.20, 0.21, 0.19, 0.22])["verdict"] == "differ"
    # 20, -10, 15, -5 points: mean 5, SD sqrt(0.065 / 3) = 0.1472, half-width 2.3534 x 0.0736 = 17.3 points
    wide = ENGINES.verdict([0.20, -0.10, 0.15, -0.05])
    assert wide["ci90"][0] == pytest.approx(0.05 - 2.3533634 * math.sqrt(0.065 / 3) / 2, rel=1e-6)
    assert wide["verdict"] == "no difference detected"
    # power: seed SD 3.546 points -> paired SD sqrt(2) x 3.546 = 5.015; (t_0.975,3 + t_0.8,3) x 5.015 / 2
    p = ENGINES.power()
    assert p[0]["sd_diff"] == pytest.approx(0.0501480, rel=1e-5)
    assert p[0]["mdd"] == pytest.approx((3.1824463 + 0.9784723) * 0.0501480 / 2, rel=1e-5)
    assert p[1]["mdd"] == pytest.approx((3.1824463 + 0.9784723) * math.sqrt(2) * 0.04932 / 2, rel=1e-5)
    assert ENGINES.power(3)[0]["mdd"] == pytest.approx((4.3026527 + 1.0606602) * 0.0501480 / math.sqrt(3), rel=1e-5)
    # steps 1..12: reward step / 10 (mean 0.65), entropy 1 + step / 100 (mean 1.065; last ten, steps 3-12: 1.075)
    steps = [{"step": t, "reward": t / 10, "entropy": 1 + t / 100} for t in range(12, 0, -1)]
    c = ENGINES.curve_summary(steps)
    assert c == pytest.approx({"reward, mean of all steps": 0.65, "entropy, mean of all steps": 1.065,
                               "entropy, mean of the last 10 steps": 1.075, "entropy at step 1": 1.01})
    run = {"steps": [{"step": 1, "step_time": 3.0}, {"step": 2, "step_time": 5.0}, {"step": 3, "step_time": 4.0}],
           "timing": {"train_cpu_s": 30.0, "attempts": 1}}
    assert ENGINES.step_time(run) == {"wall_median_s": 4.0, "cpu_per_step_s": 10.0}
    assert ENGINES.step_time(dict(run, timing={"train_cpu_s": 30.0, "attempts": 2}))["cpu_per_step_s"] is None
    # an attempt killed before its end writes no timing: the next one's counts attempts 1, the re-logged steps tell
    assert ENGINES.step_time(dict(run, resumed=True)) == {"wall_median_s": 4.0, "cpu_per_step_s": None}
    assert ENGINES.ratio([2.0, 8.0], [1.0, 2.0]) == pytest.approx(math.sqrt(8))  # ratios 2 and 4
    assert ENGINES.jobs()[:3] == [("gtpo", 0), ("trl", 0), ("gtpo", 1)] and len(ENGINES.jobs()) == 8
    g, t = ENGINES.argv_for("gtpo", 2), ENGINES.argv_for("trl", 2)
    assert g[:3] == ["--demo", "--seed", "2"] and "--engine" not in g
    assert t[t.index("--engine") + 1] == "trl" and [a for a in t if a not in ("--engine", "trl")][:-1] == g[:-1]


def test_engines_tells_a_resumed_run_by_its_re_logged_steps(tmp_path):
    from experiments.protocol.engines import ENGINES

    line = lambda step, **kw: json.dumps({"step": step, "reward": 0.5, **kw}) + "\n"
    (tmp_path / "metrics.jsonl").write_text(line(1) + line(2) + line(3) + json.dumps({"step": 3, "train_runtime": 9}))
    assert not ENGINES.resumed(str(tmp_path))  # TRL's closing summary (no reward) is not a step
    (tmp_path / "metrics.jsonl").write_text(line(1) + line(2) + line(3) + line(2) + line(3))  # resumed after step 1
    assert ENGINES.resumed(str(tmp_path))
    assert [s["step"] for s in ENGINES.steps_of(str(tmp_path))] == [1, 2, 3]


def _engines_data(tmp_path, accs: dict) -> str:
    """A data file of the two-engine design with hand-made runs: ``accs`` {(arm, seed): accuracy after}; 3 steps each,
    reward 0.1 / 0.2 / 0.3 (gtpo) or 0.2 / 0.3 / 0.4 (TRL), entropy 0.8, step time 10 s (gtpo) or 20 s (TRL)."""
    from experiments.protocol.common import write_jsonl_gz

    recs = [{"kind": "before", "arm": a, "accuracy": 0.09, "correct": [], "texts": []} for a in ("gtpo", "trl")]
    for (arm, seed), acc in accs.items():
        up = 0.1 if arm == "trl" else 0.0
        recs.append({"kind": "run", "arm": arm, "seed": seed, "declared_in": "c" * 40, "declared_at": 1000,
                     "code_commit": "c" * 40, "started_at": 2000.0 + seed, "summary": {},
                     "timing": {"train_cpu_s": 30.0 * (2 if arm == "trl" else 1), "attempts": 1},
                     "eval_after": {"accuracy": acc},
                     "steps": [{"step": t, "reward": t / 10 + up, "entropy": 0.8,
                                "step_time": 20.0 if arm == "trl" else 10.0} for t in (1, 2, 3)]})
    path = str(tmp_path / "engines.jsonl.gz")
    write_jsonl_gz(path, recs)
    return path


def test_engines_section_by_hand(tmp_path):
    """The report's section on hand-made runs: 'running' with the finished pairs' numbers and no test before every
    declared run is in; then the per-seed table, the curve and step-time comparisons and the generated verdict."""
    from experiments.protocol.report import engines as rep

    from experiments.protocol.common import write_jsonl_gz

    smol = str(tmp_path / "smol.jsonl.gz")  # the committed reruns' stand-in: seed 0 the same curve, seed 1 another
    write_jsonl_gz(smol, [{"kind": "run", "arm": rep.REPRO_ARM, "seed": s, "eval_after": {"accuracy": acc},
                           "steps": [{"reward/mean": x, "entropy/mean": 0.8} for x in rewards]}
                          for s, acc, rewards in ((0, 0.40, (0.1, 0.2, 0.3)), (1, 0.325, (0.1, 0.25, 0.3)))])
    part = _engines_data(tmp_path, {("gtpo", 0): 0.40, ("trl", 0): 0.44, ("gtpo", 1): 0.35})
    text, res = rep.section(part, use_git=False, smol_path=smol)
    assert ("seed 0 40.0 % (committed 40.0 %; reward identical at every step, entropy identical at every step); "
            "seed 1 35.0 % (committed 32.5 %; reward first differs at step 2, entropy identical at every step).") in text
    assert res["n_done"] == 3 and res["seeds"] == [0] and "primary" not in res
    assert "**Running:** 3 of 8 runs; by the stopping rule no test is computed" in text
    assert "| 0 | 40.0 | 44.0 | +4.0 | 10.0 | 20.0 | 10 | 20 |" in text  # 30 and 60 CPU s over 3 steps
    assert "| 1 | 35.0 | — | — | 10.0 | — | 10 | — |" in text
    assert "Verdict (the declared rule)" not in text
    # TRL's reward is 0.1 higher at every step (mean 0.3 vs 0.2), entropy equal; step time 2x, CPU 2x
    assert "| reward, mean of all steps | 0.2 | 0.3 | +0.100 | n/a |" in text  # one pair: no t-test
    assert "median wall seconds per step 2.00x; training CPU seconds per step 2.00x (seeds 0)" in text
    assert "CPU seconds per step gtpo's engine 10-10; TRL's engine (`--engine trl`) 20-20." in text
    assert "| 3 | 0.3 | 0.4 | 0.8 | 0.8 |" not in text and res["mean_curves"]["trl"][3]["reward"] == pytest.approx(0.4)

    # all four pairs: TRL - gtpo = +4, -2, +1, -3 points: mean 0, SD sqrt(30 / 3) = 3.162 points, t = 0
    full = _engines_data(tmp_path, {**{("gtpo", s): a for s, a in zip(range(4), (0.40, 0.42, 0.38, 0.41))},
                                    **{("trl", s): a for s, a in zip(range(4), (0.44, 0.40, 0.39, 0.38))}})
    text, res = rep.section(full, use_git=False, smol_path=smol)
    p = res["primary"]
    assert p["mean"] == pytest.approx(0.0, abs=1e-12) and p["sd"] == pytest.approx(math.sqrt(10) / 100)
    half = 2.3533634 * math.sqrt(10) / 100 / 2  # 3.72 points
    assert p["ci90"] == pytest.approx((-half, half), rel=1e-5, abs=1e-9)
    assert p["verdict"] == "agree within ±10 points"
    assert "**Verdict (the declared rule): agree within ±10 points.** TRL's engine minus gtpo's engine" in text
    assert "+0.0 points on 4 paired seeds" in text and "90 % interval -3.7 to +3.7 points" in text
    assert "W+ = 5" in text  # ranks of |4, 2, 1, 3|: positives 4 and 1 -> 4 + 1 = 5
    assert "Running" not in text
    assert res["curve_tests"]["reward, mean of all steps"]["mean"] == pytest.approx(0.1)
    assert rep.status_row(res)[1].startswith("8 of 8 runs.")
