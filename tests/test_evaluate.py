"""Tests of gtpo.evaluation: pass@k, maj@k, scoring, rescoring, MMLU, in-training eval, `gtpo eval`.

Estimator values are worked out by hand in the comments; the combinatorial maj@k is checked
against brute-force enumeration of all subsets; the batched MMLU log-likelihoods against one
unpadded forward pass per sequence; the end-to-end runs use the session's tiny random model
(~100k parameters) and the fixture datasets of tests/fixtures/data.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
from fractions import Fraction
from pathlib import Path

import pytest

from gtpo.cli import add_eval_arguments, eval_main
from gtpo.evaluation import (
    continuation_logprobs,
    default_k_list,
    evaluate,
    evaluate_during_training,
    evaluate_mmlu,
    group_answers,
    maj_at_k,
    majority_vote_score,
    mmlu_prompt,
    mmlu_stem,
    pass_at_k,
    rescore,
    score_samples,
    ScoringOptions,
)

FIXTURES = Path(__file__).parent / "fixtures" / "data"
TOL = 1e-12


# --------------------------------------------------------------------------------- pass@k


def test_pass_at_k_hand_values():
    # n=5, c=2: pass@1 = 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=TOL)
    # pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=TOL)
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252 = 11/12
    assert pass_at_k(10, 3, 5) == pytest.approx(11 / 12, abs=TOL)
    # n - c < k: every subset holds a correct sample
    assert pass_at_k(5, 2, 4) == 1.0
    # c = 0 gives 0, c = n gives 1
    for n in (1, 5, 64):
        for k in (1, n):
            assert pass_at_k(n, 0, k) == 0.0
            assert pass_at_k(n, n, k) == 1.0
    # k = n equals 1[c > 0]
    for c in range(0, 7):
        assert pass_at_k(6, c, 6) == float(c > 0)


def _pass_at_k_product(n: int, c: int, k: int) -> float:
    """Chen et al. 2021's numpy form: 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def test_pass_at_k_matches_product_form_and_exact_fraction():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 300)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        value = pass_at_k(n, c, k)
        assert value == float(exact)  # exact integers, one correctly rounded division
        assert value == pytest.approx(_pass_at_k_product(n, c, k), rel=1e-9, abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    # n = 100000, c = 1, k = 1: exactly 1e-5; C(n, k) for k = n/2 has ~30000 digits
    assert pass_at_k(100_000, 1, 1) == pytest.approx(1e-5, rel=1e-15)
    value = pass_at_k(100_000, 3, 50_000)
    # 1 - C(n-3, k)/C(n, k) = 1 - prod_{i=0}^{2} (n-k-i)/(n-i) ≈ 1 - 1/8
    assert value == pytest.approx(_pass_at_k_product(100_000, 3, 50_000), rel=1e-12)
    assert 0.0 < value < 1.0 and math.isfinite(value)


def test_pass_at_k_monotone_in_k_and_c():
    for n in (8, 13):
        for c in range(n + 1):
            values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
            assert all(a <= b + TOL for a, b in zip(values, values[1:]))
        for k in range(1, n + 1):
            values = [pass_at_k(n, c, k) for c in range(n + 1)]
            assert all(a <= b + TOL for a, b in zip(values, values[1:]))


@pytest.mark.parametrize(
    "args, match",
    [
        ((4, 1, 5), r"k must be <= n.*k=5 > n=4"),
        ((4, 5, 1), r"c \(correct samples\) must be <= n=4"),
        ((4, -1, 1), "c must be a non-negative integer"),
        ((-4, 1, 1), "n must be a non-negative integer"),
        ((4, 1, 0), "k must be >= 1"),
        ((0, 0, 1), "n .* must be >= 1"),
        ((4, 1.0, 1), "c must be a non-negative integer, got 1.0"),
        ((4, True, 1), "c must be a non-negative integer"),
    ],
)
def test_pass_at_k_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(*args)


def test_default_k_list():
    assert default_k_list(64) == [1, 8, 16, 32, 64]
    assert default_k_list(32) == [1, 8, 16, 32]
    assert default_k_list(4) == [1, 4]
    assert default_k_list(1) == [1]
    assert default_k_list(20) == [1, 8, 16, 20]


# --------------------------------------------------------------------------------- maj@k


def test_maj_at_k_tie_rules():
    # Two classes of one sample each, k = 2: a tie between "1" (gold) and "2".
    # expected: the only subset is a tie among t = 2 classes -> 1/2.
    assert maj_at_k(["1", "2"], "1", 2) == pytest.approx(0.5, abs=TOL)
    # first: the tie goes to the class whose first sample comes earliest.
    assert maj_at_k(["1", "2"], "1", 2, estimator="first") == 1.0
    assert maj_at_k(["2", "1"], "1", 2, estimator="first") == 0.0
    # Three-way tie, gold among them: 1/3.
    assert maj_at_k(["4", "5", "6"], "5", 3) == pytest.approx(1 / 3, abs=TOL)
    assert maj_at_k(["4", "5", "6"], "5", 3, estimator="first") == 0.0


def test_maj_at_k_equivalent_answers_written_differently():
    answers = ["0.5", "\\frac{1}{2}", "1/2", "3", "3"]
    # math-verify groups the first three into the gold class (3 samples) vs "3" (2 samples).
    # k=1: 3/5 = 0.6 (= pass@1).
    assert maj_at_k(answers, "1/2", 1) == pytest.approx(0.6, abs=TOL)
    # k=2: C(5,2)=10 pairs: GG 3 -> 1, G3 3*2=6 ties -> 1/2 each = 3, 33 1 -> 0: 6/10.
    assert maj_at_k(answers, "1/2", 2) == pytest.approx(0.6, abs=TOL)
    # k=3: GGG 1 -> 1, GG3 3*2=6 -> 1, G33 3 -> 0: 7/10.
    assert maj_at_k(answers, "1/2", 3) == pytest.approx(0.7, abs=TOL)
    # k=4: GGG3 2 -> 1, GG33 3 ties -> 1/2: (2 + 1.5)/5 = 0.7.
    assert maj_at_k(answers, "1/2", 4) == pytest.approx(0.7, abs=TOL)
    # k=5: 3 vs 2 -> 1.
    assert maj_at_k(answers, "1/2", 5) == 1.0
    # first 4: {0.5, \frac12, 1/2} x3 vs "3" x1 -> gold wins; first 2 is a tie won by "0.5".
    assert maj_at_k(answers, "0.5", 4, estimator="first") == 1.0
    assert maj_at_k(["3", "0.5", "1/2", "3"], "1/2", 4, estimator="first") == 0.0  # tie: "3" first
    # The same sets with the gold written another way give the same values.
    assert maj_at_k(answers, "\\frac{1}{2}", 3) == pytest.approx(0.7, abs=TOL)


def test_maj_at_k_unparsable_answers():
    answers = [None, None, "2"]
    # abstain: None does not vote. k=3: only "2" votes -> 1. k=2: {N,N} 0, {N,2} x2 -> 1: 2/3.
    assert maj_at_k(answers, "2", 3) == 1.0
    assert maj_at_k(answers, "2", 2) == pytest.approx(2 / 3, abs=TOL)
    assert maj_at_k(answers, "2", 1) == pytest.approx(1 / 3, abs=TOL)
    # vote: None is a class (2 samples) that wins k=3; k=2: {N,N} 0, {N,2} ties -> 1/2 each: 1/3.
    assert maj_at_k(answers, "2", 3, unparsable="vote") == 0.0
    assert maj_at_k(answers, "2", 2, unparsable="vote") == pytest.approx(1 / 3, abs=TOL)
    # first: the first two are both None -> abstain scores 0 (nobody voted), vote scores 0.
    assert maj_at_k(answers, "2", 2, estimator="first") == 0.0
    assert maj_at_k(["2", None, None], "2", 3, estimator="first") == 1.0
    assert maj_at_k(["2", None, None], "2", 3, estimator="first", unparsable="vote") == 0.0
    # empty strings are unparsable too; all unparsable -> 0; gold never produced -> 0.
    assert maj_at_k(["", None], "2", 2) == 0.0
    assert maj_at_k(["3", "4", "4"], "2", 3) == 0.0


def test_maj_at_k_bad_input():
    with pytest.raises(ValueError, match=r"k must be <= n.*k=4 > n=3"):
        maj_at_k(["1", "2", "3"], "1", 4)
    with pytest.raises(ValueError, match="estimator must be one of"):
        maj_at_k(["1"], "1", 1, estimator="mean")
    with pytest.raises(ValueError, match="unparsable must be one of"):
        maj_at_k(["1"], "1", 1, unparsable="skip")
    with pytest.raises(ValueError, match="correct has 1 entries but answers has 2"):
        maj_at_k(["1", "2"], "1", 1, correct=[True])


def _brute_force_majority(class_ids, gold_class, k, unparsable):
    """Mean over every k-subset of the 1/t-tie-rule vote score (exact fractions)."""
    total = Fraction(0)
    subsets = list(itertools.combinations(range(len(class_ids)), k))
    if gold_class is None:
        return total
    for subset in subsets:
        counts = {}
        for i in subset:
            c = class_ids[i]
            if c is None and unparsable == "abstain":
                continue
            counts[c] = counts.get(c, 0) + 1
        if not counts or gold_class not in counts:
            continue
        best = max(counts.values())
        if counts[gold_class] == best:
            total += Fraction(1, sum(1 for m in counts.values() if m == best))
    return total / len(subsets)


def test_majority_vote_expected_matches_brute_force():
    rng = random.Random(1)
    for _ in range(250):
        n = rng.randint(1, 9)
        n_classes = rng.randint(1, 4)
        ids = [rng.choice(list(range(n_classes)) + [None]) for _ in range(n)]
        gold = rng.choice([0, 1, None])
        k = rng.randint(1, n)
        for mode in ("abstain", "vote"):
            expected = _brute_force_majority(ids, gold, k, mode)
            got = majority_vote_score(ids, gold, k, unparsable=mode)
            assert got == pytest.approx(float(expected), abs=TOL), (ids, gold, k, mode)


def test_majority_vote_first_matches_reference_and_expected_properties():
    rng = random.Random(2)
    for _ in range(200):
        n = rng.randint(1, 10)
        ids = [rng.choice([0, 1, 2, None]) for _ in range(n)]
        k = rng.randint(1, n)
        # reference for "first", abstain: counts over the first k, earliest-first tie-break.
        head = [c for c in ids[:k] if c is not None]
        if head:
            counts = {c: head.count(c) for c in head}
            best = max(counts.values())
            winner = next(c for c in head if counts[c] == best)
            want = float(winner == 0)
        else:
            want = 0.0
        assert majority_vote_score(ids, 0, k, estimator="first") == want
        # maj@1 (expected) is the share of gold samples, i.e. pass@1.
        assert majority_vote_score(ids, 0, 1) == pytest.approx(ids.count(0) / n, abs=TOL)
        # permuting the samples does not change the expected estimator.
        shuffled = ids[:]
        rng.shuffle(shuffled)
        assert majority_vote_score(shuffled, 0, k) == pytest.approx(
            majority_vote_score(ids, 0, k), abs=TOL)


def test_majority_vote_large_n_exact_enough():
    # 64 samples: 20 gold, 44 distinct singletons -> for k >= 2 gold wins whenever it has >= 2
    # samples in the subset; with 1 it ties with the other singletons.
    ids = [0] * 20 + list(range(1, 45))
    value = majority_vote_score(ids, 0, 32)
    assert 0.99 < value <= 1.0
    # k = 64: 20 vs 1 each -> 1.
    assert majority_vote_score(ids, 0, 64) == 1.0
    # 10 gold vs a class of 24: gold never wins the full vote.
    ids = [0] * 10 + [1] * 24 + list(range(2, 32))
    assert majority_vote_score(ids, 0, 64) == 0.0


def test_group_answers_classes():
    ids, gold = group_answers(["0.5", "\\frac{1}{2}", "1/2", "7", None, " 7 "], "7")
    # "7" and " 7 " are the gold class 0; the three halves are one class; None stays None.
    assert ids == [1, 1, 1, 0, None, 0]
    assert gold == 0
    ids, gold = group_answers(["1", "2", "1"], "5")
    assert ids == [1, 2, 1] and gold is None
    # explicit correctness flags override the comparison with gold
    ids, gold = group_answers(["a", "b", "a"], None, correct=[False, True, False],
                              equivalent=lambda x, y: x == y)
    assert ids == [1, 0, 1] and gold == 0


# --------------------------------------------------------------------------------- scoring


def _sample(text, length=5, truncated=False):
    return {"text": text, "length": length, "truncated": truncated}


def _tagged(answer):
    return f"<reasoning>think</reasoning>\n<answer>{answer}</answer>"


def _hand_results():
    """Results as evaluate() stores them, with texts written by hand (n = 4)."""
    problems = [
        {"index": 0, "question": "half of one?", "gold": "1/2", "samples": [
            _sample(_tagged("0.5"), 10), _sample(_tagged("\\frac{1}{2}"), 12),
            _sample("no answer here", 20, truncated=True), _sample(_tagged("3"), 8)]},
        {"index": 1, "question": "two plus two?", "gold": "4", "samples": [
            _sample(_tagged("5"), 6), _sample(_tagged("5"), 6),
            _sample("the answer is 4", 4), _sample(_tagged("4"), 6)]},
    ]
    settings = {"n": 4, "k": [1, 2, 4], "maj_k": [2, 4], "answer_from": "tag",
                "maj_estimator": "expected", "unparsable": "abstain"}
    return {"dataset": "hand", "model": "none", "settings": settings, "metrics": {},
            "problems": problems}


def test_rescore_hand_results_exact_metrics(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_hand_results()))
    r = rescore(path, out=tmp_path / "rescored.json")
    m = r["metrics"]
    # problem 0 (answer_from="tag"): answers [0.5, \frac12, None, 3] -> c = 2 of 4.
    # problem 1: answers [5, 5, None ("4" is untagged), 4] -> c = 1 of 4.
    p0, p1 = r["problems"]
    assert [s["correct"] for s in p0["samples"]] == [True, True, False, False]
    assert [s["answer"] for s in p1["samples"]] == ["5", "5", None, "4"]
    # pass@1 = (2/4 + 1/4)/2 = 0.375; pass@2 = ((1 - C(2,2)/C(4,2)) + (1 - C(3,2)/C(4,2)))/2
    #        = ((1 - 1/6) + (1 - 3/6))/2 = (5/6 + 1/2)/2 = 2/3; pass@4 = 1.
    assert m["pass@1"] == pytest.approx(0.375, abs=TOL)
    assert m["pass@2"] == pytest.approx(2 / 3, abs=TOL)
    assert m["pass@4"] == 1.0
    # maj@2 (abstain), problem 0: classes G(2) X(1) and N(1); 6 pairs:
    #   GG 1 -> 1; GX 2 -> 1/2 each; GN 2 -> 1; XN 1 -> 0  => (1 + 1 + 2)/6 = 2/3.
    # problem 1: F="5"(2), G(1), N(1): FF 0; FG 2 -> 1/2; FN 0; GN 1 -> 1 => (1 + 1)/6 = 1/3.
    assert p0["maj@k"]["2"] == pytest.approx(2 / 3, abs=TOL)
    assert p1["maj@k"]["2"] == pytest.approx(1 / 3, abs=TOL)
    assert m["maj@2"] == pytest.approx(0.5, abs=TOL)
    # maj@4: problem 0 G 2 vs X 1 -> 1; problem 1 F 2 vs G 1 -> 0.
    assert m["maj@4"] == pytest.approx(0.5, abs=TOL)
    # format: 6 of 8 texts are fully tagged; unparsable 2 of 8; truncated 1 of 8;
    # mean length (10+12+20+8+6+6+4+6)/8 = 72/8 = 9.
    assert m["format_rate"] == pytest.approx(6 / 8, abs=TOL)
    assert m["unparsable_frac"] == pytest.approx(2 / 8, abs=TOL)
    assert m["truncated_frac"] == pytest.approx(1 / 8, abs=TOL)
    assert m["mean_length"] == pytest.approx(9.0, abs=TOL)
    assert m["n_problems"] == 2 and m["n_samples"] == 8
    assert json.loads((tmp_path / "rescored.json").read_text())["metrics"] == m
    # Other settings without regenerating: the last number makes "4" of problem 1 count.
    r2 = rescore(path, answer_from="last_number", k=[1], maj_k=[4], maj_estimator="first")
    assert [s["correct"] for s in r2["problems"][1]["samples"]] == [False, False, True, True]
    # ... and the last number of "\frac{1}{2}" is "2": problem 0 has answers 0.5, 2, None, 3.
    assert [s["answer"] for s in r2["problems"][0]["samples"]] == ["0.5", "2", None, "3"]
    assert r2["metrics"]["pass@1"] == pytest.approx((1 / 4 + 2 / 4) / 2, abs=TOL)
    # first 4, problem 1: 5, 5, 4, 4 -> tie, "5" came first -> 0; problem 0: 0.5 (gold), 2, 3
    # one vote each (None abstains) -> tie, the gold "0.5" came first -> 1.
    assert r2["problems"][1]["maj@k"]["4"] == 0.0
    assert r2["problems"][0]["maj@k"]["4"] == 1.0
    assert r2["settings"]["maj_estimator"] == "first" and r2["settings"]["k"] == [1]


