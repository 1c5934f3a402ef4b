"""Loading a task: :func:`load_task` (a task name, a hub id, a local file or a saved dataset to a
``datasets.Dataset`` of gtpo examples), the readers of hub copies and local files, and :func:`as_dataset`.

Part of :mod:`gtpo.data` (which re-exports the public names and documents the example format).
``datasets`` is imported inside functions.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Mapping, Sequence

from gtpo.rewards import extract_boxed_answer

from .templates import TEMPLATES, make_prompt
from .sources import (
    HUB_IDS,
    HubSource,
    KNOWN_TASKS,
    MATH_SUBJECTS,
    _HUB_PROCESSORS,
    _check_question,
    _load_reasoning_gym_task,
    _normalise_answer,
    _reasoning_gym_tasks,
    _require_columns,
    _row_error,
)

__all__ = ["FILE_EXTENSIONS", "load_task"]


#: Local file types :func:`load_task` reads, and the ``datasets`` builder for each.
FILE_EXTENSIONS: dict[str, str] = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}


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
