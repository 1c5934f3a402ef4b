"""Task sources: what each task is and how its raw rows become gtpo examples -- the hub ids
(``HUB_IDS``, ``HubSource``), the per-task row processors (GSM8K, MATH, the answer-column sets, MMLU) and the
procedural reasoning-gym tasks (generated offline, disjoint train and test).

Part of :mod:`gtpo.data` (which re-exports the public names and documents the example format).
``reasoning_gym`` is imported inside functions.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping, NamedTuple, Sequence

from gtpo.rewards import extract_boxed_answer

__all__ = [
    "HubSource",
    "HUB_IDS",
    "MATH_SUBJECTS",
    "REASONING_GYM_EXAMPLES",
    "KNOWN_TASKS",
    "RG_TEST_FRACTION",
    "MMLU_LETTERS",
    "mmlu_choice_lines",
    "extract_gsm8k_answer",
]


# ---------------------------------------------------------------------------------------
# Gold-answer extraction
# ---------------------------------------------------------------------------------------

_CALCULATOR_ANNOTATION = re.compile(r"<<[^>]*>>")


def extract_gsm8k_answer(text: str) -> str | None:
    """The GSM8K gold answer: the text after the last ``####``, stripped, commas removed.

    ``"...\\n#### 1,080"`` gives ``"1080"``; text without ``####`` gives None.
    """
    if "####" not in text:
        return None
    answer = text.rsplit("####", 1)[1].strip().replace(",", "")
    return answer or None


def gsm8k_reasoning(text: str) -> str:
    """The worked reasoning of a GSM8K-style rationale: everything from the last ``####`` on removed
    (GSM8K and reasoning-gym ``gsm_symbolic`` rationales end with ``"#### <answer>"``), and the
    calculator annotations ``<<48/2=24>>``."""
    if "####" in text:
        text = text.rsplit("####", 1)[0]
    return _CALCULATOR_ANNOTATION.sub("", text).strip()


def _normalise_answer(value: Any) -> str | None:
    """Gold answers as strings: ints as is, integral floats without ``.0`` (AMC 2023)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    text = str(value).strip()
    return text or None


# ---------------------------------------------------------------------------------------
# Hub sources
# ---------------------------------------------------------------------------------------


class HubSource(NamedTuple):
    """Where a benchmark lives on the Hugging Face hub.

    ``configs``: the hub configs to load and concatenate (``None`` = the default config);
    ``splits``: the hub's split names; ``split_aliases``: extra split names accepted by
    :func:`load_task` and the hub split they map to (single-split benchmarks answer to
    ``"test"``).
    """

    hub_id: str
    configs: tuple[str | None, ...]
    splits: tuple[str, ...]
    split_aliases: Mapping[str, str]


#: The seven subject configs of ``EleutherAI/hendrycks_math`` (and their ``type`` labels).
MATH_SUBJECTS: dict[str, str] = {
    "algebra": "Algebra",
    "counting_and_probability": "Counting & Probability",
    "geometry": "Geometry",
    "intermediate_algebra": "Intermediate Algebra",
    "number_theory": "Number Theory",
    "prealgebra": "Prealgebra",
    "precalculus": "Precalculus",
}


HUB_IDS: dict[str, HubSource] = {
    "gsm8k": HubSource("openai/gsm8k", ("main",), ("train", "test"), {}),
    "math": HubSource("EleutherAI/hendrycks_math", tuple(MATH_SUBJECTS), ("train", "test"), {}),
    "math500": HubSource("HuggingFaceH4/MATH-500", (None,), ("test",), {}),
    "aime24": HubSource("HuggingFaceH4/aime_2024", (None,), ("train",), {"test": "train"}),
    "aime25": HubSource("yentinglin/aime_2025", (None,), ("train",), {"test": "train"}),
    "amc23": HubSource("math-ai/amc23", (None,), ("test",), {}),
    "mmlu": HubSource("cais/mmlu", ("all",), ("test", "validation", "dev", "auxiliary_train"), {}),
}


#: reasoning-gym tasks used by this project's demos (any reasoning-gym task name works).
REASONING_GYM_EXAMPLES = ("basic_arithmetic", "gsm_symbolic", "chain_sum", "leg_counting")