def test_rescore_bad_input(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        rescore(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        rescore(bad)
    with pytest.raises(ValueError, match=r"k must be <= n.*k=8 > n=4"):
        rescore(_hand_results(), k=[8])


def test_score_samples_unparsable_is_wrong_not_an_error():
    out = score_samples(["<answer></answer>", "", "<answer>}{\\frac</answer>", _tagged("4")],
                        {"answer": "4"}, answer_from="tag")
    assert [s["answer"] for s in out] == [None, None, "}{\\frac", "4"]
    assert [s["correct"] for s in out] == [False, False, False, True]
    assert [s["format"] for s in out] == [False, False, False, True]


def test_score_samples_reasoning_gym_scorer():
    reasoning_gym = pytest.importorskip("reasoning_gym")
    entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=0)[0]
    row = {"answer": entry["answer"], "task": "basic_arithmetic",
           "rg_entry": json.dumps(entry), "rg_config": "{}"}
    out = score_samples([_tagged(entry["answer"]), _tagged("nonsense"), "no tags"], row,
                        answer_from="tag")
    assert [s["correct"] for s in out] == [True, False, False]
    assert out[0]["score"] == 1.0


# --------------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    from gtpo.run.models import load_model, load_tokenizer

    return load_model(tiny_model_path), load_tokenizer(tiny_model_path)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_eval_cli_end_to_end(tiny_model_path, tmp_path, capsys):
    data = _write_jsonl(tmp_path / "probs.jsonl", [
        {"question": "What is 2 + 2?", "answer": "4"},
        {"question": "What is 3 - 1?", "answer": 2},
        {"question": "What is 5 + 5?", "answer": "10"},
    ])
    parser = argparse.ArgumentParser()
    add_eval_arguments(parser)
    out = tmp_path / "res" / "results.json"
    args = parser.parse_args(["--model", tiny_model_path, "--dataset", data, "--n", "3",
                              "--k", "1,3", "--max-new-tokens", "8", "--batch-size", "4",
                              "--out", str(out), "--no-progress", "--dtype", "float32"])
    assert eval_main(args) == 0
    printed = capsys.readouterr().out
    assert "pass@1" in printed and "maj@3" in printed and "format_rate" in printed
    results = json.loads(out.read_text())
    assert results["settings"]["n"] == 3 and results["settings"]["k"] == [1, 3]
    assert results["settings"]["maj_estimator"] == "expected"
    assert set(results["metrics"]) >= {"pass@1", "pass@3", "maj@1", "maj@3", "format_rate",
                                       "mean_length", "truncated_frac", "unparsable_frac"}
    assert [p["gold"] for p in results["problems"]] == ["4", "2", "10"]
    for p in results["problems"]:
        assert len(p["samples"]) == 3
        for s in p["samples"]:
            assert set(s) >= {"text", "answer", "correct", "length", "truncated", "format"}
            assert 1 <= s["length"] <= 8
            if s["truncated"]:  # no EOS within max_new_tokens: all 8 tokens are kept
                assert s["length"] == 8
        c = sum(s["correct"] for s in p["samples"])
        assert p["n_correct"] == c
        assert p["pass@k"]["1"] == pytest.approx(c / 3, abs=TOL)
    lengths = [s["length"] for p in results["problems"] for s in p["samples"]]
    assert results["metrics"]["mean_length"] == pytest.approx(sum(lengths) / 9, abs=TOL)
    # rescoring the file without a model gives the same metrics
    assert rescore(out)["metrics"] == results["metrics"]
    # ... and through the CLI
    args = parser.parse_args(["--rescore", str(out), "--k", "1"])
    assert eval_main(args) == 0
    assert "pass@1" in capsys.readouterr().out


def test_eval_cli_bad_input(tiny_model_path, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_eval_arguments(parser)
    args = parser.parse_args(["--model", tiny_model_path, "--dataset", "no_such_benchmark",
                              "--n", "2", "--k", "1"])
    assert eval_main(args) == 2
    err = capsys.readouterr().err
    assert "unknown task 'no_such_benchmark'" in err and "gsm8k" in err and "aime24" in err
    args = parser.parse_args(["--model", tiny_model_path, "--dataset", "gsm8k", "--n", "4",
                              "--k", "1,8"])
    assert eval_main(args) == 2
    assert "k=8 > n=4" in capsys.readouterr().err
    assert eval_main(parser.parse_args(["--dataset", "gsm8k"])) == 2
    assert "--model and --dataset are required" in capsys.readouterr().err


def test_evaluate_settings_errors(tiny):
    model, tok = tiny
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}]
    with pytest.raises(ValueError, match="temperature=0 decodes greedily"):
        evaluate(model, tok, rows, n=2, temperature=0.0)
    with pytest.raises(ValueError, match="maj_k must be <= n"):
        evaluate(model, tok, rows, n=2, k=[1], maj_k=[4])
    with pytest.raises(ValueError, match="answer_from"):
        evaluate(model, tok, rows, n=1, answer_from="xml")
    with pytest.raises(ValueError, match="tokenizer: required"):
        evaluate(model, None, rows, n=1)


