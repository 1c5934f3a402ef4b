"""Plots and a markdown summary of training runs (``gtpo report``).

A training run directory holds ``metrics.jsonl`` (one JSON object per logged step, written by the
trainer; evaluation lines may be separate objects with only ``step`` and ``eval/*`` keys), and
optionally ``run_config.json`` (the resolved config: ``loss_type``, ``model``,
``entropy_threshold``, ...) and ``summary.json`` (final metrics such as ``accuracy_before`` /
``accuracy_after``).

The figures are the diagnostics that explain *why* a run is (un)stable, the things GRPO users ask
for (docs/users.md): reward with its spread, mean token entropy against the paper's ln 2 threshold
(GTPO, Simoni et al. TACL 2026, Sec. "Entropy control"), the fraction of conflict tokens and of
entropy-filtered completions, completion lengths and truncation, optimiser health (grad norm, learning
rate, loss, clipped fraction), probabilities of tracked tokens (e.g. shared format tokens) and every evaluation
metric. Several runs are overlaid in each figure (e.g. GTPO vs GRPO), one colour per run.

Rendering uses matplotlib's object-oriented API with the Agg canvas (``Figure`` +
``FigureCanvasAgg``), never ``pyplot``: nothing global is switched (a Jupyter user's backend
stays as it was), figures are freed as soon as they are saved, and matplotlib is only imported
when a plot is drawn, so ``import gtpo`` stays cheap. This is the pattern matplotlib documents
for rendering in servers ("Embedding in a web application server").

Every file is written atomically (``gtpo.run.checkpoint.atomic_write``: temporary file in the same
directory, fsync, ``os.replace``), so a report killed half-way never leaves a truncated PNG or
``report.md``.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from .config import resolved
from .run.checkpoint import atomic_write
from .run.metric_names import canonical_record

__all__ = [
    "load_metrics",
    "plot_run",
    "summarize",
    "write_report",
    "write_report_and_summary",
]

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "run_config.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"

LN2 = math.log(2.0)

#: Eval keys drawn on the "accuracy" panel of reward.png, in this order when several are present.
_EVAL_ACCURACY_KEYS = ("eval/pass@1", "eval/accuracy_greedy", "eval/accuracy")
#: Line styles that tell apart several keys of one run inside one panel (the colour is the run's).
_KEY_STYLES = ("-", "--", ":", "-.")
_DPI = 150


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _metrics_path(run_dir: str) -> str:
    """Return ``<run_dir>/metrics.jsonl``, or raise a ValueError naming the missing path."""
    if not os.path.exists(run_dir):
        raise ValueError(f"run directory does not exist: {run_dir!r}")
    if not os.path.isdir(run_dir):
        raise ValueError(
            f"run directory {run_dir!r} is not a directory; pass the training output_dir "
            f"that contains {METRICS_FILE}"
        )
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise ValueError(
            f"run directory {run_dir!r} has no {METRICS_FILE} (expected {path!r}); "
            "is it the output_dir of a training run?"
        )
    return path


def load_metrics(run_dir: str) -> list[dict]:
    """Read ``<run_dir>/metrics.jsonl`` into a list of dicts, one per line, in file order.

    Records are as written; the figures and summaries read them through
    :func:`gtpo.run.metric_names.canonical_record`, so a run written with the earlier metric names
    (``reward/mean``, ``entropy/mean``, ...) is drawn like a new one.
    Blank lines are ignored. The last non-blank line is skipped when it cannot be parsed: a run
    killed while writing leaves a truncated last line, and the finished lines before it are
    still good. Any other line that is not valid JSON, or is valid JSON but not an object,
    raises a ValueError naming the file and the 1-based line number.

    Args:
        run_dir: the training run's output directory.

    Returns:
        One dict per parsed line (eval-only lines included), in file order.

    Raises:
        ValueError: the directory or its metrics.jsonl is missing, or a line is corrupt.
    """
    path = _metrics_path(run_dir)
    with open(path, "rb") as fh:
        raw_lines = fh.read().split(b"\n")
    numbered = [(i + 1, line) for i, line in enumerate(raw_lines) if line.strip()]
    records: list[dict] = []
    for pos, (lineno, raw) in enumerate(numbered):
        is_last = pos == len(numbered) - 1
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if is_last:
                break  # truncated last line (e.g. the writer was killed): drop it
            raise ValueError(
                f"{path}, line {lineno}: corrupt metrics line, expected one JSON object per "
                f"line ({exc}); fix or delete that line"
            ) from exc
        if not isinstance(obj, dict):
            raise ValueError(
                f"{path}, line {lineno}: expected a JSON object per line, got "
                f"{type(obj).__name__}"
            )
        records.append(obj)
    return records


def _load_json_dict(path: str) -> dict | None:
    """Load an optional JSON object file; None when absent, ValueError when not a JSON object."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _is_number(value: Any) -> bool:
    """True for finite int/float values (bools and non-finite values are not metric values)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


@dataclass
class _Run:
    """One loaded run: its records, optional config and summary, legend label and colour."""

    path: str
    label: str
    records: list[dict]
    config: dict | None = None
    summary: dict | None = None
    color: str = "C0"
    _cache: dict = field(default_factory=dict, repr=False)

    def keys(self) -> set[str]:
        """Every key that has at least one finite numeric value with a step in this run."""
        if "__keys__" not in self._cache:
            found: set[str] = set()
            for rec in self.records:
                if not _is_number(rec.get("step")):
                    continue
                found.update(k for k, v in rec.items() if k != "step" and _is_number(v))
            self._cache["__keys__"] = found
        return self._cache["__keys__"]

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(steps (n,), values (n,))`` for ``key``, sorted by step.

        Records without a numeric ``step`` and non-finite or non-numeric values are left out.
        When a step is logged more than once (a run resumed from a checkpoint re-logs the steps
        after it), the last value in the file wins.
        """
        if key not in self._cache:
            by_step: dict[float, float] = {}
            for rec in self.records:
                step, value = rec.get("step"), rec.get(key)
                if _is_number(step) and _is_number(value):
                    by_step[step] = float(value)
            steps = np.array(sorted(by_step), dtype=float)
            values = np.array([by_step[s] for s in sorted(by_step)], dtype=float)
            self._cache[key] = (steps, values)
        return self._cache[key]

    def has(self, key: str) -> bool:
        return key in self.keys()


