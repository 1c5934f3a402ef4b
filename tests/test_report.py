"""Tests of gtpo.report: metrics loading, figures, the markdown summary, report writing, CLI hooks.

Every run directory is synthetic, written by the test itself. Rendering is the slow part
(~0.2 s a figure), so the full two-run report is written once per module and shared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from gtpo import report
from gtpo.cli import add_report_arguments, report_main
from gtpo.report import (
    _load_runs,
    _moving_average,
    _plot_keys,
    _plot_entropy,
    _plot_reward_band,
    _run_stats,
    load_metrics,
    plot_run,
    summarize,
    write_report,
)
from gtpo.run.checkpoint import atomic_write

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir, records, *, config=None, summary=None, tail=""):
    """Write metrics.jsonl (+ optional run_config.json / summary.json) for a synthetic run."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
        fh.write(tail)
    if config is not None:
        with open(os.path.join(run_dir, "run_config.json"), "w") as fh:
            json.dump(config, fh)
    if summary is not None:
        with open(os.path.join(run_dir, "summary.json"), "w") as fh:
            json.dump(summary, fh)
    return str(run_dir)


# Hand-made run used for the summary numbers (20 training steps + separate eval lines):
#   reward/mean      = step / 10          -> first 0.1; last 10 % = ceil(0.1*20) = 2 steps:
#                                            mean(1.9, 2.0) = 1.95
#   entropy/mean     = ENTROPY[step - 1]  -> start 0.5, end 0.4, max 0.9
#   gtpo/conflict_frac = 0.1 odd steps, 0.3 even -> mean 0.2
#   gtpo/filtered_frac = 0.05 for steps 1..10, 0.15 for 11..20 -> mean 0.1
#   step_time_s      = step               -> mean (1 + ... + 20) / 20 = 10.5
#   tokens_per_s     = 100 steps 1..19, 2000 at step 20 -> (19*100 + 2000) / 20 = 195
#   eval/pass@1      = 0.25 at step 10, 0.5 at step 20 (eval-only lines) -> final 0.5
ENTROPY = [0.5, 0.6, 0.7, 0.9, 0.8, 0.6, 0.5, 0.5, 0.5, 0.5,
           0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.45, 0.4]


def _gtpo_records():
    """A GTPO run written with the metric names of earlier versions (reward/mean, entropy/mean, ...): read as
    the current (TRL's) names."""
    recs = []
    for step in range(1, 21):
        recs.append({
            "step": step,
            "loss": 0.01 * step,
            "reward/mean": step / 10,
            "reward/std": 0.2,
            "reward/format/mean": 0.5,
            "reward/correct/mean": step / 40,
            "frac_zero_std_groups": 0.25,
            "completion_length/mean": 50.0 + step,
            "completion_length/max": 128,
            "truncated_frac": 0.1,
            "entropy/mean": ENTROPY[step - 1],
            "gtpo/conflict_frac": 0.1 if step % 2 else 0.3,
            "gtpo/filtered_frac": 0.05 if step <= 10 else 0.15,
            "clipfrac": 0.02,
            "grad_norm": 1.0 + 0.1 * (step % 3),
            "lr": 1e-6,
            "step_time_s": float(step),
            "tokens_per_s": 100.0 if step < 20 else 2000.0,
            "skipped_steps": 0,
            "probe/format_tokens": 0.9 - 0.01 * step,
        })
        if step in (10, 20):
            recs.append({"step": step, "eval/pass@1": step / 40, "eval/maj@4": 0.3,
                         "eval/format_rate": 0.8})
    return recs


