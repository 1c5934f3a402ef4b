"""Tests of gtpo.data: prompt templates, gold-answer extraction, every hub loader on fixtures
in the hub's own format (tests/fixtures/data, written by make_fixtures.py), reasoning-gym
generation, local files and the error messages."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from gtpo.data import (
    ANSWER_ONLY_SYSTEM_PROMPT,
    FORMAT_SYSTEM_PROMPT,
    HUB_IDS,
    KNOWN_TASKS,
    MATH_SUBJECTS,
    SYSTEM_PROMPT,
    extract_gsm8k_answer,
    format_paper_completion,
    last_boxed,
    load_task,
    make_prompt,
)
from gtpo.rewards import paper_score

FIXTURES = Path(__file__).parent / "fixtures" / "data"


# ---- prompts ----------------------------------------------------------------------------
def test_make_prompt_templates():
    q = "What is 2 + 3?"
    assert make_prompt(q) == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": q},
    ]
    assert make_prompt(q, template="unsloth")[0]["content"] == FORMAT_SYSTEM_PROMPT
    assert make_prompt(q, template="answer_only")[0]["content"] == ANSWER_ONLY_SYSTEM_PROMPT
    assert make_prompt(q, template="paper", system_prompt="Be brief.")[0] == {
        "role": "system", "content": "Be brief."}
    assert make_prompt(q, template="none") == [{"role": "user", "content": q}]
    assert make_prompt(q, template="plain") == "Question: What is 2 + 3?\nAnswer:"
    assert make_prompt(q, template="plain", system_prompt="S") == "S\n\nQuestion: What is 2 + 3?\nAnswer:"


def test_system_prompt_asks_for_the_paper_format():
    for tag in ("<reasoning>", "</reasoning>", "<answer>", "</answer>"):
        assert tag in SYSTEM_PROMPT
        assert tag in FORMAT_SYSTEM_PROMPT
    assert "step by step" in SYSTEM_PROMPT


def test_make_prompt_errors():
    with pytest.raises(ValueError, match=r"template: expected one of .*'paper'.*got 'chat'"):
        make_prompt("q", template="chat")
    with pytest.raises(ValueError, match="question: expected a non-empty string"):
        make_prompt("  ")
    with pytest.raises(ValueError, match="template 'none' has no system message"):
        make_prompt("q", template="none", system_prompt="S")


def test_format_paper_completion_earns_the_full_paper_reward():
    target = format_paper_completion("48 / 2 = 24, 48 + 24 = 72", "72")
    assert target == "<reasoning>\n48 / 2 = 24, 48 + 24 = 72\n</reasoning>\n<answer>72</answer>"
    assert paper_score(target, "72") == 20.0


# ---- gold answers -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", "72"),
        ("... \n#### 1,080", "1080"),
        ("#### -3 ", "-3"),
        ("a #### 1 then #### 2", "2"),  # the last marker
        ("no marker 5", None),
        ("#### ", None),
    ],
)
def test_extract_gsm8k_answer(text, expected):
    assert extract_gsm8k_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("The area is $\\fbox{9}$.", "9"),
        ("remainder is $\\boxed 2$.", "2"),
        ("first \\boxed{1}, final \\boxed{2}", "2"),
        ("no box", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


# ---- hub loaders on fixtures in the hub's format ----------------------------------------
def _user(row):
    return row["prompt"][-1]["content"]


def test_hub_ids_documented():
    assert HUB_IDS["gsm8k"].hub_id == "openai/gsm8k" and HUB_IDS["gsm8k"].configs == ("main",)
    assert HUB_IDS["math"].configs == tuple(MATH_SUBJECTS) and len(MATH_SUBJECTS) == 7
    assert HUB_IDS["mmlu"].configs == ("all",)
    assert set(HUB_IDS) <= set(KNOWN_TASKS)


def test_gsm8k_fixture():
    train = load_task("gsm8k", split="train", path=FIXTURES / "gsm8k")
    assert train["answer"][:] == ["72", "10", "1080"]  # commas stripped
    row = train[0]
    assert row["question"].startswith("Natalia sold clips")
    assert row["prompt"] == make_prompt(row["question"])
    assert row["task"] == "gsm8k"
    # worked solution without "####" and without calculator annotations
    assert row["solution"] == ("Natalia sold 48/2 = 24 clips in May.\n"
                               "Natalia sold 48+24 = 72 clips altogether in April and May.")
    test = load_task("gsm8k", split="test", path=FIXTURES / "gsm8k")
    assert test["answer"][:] == ["18", "3"]


def test_gsm8k_single_file_path_and_plain_template():
    file = FIXTURES / "gsm8k" / "main" / "test-00000-of-00001.parquet"
    ds = load_task("gsm8k", split="test", path=file, template="plain")
    assert ds["answer"][:] == ["18", "3"]
    assert ds[1]["prompt"] == f"Question: {ds[1]['question']}\nAnswer:"


def test_math_fixture_all_subjects():
    ds = load_task("math", split="train", path=FIXTURES / "hendrycks_math")
    # 7 subjects x 2 rows, minus the geometry row whose solution has no \boxed
    assert len(ds) == 13
    answers = ds["answer"][:]
    assert answers[:2] == ["2", "\\frac{1}{2}"]            # nested braces kept whole
    assert "9" in answers                                   # \fbox{9}
    assert "\\dfrac{1}{4}" in answers
    assert set(ds["type"][:]) == set(MATH_SUBJECTS.values())
    assert set(ds.column_names) >= {"prompt", "question", "answer", "solution", "level", "type", "task"}
    test = load_task("math", split="test", path=FIXTURES / "hendrycks_math")
    assert test["answer"][:] == ["12", "70", "4\\pi", "\\{-1, 1\\}", "6", "10", "1"]


def test_math_subjects(tmp_path):
    ds = load_task("math", split="train", path=FIXTURES / "hendrycks_math", subjects=["number_theory"])
    assert ds["answer"][:] == ["2", "6"]                    # "\boxed 2" form and "\boxed{6}"
    # a single file holding several subjects: filtered on the `type` column
    flat = tmp_path / "math_train.parquet"
    rows = [r for s in ("algebra", "prealgebra") for r in datasets.load_dataset(
        "parquet", data_files=str(FIXTURES / "hendrycks_math" / s / "train-00000-of-00001.parquet"),
        split="train").to_list()]
    datasets.Dataset.from_list(rows).to_parquet(str(flat))
    only = load_task("math", split="train", path=flat, subjects=["prealgebra"])
    assert only["answer"][:] == ["3.75", "3.14"]
    # a partial local copy: the missing subjects are named
    partial = tmp_path / "hendrycks_math"
    shutil.copytree(FIXTURES / "hendrycks_math" / "algebra", partial / "algebra")
    with pytest.raises(ValueError, match=r"no sub-directory for subject\(s\) \['counting_and_probability'"):
        load_task("math", path=partial)
    assert len(load_task("math", path=partial, subjects=["algebra"])) == 2
    with pytest.raises(ValueError, match="subjects: expected a non-empty list of"):
        load_task("math", path=partial, subjects=["calculus"])


def test_math500_fixture():
    ds = load_task("math500", split="test", path=FIXTURES / "MATH-500")
    assert ds["answer"][:] == ["\\left( 3, \\frac{\\pi}{2} \\right)", "26000", "\\frac{1}{2}"]
    assert ds[0]["unique_id"] == "test/precalculus/807.json" and ds[0]["level"] == 2
    assert ds[0]["subject"] == "Precalculus"
    with pytest.raises(ValueError, match=r"split: task 'math500' \(HuggingFaceH4/MATH-500\) has splits \['test'\]"):
        load_task("math500", split="train", path=FIXTURES / "MATH-500")


def test_aime_and_amc_fixtures():
    aime24 = load_task("aime24", split="test", path=FIXTURES / "aime_2024")  # alias of "train"
    assert aime24["answer"][:] == ["204", "025", "809"]
    assert _user(aime24[0]).startswith("Every morning Aya")
    assert load_task("aime24", split="train", path=FIXTURES / "aime_2024")["answer"][:] == aime24["answer"][:]
    aime25 = load_task("aime25", split="test", path=FIXTURES / "aime_2025")
    assert aime25["answer"][:] == ["70", "16"] and aime25["task"][:] == ["aime25", "aime25"]
    amc = load_task("amc23", split="test", path=FIXTURES / "amc23")
    assert amc["answer"][:] == ["27", "36", "3159"]        # float answers 27.0 -> "27"
    assert _user(amc[0]).startswith("Cities $A$ and $B$")


def test_mmlu_fixture():
    ds = load_task("mmlu", split="test", path=FIXTURES / "mmlu")
    assert ds["answer"][:] == ["B", "C", "D"]
    assert ds[0]["choices"] == ["0", "4", "2", "6"] and ds[0]["subject"] == "abstract_algebra"
    assert ds[0]["question"] == (
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n\n"
        "A. 0\nB. 4\nC. 2\nD. 6\n\nAnswer with the letter (A, B, C or D) of the correct choice.")
    # the question's parts are kept as data: the bare stem (the choices and subject above)
    assert ds[0]["stem"] == "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q."
    # "dev" and "validation" are distinct splits (datasets' own inference would merge them)
    assert len(load_task("mmlu", split="validation", path=FIXTURES / "mmlu")) == 1
    assert load_task("mmlu", split="dev", path=FIXTURES / "mmlu")["subject"][:] == ["abstract_algebra"]
    anatomy = load_task("mmlu", split="test", path=FIXTURES / "mmlu", subjects=["anatomy"])
    assert anatomy["answer"][:] == ["D"]


def test_hub_without_network_says_to_pass_path():
    with pytest.raises(RuntimeError, match=r"openai/gsm8k.*pass path="):
        load_task("gsm8k")


def test_size_subsamples_deterministically():
    path = FIXTURES / "hendrycks_math"
    full = load_task("math", path=path)["question"][:]
    a = load_task("math", path=path, size=5, seed=3)["question"][:]
    assert a == load_task("math", path=path, size=5, seed=3)["question"][:]
    assert a[:2] == load_task("math", path=path, size=2, seed=3)["question"][:]  # prefix
    assert a != load_task("math", path=path, size=5, seed=4)["question"][:]
    assert set(a) <= set(full) and len(set(a)) == 5
    everything = load_task("math", path=path, size=100, seed=3)["question"][:]
    assert sorted(everything) == sorted(full)               # at most all rows


# ---- reasoning-gym ----------------------------------------------------------------------
DEMO = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=["+", "-"])


def test_reasoning_gym_kwargs_pass_through():
    ds = load_task("basic_arithmetic", size=40, seed=0, **DEMO)
    assert len(ds) == 40
    assert set(ds.column_names) == {"prompt", "question", "answer", "task", "rg_entry", "rg_config"}
    for row in ds:
        expression = json.loads(row["rg_entry"])["metadata"]["expression"]
        numbers = re.findall(r"\d+", expression)
        assert len(numbers) == 2 and all(len(n) <= 2 for n in numbers)
        assert not re.search(r"[*/]", expression)
        assert int(row["answer"]) == eval(expression)  # noqa: S307 - generated arithmetic
        assert row["task"] == "basic_arithmetic"
        assert row["prompt"] == make_prompt(row["question"])
    assert json.loads(ds[0]["rg_config"]) == DEMO


def test_reasoning_gym_deterministic_and_prefix_name():
    a = load_task("basic_arithmetic", size=30, seed=7, **DEMO)
    b = load_task("rg:basic_arithmetic", size=30, seed=7, **DEMO)
    assert a.to_list() == b.to_list()
    c = load_task("basic_arithmetic", size=30, seed=8, **DEMO)
    assert a["question"][:] != c["question"][:]


def test_reasoning_gym_train_test_disjoint():
    train = load_task("basic_arithmetic", split="train", size=400, seed=0, **DEMO)
    test = load_task("basic_arithmetic", split="test", size=100, seed=0, **DEMO)
    key = lambda q: "".join(q.split())  # noqa: E731 - whitespace variants are the same question
    train_q = {key(q) for q in train["question"]}
    test_q = [key(q) for q in test["question"]]
    assert len(test_q) == len(set(test_q)) == 100        # no duplicates in test
    assert not train_q & set(test_q)
    # also against a train set drawn with another seed
    other = load_task("basic_arithmetic", split="train", size=400, seed=123, **DEMO)
    assert not {key(q) for q in other["question"]} & set(test_q)


def test_reasoning_gym_errors():
    with pytest.raises(ValueError, match=r"rejected by reasoning-gym task 'basic_arithmetic'.*Its config"):
        load_task("basic_arithmetic", size=2, bogus_option=1)
    with pytest.raises(ValueError, match="rejected"):
        load_task("basic_arithmetic", size=2, min_terms=3, max_terms=2)  # reasoning-gym validate()
    with pytest.raises(ValueError, match="splits 'train' and 'test'"):
        load_task("basic_arithmetic", split="validation", size=2)
    with pytest.raises(ValueError, match="not a reasoning-gym task"):
        load_task("rg:no_such_task", size=2)
    with pytest.raises(ValueError, match="path/columns: not used"):
        load_task("basic_arithmetic", size=2, path="x")
    # a question space too small for the requested test size: 1-digit a + b has 100 questions
    with pytest.raises(ValueError, match="question space is too small"):
        load_task("basic_arithmetic", split="test", size=50, min_terms=2, max_terms=2, max_digits=1,
                  operators=["+"], allow_negation=False, allow_parentheses=False)


# ---- local files ------------------------------------------------------------------------
ROWS = [
    {"question": "What is 2 + 3?", "answer": "5", "source": "a"},
    {"question": "What is 10 / 4?", "answer": 2.5, "source": "b"},
    {"question": "What is 7 * 6?", "answer": 42, "source": "c"},
]


def _write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif name.endswith(".json"):
        path.write_text(json.dumps(rows))
    elif name.endswith(".csv"):
        keys = list(rows[0])
        path.write_text(",".join(keys) + "\n" + "".join(
            ",".join(str(r[k]) for k in keys) + "\n" for r in rows))
    elif name.endswith(".parquet"):
        datasets.Dataset.from_list([{k: str(v) for k, v in r.items()} for r in rows]).to_parquet(str(path))
    return path


@pytest.mark.parametrize("name", ["qa.jsonl", "qa.json", "qa.csv", "qa.parquet"])
def test_local_files(tmp_path, name):
    path = _write(tmp_path, name, ROWS)
    ds = load_task(str(path))
    assert ds["question"][:] == [r["question"] for r in ROWS]
    assert ds["answer"][:] == ["5", "2.5", "42"]
    assert ds["source"][:] == ["a", "b", "c"]              # extra columns are kept
    assert ds[0]["prompt"] == make_prompt("What is 2 + 3?")
    assert ds[0]["task"] == name
    assert load_task(str(path), path=path)["answer"][:] == ["5", "2.5", "42"]  # same path: fine
    with pytest.raises(ValueError, match="path: only for hub tasks"):
        load_task(str(path), path=tmp_path / "other.jsonl")


def test_local_file_column_mapping_and_size(tmp_path):
    rows = [{"q": r["question"], "gold": str(r["answer"])} for r in ROWS]
    path = _write(tmp_path, "mapped.jsonl", rows)
    ds = load_task(str(path), columns={"question": "q", "answer": "gold"}, template="none")
    assert ds.column_names == ["prompt", "question", "answer", "task"]
    assert ds["answer"][:] == ["5", "2.5", "42"]
    assert ds[2]["prompt"] == [{"role": "user", "content": "What is 7 * 6?"}]
    assert len(load_task(str(path), columns={"question": "q", "answer": "gold"}, size=2)) == 2


def test_local_file_prompt_column_kept_verbatim(tmp_path):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 1 + 1?"}]
    path = _write(tmp_path, "conv.jsonl", [{"prompt": messages, "answer": "2"}])
    ds = load_task(str(path))
    assert ds[0]["prompt"] == messages
    assert ds[0]["question"] == "What is 1 + 1?"


@pytest.mark.parametrize(
    "rows, kwargs, message",
    [
        ([{"question": "q"}], {}, r"bad\.jsonl: missing column 'answer' \(or 'solution'\); columns found: \['question'\]"),
        ([{"text": "q", "answer": "1"}], {}, r"bad\.jsonl: missing column 'question' \(or 'prompt'\)"),
        ([{"q": "q", "answer": "1"}], {"columns": {"question": "qq"}},
         r"bad\.jsonl: missing column 'qq' \(mapped to 'question'"),
        ([{"question": "q", "answer": "1"}, {"question": "", "answer": "2"}], {},
         r"bad\.jsonl: row 1: the question is empty"),
        ([{"question": "q", "answer": "1"}, {"question": "r", "answer": None}], {},
         r"bad\.jsonl: row 1: column 'answer' is empty"),
        ([{"question": "q", "answer": "1"}], {"columns": {"gold": "answer"}},
         r"columns: keys must be among"),
    ],
)
def test_local_file_errors(tmp_path, rows, kwargs, message):
    path = _write(tmp_path, "bad.jsonl", rows)
    with pytest.raises(ValueError, match=message):
        load_task(str(path), **kwargs)


def test_local_file_unreadable_or_missing(tmp_path):
    with pytest.raises(ValueError, match=r"nope\.jsonl: file not found"):
        load_task(str(tmp_path / "nope.jsonl"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "q", "answer": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl: could not read it as json"):
        load_task(str(broken))


# ---- argument errors --------------------------------------------------------------------
def test_unknown_task_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown task 'gsm9k'; known tasks: \['gsm8k', 'math', "
                                         r"'math500', 'aime24', 'aime25', 'amc23', 'mmlu', "
                                         r"'basic_arithmetic'"):
        load_task("gsm9k")
    with pytest.raises(ValueError, match="unknown task 'data.txt'"):
        load_task("data.txt")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="gsm8k", size=0), "size: expected a positive integer"),
        (dict(name="gsm8k", template="chat"), "template: expected one of"),
        (dict(name="gsm8k", columns={"question": "q"}), "columns: only for local files"),
        (dict(name="gsm8k", min_terms=2), r"unexpected keyword\(s\) \['min_terms'\] for task 'gsm8k'"),
        (dict(name="aime24", subjects=["x"]), "subjects: only for 'math' and 'mmlu'"),
        (dict(name=""), "name: expected a task name"),
    ],
)
def test_argument_errors(kwargs, message):
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=message):
        load_task(name, **kwargs)


def test_modules_do_not_import_torch():
    code = "import sys, gtpo.data, gtpo.rewards; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
