"""Designs declared before their runs, checkably (issue 32, item 3).

An experiment's design (arms, grids, seeds, test, threshold, stopping rule) is written in its module
(its docstring and constants) and committed before its first run. The runs then execute a frozen copy
of the repository at a commit (:func:`snapshot`: ``git archive``, so the code cannot change under a
running experiment while others edit the working tree) and every run records

* ``declared_in``: the last commit at or before the snapshot that changed the experiment's module (its
  declaration), with ``declared_at`` (its committer time, Unix seconds);
* ``code_commit``: the commit the snapshot was made from;
* ``started_at``: when the run started (Unix seconds, this machine's clock).

:func:`check_runs` (called by the report for every data file that carries declarations) refuses a run
that started before its declaration was committed, and, where git is available, a ``declared_in`` that
is not in this branch's history or whose committer time is not the recorded one.

    python -m experiments.protocol.declare snapshot experiments/protocol/claim7.py /work/snap-claim7
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from .common import EXPERIMENTS, ROOT

SNAPSHOT_FILE = "SNAPSHOT.json"


def _git(*args: str, cwd: str = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def git_available(cwd: str = ROOT) -> bool:
    try:
        _git("rev-parse", "--git-dir", cwd=cwd)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


def declaration_of(module_path: str, commit: str = "HEAD") -> dict:
    """``declared_in`` / ``declared_at`` / ``code_commit`` for ``module_path`` (relative to the repository)
    at ``commit``; refuses a module with uncommitted changes when ``commit`` is HEAD."""
    code = _git("rev-parse", commit)
    if commit == "HEAD" and _git("status", "--porcelain", "--", module_path):
        raise SystemExit(f"declare: {module_path} has uncommitted changes; commit the design before running it")
    declared = _git("log", "-1", "--format=%H", code, "--", module_path)
    if not declared:
        raise SystemExit(f"declare: {module_path} is not committed at {code[:10]}")
    return {"declared_in": declared, "declared_at": int(_git("show", "-s", "--format=%ct", declared)),
            "code_commit": code, "module": module_path}


def snapshot(module_path: str, dest: str, commit: str = "HEAD") -> dict:
    """A frozen copy of the repository at ``commit`` in ``dest`` (``git archive``), with the git-ignored
    working folders (``experiments/.cache``, ``experiments/runs``) linked to this checkout's, and
    :data:`SNAPSHOT_FILE` holding the declaration of ``module_path``."""
    info = declaration_of(module_path, commit)
    if os.path.exists(dest):
        old = current(dest)
        if old and old["code_commit"] == info["code_commit"] and old["module"] == module_path:
            return old
        shutil.rmtree(dest)
    os.makedirs(dest)
    archive = subprocess.run(["git", "archive", info["code_commit"]], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    for name in (".cache", "runs"):
        os.makedirs(os.path.join(EXPERIMENTS, name), exist_ok=True)
        os.symlink(os.path.join(EXPERIMENTS, name), os.path.join(dest, "experiments", name))
    with open(os.path.join(dest, SNAPSHOT_FILE), "w") as f:
        json.dump(info, f, indent=1)
    return info


def current(root: str = ROOT) -> dict | None:
    """The snapshot record of the tree at ``root`` (None when it is not a snapshot)."""
    path = os.path.join(root, SNAPSHOT_FILE)
    return json.load(open(path)) if os.path.isfile(path) else None


def run_stamp(module_path: str) -> dict:
    """What a run records when it starts: the declaration of the snapshot it runs in and the start time.
    Refuses to run outside a snapshot of a commit that contains ``module_path``'s declaration."""
    info = current()
    if info is None:
        raise SystemExit(f"declare: runs of {module_path} execute in a snapshot (python -m experiments.protocol.declare "
                         f"snapshot {module_path} DEST), so that the declared code is what runs")
    if info["module"] != module_path:
        raise SystemExit(f"declare: this snapshot declares {info['module']}, not {module_path}")
    return {**{k: info[k] for k in ("declared_in", "declared_at", "code_commit")}, "started_at": time.time()}


def check_runs(records: list[dict], name: str, *, use_git: bool | None = None) -> dict:
    """Every record with a ``started_at`` must carry a declaration committed before it started; returns
    ``{"n", "declarations": {commit: (declared_at, runs)}, "first_start", "last_start"}``. Raises SystemExit
    naming the data file ``name`` and the run on a violation."""
    use_git = git_available() if use_git is None else use_git
    runs = [r for r in records if "started_at" in r]
    decl: dict[str, list] = {}
    for r in runs:
        what = f"{name}: run {r.get('kind')} {r.get('arm')} lr {r.get('lr')} seed {r.get('seed')}"
        if not r.get("declared_in"):
            raise SystemExit(f"{what} has no declaration commit")
        if r["started_at"] <= r["declared_at"]:
            raise SystemExit(f"{what} started at {_iso(r['started_at'])}, before its declaration "
                             f"{r['declared_in'][:10]} was committed ({_iso(r['declared_at'])})")
        decl.setdefault(r["declared_in"], [r["declared_at"], 0])[1] += 1
    if use_git:
        for commit, (at, _) in decl.items():
            try:
                real = int(_git("show", "-s", "--format=%ct", commit))
                _git("merge-base", "--is-ancestor", commit, "HEAD")
            except subprocess.CalledProcessError:
                raise SystemExit(f"{name}: declaration {commit[:10]} is not in this branch's history") from None
            if real != at:
                raise SystemExit(f"{name}: declaration {commit[:10]} was committed at {_iso(real)}, the data say {_iso(at)}")
    starts = [r["started_at"] for r in runs]
    return {"n": len(runs), "declarations": {c: tuple(v) for c, v in decl.items()},
            "first_start": min(starts) if starts else None, "last_start": max(starts) if starts else None,
            "git_checked": use_git}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def describe(check: dict) -> str:
    """One sentence for docs/results.md: which declarations, how many runs, when they ran."""
    if not check["n"]:
        return "no runs yet"
    parts = [f"{n} run{'s' if n != 1 else ''} declared in `{c[:10]}` (committed {_iso(at)})"
             for c, (at, n) in check["declarations"].items()]
    return (f"{'; '.join(parts)}; the runs started from {_iso(check['first_start'])} to {_iso(check['last_start'])}, "
            f"each after its declaration" + (" (commits checked against git)" if check["git_checked"] else
                                             " (git not available here: recorded commit times)"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot", help="freeze the repository at a commit for an experiment's runs")
    s.add_argument("module", help="the experiment's module (its declaration), e.g. experiments/protocol/claim7.py")
    s.add_argument("dest")
    s.add_argument("--commit", default="HEAD")
    args = p.parse_args(argv)
    print(json.dumps(snapshot(args.module, os.path.abspath(args.dest), args.commit), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