def _default_label(run_dir: str, config: dict | None) -> str:
    name = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
    loss_type = (config or {}).get("loss_type")
    return f"{loss_type} {name}" if loss_type else name


def _load_runs(run_dirs: Sequence[str], labels: Sequence[str] | None = None) -> list[_Run]:
    """Load every run directory (metrics, config, summary) and give it a label and a colour."""
    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = [run_dirs]
    run_dirs = [os.fspath(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("run_dirs: expected at least one run directory, got none")
    if labels is not None:
        labels = list(labels)
        if len(labels) != len(run_dirs):
            raise ValueError(
                f"labels: expected one label per run directory ({len(run_dirs)}), "
                f"got {len(labels)}: {labels!r}"
            )
    runs = []
    for i, run_dir in enumerate(run_dirs):
        records = [canonical_record(rec) for rec in load_metrics(run_dir)]
        config = _load_json_dict(os.path.join(run_dir, CONFIG_FILE))
        summary = _load_json_dict(os.path.join(run_dir, SUMMARY_FILE))
        label = labels[i] if labels is not None else _default_label(run_dir, config)
        runs.append(_Run(run_dir, label, records, config, summary, color=f"C{i % 10}"))
    return runs


# --------------------------------------------------------------------------------------------
# Plotting helpers
# --------------------------------------------------------------------------------------------


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average of ``values (n,)`` -> ``(n,)``.

    Point i is the mean of ``values[max(0, i - window + 1) : i + 1]``: the first points average
    what is available instead of being dropped, so the smoothed curve spans the same steps.
    """
    values = np.asarray(values, dtype=float)
    if window <= 1 or values.size == 0:
        return values.copy()
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, values.size + 1)
    lo = np.maximum(idx - window, 0)
    return (csum[idx] - csum[lo]) / (idx - lo)


def _check_smooth(smooth: int | None) -> int | None:
    if smooth is None:
        return None
    if isinstance(smooth, bool) or not isinstance(smooth, (int, np.integer)) or smooth < 1:
        raise ValueError(f"smooth: expected a positive integer window or None, got {smooth!r}")
    return int(smooth) if smooth > 1 else None


#: line style of a series equal to one drawn before it in the same panel: dashes with gaps through which
#: the earlier run's colour shows, so that neither hides the other
_TWIN_STYLE = (0, (3, 3))


def _twin_label(drawn: list, steps: np.ndarray, values: np.ndarray) -> str | None:
    """The label of a series in ``drawn`` (``[(steps, values, label)]``) equal to ``(steps, values)``, or None."""
    for s_other, v_other, label in drawn:
        if s_other.shape == steps.shape and np.array_equal(s_other, steps) and np.array_equal(v_other, values):
            return label
    return None


def _plot_series(ax, run: _Run, key: str, *, smooth: int | None, label: str,
                 linestyle: str = "-", markers: bool = False, drawn: list | None = None) -> list:
    """Draw one key of one run on ``ax``; with smoothing, the raw values faint behind.

    ``drawn`` (``[(steps, values, label)]``, appended to) holds the series already in the panel: a series
    equal to one of them is drawn dashed and labelled ``"<label> (same values as <other>)"``, so that
    identical runs do not hide each other.

    Returns the Line2D objects drawn (empty when the run lacks the key).
    """
    steps, values = run.series(key)
    if steps.size == 0:
        return []
    if drawn is not None:
        twin = _twin_label(drawn, steps, values)
        drawn.append((steps, values, label))
        if twin is not None:
            label, linestyle = f"{label} (same values as {twin})", _TWIN_STYLE
    lines = []
    marker = "o" if markers or steps.size == 1 else None
    if smooth:
        lines += ax.plot(steps, values, color=run.color, alpha=0.25, linewidth=0.8,
                         linestyle=linestyle)
        lines += ax.plot(steps, _moving_average(values, smooth), color=run.color,
                         linestyle=linestyle, linewidth=1.6, label=label, marker=marker,
                         markersize=3)
    else:
        lines += ax.plot(steps, values, color=run.color, linestyle=linestyle, linewidth=1.4,
                         label=label, marker=marker, markersize=3)
    return lines


def _plot_keys(ax, runs: Sequence[_Run], keys: Sequence[str], *, smooth: int | None = None,
               markers: bool = False) -> list:
    """Overlay ``keys`` of every run on one axes: colour = run, line style = key."""
    lines: list = []
    drawn: list = []
    for run in runs:
        present = [k for k in keys if run.has(k)]
        for j, key in enumerate(keys):
            if key not in present:
                continue
            label = run.label if len(keys) == 1 else f"{run.label}: {key}"
            lines += _plot_series(ax, run, key, smooth=smooth, label=label,
                                  linestyle=_KEY_STYLES[j % len(_KEY_STYLES)], markers=markers, drawn=drawn)
    return lines


def _plot_reward_band(ax, runs: Sequence[_Run], *, smooth: int | None = None) -> list:
    """reward per run with a ±reward_std band (std across the completions of a batch)."""
    lines: list = []
    drawn: list = []
    for run in runs:
        lines += _plot_series(ax, run, "reward", smooth=smooth, label=run.label, drawn=drawn)
        s_mean, mean = run.series("reward")
        s_std, std = run.series("reward_std")
        if s_mean.size == 0 or s_std.size == 0:
            continue
        common, i_mean, i_std = np.intersect1d(s_mean, s_std, return_indices=True)
        if common.size == 0:
            continue
        m, s = mean[i_mean], std[i_std]
        if smooth:
            m, s = _moving_average(m, smooth), _moving_average(s, smooth)
        ax.fill_between(common, m - s, m + s, color=run.color, alpha=0.15, linewidth=0)
    return lines


def _plot_entropy(ax, runs: Sequence[_Run], *, smooth: int | None = None) -> list:
    """Mean token entropy per run, the ln 2 line and the entropy-filter threshold of each run that filters.

    ln 2 is the entropy of two equiprobable tokens, the threshold of the GTPO paper's printed
    objective; the released code uses a configurable τ (``entropy_threshold``, 0.7 by default),
    drawn dotted in the run's colour when the run's filter was on (:func:`_filter_threshold`):
    a GRPO run, or a run whose ⟨H⟩_ini rule kept the filter off, draws none.

    Returns every Line2D drawn (run curves, the ln 2 line labelled "ln 2", threshold lines).
    """
    lines = _plot_keys(ax, runs, ["entropy"], smooth=smooth)
    lines.append(ax.axhline(LN2, color="0.3", linestyle="--", linewidth=1.2, label="ln 2"))
    for run in runs:
        tau = _filter_threshold(run)
        if tau is not None:
            lines.append(ax.axhline(tau, color=run.color, linestyle=":", linewidth=1.4,
                                    label=f"{run.label}: filter threshold {tau:.3g}"))
    return lines


def _filter_threshold(run: _Run) -> float | None:
    """The entropy threshold at which ``run`` filtered completions, or None when its filter was off.

    From ``run_config.json``: ``entropy_filter`` (None: its rule, by
    :func:`gtpo.config.resolved` as every engine decides it) and ``entropy_threshold``; under ``entropy_rule: initial``
    the filter is off when the logged ``gtpo/initial_entropy`` is above the threshold. A run
    without a config draws no threshold.
    """
    cfg = run.config or {}
    tau = cfg.get("entropy_threshold")
    if not _is_number(tau):
        return None
    if not resolved(cfg, "entropy_filter"):
        return None
    _, h_ini = run.series("gtpo/initial_entropy")
    if cfg.get("entropy_rule") == "initial" and h_ini.size and h_ini[-1] > tau:
        return None
    return float(tau)


def _panel(title: str, ylabel: str, keys: Sequence[str], draw=None, *, markers=False,
           smooth=True) -> dict:
    """One axes of a figure. ``markers``: sparse points (eval), drawn with markers and never
    smoothed; ``smooth=False``: a deterministic curve (lr schedule) that smoothing would distort."""
    return {"title": title, "ylabel": ylabel, "keys": list(keys), "draw": draw,
            "markers": markers, "smooth": smooth and not markers}


def _widen_flat_ylim(ax, *, rel_tol: float = 1e-9) -> None:
    """Give a flat panel a readable y range.

    A constant metric (a clipped fraction of 0.01 every step) comes back from float arithmetic (the trainer's,
    or the moving average) with ~1e-17 wiggles; matplotlib would zoom onto them and label the
    axis "1e-13+3e-1". When the data span is below ``rel_tol`` of its magnitude, centre the axis
    on the value with ±5 % of it instead (±0.05 around 0).
    """
    y0, y1 = ax.dataLim.intervaly
    if not (math.isfinite(y0) and math.isfinite(y1)):
        return
    if y1 - y0 <= rel_tol * max(abs(y0), abs(y1)):
        center = 0.5 * (y0 + y1)
        pad = 0.05 * abs(center) if center != 0 else 0.05
        ax.set_ylim(center - pad, center + pad)


def _draw_figure(runs: Sequence[_Run], panels: Sequence[dict], title: str, *, smooth: int | None):
    """The ``Figure`` of the panels that some run has data for, or None when no run has any key of any panel.

    Steps are whole numbers, so the x axes tick at integers only. A panel whose legend has more than
    :data:`_LEGEND_INSIDE_MAX` entries puts it outside the axes, on the right (the figure widens by the
    widest such legend, :func:`_fixed_margins`), so that it never covers the curves.
    """
    panels = [p for p in panels if any(run.has(k) for run in runs for k in p["keys"])]
    if not panels:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ncols = 1 if len(panels) == 1 else 2
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(6.4 * ncols, 3.8 * nrows), dpi=_DPI)
    FigureCanvasAgg(fig)
    wide = False
    for i, p in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        if p["draw"] is not None:
            p["draw"](ax, runs, smooth=smooth)
        else:
            _plot_keys(ax, runs, p["keys"], smooth=smooth if p["smooth"] else None,
                       markers=p["markers"])
        ax.set_title(p["title"])
        ax.set_xlabel("step")
        ax.set_ylabel(p["ylabel"])
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _widen_flat_ylim(ax)
        handles = ax.get_legend_handles_labels()[0]
        if len(handles) > _LEGEND_INSIDE_MAX:
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
            wide = True
        elif handles:
            ax.legend(fontsize="small", loc="best")
    room = 0.0
    if wide:  # room for the legends beside the axes: the widest one's (only the legends are measured)
        renderer = fig.canvas.get_renderer()
        room = 0.15 + max(ax.get_legend().get_window_extent(renderer).width for ax in fig.axes
                          if ax.get_legend() is not None) / fig.dpi
        fig.set_figwidth(fig.get_figwidth() + room * ncols)
    _fixed_margins(fig, nrows, ncols, legend_room=room)
    fig.suptitle(title)
    return fig


def _fixed_margins(fig, nrows: int, ncols: int, *, legend_room: float) -> None:
    """Margins and gaps in inches (tick labels and y label on the left, the title and suptitle above, the x
    label below, ``legend_room`` right of each column). A fixed layout: matplotlib's constrained layout
    measured every text once more per figure, ~40 % of a report's time (1.2 of 3.3 s CPU for one run)."""
    width, height = fig.get_figwidth(), fig.get_figheight()
    left, right, bottom, top = 1.0, 0.35 + legend_room, 0.55, 0.75
    gap_w, gap_h = 1.0 + legend_room, 0.85
    axes_w = (width - left - right - (ncols - 1) * gap_w) / ncols
    axes_h = (height - bottom - top - (nrows - 1) * gap_h) / nrows
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=gap_w / axes_w, hspace=gap_h / axes_h)


#: legends with more entries than this go beside the axes instead of over the curves
_LEGEND_INSIDE_MAX = 3


def _render_figure(runs: Sequence[_Run], panels: Sequence[dict], title: str, path: str,
                   *, smooth: int | None) -> bool:
    """Draw the panels that some run has data for into one PNG at ``path`` (atomically).

    Returns False (and writes nothing) when no run has any key of any panel.
    """
    fig = _draw_figure(runs, panels, title, smooth=smooth)
    if fig is None:
        return False
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    atomic_write(path, buf.getvalue())
    return True


def _prefixed_keys(runs: Iterable[_Run], prefix: str) -> list[str]:
    return sorted({k for run in runs for k in run.keys() if k.startswith(prefix)})


def _reward_function_keys(runs: Iterable[_Run]) -> list[str]:
    """``rewards/<function name>/mean`` keys (per reward function, TRL's names)."""
    return sorted({k for run in runs for k in run.keys()
                   if k.startswith("rewards/") and k.endswith("/mean") and k.count("/") >= 2})


def _figures(runs: Sequence[_Run]) -> list[tuple[str, str, list[dict]]]:
    """The figure plan: (file name, figure title, panels)."""
    accuracy_keys = [k for k in _EVAL_ACCURACY_KEYS if any(r.has(k) for r in runs)]
    probe_keys = _prefixed_keys(runs, "probe/")
    eval_keys = _prefixed_keys(runs, "eval/")
    return [
        ("reward.png", "Reward", [
            _panel("Reward (mean ± std over completions)", "reward", ["reward"],
                   _plot_reward_band),
            _panel("Evaluation accuracy", "accuracy", accuracy_keys, markers=True),
            _panel("Reward per function (mean)", "reward", _reward_function_keys(runs)),
            _panel("Groups with zero reward variance", "fraction", ["frac_reward_zero_std"]),
        ]),
        ("entropy.png", "Entropy", [
            _panel("Mean token entropy (vs ln 2)", "entropy (nats)", ["entropy"],
                   _plot_entropy),
        ]),
        ("conflict.png", "GTPO token conflicts and entropy filter", [
            _panel("Conflict tokens", "fraction of completion tokens", ["gtpo/conflict_frac"]),
            _panel("Entropy-filtered completions", "fraction of completions",
                   ["gtpo/filtered_frac"]),
        ]),
        ("length.png", "Completion length", [
            _panel("Completion length (solid: mean, dashed: max)", "tokens",
                   ["completions/mean_length", "completions/max_length"]),
            _panel("Truncated completions", "fraction", ["completions/clipped_ratio"]),
        ]),
        ("optim.png", "Optimisation", [
            _panel("Gradient norm", "grad norm", ["grad_norm"]),
            _panel("Learning rate", "learning_rate", ["learning_rate"], smooth=False),
            _panel("Loss", "loss", ["loss"]),
            _panel("Clipped fraction (ratio outside the clip range)", "fraction of tokens", ["clip_ratio/region_mean"]),
        ]),
        ("probes.png", "Probability of tracked tokens", [
            _panel(k[len("probe/"):], "mean probability", [k]) for k in probe_keys
        ]),
        ("eval.png", "Evaluation", [
            _panel(k, k[len("eval/"):], [k], markers=True) for k in eval_keys
        ]),
    ]


def _plot_runs(runs: Sequence[_Run], out_dir: str, *, smooth: int | None) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, title, panels in _figures(runs):
        path = os.path.join(out_dir, name)
        if _render_figure(runs, panels, title, path, smooth=smooth):
            written.append(path)
    return written


def plot_run(run_dirs: Sequence[str], out_dir: str, *, labels: Sequence[str] | None = None,
             smooth: int | None = None) -> list[str]:
    """Write one PNG per topic into ``out_dir``, overlaying all runs (one colour per run).

    Figures (each skipped when no run has any of its keys; panels without data are dropped):
    ``reward.png`` (reward mean ± std band; eval pass@1 / greedy accuracy; per-function reward;
    zero-variance groups), ``entropy.png`` (entropy, dashed ln 2 line, each run's
    ``entropy_threshold``), ``conflict.png`` (gtpo/conflict_frac, gtpo/filtered_frac),
    ``length.png`` (completions/mean_length and max_length, completions/clipped_ratio), ``optim.png``
    (grad_norm, learning_rate, loss, clip_ratio/region_mean), ``probes.png`` (every probe/* key), ``eval.png`` (every eval/* key).

    Args:
        run_dirs: training output directories, each with a metrics.jsonl.
        out_dir: where the PNGs go (created if needed).
        labels: legend label per run; default ``"<loss_type> <dir name>"`` from run_config.json
            (just the dir name when there is no config).
        smooth: trailing moving-average window in steps (None or 1: no smoothing); the raw
            values are drawn faint behind the smoothed curve. Eval points are never smoothed.

    Returns:
        Paths of the PNGs written, in the order above.
    """
    smooth = _check_smooth(smooth)
    return _plot_runs(_load_runs(run_dirs, labels), out_dir, smooth=smooth)


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def _run_stats(run: _Run) -> dict[str, float | int | None]:
    """Scalar statistics of one run (None where the run lacks the key).

    - ``steps``: distinct steps that have a training metric (any key other than eval/*).
    - ``last_step``: the largest such step.
    - ``reward_first``: reward at the first step; ``reward_last10``: mean of reward
      over the last 10 % of its logged steps (at least one step, ceil(0.1·n)).
    - ``entropy_start`` / ``entropy_end`` / ``entropy_max``: entropy first, last, max.
    - ``conflict_frac_mean``, ``filtered_frac_mean``, ``step_time_s_mean``,
      ``tokens_per_s_mean``: means over the logged steps.
    """
    train_steps = {
        rec["step"] for rec in run.records
        if _is_number(rec.get("step"))
        and any(k != "step" and not k.startswith("eval/") and _is_number(v)
                for k, v in rec.items())
    }
    stats: dict[str, float | int | None] = {
        "steps": len(train_steps),
        "last_step": max(train_steps) if train_steps else None,
    }
    _, reward = run.series("reward")
    stats["reward_first"] = float(reward[0]) if reward.size else None
    if reward.size:
        k = max(1, math.ceil(0.1 * reward.size))
        stats["reward_last10"] = float(reward[-k:].mean())
    else:
        stats["reward_last10"] = None
    _, entropy = run.series("entropy")
    stats["entropy_start"] = float(entropy[0]) if entropy.size else None
    stats["entropy_end"] = float(entropy[-1]) if entropy.size else None
    stats["entropy_max"] = float(entropy.max()) if entropy.size else None
    for name, key in (("conflict_frac_mean", "gtpo/conflict_frac"),
                      ("filtered_frac_mean", "gtpo/filtered_frac"),
                      ("step_time_s_mean", "step_time"),
                      ("tokens_per_s_mean", "gtpo/tokens_per_s")):
        _, values = run.series(key)
        stats[name] = float(values.mean()) if values.size else None
    return stats


def _final_evals(run: _Run) -> dict[str, float]:
    """Last logged value (at the largest step) of every eval/* key."""
    out = {}
    for key in sorted(k for k in run.keys() if k.startswith("eval/")):
        _, values = run.series(key)
        out[key] = float(values[-1])
    return out


_STAT_ROWS = (
    ("steps", "steps logged"),
    ("last_step", "last step"),
    ("reward_first", "reward, first step"),
    ("reward_last10", "reward, mean of last 10 %"),
    ("entropy_start", "entropy, start"),
    ("entropy_end", "entropy, end"),
    ("entropy_max", "entropy, max"),
    ("conflict_frac_mean", "gtpo/conflict_frac, mean"),
    ("filtered_frac_mean", "gtpo/filtered_frac, mean"),
    ("step_time_s_mean", "step time (s), mean"),
    ("tokens_per_s_mean", "tokens/s, mean"),
)


def _fmt(value: Any) -> str:
    """Format a table cell: ints as is, floats with 4 significant digits, missing as '—'."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    if isinstance(value, str):
        return _md_escape(value)
    return _md_escape(json.dumps(value, sort_keys=True))


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _summarize_runs(runs: Sequence[_Run]) -> str:
    header = ["metric"] + [_md_escape(run.label) for run in runs]
    parts = ["## Runs", ""]
    for run in runs:
        cfg = run.config or {}
        bits = [f"**{_md_escape(run.label)}**: `{run.path}`"]
        for key in ("loss_type", "model", "entropy_threshold"):
            if key in cfg:
                bits.append(f"{key} = {_fmt(cfg[key])}")
        parts.append("- " + ", ".join(bits))

    stats = [_run_stats(run) for run in runs]
    rows = [[title] + [_fmt(s[key]) for s in stats] for key, title in _STAT_ROWS]
    finals = [_final_evals(run) for run in runs]
    for key in sorted({k for f in finals for k in f}):
        rows.append([f"{key}, final"] + [_fmt(f.get(key)) for f in finals])
    parts += ["", "## Comparison", "", _table(header, rows)]

    if any(run.summary for run in runs):
        keys: list[str] = []
        for run in runs:
            keys += [k for k in (run.summary or {}) if k not in keys]
        srows = [[_md_escape(k)] + [_fmt((run.summary or {}).get(k)) for run in runs]
                 for k in keys]
        parts += ["", "## Final summary (summary.json)", "", _table(header, srows)]
    return "\n".join(parts) + "\n"


def summarize(run_dirs: Sequence[str], *, labels: Sequence[str] | None = None) -> str:
    """A markdown summary comparing runs: one column per run, one row per statistic.

    Rows: steps logged and last step; reward at the first step vs the mean over the last
    10 % of steps; entropy at start, end and its max; mean gtpo/conflict_frac and
    gtpo/filtered_frac; mean step time and tokens/s; the final value of every eval/* key; then a
    second table with summary.json's contents when any run has one. Missing values show "—".

    Args:
        run_dirs: training output directories, each with a metrics.jsonl.
        labels: column label per run (default as in :func:`plot_run`).
    """
    return _summarize_runs(_load_runs(run_dirs, labels))


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def write_report_and_summary(run_dirs: Sequence[str], out_dir: str | None = None, *,
                             labels: Sequence[str] | None = None,
                             smooth: int | None = None) -> tuple[str, str]:
    """:func:`write_report` that also returns the markdown summary: ``(report.md path, summary)``."""
    smooth = _check_smooth(smooth)
    runs = _load_runs(run_dirs, labels)
    if out_dir is None:
        out_dir = os.path.join(runs[0].path, "report")
    out_dir = os.fspath(out_dir)
    pngs = _plot_runs(runs, out_dir, smooth=smooth)
    summary = _summarize_runs(runs)
    parts = ["# Training report", "", summary, "## Figures", ""]
    if not pngs:
        parts.append("No plottable metrics found.")
    for png in pngs:
        name = os.path.basename(png)
        parts += [f"![{name[:-len('.png')]}]({name})", ""]
    path = os.path.join(out_dir, REPORT_FILE)
    atomic_write(path, "\n".join(parts).rstrip("\n") + "\n")
    return path, summary


def write_report(run_dirs: Sequence[str], out_dir: str | None = None, *,
                 labels: Sequence[str] | None = None, smooth: int | None = None) -> str:
    """Write the PNGs of :func:`plot_run` and ``report.md`` (summary + image links) to out_dir.

    Args:
        run_dirs: training output directories, each with a metrics.jsonl.
        out_dir: output directory; default ``<first run dir>/report``.
        labels: legend/column label per run.
        smooth: moving-average window for the curves (None: raw).

    Returns:
        The path of report.md. Every file is written atomically.
    """
    return write_report_and_summary(run_dirs, out_dir, labels=labels, smooth=smooth)[0]