@pytest.mark.parametrize(
    "name, path, golds",
    [
        ("gsm8k", "gsm8k", None),
        ("math", "hendrycks_math", None),
        ("math500", "MATH-500/test.jsonl", None),
        ("aime24", "aime_2024", None),
        ("aime25", "aime_2025", None),
        ("amc23", "amc23/test.jsonl", None),
    ],
)
def test_evaluate_hub_loaders_on_fixtures(tiny, name, path, golds):
    from gtpo.data import load_task

    model, tok = tiny
    expected = load_task(name, split="test", path=FIXTURES / path, size=2)
    r = evaluate(model, tok, name, data_path=str(FIXTURES / path), size=2, n=2, k=[1, 2],
                 max_new_tokens=4)
    assert r["dataset"] == name
    assert [p["gold"] for p in r["problems"]] == expected["answer"]
    assert [p["question"] for p in r["problems"]] == expected["question"]
    assert r["metrics"]["n_samples"] == 2 * len(expected)


def test_evaluate_reasoning_gym_task(tiny):
    pytest.importorskip("reasoning_gym")
    model, tok = tiny
    r = evaluate(model, tok, "rg:basic_arithmetic", size=2, n=2, k=[1, 2], max_new_tokens=4)
    assert r["dataset"] == "rg:basic_arithmetic"
    assert all(p["rg_entry"] for p in r["problems"])
    assert r["metrics"]["n_problems"] == 2
    assert rescore(r)["metrics"] == r["metrics"]