#: Task names :func:`load_task` knows (plus any reasoning-gym task, and local files).
KNOWN_TASKS = tuple(HUB_IDS) + REASONING_GYM_EXAMPLES


#: Fraction of the reasoning-gym question space reserved for the "test" split.
RG_TEST_FRACTION = 0.2


#: Default number of generated reasoning-gym examples (reasoning-gym's own default size).
RG_DEFAULT_SIZE = 500


#: Offset between the reasoning-gym seeds of the "train" and "test" streams.
_RG_TEST_SEED_OFFSET = 1_000_003


#: The answer letters of multiple-choice rows (MMLU): choice ``i`` is ``MMLU_LETTERS[i]``.
MMLU_LETTERS = "ABCDEFGHIJ"


def _require_columns(rows_desc: str, columns: Sequence[str], required: Sequence[str]) -> None:
    missing = [c for c in required if c not in columns]
    if missing:
        raise ValueError(
            f"{rows_desc}: missing column(s) {missing}; columns found: {list(columns)}"
        )


def _row_error(desc: str, index: int, message: str) -> ValueError:
    return ValueError(f"{desc}: row {index}: {message}")


# ---- per-task row processing: raw hub row -> (question, answer, solution, extras) ----------


def _process_gsm8k(row: dict, desc: str, i: int) -> dict | None:
    gold = extract_gsm8k_answer(row["answer"] or "")
    if gold is None:
        raise _row_error(desc, i, "column 'answer' has no '#### <final answer>' line")
    return {
        "question": row["question"],
        "answer": gold,
        "solution": gsm8k_reasoning(row["answer"]),
    }


def _process_math(row: dict, desc: str, i: int) -> dict | None:
    gold = extract_boxed_answer(row["solution"] or "")
    if not gold:
        return None  # a solution without a \boxed answer: dropped (documented in load_task)
    return {
        "question": row["problem"],
        "answer": gold,
        "solution": row["solution"],
        "level": row.get("level"),
        "type": row.get("type"),
    }


def _process_answer_column(question_column: str, extras: Sequence[str]):
    def process(row: dict, desc: str, i: int) -> dict | None:
        gold = _normalise_answer(row["answer"])
        if gold is None:
            raise _row_error(desc, i, "column 'answer' is empty")
        out = {"question": row[question_column], "answer": gold, "solution": row.get("solution")}
        for column in extras:
            if column in row:
                out[column] = row[column]
        return out

    return process


def mmlu_choice_lines(choices: Sequence[str]) -> list[str]:
    """The lines that list multiple-choice options: ``["A. <choice 0>", "B. <choice 1>", ...]``.

    The one format of the choices, in the ``question`` of :func:`load_task`'s MMLU rows and in
    the log-likelihood prompt of ``gtpo.evaluation.mmlu``. At most ``len(MMLU_LETTERS)`` choices.
    """
    return [f"{MMLU_LETTERS[k]}. {choice}" for k, choice in enumerate(choices)]


def _mmlu_question(stem: str, choices: Sequence[str]) -> str:
    """The generation-task question of an MMLU row: stem, choice lines, "Answer with the letter"."""
    letters = ", ".join(MMLU_LETTERS[: len(choices) - 1]) + f" or {MMLU_LETTERS[len(choices) - 1]}"
    lines = [stem, "", *mmlu_choice_lines(choices), ""]
    lines.append(f"Answer with the letter ({letters}) of the correct choice.")
    return "\n".join(lines)


def _process_mmlu(row: dict, desc: str, i: int) -> dict | None:
    choices = list(row["choices"] or [])
    if not 2 <= len(choices) <= len(MMLU_LETTERS):
        raise _row_error(desc, i, f"column 'choices' must hold 2-10 options, got {choices!r}")
    answer = row["answer"]
    if isinstance(answer, str) and answer.strip().upper() in MMLU_LETTERS[: len(choices)]:
        letter = answer.strip().upper()
    elif isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        letter = MMLU_LETTERS[answer]
    else:
        raise _row_error(
            desc, i, f"column 'answer' must be a choice index 0-{len(choices) - 1}, got {answer!r}"
        )
    stem = row["question"].strip()
    return {
        "question": _mmlu_question(stem, choices),
        "answer": letter,
        "stem": stem,
        "choices": choices,
        "subject": row.get("subject"),
    }


