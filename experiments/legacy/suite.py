"""The first small-scale reproduction suite of the GTPO paper's claims (superseded: kept as history).

Issue 16 found that most of its runs could not decide the claims; the science protocol
(``experiments/protocol/``, docs/results.md) replaced it. Its results stay in docs/results-suite.md.

    python experiments/legacy/suite.py [CLAIM ...] [--seeds 0 1 2] [--steps N] [--smollm2-steps M] [--dry-run]

CLAIM is a number 1-7 or a name (``shared_tokens collapse threshold gamma onlyneg grpo_filter
accuracy``); none means all. For the chosen claims it

1. builds the tiny pretrained model on first use (``experiments/pretrain.py``, cached under
   ``experiments/.cache/``);
2. runs every training run the claims need, each one ``gtpo train <base YAML> <method overrides>
   --seed S --max_steps N --output_dir experiments/runs/...`` executed in this process through
   ``gtpo.app`` as ``gtpo train`` runs it (``experiments.protocol.tinyruns.train``), runs shared by several
   claims once; the SFT baseline as ``gtpo sft`` runs it (``gtpo.app.sft``);
3. evaluates claim 7's final models on the held-out split (``gtpo.evaluation.evaluate``: pass@k,
   maj@k, format rate);
4. averages every run's metrics over the seeds (mean ± std), plots the seed-mean curves of each
   claim with ``gtpo.report.write_report`` and writes ``docs/results-suite.md`` (PNGs under
   ``docs/results/``) with the exact commands.

Resumable: a finished run (``summary.json``, or ``suite_status.json`` of a run that stopped itself)
is skipped; a partial one resumes from its newest checkpoint (``--resume_from_checkpoint true``);
one killed before its first checkpoint starts again (``--overwrite``). Ctrl-C finishes the current
step, checkpoints and stops the suite: run the same command again to continue. Evaluations are
cached in each run directory (``eval.json``).

Runs live in ``experiments/runs/<model>-<steps>steps/<method>[+stress]/seed<S>/``, so runs of a
different length (e.g. smoke runs with ``--steps 2``) never mix with the full suite's.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import resource
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))         # experiments/legacy
EXPERIMENTS = os.path.dirname(HERE)                        # pretrain.py, rewards.py, configs/tiny.yaml
ROOT = os.path.dirname(EXPERIMENTS)
CONFIGS = os.path.join(HERE, "configs")
RUNS = os.path.join(EXPERIMENTS, "runs")
DOCS_MD = os.path.join(ROOT, "docs", "results-suite.md")
DOCS_DIR = os.path.join(ROOT, "docs", "results")
#: Human-written verdicts, one per claim ("1": "...", markdown), read after the full run; the suite
#: copies them into docs/results-suite.md so regenerating the file keeps them.
VERDICTS = os.path.join(HERE, "verdicts.yaml")

DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_STEPS = {"tiny": 150, "smollm2": 8}
BASE_CONFIG = {"tiny": "experiments/configs/tiny.yaml", "smollm2": "experiments/legacy/configs/smollm2.yaml"}
SFT_CONFIG = "experiments/legacy/configs/tiny_sft.yaml"
METHODS_FILE = os.path.join(CONFIGS, "methods.yaml")
#: The stressed setting multiplies the shared learning rate by this (same for every method).
STRESS_LR_FACTOR = 10.0
#: Learning-rate settings beyond the shared rate, by run-id suffix ("gtpo+mid"): the factor, a short
#: label for run names and the title of their groups. "mid" (3x, the rate at which the GRPO pilot's
#: operand probe fell 0.97 -> 0.58 while it still learned the format) was added for every method of
#: claims 1-6 after the full 10x runs collapsed every method.
SETTINGS = {"mid": (3.0, "3x lr", "Moderate (3x learning rate)"),
            "stress": (STRESS_LR_FACTOR, "10x lr", "Stressed (10x learning rate)")}
#: Claim 7's held-out evaluation (the whole 200-problem test split of the tiny task).
EVAL = dict(n=8, k=[1, 4, 8], maj_k=[4, 8], temperature=1.0, max_new_tokens=64, answer_from="tag")
#: CPU seconds used for the plan when no run of that model has been measured yet (2 cores, no load).
COST_PER_STEP = {"tiny": 0.5, "smollm2": 15.0, "sft": 0.2}
COST_PER_RUN = {"tiny": 20.0, "smollm2": 45.0, "sft": 15.0, "eval": 20.0, "pretrain": 600.0}
DAPO_COST_FACTOR = 1.5  # dynamic sampling draws extra groups
#: Runs shorter than this (or fewer than 3 seeds) make docs/results-suite.md a smoke run, "not results".
MIN_REAL_STEPS = {"tiny": 50, "smollm2": 4}

log = logging.getLogger("suite")


# ------------------------------------------------------------------------------------ claims
@dataclass(frozen=True)
class Group:
    """Runs compared together in one table and one set of overlaid figures."""

    name: str
    title: str
    model: str                      # "tiny" | "smollm2"
    runs: tuple[str, ...]           # run ids: a method of methods.yaml, "+stress" for the stressed setting;
    #                                 "sft" (SFT baseline) and "start" (the model before RL) only in tables
    figures: tuple[str, ...]        # PNGs of gtpo report to show
    columns: tuple[str, ...]        # table columns (keys of COLUMNS)
    compare: tuple[str, ...] = ()   # columns compared automatically between runs


@dataclass(frozen=True)
class Claim:
    key: str
    number: int
    title: str
    paper: str
    setup: str
    groups: tuple[Group, ...]


TRAIN_COLS = ("reward_first", "reward_last", "accuracy_last", "format_last", "entropy_start", "entropy_end",
              "entropy_max", "heldout_final")


def _metrics_of(run_dir: str) -> list[dict]:
    """metrics.jsonl of a run under the metric names this suite reads (gtpo's earlier ones; gtpo.run.metric_names)."""
    from gtpo.run.metric_names import legacy_record
    from gtpo.report import load_metrics

    return [legacy_record(m) for m in load_metrics(run_dir)]


def tiny_groups(methods: tuple[str, ...], figures: tuple[str, ...], columns: tuple[str, ...],
                compare: tuple[str, ...], settings: tuple[str, ...] = ("mid", "stress")) -> tuple[Group, ...]:
    """The same comparison of tiny-model ``methods`` in each learning-rate setting ("normal": the
    shared rate, or a key of :data:`SETTINGS`), one group each."""
    return tuple(Group(name, "Shared learning rate" if name == "normal" else SETTINGS[name][2], "tiny",
                       tuple(m if name == "normal" else f"{m}+{name}" for m in methods), figures, columns, compare)
                 for name in settings)


PROBE_COLS = ("probe_open_tag", "probe_copy_operands", "probe_answer_tags", "probe_close_eos", "probe_min",
              "conflict_mean", "format_last")

CLAIMS: tuple[Claim, ...] = (
    Claim("shared_tokens", 1, "Shared-token penalization",
          "GRPO gives tokens shared by positive and negative completions of a group (format tags, common "
          "prefixes and endings) opposite signals, so negative updates can lower tokens a correct answer "
          "needs; GTPO's conflict masks skip the negative update on them and amplify the positive one.",
          "Probes (`probes:` in experiments/configs/tiny.yaml): the mean probability, under the policy, of "
          "the opening `<reasoning>` tag after the prompt (`open_tag`), of the operands every completion "
          "copies first (`copy_operands`), of the tags between reasoning and answer (`answer_tags`) and of "
          "`</answer>` + EOS (`close_eos`), each averaged over two held-out prompts, logged every step.",
          tiny_groups(("gtpo", "grpo"), ("probes.png", "conflict.png"), PROBE_COLS, ("probe_min", "format_last"),
                      ("normal", "mid", "stress"))),
    Claim("collapse", 2, "Entropy and collapse",
          "Negatively rewarded completions push probability toward unlikely tokens: under GRPO entropy "
          "rises while accuracy and formatting fall (policy collapse); GTPO's masks and entropy filter "
          "prevent it.",
          "Entropy (mean token entropy of the sampled completions), reward, training accuracy and format "
          "rate, and greedy held-out accuracy, at the shared learning rate, at 3x and in the stressed setting "
          "(10x the learning rate) where GRPO is expected to drift.",
          tiny_groups(("gtpo", "grpo"), ("entropy.png", "reward.png"), TRAIN_COLS,
                      ("entropy_end", "reward_last", "heldout_final"), ("normal", "mid", "stress"))),
    Claim("threshold", 3, "Entropy filter threshold",
          "The threshold matters: tau = 0.7 keeps training stable and formatted, tau = 2.0 lets entropy "
          "drift and formatting degrade (1.05 in between).",
          "GTPO with tau = 0.7 (the released code), 1.05 and 2.0, at 3x and 10x the learning rate (at the "
          "shared rate the tiny model's entropy does not drift within the budget, so no threshold would "
          "be tested).",
          tiny_groups(("gtpo", "gtpo_tau1.05", "gtpo_tau2.0"), ("entropy.png", "conflict.png", "reward.png"),
                      TRAIN_COLS + ("filtered_mean",), ("entropy_end", "format_last", "reward_last"))),
    Claim("gamma", 4, "Entropy shaping gamma without the filter",
          "gamma = 0.1 without the filter lets entropy climb past ln 2 and collapses accuracy; with the "
          "filter it is stable.",
          "GTPO with gamma = 0.1 and the filter (tau = 0.7) vs gamma = 0.1 without the filter, at 3x and 10x "
          "the learning rate.",
          tiny_groups(("gtpo", "gtpo_nofilter"), ("entropy.png", "reward.png"), TRAIN_COLS + ("filtered_mean",),
                      ("entropy_end", "reward_last", "heldout_final"))),
    Claim("onlyneg", 5, "OnlyNeg vs filtering all completions",
          "Filtering only negative completions (OnlyNeg) over-prunes and does worse than filtering all.",
          "GTPO with the filter on all completions vs on negative completions only, at 3x and 10x the "
          "learning rate.",
          tiny_groups(("gtpo", "gtpo_onlyneg"), ("entropy.png", "conflict.png", "reward.png"),
                      TRAIN_COLS + ("filtered_mean",), ("reward_last", "heldout_final", "entropy_end"))),
    Claim("grpo_filter", 6, "GRPO + filter + gamma vs GTPO",
          "GRPO with GTPO's entropy filter and gamma is stabilised too, but ends below GTPO (the conflict "
          "masks add accuracy).",
          "GRPO; GRPO + filter (tau = 0.7) + gamma = 0.1 (the GTPO loss with all conflict weights 1, mean "
          "over completions, group-std advantages); GTPO. At 3x and 10x the learning rate.",
          tiny_groups(("grpo", "grpo_filter_gamma", "gtpo"), ("entropy.png", "reward.png"), TRAIN_COLS + ("filtered_mean",),
                      ("reward_last", "heldout_final", "entropy_end"))),
    Claim("accuracy", 7, "Accuracy vs steps at equal budget",
          "GTPO reaches higher accuracy than GRPO (and the other baselines) at the same budget; the "
          "paper's ln 2 entropy rule rests on the policy's entropy.",
          "Tiny model, shared learning rate, same steps and completions per step for every method; the SFT "
          "baseline trains on the gold completions of the same training prompts for the same number of "
          "steps with the same batch size (16 sequences) and learning rate. Held-out: the 200-problem test "
          "split, 8 samples per problem at temperature 1 (pass@1, pass@8, maj@8, format rate; answers read "
          "from the `<answer>` tag) with `gtpo.evaluation.evaluate`, plus the greedy accuracy curve during "
          "training (100 problems; paper reward 20 = correct and formatted). SmolLM2-135M-Instruct + LoRA: "
          "what each entropy rule does when the policy starts far above ln 2.",
          (Group("tiny", "Tiny model: GTPO, GRPO, Dr.GRPO, DAPO, SFT", "tiny",
                 ("start", "gtpo", "grpo", "dr_grpo", "dapo", "sft"),
                 ("eval.png", "reward.png", "entropy.png"),
                 ("pass@1", "pass@8", "maj@8", "eval_format", "heldout_final", "reward_last", "entropy_end"),
                 ("pass@1", "maj@8", "heldout_final")),
           Group("smollm2", "SmolLM2-135M-Instruct: entropy rules", "smollm2",
                 ("start", "gtpo", "gtpo_initial", "gtpo_tau1.05", "gtpo_tau2.0"),
                 ("entropy.png", "conflict.png", "reward.png"),
                 ("filtered_mean", "entropy_start", "entropy_end", "reward_first", "reward_last", "heldout_final"),
                 ("filtered_mean", "reward_last")))),
)
CLAIM_BY_KEY = {c.key: c for c in CLAIMS}

RUN_LABELS = {
    "gtpo": "GTPO (tau 0.7)", "grpo": "GRPO", "dr_grpo": "Dr.GRPO", "dapo": "DAPO", "sft": "SFT", "start": "before RL",
    "gtpo_tau1.05": "GTPO tau 1.05", "gtpo_tau2.0": "GTPO tau 2.0", "gtpo_nofilter": "GTPO no filter (gamma 0.1)",
    "gtpo_onlyneg": "GTPO OnlyNeg", "grpo_filter_gamma": "GRPO + filter + gamma",
    "gtpo_initial": "GTPO <H>_ini rule (ln 2)",
}


def run_label(run_id: str, model: str = "tiny") -> str:
    method, _, setting = run_id.partition("+")
    label = RUN_LABELS.get(method, method)
    if model == "smollm2" and method == "gtpo":
        label = "GTPO fixed tau 0.7"
    return label + (f" [{SETTINGS[setting][1]}]" if setting in SETTINGS else f" [{setting}]" if setting else "")


# ------------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class Run:
    model: str
    run_id: str
    seed: int
    steps: int

    @property
    def method(self) -> str:
        return self.run_id.partition("+")[0]

    @property
    def lr_factor(self) -> float:
        """The learning-rate multiplier of the run's setting (1 for the shared rate)."""
        setting = self.run_id.partition("+")[2]
        if setting and setting not in SETTINGS:
            raise ValueError(f"run {self.run_id!r}: unknown setting {setting!r}; choose from {sorted(SETTINGS)}")
        return SETTINGS[setting][0] if setting else 1.0

    @property
    def kind(self) -> str:
        return {"sft": "sft", "start": "start"}.get(self.method, "train")

    @property
    def dir(self) -> str:
        return os.path.join(RUNS, f"{self.model}-{self.steps}steps", self.run_id, f"seed{self.seed}")

    @property
    def rel_dir(self) -> str:
        return os.path.relpath(self.dir, ROOT)


def load_yaml(path: str) -> dict:
    import yaml

    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def _render(value) -> str:
    """A value as a ``gtpo train`` command-line token (read back as YAML by the CLI)."""
    import yaml

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return repr(value) if isinstance(value, float) else str(value)
    return yaml.safe_dump(value, default_flow_style=True).strip()


def _every(steps: int, parts: int = 6) -> int:
    return max(1, steps // parts)


def train_argv(run: Run) -> list[str]:
    """The ``gtpo train`` arguments of a run (after ``gtpo train``)."""
    methods = load_yaml(METHODS_FILE)
    if run.method not in methods:
        raise ValueError(f"run {run.run_id!r}: method {run.method!r} is not in {METHODS_FILE}")
    argv = [BASE_CONFIG[run.model]]
    overrides = dict(methods[run.method])
    preset = overrides.pop("preset", None)
    if preset:
        argv += ["--preset", preset]
    for key, value in overrides.items():
        argv += [f"--{key}", _render(value)]
    if run.lr_factor != 1.0:
        lr = float(load_yaml(os.path.join(ROOT, BASE_CONFIG[run.model]))["learning_rate"]) * run.lr_factor
        argv += ["--learning_rate", _render(lr)]
    argv += ["--seed", str(run.seed), "--max_steps", str(run.steps), "--eval_steps",
             str(run.steps if run.model == "smollm2" else _every(run.steps)),
             "--save_steps", str(_every(run.steps, 4)), "--output_dir", run.rel_dir]
    return argv


def sft_argv(run: Run) -> list[str]:
    """``gtpo sft`` arguments of the SFT baseline: the RL runs' learning rate, and as many sequences per
    step as an RL step has completions (prompts_per_step x group_size), for as many steps."""
    rl = load_yaml(os.path.join(ROOT, BASE_CONFIG["tiny"]))
    return [SFT_CONFIG, "--seed", str(run.seed), "--max_steps", str(run.steps),
            "--learning_rate", _render(float(rl["learning_rate"])),
            "--batch_size", str(int(rl["group_size"]) * int(rl["prompts_per_step"])),
            "--logging_steps", str(_every(run.steps, 20)), "--output_dir", run.rel_dir]


def command(run: Run) -> str:
    if run.kind == "train":
        return "gtpo train " + shlex.join(train_argv(run))
    if run.kind == "sft":
        return "gtpo sft " + shlex.join(sft_argv(run))
    return "(no training: the pretrained tiny model)"


def status(run: Run) -> tuple[str, int]:
    """("done" | "stopped" | "partial" | "todo" | "stale", last step logged). "stale": finished with a
    command other than the current one (a config or the suite changed): the suite refuses to mix it in."""
    d = run.dir
    if run.kind == "start":
        return ("done" if os.path.isfile(os.path.join(d, "eval.json")) else "todo"), 0
    st = _read_json(os.path.join(d, "suite_status.json"))
    if st and st.get("command") not in (None, command(run)):
        return "stale", 0
    if os.path.isfile(os.path.join(d, "summary.json")):
        return "done", run.steps
    if st and st.get("status") == "stopped":
        return "stopped", int(st.get("last_step", 0))
    if run.kind == "train":
        from gtpo.run.checkpoint import latest_checkpoint

        ck = latest_checkpoint(d) if os.path.isdir(d) else None
        if ck:
            return "partial", int(os.path.basename(ck).split("-")[-1])
    return "todo", 0


def _read_json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None


def _write_json(path: str, data) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, default=float)
    os.replace(tmp, path)


class Interrupted(Exception):
    pass


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sft(argv: list[str]) -> int:
    """``gtpo sft ARGV`` through ``gtpo.app.sft``, as the CLI runs it: a YAML path first (optional), then ``--field
    value`` overrides; no arguments or ``--demo`` start from the offline default run."""
    from gtpo.app import parse_overrides
    from gtpo.app.sft import resolve_sft_spec, run_sft_job

    rest = [a for a in argv if a != "--demo"]
    config_path = rest.pop(0) if rest and not rest[0].startswith("--") else None
    spec, source, options = resolve_sft_spec(config_path, parse_overrides(rest), demo=not argv or "--demo" in argv)
    run_sft_job(spec, source=source, options=options)
    return 0


def execute(run: Run) -> None:
    """Train (or resume) one run through gtpo's application layer, in this process."""
    from experiments.protocol.tinyruns import train
    from gtpo.errors import TrainingStopped

    state, step = status(run)
    if state in ("done", "stopped"):
        return
    if state == "stale":
        raise SystemExit(f"{run.rel_dir} was made by another command than\n  {command(run)}\n(see its "
                         "suite_status.json); delete that directory to rerun it, or restore the configs")
    os.makedirs(run.dir, exist_ok=True)
    if run.kind == "train":
        argv = train_argv(run)
        if state == "partial":
            argv += ["--resume_from_checkpoint", "true"]
        elif any(os.path.exists(os.path.join(run.dir, f)) for f in ("metrics.jsonl", "run_config.json")):
            argv += ["--overwrite"]
        print(f"[suite] {'resuming' if state == 'partial' else 'running'} {run.rel_dir}"
              f"{f' from step {step}' if state == 'partial' else ''}\n        gtpo train {shlex.join(argv)}",
              flush=True)
    else:
        argv = sft_argv(run)
        print(f"[suite] running {run.rel_dir}\n        gtpo sft {shlex.join(argv)}", flush=True)
    t0, c0 = time.time(), _cpu_seconds()
    stopped = None
    try:
        rc = train(argv) if run.kind == "train" else _sft(argv)
    except TrainingStopped as err:  # the run stopped itself (non-finite steps): that is its result
        rc, stopped = 1, str(err)
    earlier = _read_json(os.path.join(run.dir, "suite_status.json")) or {}
    if earlier.get("status") != "partial" or state != "partial":
        earlier = {}  # times of an interrupted attempt count only when this one resumed it
    record = {"command": command(run), "wall_s": time.time() - t0 + earlier.get("wall_s", 0.0),
              "cpu_s": _cpu_seconds() - c0 + earlier.get("cpu_s", 0.0),
              "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    if stopped is not None:
        steps = [m["step"] for m in _metrics_of(run.dir) if "reward/mean" in m]
        record.update(status="stopped", message=stopped, last_step=max(steps, default=0))
        _write_json(os.path.join(run.dir, "suite_status.json"), record)
        print(f"[suite] {run.rel_dir} stopped itself: {stopped.splitlines()[0]}", flush=True)
        return
    interrupted = rc == 130 or (rc == 0 and run.kind == "train"
                                and not os.path.isfile(os.path.join(run.dir, "summary.json")))
    if interrupted:  # Ctrl-C / SIGTERM: the trainer checkpointed (or the run restarts from step 0)
        if run.kind == "train":
            _write_json(os.path.join(run.dir, "suite_status.json"), {**record, "status": "partial"})
        raise Interrupted(run.rel_dir)
    if rc != 0:
        raise RuntimeError(f"{command(run)} exited with {rc} (its error is printed above)")
    if run.kind == "sft":
        _write_json(os.path.join(run.dir, "summary.json"), {"steps": run.steps})
    record["status"] = "done"
    _write_json(os.path.join(run.dir, "suite_status.json"), record)
    from gtpo.run.checkpoint import list_checkpoints, remove_checkpoint

    for _step, path in list_checkpoints(run.dir):  # the final model is kept; checkpoints only cost disk
        remove_checkpoint(path)


def evaluate_run(run: Run, tiny_dir: str, size: int | None = None) -> dict:
    """Claim 7's held-out evaluation, cached in the run's eval.json.

    Tiny model (a finished run, or ``start``: the pretrained model): ``EVAL`` on the test split
    (``size``: that many problems after a seeded shuffle; None: all 200). SmolLM2 ``start`` (the
    model before RL): the same greedy accuracy the SmolLM2 runs log as ``eval/accuracy_greedy`` (the
    ``eval_dataset`` of smollm2.yaml, last-number answers).
    """
    path = os.path.join(run.dir, "eval.json")
    cached = _read_json(path)
    if run.model == "tiny":
        kwargs = dict(dataset=os.path.join(os.path.relpath(tiny_dir, ROOT), "data", "test.jsonl"), seed=run.seed,
                      batch_size=256, size=size, **EVAL)
        model = os.path.join(tiny_dir, "model") if run.kind == "start" else run.dir
    else:
        cfg = load_yaml(os.path.join(ROOT, BASE_CONFIG["smollm2"]))
        ds = cfg["eval_dataset"]
        kwargs = dict(dataset=ds["name"], split=ds.get("split", "test"), size=ds.get("size"), seed=ds.get("seed", 0),
                      template=ds.get("template", "paper"), task_kwargs=ds.get("kwargs"), n=1, k=[1],
                      temperature=0.0, max_new_tokens=cfg["max_completion_length"], answer_from="last_number",
                      batch_size=64)
        model = cfg["model"]
    if (cached and "metrics" in cached and cached.get("settings", {}).get("size") == kwargs["size"]
            and ("greedy" in cached or not (run.model == "tiny" and run.kind == "start"))):
        return cached["metrics"]
    from gtpo.evaluation import evaluate

    os.makedirs(run.dir, exist_ok=True)
    print(f"[suite] evaluating {run.rel_dir} (n={kwargs['n']}, T={kwargs['temperature']})", flush=True)
    t0, c0 = time.time(), _cpu_seconds()
    res = evaluate(model, **kwargs)
    if run.model == "tiny" and run.kind == "start":  # the greedy curve's step 0 (what the runs log later)
        res["greedy"] = _greedy_tiny(model)
    res["suite"] = {"wall_s": time.time() - t0, "cpu_s": _cpu_seconds() - c0}
    _write_json(path, res)
    return res["metrics"]


def _greedy_tiny(model_dir: str) -> dict:
    """``eval/*`` greedy metrics of a tiny model exactly as the RL runs log them (tiny.yaml's
    ``eval_dataset`` and ``eval_reward``, ``gtpo.evaluation.evaluate_during_training``)."""
    from gtpo.app import load_dataset_spec
    from gtpo.evaluation import evaluate_during_training
    from gtpo.evaluation.options import ScoringOptions
    from gtpo.run.models import load_model_and_tokenizer
    from gtpo.rewards import resolve_reward

    cfg = load_yaml(os.path.join(ROOT, BASE_CONFIG["tiny"]))
    model, tok = load_model_and_tokenizer(model_dir)
    tok.padding_side = "left"
    data = load_dataset_spec(cfg["eval_dataset"], default_split="test")
    return evaluate_during_training(model, tok, data, max_new_tokens=cfg.get("eval_max_new_tokens") or
                                    cfg["max_completion_length"], temperature=0.0,
                                    scoring=ScoringOptions(reward_fn=resolve_reward(cfg["eval_reward"])))


# ------------------------------------------------------------------------------------ planning
def plan(claims: list[Claim], seeds: list[int], steps: dict[str, int]) -> list[tuple[Run, list[int]]]:
    """Unique runs of the chosen claims, each with the claim numbers that use it, in run order."""
    out: dict[Run, list[int]] = {}
    for claim in claims:
        for group in claim.groups:
            for run_id in group.runs:
                # greedy decoding does not depend on the seed: SmolLM2's starting point is evaluated once
                for seed in (seeds[:1] if (group.model, run_id) == ("smollm2", "start") else seeds):
                    run = Run(group.model, run_id, seed, steps[group.model])
                    out.setdefault(run, [])
                    if claim.number not in out[run]:
                        out[run].append(claim.number)
    order = {"start": 0, "train": 1, "sft": 2}
    # SmolLM2 runs seed by seed (every rule's seed 0 first), so a suite stopped early still compares them all
    return sorted(out.items(), key=lambda kv: (kv[0].model != "tiny", order[kv[0].kind],
                                               kv[0].seed if kv[0].model == "smollm2" else 0,
                                               kv[0].run_id, kv[0].seed))


def _measured_cost(model: str) -> float | None:
    """Median measured CPU seconds per step of finished training runs of ``model`` (>= 10 steps)."""
    rates = []
    roots = [d for d in (os.listdir(RUNS) if os.path.isdir(RUNS) else []) if d.startswith(model + "-")]
    for root in roots:
        steps = int(root[len(model) + 1:-len("steps")])
        if steps < 10:
            continue
        for run_id in os.listdir(os.path.join(RUNS, root)):
            if run_id.startswith(("_", "sft", "start")):
                continue
            for seed in os.listdir(os.path.join(RUNS, root, run_id)):
                st = _read_json(os.path.join(RUNS, root, run_id, seed, "suite_status.json")) or {}
                if st.get("status") == "done" and not run_id.startswith("dapo"):
                    rates.append(max(0.0, st["cpu_s"] - COST_PER_RUN[model]) / steps)
    return statistics.median(rates) if rates else None


def estimate(run: Run, claims: set[int]) -> float:
    if run.kind == "start":
        return COST_PER_RUN["eval"] * (2.0 if run.model == "smollm2" else 1.0)
    if run.kind == "sft":
        return COST_PER_RUN["sft"] + COST_PER_STEP["sft"] * run.steps + COST_PER_RUN["eval"]
    per_step = _measured_cost(run.model) or COST_PER_STEP[run.model]
    cost = COST_PER_RUN[run.model] + per_step * run.steps * (DAPO_COST_FACTOR if run.method == "dapo" else 1.0)
    if 7 in claims and run.model == "tiny":
        cost += COST_PER_RUN["eval"]
    return cost


def print_plan(items, tiny_ready: bool) -> float:
    total = 0.0 if tiny_ready else COST_PER_RUN["pretrain"]
    rows = []
    for run, claims in items:
        state, step = status(run)
        est = estimate(run, set(claims))
        remaining = 0.0 if state in ("done", "stopped") else est * (1 - step / max(run.steps, 1))
        total += remaining
        rows.append((run.rel_dir, ",".join(map(str, claims)), f"{state}{f'@{step}' if state == 'partial' else ''}",
                     f"{est:7.0f}", f"{remaining:7.0f}"))
    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"{'run':<{width}}  {'claims':<12}  status      est.s  left.s")
    for r in rows:
        print(f"{r[0]:<{width}}  {r[1]:<12}  {r[2]:<10} {r[3]} {r[4]}")
    src = {m: ("measured" if _measured_cost(m) else "default") for m in ("tiny", "smollm2")}
    build = "cached" if tiny_ready else f"to build (~{COST_PER_RUN['pretrain']:.0f} s)"
    print(f"\npretrained tiny model: {build}")
    print(f"{len(rows)} runs; estimated CPU time left: {total / 60:.0f} min ({total / 3600:.2f} h) on 2 cores "
          f"(per-step costs: tiny {src['tiny']}, smollm2 {src['smollm2']})")
    return total


# ------------------------------------------------------------------------------------ metrics
def _mean(values):
    return sum(values) / len(values) if values else None


def _last_frac(values, frac=0.1):
    if not values:
        return None
    k = max(1, math.ceil(frac * len(values)))
    return _mean(values[-k:])


def run_stats(run: Run) -> dict:
    """Scalar statistics of one run (None where it lacks the metric)."""
    out: dict = {}
    d = run.dir
    ev = _read_json(os.path.join(d, "eval.json"))
    if ev and "metrics" in ev:
        for k in ("pass@1", "pass@8", "maj@8"):
            out[k] = ev["metrics"].get(k)
        out["eval_format"] = ev["metrics"].get("format_rate")
    if run.kind == "start" and ev and "metrics" in ev:
        out["heldout_final"] = (ev["metrics"].get("pass@1") if run.model == "smollm2"
                                else (ev.get("greedy") or {}).get("eval/accuracy_greedy"))
    if run.kind != "train" or not os.path.isfile(os.path.join(d, "metrics.jsonl")):
        return out
    recs = _metrics_of(d)
    by_step: dict[int, dict] = {}
    for r in recs:  # a resumed run re-logs steps: the last line wins
        by_step.setdefault(int(r.get("step", 0)), {}).update(r)
    steps = sorted(s for s, r in by_step.items() if "reward/mean" in r)

    def series(key):
        return [by_step[s][key] for s in steps if isinstance(by_step[s].get(key), (int, float))]

    reward = series("reward/mean")
    out["steps_done"] = len(steps)
    out["reward_first"] = reward[0] if reward else None
    out["reward_last"] = _last_frac(reward)
    out["accuracy_last"] = _last_frac(series("reward/paper_accuracy/mean"))
    out["format_last"] = _last_frac(series("reward/paper_format/mean"))
    ent = series("entropy/mean")
    out["entropy_start"] = ent[0] if ent else None
    out["entropy_end"] = _last_frac(ent)
    out["entropy_max"] = max(ent) if ent else None
    out["filtered_mean"] = _mean(series("gtpo/filtered_frac"))
    out["conflict_mean"] = _mean(series("gtpo/conflict_frac"))
    evals = [by_step[s]["eval/accuracy_greedy"] for s in sorted(by_step) if "eval/accuracy_greedy" in by_step[s]]
    out["heldout_final"] = evals[-1] if evals else None
    probe_keys = sorted({k for r in by_step.values() for k in r if k.startswith("probe/")})
    kinds: dict[str, list[str]] = {}
    for k in probe_keys:
        kinds.setdefault(k.split("_", 1)[1] if "_" in k else k, []).append(k)
    mins = []
    for kind, keys in kinds.items():
        start = _mean([by_step[0][k] for k in keys if k in by_step.get(0, {})])
        end = _mean([v for v in (_last_frac(series(k)) for k in keys) if v is not None])
        out[f"probe_{kind}"] = (start, end)
        mins.append(min(v for k in keys for v in series(k) + [by_step.get(0, {}).get(k, 1.0)]))
    out["probe_min"] = min(mins) if mins else None
    st = _read_json(os.path.join(d, "suite_status.json")) or {}
    out["stopped"] = st.get("status") == "stopped"
    return out


COLUMNS = {  # key: (header, kind) -- kind: "reward" (raw), "pct" (fraction shown in %), "num", "probe"
    "reward_first": ("reward, step 1", "num"),
    "reward_last": ("reward, last 10 %", "num"),
    "accuracy_last": ("train accuracy, last 10 %", "pct"),
    "format_last": ("train format rate, last 10 %", "pct"),
    "entropy_start": ("entropy, step 1", "num"),
    "entropy_end": ("entropy, last 10 %", "num"),
    "entropy_max": ("entropy, max", "num"),
    "heldout_final": ("held-out greedy acc., final", "pct"),
    "filtered_mean": ("filtered completions, mean", "pct"),
    "conflict_mean": ("conflict tokens, mean", "pct"),
    "probe_open_tag": ("p(open tag) start → end", "probe"),
    "probe_copy_operands": ("p(copied operands) start → end", "probe"),
    "probe_answer_tags": ("p(answer tags) start → end", "probe"),
    "probe_close_eos": ("p(close + EOS) start → end", "probe"),
    "probe_min": ("lowest probe value", "num"),
    "pass@1": ("pass@1", "pct"),
    "pass@8": ("pass@8", "pct"),
    "maj@8": ("maj@8", "pct"),
    "eval_format": ("format rate (eval)", "pct"),
}


def _agg(values):
    vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if not vals:
        return None, None, 0
    return _mean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


def _fmt_ms(mean, std, kind) -> str:
    if mean is None:
        return "—"
    scale, digits = (100.0, 1) if kind == "pct" else (1.0, 3)
    text = f"{mean * scale:.{digits}f}"
    return text + (f" ± {std * scale:.{digits}f}" if std is not None else "")


def cell(stats: list[dict], key: str) -> str:
    kind = COLUMNS[key][1]
    if kind == "probe":
        pairs = [s.get(key) for s in stats if s.get(key)]
        if not pairs:
            return "—"
        m0, s0, _ = _agg([p[0] for p in pairs if p[0] is not None])
        m1, s1, _ = _agg([p[1] for p in pairs if p[1] is not None])
        return f"{_fmt_ms(m0, s0, 'num')} → {_fmt_ms(m1, s1, 'num')}"
    mean, std, _ = _agg([s.get(key) for s in stats])
    return _fmt_ms(mean, std, kind)


def compare_text(group: Group, stats_by_run: dict[str, list[dict]], key: str) -> str:
    """One line comparing ``key`` across the runs of a group: a difference counts as clear only
    when it exceeds the sum of the two seed standard deviations and every side has >= 3 seeds."""
    kind = COLUMNS[key][1]
    rows = []
    for run_id in group.runs:
        mean, std, n = _agg([s.get(key) for s in stats_by_run.get(run_id, [])])
        if mean is not None:
            rows.append((run_id, mean, std or 0.0, n))
    if len(rows) < 2:
        return ""
    best = max(rows, key=lambda r: r[1])
    worst = min(rows, key=lambda r: r[1])
    clear = best[1] - worst[1] > best[2] + worst[2] and min(r[3] for r in rows) >= 3
    parts = ", ".join(f"{run_label(r[0], group.model)} {_fmt_ms(r[1], r[2] or None, kind)}" for r in rows)
    if best[1] == worst[1]:
        verdict = "all equal"
    else:
        verdict = (f"highest: {run_label(best[0], group.model)}, lowest: {run_label(worst[0], group.model)} — "
                   + ("the gap exceeds the sum of their seed standard deviations" if clear else
                      "not separated by more than the seed spread (or fewer than 3 seeds)"))
    return f"- {COLUMNS[key][0]}: {parts}; {verdict}."


def mean_run_dir(model: str, steps: int, run_id: str, seed_runs: list[Run], step0: float | None = None) -> str | None:
    """A run directory whose metrics.jsonl is the per-step mean over seeds (for gtpo report);
    ``step0``: the greedy held-out accuracy of the starting model, drawn at step 0 (every run starts
    from that model and evaluates the same problems greedily)."""
    series: dict[int, dict[str, list[float]]] = {}
    used = 0
    for run in seed_runs:
        if not os.path.isfile(os.path.join(run.dir, "metrics.jsonl")):
            continue
        used += 1
        by_step: dict[int, dict] = {}
        for r in _metrics_of(run.dir):
            by_step.setdefault(int(r.get("step", 0)), {}).update(r)
        for step, rec in by_step.items():
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    series.setdefault(step, {}).setdefault(k, []).append(float(v))
    if not used:
        return None
    if step0 is not None:
        series.setdefault(0, {})["eval/accuracy_greedy"] = [step0]
    out = os.path.join(RUNS, f"{model}-{steps}steps", "_seed_mean", run_id)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "metrics.jsonl.tmp"), "w") as fh:
        for step in sorted(series):
            fh.write(json.dumps({"step": step, **{k: _mean(v) for k, v in series[step].items()}}) + "\n")
    os.replace(os.path.join(out, "metrics.jsonl.tmp"), os.path.join(out, "metrics.jsonl"))
    cfg = _read_json(os.path.join(seed_runs[0].dir, "run_config.json"))
    if cfg:
        _write_json(os.path.join(out, "run_config.json"), cfg)
    return out