def test_evaluate_is_seeded_and_leaves_global_rng_alone(tiny):
    import torch

    model, tok = tiny
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}]
    torch.manual_seed(123)
    a = evaluate(model, tok, rows, n=3, k=[1], max_new_tokens=6, seed=5)
    after = torch.rand(3)
    torch.manual_seed(123)
    b = evaluate(model, tok, rows, n=3, k=[1], max_new_tokens=6, seed=5)
    assert torch.equal(after, torch.rand(3))  # the caller's random stream is unchanged
    assert [s["text"] for s in a["problems"][0]["samples"]] == \
        [s["text"] for s in b["problems"][0]["samples"]]


def test_evaluate_loads_peft_adapter(tiny_model_path, tmp_path):
    from peft import LoraConfig, get_peft_model

    from gtpo.run.models import load_model

    base = load_model(tiny_model_path)
    lora = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    lora.save_pretrained(tmp_path / "adapter")
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}]
    r = evaluate(tiny_model_path, None, rows, adapter=str(tmp_path / "adapter"), n=1, k=[1],
                 max_new_tokens=3, dtype="float32")
    assert r["adapter"] == str(tmp_path / "adapter")
    with pytest.raises(ValueError, match="adapter: .* does not exist"):
        evaluate(tiny_model_path, None, rows, adapter=str(tmp_path / "nope"), n=1, k=[1])