def _grpo_records():
    """A GRPO run (current metric names): no gtpo/* metrics but tokens/s, no probe/*, entropy drifting above ln 2."""
    recs = []
    for step in range(1, 16):
        recs.append({
            "step": step, "loss": -0.01 * step, "reward": 0.05 * step, "reward_std": 0.3,
            "entropy": 0.5 + 0.03 * step, "grad_norm": 2.0, "learning_rate": 1e-6,
            "completions/mean_length": 60.0, "completions/max_length": 128, "clip_ratio/region_mean": 0.0,
            "step_time": 2.0, "gtpo/tokens_per_s": 50.0,
        })
    recs.append({"step": 15, "eval/pass@1": 0.2})
    return recs


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    gtpo_dir = _write_run(base / "run_gtpo", _gtpo_records(),
                          config={"loss_type": "gtpo", "model": "tiny", "entropy_threshold": 0.7},
                          summary={"accuracy_before": 0.1, "accuracy_after": 0.42},
                          tail='{"step": 21, "loss": 0.2')  # killed mid-line
    grpo_dir = _write_run(base / "run_grpo", _grpo_records(),
                          config={"loss_type": "grpo", "model": "tiny", "entropy_threshold": 0.7})
    return gtpo_dir, grpo_dir


@pytest.fixture(scope="module")
def written_report(two_runs):
    path = write_report(list(two_runs), smooth=3)
    return path, os.path.dirname(path)


# ------------------------------------------------------------------------------------ loading


def test_load_metrics_parses_lines_and_skips_blank(tmp_path):
    run = _write_run(tmp_path, [{"step": 1, "loss": 0.5}], tail="\n  \n" + '{"step": 2}\n')
    assert load_metrics(run) == [{"step": 1, "loss": 0.5}, {"step": 2}]


@pytest.mark.parametrize("tail", ['{"step": 3, "lo', '{"step": 3, "lo\n', '{"step": 3, "a": "\xe9'])
def test_load_metrics_skips_truncated_last_line(tmp_path, tail):
    run = _write_run(tmp_path, [{"step": 1}, {"step": 2}], tail=tail)
    if "\xe9" in tail:  # cut inside a 2-byte UTF-8 character: invalid UTF-8 at the end
        path = os.path.join(run, "metrics.jsonl")
        with open(path, "rb") as fh:
            data = fh.read()
        with open(path, "wb") as fh:
            fh.write(data[:-1])
    assert load_metrics(run) == [{"step": 1}, {"step": 2}]


