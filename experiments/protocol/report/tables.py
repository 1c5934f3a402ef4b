"""What every section of docs/results.md shares: where the document and its figures go, number formats, markdown
tables, figures, the committed data files' start records and runs, and a declared design's text."""

from __future__ import annotations

import os
import statistics

from ..common import DATA, ROOT, read_jsonl_gz

DOCS_MD = os.path.join(ROOT, "docs", "results.md")
FIG_DIR = os.path.join(ROOT, "docs", "results", "protocol")
README_MD = os.path.join(ROOT, "README.md")  # its results table's generated rows (:func:`replace_row`)


def fmt_p(p: float) -> str:
    if p != p:
        return "n/a"
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def fmt_half(x: float) -> str:
    """A rank sum or a median of integers, exactly: whole numbers without a decimal, halves with one
    (W+ 75.5 prints "75.5", never Python's half-to-even "76")."""
    if x != x:
        return "n/a"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def mean_sd(xs) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.3g}"
    return f"{statistics.mean(xs):.3g} ± {statistics.stdev(xs):.2g}"


def table(header, rows) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def replace_row(path: str, prefix: str, row: str) -> None:
    """Replace the one line of the markdown file ``path`` that starts with ``prefix`` (a table row of generated
    verdicts) by ``row``; ValueError when no line or several lines start with it."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    hits = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    if len(hits) != 1:
        raise ValueError(f"{path}: expected one line starting with {prefix!r}, found {len(hits)}")
    lines[hits[0]] = row
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


# ------------------------------------------------------------------ figures
def _figure(ncols: int = 1, nrows: int = 1, w: float = 5.0, h: float = 3.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _save(fig, name: str) -> str:
    os.makedirs(FIG_DIR, exist_ok=True)
    path = os.path.join(FIG_DIR, name)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=110)
    os.replace(path + ".tmp.png", path)
    return os.path.relpath(path, os.path.dirname(DOCS_MD))


def load_start_and_runs(name: str, kinds: tuple[str, ...]) -> tuple[dict | None, list[dict]]:
    """(the ``start`` record, the records of ``kinds``) of ``experiments/data/<name>``; (None, []) if absent."""
    path = os.path.join(DATA, name)
    if not os.path.isfile(path):
        return None, []
    recs = read_jsonl_gz(path)
    start = next((r for r in recs if r["kind"] == "start"), None)
    return start, [r for r in recs if r["kind"] in kinds]


def design_paragraph(design) -> str:
    """The **Design** paragraph of a design's declaration (``designs/``: the module docstring it was declared in), as
    markdown: the declaration itself."""
    doc = design.declaration()
    body = doc[doc.index("**Design"):].split("\n\n    python")[0]
    return body.replace(":data:", "").replace(":func:", "").replace(":mod:", "").replace("``", "`") + "\n"