# --------------------------------------------------------------------------------- MMLU


def _slow_continuation_logprob(model, tok, context, continuation, add_special_tokens=True):
    """One unpadded forward pass over context + continuation (same tokenisation rule)."""
    import torch

    ctx = tok(context, add_special_tokens=add_special_tokens)["input_ids"]
    full = tok(context + continuation, add_special_tokens=add_special_tokens)["input_ids"]
    assert full[:len(ctx)] == ctx
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([full])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[t - 1, full[t]] for t in range(len(ctx), len(full))))


def test_continuation_logprobs_match_unpadded_reference(tiny):
    model, tok = tiny
    contexts = ["What is 2 + 2? Answer:", "apples", "the sum of the books and the cats is"]
    # " the", " what", " sum", " apples" are single tokens of the tiny tokenizer (one forward
    # per context); " A"/" B" are two tokens each (one sequence per continuation).
    conts = [[" the", " what", " sum"], [" A", " B", " apples"], [" 12", " answer"]]
    got = continuation_logprobs(model, tok, contexts, conts, batch_size=2)
    for q, (context, options) in enumerate(zip(contexts, conts)):
        for j, option in enumerate(options):
            want = _slow_continuation_logprob(model, tok, context, option)
            assert got[q][j] == pytest.approx(want, abs=1e-4), (context, option)


