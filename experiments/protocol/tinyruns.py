"""Training runs through the application layer (``gtpo.app``, what ``gtpo train`` calls): :func:`train` with
``gtpo train``'s arguments, and resumable tiny-model runs (:func:`execute`), one at a time."""

from __future__ import annotations

import json
import os
import time

from gtpo.run.metric_names import legacy_record

from .common import ROOT, cpu_seconds, now, read_jsonl, write_json


def train(argv: list[str], hooks=None) -> int:
    """``gtpo train ARGV`` through ``gtpo.app``, as the CLI runs it: ``argv`` is a YAML path first (optional), then
    ``--field value`` overrides; ``--demo`` starts from the offline default run (``hooks``: :class:`gtpo.app.RunHooks`)."""
    from gtpo.app import parse_overrides, resolve_train_spec, run_training

    rest = list(argv)
    config_path = rest.pop(0) if rest and not rest[0].startswith("--") else None
    demo = "--demo" in rest
    rest = [a for a in rest if a != "--demo"]
    spec, source, options = resolve_train_spec(config_path, parse_overrides(rest), demo=demo)
    return run_training(spec, source=source, argv=list(argv), options=options, hooks=hooks)


def run_status(d: str) -> str:
    if os.path.isfile(os.path.join(d, "summary.json")):
        return "done"
    if os.path.isdir(d) and any(n.startswith("checkpoint-") and not n.endswith(".tmp") for n in os.listdir(d)):
        return "partial"
    return "fresh" if not os.path.exists(d) else "restart"


def execute(argv: list[str], d: str, tag: str) -> str:
    """Train (or resume) the run whose output directory is ``d``; returns its status afterwards."""
    from gtpo.errors import TrainingStopped

    st = run_status(d)
    if st == "done":
        return st
    full = list(argv) + ["--output_dir", os.path.relpath(d, ROOT)]
    if st == "partial":
        full += ["--resume_from_checkpoint", "true"]
    elif st == "restart":
        full += ["--overwrite"]
    print(f"[runs] {now()} {tag} ({st})", flush=True)
    t0, c0 = time.time(), cpu_seconds()
    stopped = None
    try:
        code = train(full)
    except TrainingStopped as err:  # non-finite updates in a row: the run ended by itself (a collapse)
        stopped, code = str(err).splitlines()[0], 0
        os.makedirs(d, exist_ok=True)
        write_json(os.path.join(d, "summary.json"), {"stopped": stopped})
    if code != 0:
        raise SystemExit(f"gtpo train exited {code}")
    tpath = os.path.join(d, "timing.json")
    old = json.load(open(tpath)) if os.path.isfile(tpath) else {"wall_s": 0.0, "cpu_s": 0.0}
    write_json(tpath, {"wall_s": old["wall_s"] + time.time() - t0, "cpu_s": old["cpu_s"] + cpu_seconds() - c0,
                       "argv": list(argv)})
    print(f"[runs] {now()} {tag}: done in {time.time() - t0:.0f} s", flush=True)
    return run_status(d)


#: the per-step metrics the claim-7 data files keep of each run
CLAIM7_STEP_KEYS = ("reward/mean", "entropy/mean", "reward/paper_format/mean", "reward/paper_accuracy/mean",
                    "update_norm", "kl/new_old", "frac_zero_std_groups", "gtpo/filtered_frac", "gtpo/conflict_frac",
                    "completion_length/mean", "step")


def kept_steps(d: str, keep=CLAIM7_STEP_KEYS) -> list[dict]:
    """:func:`step_metrics` of the run in ``d``, each step reduced to the keys ``keep`` it has."""
    return [{k: m[k] for k in keep if k in m} for m in step_metrics(d)]


def step_metrics(d: str) -> list[dict]:
    """Per-step numeric metrics under gtpo's earlier names (``reward/mean``, ...: those of the committed data;
    :func:`gtpo.run.metric_names.legacy_record`), the last line of each step winning (a resumed run re-logs steps)."""
    steps: dict[int, dict] = {}
    path = os.path.join(d, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    for m in map(legacy_record, read_jsonl(path)):  # the committed data keeps gtpo's earlier metric names
        if "reward/mean" in m:
            steps[int(m["step"])] = {k: v for k, v in m.items() if isinstance(v, (int, float))}
    return [steps[k] for k in sorted(steps)]