# ------------------------------------------------------------------------------------ the document
def measured_cpu(items) -> float:
    """Sum of the CPU seconds measured for these runs and their evaluations."""
    total = 0.0
    for run, _claims in items:
        st = _read_json(os.path.join(run.dir, "suite_status.json")) or {}
        ev = _read_json(os.path.join(run.dir, "eval.json")) or {}
        total += float(st.get("cpu_s", 0.0)) + float((ev.get("suite") or {}).get("cpu_s", 0.0))
    return total


def sampler_note(items) -> str:
    """How the training runs sampled their completions, from each run's ``run_config.json``:
    ``decode_loop`` true (gtpo's decoding loop), false, or absent (runs made before the field
    existed, which sampled with transformers ``generate``)."""
    kinds = set()
    for run, _claims in items:
        if run.kind != "train":
            continue
        cfg = _read_json(os.path.join(run.dir, "run_config.json"))
        if cfg is not None:
            kinds.add({True: "loop", False: "generate"}.get(cfg.get("decode_loop"), "before"))
    names = {"loop": "gtpo's decoding loop (`GTPOConfig.decode_loop`, the default)",
             "generate": "transformers `generate` (`decode_loop: false`)",
             "before": "transformers `generate` (the runs predate `GTPOConfig.decode_loop`, commit 7aee700; "
                       "rerun now, they sample with the decoding loop: the same distribution, another random "
                       "stream, so per-seed numbers would change)"}
    if not kinds:
        return "no finished training run"
    return "; ".join(names[k] for k in sorted(kinds)) + (" (mixed across runs)" if len(kinds) > 1 else "")