class _FullLogitsLM:
    """A causal LM whose forward has no ``logits_to_keep`` (older architectures): the scorer
    must then slice the last positions itself."""

    def __init__(self, model):
        self.model, self.training = model, False

    def parameters(self):
        return self.model.parameters()

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def forward(self, input_ids, attention_mask, position_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids)

    __call__ = forward


def test_continuation_logprobs_without_logits_to_keep(tiny):
    model, tok = tiny
    contexts, conts = ["What is 2 + 2? Answer:", "apples"], [[" the", " A"], [" what", " sum"]]
    from gtpo.evaluation.mmlu import _accepts_logits_to_keep

    assert _accepts_logits_to_keep(model) and not _accepts_logits_to_keep(_FullLogitsLM(model))
    want = continuation_logprobs(model, tok, contexts, conts)
    got = continuation_logprobs(_FullLogitsLM(model), tok, contexts, conts)
    for got_row, want_row in zip(got, want):
        assert got_row == pytest.approx(want_row, abs=1e-5)


def test_mmlu_prompt_format():
    stem = mmlu_stem("What is 1+1?\n\nA. 1\nB. 2\n\nAnswer with the letter (A or B) of the "
                     "correct choice.", ["1", "2"])
    assert stem == "What is 1+1?"
    assert mmlu_prompt(stem, ["1", "2"], "high_school_math") == (
        "The following are multiple choice questions (with answers) about high school math."
        "\n\nWhat is 1+1?\nA. 1\nB. 2\nAnswer:"
    )
    assert mmlu_stem("bare question", ["x"]) == "bare question"


