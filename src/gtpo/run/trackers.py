"""Experiment trackers (``report_to``): whether each is installed, and the run config they receive.

Trackers are accelerate's (``Accelerator(log_with=...)``): TensorBoard, Weights & Biases, trackio.
accelerate drops a tracker whose package is missing with a library warning, and the run then logs
nothing to it; :func:`check_trackers` turns that into an error before any model is loaded.
accelerate's TensorBoard tracker hands the run config to ``SummaryWriter.add_hparams``, which takes
only ``int``, ``float``, ``str``, ``bool`` and tensors (a list or None crashes the run at its start);
:func:`start_trackers` gives it the flat config of :func:`tracker_config` and the other trackers
the config as it is. :func:`log_table` gives every tracker a table (``log_completions``: TRL's
completions table) in its own form.

No torch import here.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any, Iterable, Mapping

__all__ = ["TRACKER_PACKAGES", "check_trackers", "log_table", "markdown_table", "start_trackers", "tracker_config"]

#: tracker -> (importable modules, any of which makes it available; the pip requirement that installs it)
TRACKER_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
    "trackio": (("trackio",), "trackio"),
}


def _installed(modules: Iterable[str]) -> bool:
    return any(importlib.util.find_spec(m) is not None for m in modules)


def check_trackers(report_to: Iterable[str] | str | None, *, where: str = "report_to") -> None:
    """Raise ``ValueError`` when a tracker of ``report_to`` is not installed.

    Args:
        report_to: tracker names (``"none"`` and names this module does not know are left to the
            config's own validation).
        where: what the message names as the origin of the value (``"report_to"``, a YAML file,
            ``--report_to``).

    Raises:
        ValueError: naming every missing tracker and the ``pip install`` command that adds it.
    """
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    missing = [n for n in names if n in TRACKER_PACKAGES and not _installed(TRACKER_PACKAGES[n][0])]
    if missing:
        pip = " ".join(TRACKER_PACKAGES[n][1] for n in missing)
        raise ValueError(
            f"{where}: {', '.join(repr(n) for n in missing)} {'is' if len(missing) == 1 else 'are'} not installed, "
            f"so nothing would be logged there: pip install {pip} (or pip install 'gtpo[{missing[0]}]'), "
            "or remove it from report_to"
        )


def _scalar(value: Any) -> int | float | str | bool:
    if isinstance(value, (bool, int, float, str)):
        return value
    if value is None:
        return "None"
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def tracker_config(values: Mapping[str, Any]) -> dict[str, int | float | str | bool]:
    """The run config as trackers take it: one level, every value an int, float, str or bool.

    Nested mappings become dotted keys (``{"peft": {"r": 16}}`` -> ``{"peft.r": 16}``); lists
    and other values become their JSON text (``[1, 8]`` -> ``"[1, 8]"``); None becomes
    ``"None"``. Scalars are kept as they are.
    """
    out: dict[str, int | float | str | bool] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            out[prefix] = _scalar(value)

    for key, value in values.items():
        walk(str(key), value)
    return out


def start_trackers(accelerator, project: str, config: Mapping[str, Any]) -> None:
    """``accelerator.init_trackers(project)`` and the run ``config`` stored in each tracker: TensorBoard
    gets :func:`tracker_config` (its ``add_hparams`` takes scalars only), the others ``config`` as it is."""
    accelerator.init_trackers(project)
    flat = tracker_config(config)
    for tracker in accelerator.trackers:
        tracker.store_init_configuration(flat if tracker.name == "tensorboard" else dict(config))


def markdown_table(table: Mapping[str, list]) -> str:
    """``{column: values}`` (equal lengths) as a Markdown table, which TensorBoard's text plugin renders: ``|`` escaped,
    line breaks as ``<br>``."""
    def cell(value: Any) -> str:
        text = "" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
        return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    columns = list(table)
    rows = zip(*(table[c] for c in columns))
    lines = ["| " + " | ".join(map(cell, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def log_table(accelerator, name: str, table: Mapping[str, list], step: int) -> None:
    """``table`` (``{column: values}``, equal lengths) logged as ``name`` at ``step`` to every tracker of
    ``accelerator`` (main process): W&B and trackio get their ``Table`` of a pandas DataFrame (as TRL's
    ``log_completions`` logs them), TensorBoard a Markdown text (:func:`markdown_table`). Other trackers are skipped."""
    if not accelerator.is_main_process:
        return
    frame = None
    for tracker in accelerator.trackers:
        if tracker.name in ("wandb", "trackio"):
            import pandas as pd

            frame = pd.DataFrame(dict(table)) if frame is None else frame
            module = __import__(tracker.name)
            tracker.log({name: module.Table(dataframe=frame)}, step=step)
        elif tracker.name == "tensorboard":
            tracker.writer.add_text(name, markdown_table(table), global_step=step)
            tracker.writer.flush()