def _rel_doc(path: str) -> str:
    return os.path.relpath(path, os.path.dirname(DOCS_MD))


def write_results(claims: list[Claim], seeds: list[int], steps: dict[str, int], items, tiny_dir: str,
                  argv: list[str], cpu_total: float, eval_problems: int | None = None) -> str:
    from gtpo.report import write_report

    start = _read_json(os.path.join(tiny_dir, "start.json")) or {}
    smoke = (steps["tiny"] < MIN_REAL_STEPS["tiny"] or steps["smollm2"] < MIN_REAL_STEPS["smollm2"]
             or len(seeds) < 3)
    tiny_cfg = load_yaml(os.path.join(ROOT, BASE_CONFIG["tiny"]))
    lr = float(tiny_cfg["learning_rate"])
    verdicts = (load_yaml(VERDICTS) or {}) if os.path.isfile(VERDICTS) else {}
    suite_cmd = "python experiments/legacy/suite.py" + ("" if not argv else " " + shlex.join(argv))
    lines = ["# Small-scale reproduction of the GTPO paper's claims", ""]
    n_eval = eval_problems or 200
    if smoke:
        lines += ["> **SMOKE RUN — NOT RESULTS.** This file was generated from "
                  f"{steps['tiny']}-step tiny-model runs and {steps['smollm2']}-step SmolLM2 runs with "
                  f"{len(seeds)} seed(s), only to check that every part of the suite works. Nothing below says "
                  "anything about GTPO or the baselines. The real results come from the full suite "
                  "(`python experiments/legacy/suite.py`, see *Commands*).", ""]
    lines += [
        "Generated by `experiments/legacy/suite.py` (do not edit by hand: rerun the suite). How the experiments are "
        "built and why: [experiments/legacy/README.md](../experiments/legacy/README.md). Method and paper: "
        "[docs/method.md](method.md), arXiv 2508.03772.", "",
        "## Setup", "",
        f"- **Tiny model** (claims 1-7): a {start.get('parameters', 0) / 1e6:.2f}M-parameter Llama pretrained by "
        "`experiments/pretrain.py` on a synthetic task in the paper's chat format (system prompt of the paper, "
        "`What is 59 + 7 - 1?`, completion `<reasoning>\\n59 + 7 = 66\\n66 - 1 = 65\\n</reasoning>\\n"
        f"<answer>\\n65\\n</answer>`), with noisy targets ({start.get('p_slip', 0):.0%} arithmetic slips, "
        f"{start.get('p_broken', 0):.0%} broken formats) and a short pretraining "
        f"({' + '.join(str(p.get('max_steps')) for p in start.get('pretrain', []))} steps, "
        f"{start.get('pretrain_seconds', 0):.0f} s wall). "
        "Reward: the paper's (`paper`, 0-20: format 10 + correct 10).",
        "- **Its starting point** (measured after pretraining, 64 training prompts x 8 samples at temperature 1): "
        f"paper reward {start.get('paper_reward_mean', float('nan')):.2f} / 20 "
        f"({start.get('paper_reward_frac_of_max', float('nan')):.0%} of the maximum), format rate "
        f"{start.get('format_rate', float('nan')):.0%}, accuracy {start.get('accuracy', float('nan')):.0%}, mean token "
        f"entropy {start.get('entropy_token_mean', float('nan')):.3f} nats "
        f"({start.get('frac_completions_entropy_above_0.7', float('nan')):.0%} of completions above 0.7), groups "
        f"with zero reward variance {start.get('frac_groups_zero_reward_variance', float('nan')):.0%}; greedy "
        f"held-out accuracy {start.get('heldout_greedy_paper_accuracy', float('nan')):.0%}.",
        f"- **RL runs**: {tiny_cfg['group_size']} completions per prompt, {tiny_cfg['prompts_per_step']} prompts per "
        f"step, {steps['tiny']} steps, up to {tiny_cfg['max_completion_length']} new tokens, temperature "
        f"{tiny_cfg['temperature']}, full fine-tuning, AdamW, {tiny_cfg['lr_scheduler_type']} learning rate, grad "
        f"clipping {tiny_cfg['max_grad_norm']}; seeds {', '.join(map(str, seeds))} (the RL seed: sampling and data "
        "order; the pretrained model is the same).",
        f"- **Hyperparameter budget**: every method uses one shared learning rate, {lr:g}, and in the stressed "
        f"setting {lr * STRESS_LR_FACTOR:g} (x{STRESS_LR_FACTOR:g}), chosen before any RL run and then checked "
        "once with a 30-step GRPO-only pilot (1e-4, 3e-4, 1e-3), which kept them: GRPO learns at the shared rate "
        "and drifts at the stressed one. The full 10x runs then collapsed every method, so a moderate setting, "
        f"{lr * SETTINGS['mid'][0]:g} (x{SETTINGS['mid'][0]:g}, the pilot's middle rate), was added for every method "
        "of claims 1-6 alike. No method was tuned (zero tries for every method, GRPO's pilot aside). "
        "Each method keeps its own published defaults (`experiments/legacy/configs/methods.yaml`, the presets of "
        "`gtpo.GTPOConfig`).",
        f"- **SmolLM2-135M-Instruct** (claim 7): LoRA r=16, reasoning-gym `basic_arithmetic`, last-number reward, "
        f"{steps['smollm2']} steps of 1 prompt x 8 completions (`experiments/legacy/configs/smollm2.yaml`).",
        f"- **Tables**: mean ± sample std over the {len(seeds)} seed(s); rewards are raw (tiny: 0-20; SmolLM2: "
        "0-1); 'last 10 %' is the mean over the last 10 % of the steps. **Figures**: `gtpo report` of the "
        "per-step mean over seeds of each run (per-seed runs: `experiments/runs/`).",
        f"- **Sampling** of the training runs: {sampler_note(items)}.",
        f"- CPU time measured for the runs and evaluations in this file: {cpu_total / 60:.0f} min, plus "
        f"{start.get('build_seconds', 0) / 60:.0f} min (wall) to build the tiny model.", "",
    ]
    stats_cache: dict[Run, dict] = {}
    for claim in claims:
        setup = claim.setup.replace("the 200-problem test split", f"{n_eval} problems of the test split")
        lines += [f"## Claim {claim.number}: {claim.title}", "", f"**Paper.** {claim.paper}", "",
                  f"**Here.** {setup}", ""]
        for group in claim.groups:
            n_steps = steps[group.model]
            lines += [f"### {group.title}", ""]
            stats_by_run: dict[str, list[dict]] = {}
            seed_runs_by_id: dict[str, list[Run]] = {}
            for run_id in group.runs:
                runs = [Run(group.model, run_id, s, n_steps) for s in seeds]
                seed_runs_by_id[run_id] = runs
                stats_by_run[run_id] = [stats_cache.setdefault(r, run_stats(r)) for r in runs
                                        if status(r)[0] in ("done", "stopped")]
            header = ["run", "seeds"] + [COLUMNS[c][0] for c in group.columns]
            lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
            for run_id in group.runs:
                st = stats_by_run[run_id]
                stopped = sum(1 for s in st if s.get("stopped"))
                name = run_label(run_id, group.model) + (f" ({stopped} stopped itself)" if stopped else "")
                lines.append("| " + " | ".join([name, str(len(st))] + [cell(st, c) for c in group.columns]) + " |")
            lines.append("")
            obs = [t for t in (compare_text(group, stats_by_run, k) for k in group.compare) if t]
            if obs:
                lines += ["Automatic comparison (read with the figures):", ""] + obs + [""]
            train_ids = [r for r in group.runs if Run(group.model, r, 0, 1).kind == "train"]
            starts = [s.get("heldout_final") for s in stats_by_run.get("start", [])]
            step0 = starts[0] if starts and starts[0] is not None else None
            mean_dirs, labels = [], []
            for run_id in train_ids:
                d = mean_run_dir(group.model, n_steps, run_id, seed_runs_by_id[run_id], step0)
                if d:
                    mean_dirs.append(d)
                    labels.append(f"{run_label(run_id, group.model)} (mean of {len(stats_by_run[run_id])})")
            if mean_dirs:
                out = os.path.join(DOCS_DIR, f"claim{claim.number}-{group.name}")
                shutil.rmtree(out, ignore_errors=True)
                smooth = 5 if n_steps >= 50 else None
                write_report(mean_dirs, out, labels=labels, smooth=smooth)
                shown = [f for f in group.figures if os.path.isfile(os.path.join(out, f))]
                for name in os.listdir(out):  # only the figures shown here are kept in docs/
                    if name not in shown:
                        os.remove(os.path.join(out, name))
                for fig in shown:
                    image = _rel_doc(os.path.join(out, fig))
                    lines += [f"![claim {claim.number} {group.name} {fig[:-4]}]({image})", ""]
                lines += ["Every figure of `gtpo report` for these runs (lengths, optimiser, ...): "
                          f"`gtpo report {' '.join(os.path.relpath(d, ROOT) for d in mean_dirs)}` (seed means) "
                          "or the `report/` directory of each run.", ""]
        written = verdicts.get(str(claim.number)) or verdicts.get(claim.number)
        lines += ["**Verdict.** " + ("(smoke run: none)" if smoke else str(written).strip() if written else
                                     "_to be written by whoever reads the full run: state whether the claim "
                                     f"reproduces at this scale, citing the table and figures above "
                                     f"(`{os.path.relpath(VERDICTS, ROOT)}`)._"), ""]
    lines += ["## Commands", "", "The whole suite (resumable; rerun the same command after an interruption):", "",
              "```bash", "source .venv/bin/activate", "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1",
              "python experiments/pretrain.py          # optional: the suite builds the model on first use",
              suite_cmd, "```", "", "Every run, exactly as executed (from the repository root):", "",
              "<details><summary>commands</summary>", "", "```bash"]
    for run, _claims in items:
        if run.kind != "start":
            lines.append(command(run))
    lines += ["```", "", "</details>", ""]
    text = "\n".join(lines)
    os.makedirs(os.path.dirname(DOCS_MD), exist_ok=True)
    with open(DOCS_MD + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(DOCS_MD + ".tmp", DOCS_MD)
    return DOCS_MD


# ------------------------------------------------------------------------------------ main
def check_tiny_config(tiny_dir: str) -> None:
    """The tiny configs must point at the cache built by this version of pretrain.py, and their
    probes must be the ones it wrote (probes.json)."""
    rel = os.path.relpath(tiny_dir, ROOT)
    for name in (BASE_CONFIG["tiny"], SFT_CONFIG):
        cfg = load_yaml(os.path.join(ROOT, name))
        if not str(cfg.get("model", "")).startswith(rel + "/"):
            raise SystemExit(f"{name}: model is {cfg.get('model')!r}, but pretrain.py builds {rel}/model; "
                             "update the paths in the config (pretrain.VERSION changed?)")
    probes = _read_json(os.path.join(tiny_dir, "probes.json"))
    cfg = load_yaml(os.path.join(ROOT, BASE_CONFIG["tiny"]))
    if probes is not None and {k: list(v) for k, v in (cfg.get("probes") or {}).items()} != probes:
        raise SystemExit(f"{BASE_CONFIG['tiny']}: `probes:` differs from {rel}/probes.json; copy them over")


def parse_claims(names: list[str]) -> list[Claim]:
    if not names:
        return list(CLAIMS)
    out = []
    for name in names:
        key = name.lower().replace("-", "_")
        claim = next((c for c in CLAIMS if key in (c.key, str(c.number), f"claim{c.number}")), None)
        if claim is None:
            raise SystemExit(f"unknown claim {name!r}; choose from "
                             f"{', '.join(f'{c.number}/{c.key}' for c in CLAIMS)}")
        if claim not in out:
            out.append(claim)
    return sorted(out, key=lambda c: c.number)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("claims", nargs="*", metavar="CLAIM", help="1-7 or names; default: all")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS["tiny"], help="steps of the tiny-model runs")
    parser.add_argument("--smollm2-steps", type=int, default=None,
                        help=f"steps of the SmolLM2 runs (default {DEFAULT_STEPS['smollm2']}, at most --steps)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the estimated CPU time, run nothing")
    parser.add_argument("--eval-problems", type=int, default=None,
                        help="claim 7: evaluate on this many test problems (default: all 200)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's, one per core); 1 is kinder to a shared machine")
    parser.add_argument("--no-docs", action="store_true", help="do not (re)write docs/results-suite.md")
    args = parser.parse_args(argv)
    if args.steps < 1 or (args.smollm2_steps is not None and args.smollm2_steps < 1):
        parser.error("--steps and --smollm2-steps must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.chdir(ROOT)  # configs refer to experiments/... relative to the repository root
    sys.path.insert(0, EXPERIMENTS)
    import pretrain

    claims = parse_claims(args.claims)
    steps = {"tiny": args.steps,
             "smollm2": args.smollm2_steps or min(DEFAULT_STEPS["smollm2"], args.steps)}
    items = plan(claims, args.seeds, steps)
    tiny_dir = pretrain.cache_dir(0)
    tiny_ready = os.path.isfile(os.path.join(tiny_dir, "start.json"))
    print(f"[suite] claims {', '.join(str(c.number) for c in claims)}; seeds {args.seeds}; steps tiny "
          f"{steps['tiny']}, smollm2 {steps['smollm2']}")
    total = print_plan(items, tiny_ready)
    if args.dry_run:
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    tiny_dir = pretrain.ensure_tiny_model(0, log=lambda m: print(f"[suite] {m}", flush=True))
    check_tiny_config(tiny_dir)
    t0 = time.time()
    try:
        for i, (run, claim_numbers) in enumerate(items, 1):
            if run.kind != "start":
                print(f"[suite] ({i}/{len(items)}) claims {claim_numbers}", flush=True)
                execute(run)
                gc.collect()
            if 7 in claim_numbers and (run.kind == "start" or (run.model == "tiny" and status(run)[0] == "done")):
                evaluate_run(run, tiny_dir, args.eval_problems)
    except (Interrupted, KeyboardInterrupt) as err:
        print(f"\n[suite] interrupted ({err}); every finished run is kept and the interrupted one has a "
              f"checkpoint. Resume with the same command:\n  python experiments/legacy/suite.py {shlex.join(argv)}",
              file=sys.stderr, flush=True)
        return 130
    print(f"[suite] all runs finished in {(time.time() - t0) / 60:.1f} min (estimated {total / 60:.0f} min)",
          flush=True)
    if not args.no_docs:
        path = write_results(claims, args.seeds, steps, items, tiny_dir, argv, measured_cpu(items),
                             args.eval_problems)
        print(f"[suite] wrote {os.path.relpath(path, ROOT)} and {os.path.relpath(DOCS_DIR, ROOT)}/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