def test_evaluate_mmlu_on_fixture(tiny, tmp_path):
    from gtpo.data import load_task

    model, tok = tiny
    rows = load_task("mmlu", split="test", path=FIXTURES / "mmlu")
    r = evaluate(model, tok, "mmlu", data_path=str(FIXTURES / "mmlu"), batch_size=3,
                 out=tmp_path / "mmlu.json")
    problems = r["problems"]
    assert len(problems) == len(rows)
    first = problems[0]  # the batched scorer itself is checked above; one problem end to end
    context = mmlu_prompt(first["question"], first["choices"], first["subject"])
    want = [_slow_continuation_logprob(model, tok, context, f" {L}") for L in "ABCD"]
    assert first["logprobs"] == pytest.approx(want, abs=1e-4)
    for p, row in zip(problems, rows):
        assert p["pred"] == "ABCD"[max(range(4), key=lambda i: p["logprobs"][i])]
        assert p["gold"] == row["answer"] and p["correct"] == (p["pred"] == p["gold"])
    m = r["metrics"]
    assert m["accuracy"] == pytest.approx(sum(p["correct"] for p in problems) / len(problems))
    subjects = {p["subject"] for p in problems}
    assert set(m["by_subject"]) == subjects
    assert sum(v["n"] for v in m["by_subject"].values()) == len(problems)
    assert m["accuracy_macro"] == pytest.approx(
        sum(v["accuracy"] for v in m["by_subject"].values()) / len(subjects))
    assert rescore(tmp_path / "mmlu.json")["metrics"] == m
    # chat-template variant runs and scores bare letters
    chat = evaluate_mmlu(model, tok, rows, batch_size=4, chat_template=True)
    assert chat["settings"]["chat_template"] is True
    assert all(len(p["logprobs"]) == 4 for p in chat["problems"])


