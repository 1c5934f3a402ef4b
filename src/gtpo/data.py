"""Math reasoning datasets, prompt templates and the normalised example format.

One entry point, :func:`load_task`, returns a ``datasets.Dataset`` whose rows have

* ``prompt``: a string (standard prompt) or a list of chat messages
  ``[{"role": "system", ...}, {"role": "user", ...}]`` (conversational; the trainer applies
  the tokenizer's chat template), built by :func:`make_prompt`;
* ``question``: the raw question text; ``answer``: the gold final answer (a string);
* ``task``: the task name; optionally ``solution`` (worked reasoning, for SFT warm-up);
* task-specific extras: reasoning-gym rows carry ``rg_entry`` (the generated entry as JSON,
  for the task's scorer) and ``rg_config`` (the task config as JSON); MMLU rows keep
  ``stem`` (the bare question), ``choices`` and ``subject`` as data (``answer`` is the letter;
  ``question`` adds the ``A. ...`` choice lines and an instruction, for generation); MATH rows
  keep ``level`` and ``type``; MATH-500 rows keep ``level``, ``subject`` and ``unique_id``.

Every extra column reaches the reward functions as a keyword argument (TRL's contract).

Sources (``HUB_IDS``; reference facts from the paper's setup, docs/gtpo-method.md §7):

==========  ==============================  ==========  ===================  ====================
name        hub id                          config(s)   splits               gold answer
==========  ==============================  ==========  ===================  ====================
gsm8k       openai/gsm8k                    main        train, test          after ``####``
math        EleutherAI/hendrycks_math       7 subjects  train, test          last ``\\boxed{}``
math500     HuggingFaceH4/MATH-500          -           test                 ``answer``
aime24      HuggingFaceH4/aime_2024         -           train (test alias)   ``answer``
aime25      yentinglin/aime_2025            -           train (test alias)   ``answer``
amc23       math-ai/amc23                   -           test                 ``answer``
mmlu        cais/mmlu                       all         test, validation,    letter of ``answer``
                                                        dev, auxiliary_train
==========  ==============================  ==========  ===================  ====================

AIME 2025: ``yentinglin/aime_2025`` (30 problems, columns ``problem``/``answer``, one split
``train``) is the copy used next to ``HuggingFaceH4/aime_2024`` by open-r1/lighteval-style
evaluations; ``opencompass/AIME2025`` (two configs) holds the same problems. The benchmark
sets with a single hub split ``train`` also answer to ``split="test"``.

Offline use: every hub loader takes ``path=``, a local copy in the hub's own format that
replaces the hub id, so the parsing code is the same: a directory laid out like the hub
repository (e.g. ``gsm8k/main/train-00000-of-00001.parquet``; per-config sub-directories
are used when present) or a single file (parquet/jsonl/json/csv) holding the requested
split. The tests run every loader on such fixtures (tests/fixtures/data).

Procedural tasks come from reasoning-gym (``"rg:<task>"`` or a bare task name such as
``"basic_arithmetic"``), generated offline; ``"train"`` and ``"test"`` are disjoint by
construction (see :func:`load_task`).

No torch import here; ``datasets`` and ``reasoning_gym`` are imported inside functions.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from gtpo.rewards import extract_boxed_answer

__all__ = [
    "SYSTEM_PROMPT",
    "FORMAT_SYSTEM_PROMPT",
    "ANSWER_ONLY_SYSTEM_PROMPT",
    "TEMPLATES",
    "HubSource",
    "HUB_IDS",
    "MATH_SUBJECTS",
    "REASONING_GYM_EXAMPLES",
    "KNOWN_TASKS",
    "FILE_EXTENSIONS",
    "RG_TEST_FRACTION",
    "MMLU_LETTERS",
    "make_prompt",
    "mmlu_choice_lines",
    "format_paper_completion",
    "extract_gsm8k_answer",
    "last_boxed",
    "load_task",
]

# ---------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------

#: The system prompt of the GTPO reference code (``config.yaml`` of
#: github.com/winstonsmith1897/GTPO; its ``train_model.py`` default differs only by
#: "solving problems"). The paper: think step by step between the reasoning tags, then give
#: the final answer between the answer tags.
SYSTEM_PROMPT = (
    "You are a helpful assistant for solving math problems. Given a question, first think "
    "step by step between <reasoning> and </reasoning>. Then, give the final answer between "
    "<answer> and </answer>."
)

#: The explicit-skeleton system prompt of the Unsloth GRPO notebooks (template "unsloth").
FORMAT_SYSTEM_PROMPT = (
    "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
)

#: System prompt of the "answer_only" template: only the tagged final answer.
ANSWER_ONLY_SYSTEM_PROMPT = (
    "Give only the final answer, between <answer> and </answer>, with no other text."
)

#: Prompt templates understood by :func:`make_prompt`.
TEMPLATES = ("paper", "unsloth", "plain", "answer_only", "none")


def make_prompt(
    question: str, *, template: str = "paper", system_prompt: str | None = None
) -> str | list[dict[str, str]]:
    """Build the prompt of one question.

    Templates:

    * ``"paper"`` (default): conversational, the paper's system prompt (:data:`SYSTEM_PROMPT`,
      or ``system_prompt``) then the question as the user message. The trainer applies the
      tokenizer's chat template, as the reference code does.
    * ``"unsloth"``: conversational, the Unsloth notebooks' format skeleton
      (:data:`FORMAT_SYSTEM_PROMPT`, or ``system_prompt``) then the question.
    * ``"answer_only"``: conversational, asks only for ``<answer>...</answer>``
      (:data:`ANSWER_ONLY_SYSTEM_PROMPT`, or ``system_prompt``).
    * ``"none"``: conversational, the question alone as a user message (no system message;
      passing ``system_prompt`` is an error).
    * ``"plain"``: a standard string prompt ``"Question: ...\\nAnswer:"`` for base models
      without a chat template; ``system_prompt``, when given, is prepended with a blank line.

    Returns:
        A string for ``"plain"``, else a list of ``{"role", "content"}`` messages.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question: expected a non-empty string, got {question!r}")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(f"system_prompt: expected a string or None, got {system_prompt!r}")
    defaults = {
        "paper": SYSTEM_PROMPT,
        "unsloth": FORMAT_SYSTEM_PROMPT,
        "answer_only": ANSWER_ONLY_SYSTEM_PROMPT,
    }
    if template in defaults:
        system = defaults[template] if system_prompt is None else system_prompt
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
    if template == "none":
        if system_prompt is not None:
            raise ValueError(
                "system_prompt: template 'none' has no system message; use template='paper' "
                "with system_prompt=... instead"
            )
        return [{"role": "user", "content": question}]
    if template == "plain":
        text = f"Question: {question}\nAnswer:"
        return text if system_prompt is None else f"{system_prompt}\n\n{text}"
    raise ValueError(f"template: expected one of {TEMPLATES}, got {template!r}")