def test_load_metrics_corrupt_middle_line_names_file_and_line(tmp_path):
    run = str(tmp_path)
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        fh.write('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2: corrupt") as err:
        load_metrics(run)
    assert os.path.join(run, "metrics.jsonl") in str(err.value)


def test_load_metrics_non_object_line_is_an_error(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        fh.write('{"step": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"line 2: expected a JSON object per line, got list"):
        load_metrics(str(tmp_path))


def test_missing_run_dir_and_missing_metrics_name_the_path(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(ValueError, match="does not exist") as err:
        load_metrics(missing)
    assert missing in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no metrics.jsonl") as err:
        summarize([str(empty)])
    assert os.path.join(str(empty), "metrics.jsonl") in str(err.value)


def test_corrupt_run_config_names_the_file(tmp_path):
    run = _write_run(tmp_path, [{"step": 1, "loss": 1.0}])
    (tmp_path / "run_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="run_config.json: not valid JSON"):
        summarize([run])


def test_series_sorted_last_value_wins_and_non_numbers_dropped(tmp_path):
    # A resumed run re-logs steps 2 and 3: the later values (20, 30) replace the first ones.
    recs = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"step": 3, "loss": 3.0},
            {"step": 2, "loss": 20.0}, {"step": 3, "loss": 30.0}, {"step": 4, "loss": None},
            {"step": 5, "loss": "nan"}, {"step": 6, "loss": True}, {"loss": 7.0},
            {"step": 8, "loss": float("nan")}]
    (run,) = _load_runs([_write_run(tmp_path, recs)])
    steps, values = run.series("loss")
    np.testing.assert_array_equal(steps, [1, 2, 3])
    np.testing.assert_array_equal(values, [1.0, 20.0, 30.0])


def test_labels_default_and_mismatch(two_runs):
    runs = _load_runs(list(two_runs))
    assert [r.label for r in runs] == ["gtpo run_gtpo", "grpo run_grpo"]
    assert [r.color for r in runs] == ["C0", "C1"]
    with pytest.raises(ValueError, match=r"labels: expected one label per run directory \(2\)"):
        _load_runs(list(two_runs), ["only one"])


# ------------------------------------------------------------------------------------ smoothing


def test_moving_average_golden():
    # window 2: [1, (1+2)/2, (2+3)/2, (3+4)/2, (4+5)/2]; window 3: [1, 1.5, 2, 3, 4]
    np.testing.assert_allclose(_moving_average(np.arange(1.0, 6.0), 2),
                               [1.0, 1.5, 2.5, 3.5, 4.5], rtol=0, atol=1e-12)
    np.testing.assert_allclose(_moving_average(np.arange(1.0, 6.0), 3),
                               [1.0, 1.5, 2.0, 3.0, 4.0], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(_moving_average(np.array([3.0, 1.0]), 1), [3.0, 1.0])


def test_moving_average_matches_slow_reference():
    rng = np.random.default_rng(0)
    for n, window in [(1, 5), (17, 1), (17, 4), (50, 50), (50, 80), (200, 7)]:
        x = rng.normal(size=n)
        slow = [x[max(0, i - window + 1): i + 1].mean() for i in range(n)]
        np.testing.assert_allclose(_moving_average(x, window), slow, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "3", True])
def test_smooth_must_be_positive_int(two_runs, tmp_path, bad):
    with pytest.raises(ValueError, match="smooth: expected a positive integer"):
        plot_run(list(two_runs), str(tmp_path), smooth=bad)


# ------------------------------------------------------------------------------------ axes


def _axes():
    from matplotlib.figure import Figure

    return Figure().add_subplot()


def test_plot_entropy_draws_both_runs_ln2_and_threshold(two_runs):
    runs = _load_runs(list(two_runs))
    ax = _axes()
    lines = _plot_entropy(ax, runs)
    by_label = {ln.get_label(): ln for ln in lines}
    # one curve per run (overlay), in the run's colour, with the run's data
    for run in runs:
        line = by_label[run.label]
        assert line.get_color() == run.color
        steps, values = run.series("entropy")
        assert steps.size
        np.testing.assert_array_equal(line.get_xdata(), steps)
        np.testing.assert_array_equal(line.get_ydata(), values)
    # ln 2 = 0.6931..., dashed, horizontal
    ln2 = by_label["ln 2"]
    assert ln2.get_linestyle() == "--"
    np.testing.assert_allclose(ln2.get_ydata(), [math.log(2)] * 2, rtol=0, atol=1e-15)
    # entropy_threshold 0.7 of the GTPO run only: the GRPO run's config has one too, but GRPO does not filter
    thr = [ln for ln in lines if "threshold" in ln.get_label()]
    assert len(thr) == 1 and thr[0].get_label() == "gtpo run_gtpo: filter threshold 0.7"
    np.testing.assert_allclose(thr[0].get_ydata(), [0.7, 0.7], rtol=0, atol=1e-15)
    assert thr[0].get_color() == "C0"


def test_plot_entropy_smoothing_draws_raw_faint_behind(two_runs):
    runs = _load_runs([two_runs[0]])
    ax = _axes()
    lines = _plot_entropy(ax, runs, smooth=3)
    raw = [ln for ln in lines if ln.get_alpha() == 0.25]
    smoothed = [ln for ln in lines if ln.get_label() == runs[0].label]
    assert len(raw) == 1 and len(smoothed) == 1
    np.testing.assert_array_equal(raw[0].get_ydata(), ENTROPY)
    # second smoothed point: (0.5 + 0.6) / 2 = 0.55; fourth: (0.6 + 0.7 + 0.9) / 3
    np.testing.assert_allclose(smoothed[0].get_ydata()[[1, 3]], [0.55, 2.2 / 3], atol=1e-12)


def test_reward_band_overlays_runs_with_std_band(two_runs):
    runs = _load_runs(list(two_runs))
    ax = _axes()
    lines = _plot_reward_band(ax, runs)
    assert [ln.get_label() for ln in lines] == [r.label for r in runs]
    assert len(ax.collections) == 2  # one ±std band per run
    # GTPO band at step 1: reward 0.1 ± std 0.2 -> [-0.1, 0.3]
    verts = ax.collections[0].get_paths()[0].vertices
    at_step1 = verts[np.isclose(verts[:, 0], 1.0)][:, 1]
    np.testing.assert_allclose(sorted(set(np.round(at_step1, 12))), [-0.1, 0.3], atol=1e-12)


def test_plot_entropy_threshold_only_where_the_filter_was_on(tmp_path):
    recs = [{"step": s, "entropy": 1.5, "gtpo/initial_entropy": 1.8} for s in (1, 2)]
    configs = {
        "grpo_filter": {"loss_type": "grpo", "entropy_filter": True, "entropy_threshold": 1.05},  # drawn
        "gtpo_off": {"loss_type": "gtpo", "entropy_filter": False, "entropy_threshold": 0.7},
        "paper_inactive": {"loss_type": "gtpo", "entropy_rule": "initial", "entropy_threshold": 0.6931},
        "paper_active": {"loss_type": "gtpo", "entropy_rule": "initial", "entropy_threshold": 2.0},  # 1.8 <= 2
        "no_config": None,
    }
    runs = _load_runs([_write_run(tmp_path / name, recs, config=cfg) for name, cfg in configs.items()],
                      labels=list(configs))
    lines = _plot_entropy(_axes(), runs)
    assert sorted(ln.get_label() for ln in lines if "threshold" in ln.get_label()) == [
        "grpo_filter: filter threshold 1.05", "paper_active: filter threshold 2"]


def test_identical_runs_stay_visible_and_say_so(tmp_path):
    recs = [{"step": s, "reward": 0.1 * s, "reward_std": 0.1, "entropy": 0.5} for s in (1, 2, 3)]
    dirs = [_write_run(tmp_path / n, recs) for n in ("a", "b")]
    dirs.append(_write_run(tmp_path / "c", [{**r, "entropy": 0.6} for r in recs]))
    runs = _load_runs(dirs)
    ax = _axes()
    lines = _plot_keys(ax, runs, ["entropy"])
    assert [ln.get_label() for ln in lines] == ["a", "b (same values as a)", "c"]
    assert lines[0].get_linestyle() == "-" and lines[1].get_linestyle() == "--" and lines[2].get_linestyle() == "-"
    assert ax.lines.index(lines[1]) > ax.lines.index(lines[0])  # the dashed twin on top: both colours show
    band = _plot_reward_band(_axes(), runs)
    assert [ln.get_label() for ln in band] == ["a", "b (same values as a)", "c (same values as a)"]


def _four_runs(tmp_path):
    dirs = []
    for i in range(4):
        recs = [{"step": s, "reward": 0.1 * s + i, "entropy": 0.5 + 0.1 * i + 0.01 * s} for s in range(1, 11)]
        recs += [{"step": s, "eval/pass@1": 0.1 * i + 0.01 * s} for s in (2, 4)]
        dirs.append(_write_run(tmp_path / f"run{i}", recs, config={"loss_type": "gtpo", "entropy_threshold": 0.7}))
    return _load_runs(dirs)


def test_legends_never_cover_the_curves_with_four_runs(tmp_path):
    runs = _four_runs(tmp_path)
    for name, title, panels in report._figures(runs):
        fig = report._draw_figure(runs, panels, title, smooth=None)
        if fig is None:
            continue
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None or len(legend.get_texts()) <= report._LEGEND_INSIDE_MAX:
                continue
            box, area = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert box.x0 >= area.x1, (name, ax.get_title())  # beside the axes, not over them
            for other in fig.axes:  # and over no other panel
                if other is not ax:
                    assert not box.overlaps(other.get_window_extent(renderer)), (name, ax.get_title())


def test_step_axes_tick_at_whole_steps(tmp_path):
    runs = _four_runs(tmp_path)
    panels = [p for _, _, ps in report._figures(runs) for p in ps if p["keys"] == ["eval/pass@1"]]
    fig = report._draw_figure(runs, panels[:1], "eval", smooth=None)
    fig.canvas.draw()
    (ax,) = fig.axes
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_old_metric_names_read_as_current(tmp_path):
    run = _write_run(tmp_path, [{"step": 1, "reward/mean": 0.5, "reward/correct/mean": 1.0, "lr": 1e-6,
                                 "truncated_frac": 0.25, "no_signal/filtered": 2, "reward": 0.7,
                                 "gtpo/conflict_frac": 0.1, "eval/pass@1": 0.3}])
    # a line holding both names keeps the current one (reward 0.7)
    assert _load_runs([run])[0].records == [{"step": 1, "rewards/correct/mean": 1.0, "learning_rate": 1e-6,
                                  "completions/clipped_ratio": 0.25, "gtpo/no_signal/filtered": 2, "reward": 0.7,
                                  "gtpo/conflict_frac": 0.1, "eval/pass@1": 0.3}]


# ------------------------------------------------------------------------------------ figures


def test_write_report_writes_valid_pngs(written_report, two_runs):
    path, out_dir = written_report
    assert out_dir == os.path.join(two_runs[0], "report")  # default out dir
    names = sorted(f for f in os.listdir(out_dir) if f.endswith(".png"))
    assert names == sorted(["reward.png", "entropy.png", "conflict.png", "length.png",
                            "optim.png", "probes.png", "eval.png"])
    for name in names:
        with open(os.path.join(out_dir, name), "rb") as fh:
            data = fh.read()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 20_000, name  # a drawn figure, not an empty canvas
    assert not [f for f in os.listdir(out_dir) if f.endswith(".tmp")]


def test_report_md_links_every_png_and_contains_summary(written_report):
    path, out_dir = written_report
    text = open(path, encoding="utf-8").read()
    assert text.startswith("# Training report\n")
    for name in os.listdir(out_dir):
        if name.endswith(".png"):
            assert f"![{name[:-4]}]({name})" in text
    assert "## Comparison" in text and "| gtpo run_gtpo | grpo run_grpo |" in text


def test_figures_skipped_when_no_run_has_their_keys(tmp_path):
    # Only loss + grad_norm: optim.png only; no reward/entropy/conflict/length/probes/eval.
    run = _write_run(tmp_path / "r", [{"step": s, "loss": 1.0 / s, "grad_norm": 0.5}
                                      for s in range(1, 6)])
    written = plot_run([run], str(tmp_path / "out"))
    assert [os.path.basename(p) for p in written] == ["optim.png"]
    assert sorted(os.listdir(tmp_path / "out")) == ["optim.png"]


def test_empty_metrics_gives_no_figures_and_a_report(tmp_path):
    run = _write_run(tmp_path / "r", [])
    path = write_report([run], str(tmp_path / "out"))
    text = open(path).read()
    assert "No plottable metrics found." in text
    assert "| steps logged | 0 |" in text
    assert os.listdir(tmp_path / "out") == ["report.md"]


def test_plotting_leaves_global_backend_alone(tmp_path):
    import matplotlib

    before = matplotlib.get_backend()
    run = _write_run(tmp_path / "r", [{"step": 1, "learning_rate": 1e-6}, {"step": 2, "learning_rate": 1e-6}])
    plot_run([run], str(tmp_path / "out"))
    assert matplotlib.get_backend() == before


def test_import_does_not_import_matplotlib():
    code = ("import sys, gtpo.report; "
            "print('matplotlib' in sys.modules, 'matplotlib.pyplot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


# ------------------------------------------------------------------------------------ summary


def test_run_stats_hand_computed(two_runs):
    gtpo, grpo = (_run_stats(r) for r in _load_runs(list(two_runs)))
    # eval-only lines and the truncated tail are not training steps
    assert gtpo["steps"] == 20 and gtpo["last_step"] == 20
    expected = {"reward_first": 0.1, "reward_last10": 1.95, "entropy_start": 0.5,
                "entropy_end": 0.4, "entropy_max": 0.9, "conflict_frac_mean": 0.2,
                "filtered_frac_mean": 0.1, "step_time_s_mean": 10.5, "tokens_per_s_mean": 195.0}
    for key, value in expected.items():
        assert gtpo[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    # GRPO: 15 steps, reward 0.05*step -> first 0.05; last ceil(1.5) = 2 steps: (0.7+0.75)/2
    # entropy 0.5 + 0.03*step -> start 0.53, end/max 0.95; no gtpo/* keys -> None
    assert grpo["steps"] == 15
    assert grpo["reward_first"] == pytest.approx(0.05, abs=1e-12)
    assert grpo["reward_last10"] == pytest.approx(0.725, abs=1e-12)
    assert grpo["entropy_start"] == pytest.approx(0.53, abs=1e-12)
    assert grpo["entropy_end"] == grpo["entropy_max"] == pytest.approx(0.95, abs=1e-12)
    assert grpo["conflict_frac_mean"] is None and grpo["filtered_frac_mean"] is None


def test_summarize_markdown_table(two_runs):
    md = summarize(list(two_runs), labels=["GTPO", "GR|PO"])
    assert "| metric | GTPO | GR\\|PO |" in md  # pipes in labels escaped
    for row in ["| steps logged | 20 | 15 |",
                "| reward, first step | 0.1 | 0.05 |",
                "| reward, mean of last 10 % | 1.95 | 0.725 |",
                "| entropy, start | 0.5 | 0.53 |",
                "| entropy, end | 0.4 | 0.95 |",
                "| entropy, max | 0.9 | 0.95 |",
                "| gtpo/conflict_frac, mean | 0.2 | — |",
                "| gtpo/filtered_frac, mean | 0.1 | — |",
                "| step time (s), mean | 10.5 | 2 |",
                "| tokens/s, mean | 195 | 50 |",
                "| eval/pass@1, final | 0.5 | 0.2 |",
                "| eval/maj@4, final | 0.3 | — |",
                "| eval/format_rate, final | 0.8 | — |",
                # summary.json of the GTPO run only
                "| accuracy_before | 0.1 | — |",
                "| accuracy_after | 0.42 | — |"]:
        assert row in md, row
    assert "## Final summary (summary.json)" in md
    assert "loss_type = gtpo, model = tiny, entropy_threshold = 0.7" in md
    assert "loss_type = grpo, model = tiny, entropy_threshold = 0.7" in md


def test_summarize_without_summary_json_has_no_summary_table(two_runs):
    md = summarize([two_runs[1]])
    assert "summary.json" not in md
    assert "| steps logged | 15 |" in md


# ------------------------------------------------------------------------------------ writing / CLI


def test_atomic_write_keeps_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        atomic_write(str(path), "new \ud800")  # a lone surrogate cannot be encoded
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["report.md"]


def test_cli_hooks(two_runs, tmp_path, capsys):
    parser = add_report_arguments(argparse.ArgumentParser())
    out = str(tmp_path / "rep")
    args = parser.parse_args([two_runs[1], "--out", out, "--labels", " only-grpo ",
                              "--smooth", "2"])
    assert args.run_dirs == [two_runs[1]] and args.smooth == 2
    assert report_main(args) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == os.path.join(out, "report.md")
    assert "| metric | only-grpo |" in printed
    assert os.path.isfile(os.path.join(out, "entropy.png"))
    with pytest.raises(SystemExit):
        parser.parse_args([])  # at least one run dir


def test_cli_missing_run_dir_raises_value_error(tmp_path):
    parser = add_report_arguments(argparse.ArgumentParser())
    missing = str(tmp_path / "missing_run")
    with pytest.raises(ValueError, match="does not exist") as err:
        report_main(parser.parse_args([missing]))
    assert missing in str(err.value)


def test_module_exports():
    assert set(report.__all__) == {"load_metrics", "plot_run", "summarize", "write_report",
                                   "write_report_and_summary"}