# --------------------------------------------------------------------------------- training


def test_evaluate_during_training_keys_and_side_effects(tiny):
    import torch

    model, tok = tiny
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}, {"prompt": "What is 2 + 3?", "answer": "5"}]
    model.train()
    torch.manual_seed(7)
    greedy = evaluate_during_training(model, tok, rows, n=4, k_list=[1], max_new_tokens=5,
                                      temperature=0.0, batch_size=8)
    after = torch.rand(2)
    assert model.training  # restored
    torch.manual_seed(7)
    sampled = evaluate_during_training(model, tok, rows, n=4, k_list=[1, 4], max_new_tokens=5,
                                       temperature=1.0, batch_size=8)
    assert torch.equal(after, torch.rand(2))  # the training RNG stream is untouched
    assert set(greedy) == {"eval/accuracy_greedy", "eval/format_rate", "eval/mean_length",
                           "eval/truncated_frac", "eval/unparsable_frac", "eval/mean_score"}
    assert set(sampled) == {"eval/pass@1", "eval/pass@4", "eval/maj@4", "eval/format_rate",
                            "eval/mean_length", "eval/truncated_frac", "eval/unparsable_frac",
                            "eval/mean_score"}
    assert all(isinstance(v, float) for v in sampled.values())
    # a reward function that marks everything correct gives pass@k = maj@k = 1
    everything = evaluate_during_training(
        model, tok, rows, n=2, k_list=[1, 2], max_new_tokens=3, temperature=1.0,
        scoring=ScoringOptions(reward_fn=lambda *, completions, **kw: [1.0] * len(completions)))
    assert everything["eval/pass@1"] == 1.0 and everything["eval/maj@2"] == 1.0
    # the reward function gets TRL's arguments: prompts, completions, completion_ids, columns
    seen = {}

    def spy(*, prompts, completions, completion_ids, answer, **kw):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, answer=answer)
        return [0.5] * len(completions)

    half = evaluate_during_training(model, tok, rows[:1], n=2, k_list=[1], max_new_tokens=3,
                                    temperature=1.0, scoring=ScoringOptions(reward_fn=spy, correct_threshold=0.5))
    assert half["eval/pass@1"] == 1.0 and half["eval/mean_score"] == 0.5
    assert seen["prompts"] == [rows[0]["prompt"]] * 2 and seen["answer"] == ["2", "2"]
    assert [tok.decode(ids, skip_special_tokens=True) for ids in seen["ids"]] == \
        seen["completions"]
    assert all(1 <= len(ids) <= 3 for ids in seen["ids"])
    with pytest.raises(ValueError, match="no gold 'answer'"):
        evaluate_during_training(model, tok, [{"prompt": "hi"}], n=1, temperature=0.0)
    with pytest.raises(ValueError, match="k_list must be <= n"):
        evaluate_during_training(model, tok, rows, n=2, k_list=[4], temperature=1.0)


def test_top_level_exports(tiny):
    import gtpo
    import gtpo.evaluation  # noqa: F401  (binds the package, which leaves gtpo.evaluate alone)

    assert gtpo.pass_at_k is pass_at_k and gtpo.maj_at_k is maj_at_k
    model, tok = tiny
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}]
    # gtpo.evaluate is the function gtpo.evaluation.api.evaluate, also after the import above.
    assert gtpo.evaluate is evaluate and gtpo.evaluation.evaluate is evaluate
    for target in (gtpo.evaluate, gtpo.evaluation.api.evaluate):
        with pytest.raises(ValueError, match="temperature=0 decodes greedily"):
            target(model, tok, rows, n=2, temperature=0.0)