def format_paper_completion(reasoning: str, answer: str) -> str:
    """A target completion in the paper's format, for SFT warm-up.

    ``"<reasoning>\\n{reasoning}\\n</reasoning>\\n<answer>{answer}</answer>"``, the layout the
    reference code (``train_model.py``) builds from GSM8K/MATH solutions. It earns the full
    format score of :func:`gtpo.rewards.paper_format_score` (10) and, with the gold answer, the
    full paper reward (20).
    """
    return f"<reasoning>\n{reasoning.strip()}\n</reasoning>\n<answer>{str(answer).strip()}</answer>"


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


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced.

    ``"... $\\boxed{\\frac{1}{2}}$."`` gives ``"\\frac{1}{2}"``; no box gives None. Same as
    :func:`gtpo.rewards.extract_boxed_answer`.
    """
    return extract_boxed_answer(text)


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

#: Local file types :func:`load_task` reads, and the ``datasets`` builder for each.
FILE_EXTENSIONS: dict[str, str] = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}

#: Fraction of the reasoning-gym question space reserved for the "test" split.
RG_TEST_FRACTION = 0.2
#: Default number of generated reasoning-gym examples (reasoning-gym's own default size).
RG_DEFAULT_SIZE = 500
#: Offset between the reasoning-gym seeds of the "train" and "test" streams.
_RG_TEST_SEED_OFFSET = 1_000_003

#: The answer letters of multiple-choice rows (MMLU): choice ``i`` is ``MMLU_LETTERS[i]``.
MMLU_LETTERS = "ABCDEFGHIJ"


def _hub_split(name: str, split: str) -> str:
    source = HUB_IDS[name]
    if split in source.splits:
        return split
    if split in source.split_aliases:
        return source.split_aliases[split]
    accepted = list(source.splits) + list(source.split_aliases)
    raise ValueError(f"split: task {name!r} ({source.hub_id}) has splits {accepted}, got {split!r}")


def _read_file(path: Path):
    """Read one local data file with ``datasets`` (builder chosen by extension)."""
    import datasets

    builder = FILE_EXTENSIONS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(
            f"{path}: unsupported file type {path.suffix!r}; expected one of "
            f"{sorted(FILE_EXTENSIONS)}"
        )
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    with open(path, "rb") as fh:
        head = fh.read(65536)
    if not head.strip() and path.stat().st_size <= len(head):  # nothing but whitespace
        raise ValueError(f"{path}: the file is empty (no rows)")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:
        reason = str(exc).strip() or type(exc).__name__
        raise ValueError(f"{path}: could not read it as {builder}: {reason}") from exc


def _load_raw(source: HubSource, config: str | None, hub_split: str, path: str | Path | None):
    """The raw hub rows of one config and split: from the hub, or from ``path`` (a local copy)."""
    import datasets

    if path is None:
        try:
            return datasets.load_dataset(source.hub_id, config, split=hub_split)
        except OSError as exc:  # offline, not found, network errors
            raise RuntimeError(
                f"could not load {source.hub_id} (config {config}, split {hub_split}) from the "
                f"Hugging Face hub: {exc}. Without network, download a copy of the dataset "
                "repository elsewhere and pass path=<local directory or file>."
            ) from exc
    local = Path(path)
    if local.is_file():
        return _read_file(local)
    if not local.is_dir():
        raise ValueError(f"path: {str(local)!r} does not exist")
    data_dir = config if config is not None and (local / config).is_dir() else None
    root = local / data_dir if data_dir else local
    # Files named after the split, as in the hub's parquet layout ("test-00000-of-00001.parquet",
    # "data/train-*.parquet", "test.jsonl"). Matched exactly here because `datasets`' own split
    # inference merges "dev" into "validation" (MMLU has both).
    split_files = sorted(
        str(f)
        for pattern in (
            f"{hub_split}-*",
            f"{hub_split}.*",
            f"data/{hub_split}-*",
            f"data/{hub_split}.*",
        )
        for f in root.glob(pattern)
        if f.is_file() and f.suffix.lower() in FILE_EXTENSIONS
    )
    builders = {FILE_EXTENSIONS[Path(f).suffix.lower()] for f in split_files}
    if split_files and len(builders) == 1:
        try:
            return datasets.load_dataset(builders.pop(), data_files=split_files, split="train")
        except Exception as exc:
            raise ValueError(f"{split_files}: could not read split {hub_split!r}: {exc}") from exc
    try:
        return datasets.load_dataset(str(local), data_dir=data_dir, split=hub_split)
    except Exception as exc:
        where = local / data_dir if data_dir else local
        raise ValueError(
            f"{where}: could not load split {hub_split!r} of a local copy of {source.hub_id}: {exc}"
        ) from exc


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
    gold = last_boxed(row["solution"] or "")
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


def _load_hub_task(
    name: str,
    split: str,
    path: str | Path | None,
    subjects: Sequence[str] | None,
) -> list[dict]:
    source = HUB_IDS[name]
    hub_split = _hub_split(name, split)
    required, process = _HUB_PROCESSORS[name]
    configs: list[str | None] = list(source.configs)
    type_filter: set[str] | None = None
    if name == "math":
        if subjects is not None:
            unknown = [s for s in subjects if s not in MATH_SUBJECTS]
            if unknown or not subjects:
                raise ValueError(
                    f"subjects: expected a non-empty list of {list(MATH_SUBJECTS)}, got "
                    f"{list(subjects)!r}"
                )
            configs = list(subjects)
        if path is not None:
            local = Path(path)
            present = [c for c in configs if (local / c).is_dir()]
            if local.is_dir() and present and len(present) < len(configs):
                missing = [c for c in configs if c not in present]
                raise ValueError(
                    f"path: {str(local)!r} has no sub-directory for subject(s) {missing}; pass "
                    f"subjects={present} to load only the subjects present"
                )
            if not (local.is_dir() and present):
                # a single file or a flat directory holds every subject: filter on `type`
                if subjects is not None:
                    type_filter = {MATH_SUBJECTS[s] for s in subjects}
                configs = [None]
    rows: list[dict] = []
    for config in configs:
        raw = _load_raw(source, config, hub_split, path)
        desc = str(path) if path is not None else source.hub_id
        desc = (
            f"{desc} (config {config}, split {hub_split})"
            if config
            else f"{desc} (split {hub_split})"
        )
        _require_columns(desc, raw.column_names, required)
        for i, row in enumerate(raw.to_list()):
            if type_filter is not None and row.get("type") not in type_filter:
                continue
            _check_question(desc, i, row[required[0]])
            out = process(row, desc, i)
            if out is None:
                continue
            if name == "mmlu" and subjects is not None and out["subject"] not in subjects:
                continue
            rows.append(out)
    if not rows:
        raise ValueError(f"task {name!r}: no rows found (split {split!r}, subjects {subjects})")
    return rows


# ---------------------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------------------

_COLUMN_KEYS = ("question", "prompt", "answer", "solution")


def _question_of_prompt(prompt: Any) -> str | None:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [
            m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"
        ]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None


def _load_file_task(path: Path, columns: Mapping[str, str] | None) -> tuple[list[dict], bool]:
    """Rows of a local file; returns (rows, has_prompt) where has_prompt = prompt kept as is."""
    _check_column_keys(columns)
    return _rows_of(_read_file(path), str(path), columns)


def _check_column_keys(columns: Mapping[str, str] | None) -> None:
    mapping = dict(columns or {})
    unknown = [k for k in mapping if k not in _COLUMN_KEYS]
    if unknown:
        raise ValueError(
            f"columns: keys must be among {list(_COLUMN_KEYS)} (the names this loader expects), "
            f"got {unknown}; map them to your file's columns, e.g. "
            "columns={'question': 'my_q', 'answer': 'my_a'}"
        )


def _rows_of(raw, path: str, columns: Mapping[str, str] | None) -> tuple[list[dict], bool]:
    """The rows of a raw ``datasets.Dataset`` (a local file, a dataset directory, a hub dataset) in the normalised
    format; ``path`` names the source in messages. Returns ``(rows, has_prompt)``.

    Columns (``columns`` maps these names to the source's): ``question`` or ``prompt`` (kept as is), ``answer``;
    without an ``answer`` column, the answer is read from ``solution`` (TRL's datasets: its last ``\\boxed{}``,
    else the whole text). A column mapped to two names (``{answer: solution}``) is kept under both.
    """
    mapping = dict(columns or {})
    found = list(raw.column_names)
    for key, column in mapping.items():
        if column not in found:
            raise ValueError(
                f"{path}: missing column {column!r} (mapped to {key!r} by columns=); "
                f"columns found: {found}"
            )
    col = {key: mapping.get(key, key) for key in _COLUMN_KEYS}
    if col["question"] not in found and col["prompt"] not in found:
        raise ValueError(
            f"{path}: missing column 'question' (or 'prompt'); columns found: {found}. "
            "Map yours with columns={'question': '<your column>'}"
        )
    answer_from_solution = col["answer"] not in found and col["solution"] in found
    if col["answer"] not in found and not answer_from_solution:
        raise ValueError(
            f"{path}: missing column 'answer' (or 'solution'); columns found: {found}. "
            "Map yours with columns={'answer': '<your column>'}"
        )
    has_question = col["question"] in found
    has_prompt = col["prompt"] in found
    rows: list[dict] = []
    for i, raw_row in enumerate(raw.to_list()):
        row = {k: v for k, v in raw_row.items() if k not in {col[key] for key in _COLUMN_KEYS}}
        row.update({key: raw_row[col[key]] for key in _COLUMN_KEYS if col[key] in found})
        if answer_from_solution:
            solution = row["solution"]
            row["answer"] = (extract_boxed_answer(solution) or solution) if isinstance(solution, str) else solution
        if has_prompt:
            prompt = row["prompt"]
            valid = (isinstance(prompt, str) and prompt.strip()) or (
                isinstance(prompt, list)
                and prompt
                and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
            )
            if not valid:
                raise _row_error(
                    str(path),
                    i,
                    f"column {col['prompt']!r} must be a non-empty string or a list of "
                    f"{{'role', 'content'}} messages, got {prompt!r}",
                )
        if not has_question:
            row["question"] = _question_of_prompt(row["prompt"])
        _check_question(str(path), i, row["question"])
        gold = _normalise_answer(row["answer"])
        if gold is None:
            what = col["solution"] if answer_from_solution else col["answer"]
            raise _row_error(str(path), i, f"column {what!r} is empty")
        row["answer"] = gold
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows, has_prompt


def _is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` was written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _load_dataset_source(name: str, split: str, config: str | None):
    """The raw rows of a dataset that is neither a built-in task nor a single file: a directory
    (``save_to_disk`` output, or files laid out like a hub repository: parquet/jsonl/... named after
    their split) or a hub dataset id (``org/name``), as ``datasets.load_dataset(name, config, split=split)``
    loads it. A directory holding one dataset without splits is the data whatever ``split`` says."""
    import datasets

    local = Path(name)
    if local.is_dir() and _is_saved_dataset(local):
        try:
            data = datasets.load_from_disk(str(local))
        except Exception as exc:
            raise ValueError(f"{name}: could not load the saved dataset: {str(exc).strip() or type(exc).__name__}") \
                from exc
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ValueError(f"split: {name} has splits {sorted(data)}, got {split!r}")
            return data[split]
        return data
    try:
        return datasets.load_dataset(name, config, split=split)
    except ValueError as exc:  # e.g. an unknown split or config: datasets says which exist
        raise ValueError(f"{name}: {str(exc).strip() or type(exc).__name__}") from exc
    except Exception as exc:  # offline, not found, network errors
        where = "the local directory" if local.is_dir() else "the Hugging Face hub"
        hint = ("" if local.is_dir() else " Offline (HF_DATASETS_OFFLINE=1) only datasets already in the cache "
                "load: download it where the hub is reachable (datasets.load_dataset(...).save_to_disk(DIR)) and "
                "give DIR, or a .parquet/.jsonl file")
        raise ValueError(f"could not load dataset {name!r} (config {config}, split {split!r}) from {where}: "
                         f"{str(exc).strip() or type(exc).__name__}.{hint}") from exc


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


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


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


def _subsample(rows: list[dict], size: int | None, seed: int) -> list[dict]:
    """The first ``size`` rows after a shuffle with ``random.Random(seed)`` (all if None)."""
    if size is None:
        return rows
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in order[:size]]


def _unknown_task_error(name: Any) -> ValueError:
    rg_tasks = _reasoning_gym_tasks()
    rg_note = (
        "any reasoning-gym task as 'rg:<task>' or its bare name"
        if rg_tasks
        else "reasoning-gym tasks (not available: pip install reasoning-gym)"
    )
    return ValueError(
        f"name: unknown task {name!r}; known tasks: {list(KNOWN_TASKS)}, {rg_note}, a local "
        f"file ending in {sorted(FILE_EXTENSIONS)}, a dataset directory, or a hub dataset id 'org/name'"
    )


def _without_progress_bars(func):
    """``func`` with ``datasets``' progress bars off while it runs ("Generating train split", "Map"): reading a
    small local file is not work the user waits for; the previous setting is restored afterwards."""
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from datasets.utils import logging as ds_logging

        was_enabled = ds_logging.is_progress_bar_enabled()
        ds_logging.disable_progress_bar()
        try:
            return func(*args, **kwargs)
        finally:
            if was_enabled:
                ds_logging.enable_progress_bar()

    return wrapper


@_without_progress_bars
def load_task(
    name: str,
    *,
    split: str = "train",
    size: int | None = None,
    seed: int = 0,
    template: str = "paper",
    system_prompt: str | None = None,
    path: str | Path | None = None,
    columns: Mapping[str, str] | None = None,
    config: str | None = None,
    **task_kwargs: Any,
):
    """Load a task as a ``datasets.Dataset`` of normalised examples (see the module docstring).

    Args:
        name: a hub benchmark (``"gsm8k"``, ``"math"``, ``"math500"``, ``"aime24"``,
            ``"aime25"``, ``"amc23"``, ``"mmlu"``; see :data:`HUB_IDS`), a reasoning-gym task
            (``"rg:<task>"`` or a bare name such as ``"basic_arithmetic"``), a local file
            path ending in ``.jsonl``/``.json``/``.parquet``/``.csv``, a local dataset
            directory (``save_to_disk`` output, or parquet/jsonl files named after their
            split, as in a hub repository), or any hub dataset id ``org/name`` (TRL's
            ``dataset_name``; offline only from the cache). Directories and hub datasets
            are read like local files (columns below).
        split: ``"train"``/``"test"`` (hub benchmarks: their hub splits, see
            :data:`HUB_IDS`; local files ignore it: the file is the data).
        size: hub/files: keep the first ``size`` rows after a shuffle seeded by ``seed``
            (deterministic; ``size=10`` is a prefix of ``size=20``; at most all rows; None
            keeps all rows in their original order). reasoning-gym: the number of examples
            generated (default :data:`RG_DEFAULT_SIZE`).
        seed: the subsampling seed; for reasoning-gym the generation seed.
        template, system_prompt: how ``prompt`` is built from the question
            (:func:`make_prompt`). A local file's own ``prompt`` column is kept as is.
        path: hub benchmarks only: a local copy in the hub's format (a directory laid out
            like the hub repository, or one file with the requested split) used instead of
            the hub id.
        columns: local files, directories and hub ids:
            ``{"question"|"prompt"|"answer"|"solution": file_column}``.
        config: directories and hub ids: the dataset config (TRL's ``dataset_config``).
        task_kwargs: reasoning-gym: the task's config keywords, passed to
            ``reasoning_gym.create_dataset(task, size=..., seed=..., **task_kwargs)`` (e.g.
            ``min_terms=2, max_terms=2, max_digits=2, operators=["+", "-"]`` for
            ``basic_arithmetic``); ``"math"`` and ``"mmlu"``: ``subjects=[...]``.

    Details:
        * GSM8K: gold = text after ``####`` without commas; ``solution`` = the worked answer
          without the ``<<...>>`` calculator annotations.
        * MATH: gold = last ``\\boxed{}``/``\\fbox{}`` of the solution (balanced braces); the
          few rows whose solution has no box are dropped.
        * MMLU: the question lists the choices as ``A. ...`` lines
          (:func:`mmlu_choice_lines`) and asks for the letter; ``answer`` is the letter;
          ``stem`` (the bare question), ``choices`` and ``subject`` are kept as data.
        * reasoning-gym: ``"train"`` and ``"test"`` are disjoint for every size and seed:
          each question (whitespace removed) is assigned to one split by a hash
          (:data:`RG_TEST_FRACTION` of them to "test") and each split only keeps its own;
          the two splits also use different seed streams, and "test" drops duplicates.
          ``answer`` is the task's string answer, ``rg_entry`` its entry as JSON (for
          ``gtpo.rewards.reasoning_gym_reward``), ``rg_config`` the task keywords as JSON.
        * Local files, directories, hub ids: columns ``question`` (or ``prompt``: a string or a
          list of messages, kept as is) and ``answer``; without ``answer``, the answer is the
          last ``\\boxed{}`` of ``solution`` (else all of it), as in TRL's datasets whose rewards
          read ``solution``; other columns are kept (they reach reward functions).
          Numeric answers become strings (``27.0`` -> ``"27"``).

    Raises:
        ValueError: unknown task (listing the known ones), bad split/size/template/keywords,
            a file or column missing (naming the file and the column), a bad row (naming the
            file and the row index).
        RuntimeError: a hub dataset could not be downloaded (offline): pass ``path=``.
    """
    import datasets

    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name: expected a task name or a file path, got {name!r}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"size: expected a positive integer or None, got {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    if template not in TEMPLATES:
        raise ValueError(f"template: expected one of {TEMPLATES}, got {template!r}")
    if not isinstance(split, str):
        raise ValueError(f"split: expected a string, got {split!r}")
    key = name.strip()
    lower = key.lower()

    keep_prompt = False
    if config is not None and (lower in HUB_IDS or any(lower.endswith(ext) for ext in FILE_EXTENSIONS)):
        raise ValueError(f"config: only for dataset directories and hub ids, not {key!r}")
    if any(lower.endswith(ext) for ext in FILE_EXTENSIONS):
        if path is not None and Path(path) != Path(key):
            raise ValueError(
                f"path: only for hub tasks; the task {key!r} is a file, which is already the path"
            )
        if task_kwargs:
            raise ValueError(f"unexpected keyword(s) {sorted(task_kwargs)} for a local file task")
        file_path = Path(key)
        rows, keep_prompt = _load_file_task(file_path, columns)
        task_name = file_path.name
        rows = _subsample(rows, size, seed)
    elif lower in HUB_IDS:
        if columns is not None:
            raise ValueError("columns: only for local files; hub tasks have fixed columns")
        subjects = task_kwargs.pop("subjects", None)
        if task_kwargs:
            raise ValueError(f"unexpected keyword(s) {sorted(task_kwargs)} for task {lower!r}")
        if subjects is not None and lower not in ("math", "mmlu"):
            raise ValueError(f"subjects: only for 'math' and 'mmlu', not {lower!r}")
        if isinstance(subjects, str):
            subjects = [subjects]
        rows = _load_hub_task(lower, split, path, subjects)
        task_name = lower
        rows = _subsample(rows, size, seed)
    elif not lower.startswith("rg:") and (Path(key).is_dir() or _looks_like_hub_id(key)):
        if task_kwargs or path is not None:
            raise ValueError(f"unexpected keyword(s) {sorted(task_kwargs) + (['path'] if path else [])} for the "
                             f"dataset {key!r}")
        _check_column_keys(columns)
        rows, keep_prompt = _rows_of(_load_dataset_source(key, split, config), key, columns)
        task_name = Path(key).name
        rows = _subsample(rows, size, seed)
    else:
        if config is not None:
            raise ValueError(f"config: only for dataset directories and hub ids, not {key!r}")
        rg_name = key[3:] if lower.startswith("rg:") else key
        if not lower.startswith("rg:") and rg_name not in _reasoning_gym_tasks():
            raise _unknown_task_error(name)
        if path is not None or columns is not None:
            raise ValueError("path/columns: not used by reasoning-gym tasks (they are generated)")
        rows = _load_reasoning_gym_task(rg_name, split, size, seed, task_kwargs)
        task_name = rg_name

    examples = []
    for row in rows:
        example = dict(row)
        if not keep_prompt:
            example["prompt"] = make_prompt(
                row["question"], template=template, system_prompt=system_prompt
            )
        example.setdefault("task", task_name)
        ordered = {k: example.pop(k) for k in ("prompt", "question", "answer") if k in example}
        ordered.update(example)
        examples.append(ordered)
    return datasets.Dataset.from_list(examples)


def as_dataset(dataset, name: str = "train_dataset"):
    """A ``datasets.Dataset`` from a Dataset or a list of dicts (the trainer's ``train_dataset`` /
    ``eval_dataset``), with errors naming ``name`` and the row."""
    from datasets import Dataset

    if isinstance(dataset, Dataset):
        return dataset
    if isinstance(dataset, (list, tuple)):
        if not dataset:
            raise ValueError(f"{name} is empty: give at least one row with a 'prompt'")
        bad = next((i for i, r in enumerate(dataset) if not isinstance(r, dict)), None)
        if bad is not None:
            raise ValueError(f"{name} as a list must hold dicts with a 'prompt' key; row {bad} is "
                             f"{type(dataset[bad]).__name__}")
        try:
            return Dataset.from_list(list(dataset))
        except Exception as err:  # pyarrow cannot build a table: e.g. a column mixing strings and lists
            raise ValueError(
                f"{name}: cannot build a dataset from these rows ({type(err).__name__}: {str(err).splitlines()[0]}); "
                "every row must have the same columns with values of one type (e.g. 'prompt' always a string, "
                "or always a list of messages)"
            ) from err
    raise ValueError(f"{name} must be a datasets.Dataset or a list of dicts, got {type(dataset).__name__}")