# name -> (required raw columns, row processor)
_HUB_PROCESSORS = {
    "gsm8k": (("question", "answer"), _process_gsm8k),
    "math": (("problem", "solution"), _process_math),
    "math500": (
        ("problem", "answer"),
        _process_answer_column("problem", ("level", "subject", "unique_id")),
    ),
    "aime24": (("problem", "answer"), _process_answer_column("problem", ("id",))),
    "aime25": (("problem", "answer"), _process_answer_column("problem", ("id",))),
    "amc23": (("question", "answer"), _process_answer_column("question", ("id",))),
    "mmlu": (("question", "choices", "answer"), _process_mmlu),
}


def _check_question(desc: str, i: int, question: Any) -> None:
    if not isinstance(question, str) or not question.strip():
        raise _row_error(desc, i, f"the question is empty or not text: {question!r}")


# ---------------------------------------------------------------------------------------
# reasoning-gym
# ---------------------------------------------------------------------------------------


def _import_reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as exc:  # pragma: no cover - optional dependency
        raise ImportError(
            "reasoning-gym tasks need the reasoning-gym package: pip install reasoning-gym "
            "(or pip install 'gtpo[demo]')"
        ) from exc
    return reasoning_gym


def _reasoning_gym_tasks() -> tuple[str, ...]:
    try:
        reasoning_gym = _import_reasoning_gym()
    except ImportError:
        return ()
    return tuple(sorted(reasoning_gym.factory.DATASETS))


def _rg_split_of(question: str) -> str:
    """Deterministic split of a question: a hash of it with whitespace removed.

    Questions that differ only in whitespace (reasoning-gym's ``whitespace="random"``) land
    in the same split; :data:`RG_TEST_FRACTION` of the hash space goes to "test".
    """
    key = "".join(question.split()).encode("utf-8")
    h = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2.0**64
    return "test" if h < RG_TEST_FRACTION else "train"


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _load_reasoning_gym_task(
    task: str, split: str, size: int | None, seed: int, task_kwargs: dict
) -> list[dict]:
    reasoning_gym = _import_reasoning_gym()
    if task not in reasoning_gym.factory.DATASETS:
        raise ValueError(
            f"name: {task!r} is not a reasoning-gym task; e.g. {list(REASONING_GYM_EXAMPLES)} "
            f"(all: {sorted(reasoning_gym.factory.DATASETS)})"
        )
    if split not in ("train", "test"):
        raise ValueError(
            f"split: reasoning-gym tasks have splits 'train' and 'test', got {split!r}"
        )
    try:
        config_json = json.dumps(task_kwargs, sort_keys=True)
    except TypeError as exc:
        raise ValueError(f"task keywords of {task!r} must be JSON-serialisable: {exc}") from exc
    n = RG_DEFAULT_SIZE if size is None else size
    fraction = RG_TEST_FRACTION if split == "test" else 1.0 - RG_TEST_FRACTION
    attempts = int(4 * n / fraction) + 1000
    stream_seed = seed if split == "train" else seed + _RG_TEST_SEED_OFFSET
    try:
        dataset = reasoning_gym.create_dataset(task, size=attempts, seed=stream_seed, **task_kwargs)
    except (TypeError, AssertionError, ValueError) as exc:
        config_cls = reasoning_gym.factory.DATASETS[task][1]
        import inspect

        raise ValueError(
            f"task keywords {task_kwargs} rejected by reasoning-gym task {task!r}: {exc}. "
            f"Its config: {inspect.signature(config_cls)}"
        ) from exc
    rows: list[dict] = []
    seen: set[str] = set()
    for idx in range(attempts):
        entry = dataset[idx]
        question = entry["question"]
        if _rg_split_of(question) != split:
            continue
        if split == "test":
            key = "".join(question.split())
            if key in seen:
                continue
            seen.add(key)
        rows.append(
            {
                "question": question,
                "answer": _normalise_answer(entry["answer"]) or "",
                "task": task,
                "rg_entry": json.dumps(entry, default=_json_default),
                "rg_config": config_json,
            }
        )
        if len(rows) == n:
            return rows
    raise ValueError(
        f"reasoning-gym task {task!r} with {task_kwargs} gave only {len(rows)} {split} "
        f"examples in {attempts} draws (size={n}); its question space is too small for this "
        "size: lower size or widen the task settings"
    )
