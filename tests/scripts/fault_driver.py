"""Crash, signal and disk-failure scenarios for tests/test_faults.py, run by one driver process.

Usage: python fault_driver.py MODEL_DIR WORK_DIR SCENARIOS RESULT_JSON
    SCENARIOS: "all" or comma-separated names of :data:`SCENARIOS`.

Every training attempt is the real command line, ``gtpo.cli.main(["train", CONFIG, ...])``, run in
a child process forked from this driver, which imports torch, transformers and gtpo once (a fresh
interpreter per attempt would spend most of the test's time importing). Faults are injected in the
child only, by wrapping library functions there; the library itself has no fault switches:

* kill points: at a chosen moment the child sends itself SIGKILL (nothing runs after it: no
  ``finally``, no flush), in some places after writing half of a file;
* stop signals: the child waits at a pause point while the driver, another process, sends it
  SIGTERM or SIGINT, once or twice;
* a real write failure: the child lowers its own RLIMIT_FSIZE, so the kernel refuses (EFBIG) the
  writes of the next checkpoint.

After a fault the run is resumed with ``--resume_from_checkpoint true`` (for the signal scenarios:
with the command the CLI printed) until it finishes. The driver records exit codes, where each
attempt resumed from, and which checkpoints were complete after each fault; the test compares
the final weights, metrics.jsonl and completions.jsonl with the uninterrupted run ("reference").
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")  # no allocator thread across fork
os.environ.setdefault("MPLBACKEND", "Agg")

import multiprocessing as mp  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(1)

import datasets  # noqa: E402,F401  (preloaded for the children)
import matplotlib.pyplot  # noqa: E402,F401
import safetensors.torch  # noqa: E402,F401
import transformers.modeling_utils  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402,F401

import gtpo.cli  # noqa: E402
import gtpo.data  # noqa: E402,F401
import gtpo.run.models  # noqa: E402,F401
import gtpo.report  # noqa: E402,F401
import gtpo.rewards  # noqa: E402,F401
from gtpo.run import checkpoint as ckpt  # noqa: E402
from gtpo import trainer as tr  # noqa: E402
import gtpo.app.training  # noqa: E402,F401
from gtpo.integrations import trl_option_names  # noqa: E402
from gtpo.run.models import import_bitsandbytes_quietly  # noqa: E402

# what every `gtpo train` imports at run time, loaded once here rather than in each of the ~40 children (measured
# under load: bitsandbytes, which peft imports and which imports torch's inductor, ~4.8 s; TRL's GRPOConfig, whose
# option names the CLI reads, ~3.5 s): as the run itself imports them (bitsandbytes quietly: these runs quantize
# nothing)
import_bitsandbytes_quietly(quantizing=False)
trl_option_names()

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_STEPS = 8

# name -> (kill point of the first attempt, the checkpoint step the resume must start from; 0: none)
KILL_POINTS = {
    "step_end@1": 0,          # after step 1's update, before any checkpoint: resume starts over
    "step_end@3": 2,          # after step 3's optimizer update, before its metrics line
    "rollout@5": 4,           # while sampling step 5's completions
    "metrics_append@5": 4,    # half of step 5's metrics.jsonl line written
    "model_write@4": 2,       # half of checkpoint-4's model.safetensors written (temporary dir)
    "optimizer_write@6": 4,   # half of checkpoint-6's optimizer.pt written
    "state_write@4": 2,       # half of checkpoint-4's trainer_state.json written, before the rename
    "after_rename@6": 6,      # checkpoint-6 renamed into place, old checkpoints not yet rotated out
    "rotation@6": 6,          # in the middle of deleting checkpoint-2 (save_total_limit=2)
    "final_save": 8,          # in the middle of moving the final model files into output_dir
}
CHAIN = ["step_end@3", "before_commit@6", "metrics_append@7"]  # three kills in a row, one run
CHAIN_RESUMES = [None, 2, 4, 6]
SIGNALS = {"sigterm": signal.SIGTERM, "sigint": signal.SIGINT}


# ----------------------------------------------------------------------------- run setup
def write_inputs(model_dir: str, work: str) -> str:
    data = os.path.join(work, "train.jsonl")
    with open(data, "w") as fh:
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 2), (4, 5), (6, 3)]:
            fh.write(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
    config = {
        "model": model_dir,
        "dataset": {"name": data, "template": "plain"},
        "reward_funcs": [os.path.join(HERE, "fault_rewards.py") + ":digit_reward"],
        "group_size": 4, "prompts_per_step": 2, "max_steps": MAX_STEPS, "max_completion_length": 6,
        "micro_batch_size": 4, "learning_rate": 1e-2, "lr_scheduler_type": "cosine", "warmup_ratio": 0.25,
        "entropy_rule": "initial", "entropy_threshold": 0.6931, "seed": 0,
        "save_steps": 2, "save_total_limit": 2, "log_completions_steps": 1, "num_completions_to_print": 2,
        "disable_tqdm": True, "log_level": "info",
    }
    path = os.path.join(work, "run.yaml")
    import yaml

    with open(path, "w") as fh:
        yaml.safe_dump(config, fh)
    return path


# ----------------------------------------------------------------------------- in the child
def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _latest_step(out: str) -> int | None:
    found = ckpt.list_checkpoints(out)
    return found[-1][0] if found else None


def install_kill(spec: str) -> None:
    """Wrap one library function so that the child kills itself with SIGKILL at ``spec``."""
    name, _, at = spec.partition("@")
    k = int(at) if at else None
    T = tr.GTPOTrainer
    tmp_k = f"{ckpt.TMP_PREFIX}{k}"
    if name == "step_end":
        orig_step = T.step

        def step(self):
            out = orig_step(self)
            if self.global_step == k:
                _die()
            return out

        T.step = step
    elif name == "rollout":
        orig_rollout = T.sample_rollout

        def rollout(self, rows):
            if self.global_step + 1 == k:
                _die()
            return orig_rollout(self, rows)

        T.sample_rollout = rollout
    elif name == "metrics_append":
        orig_append = ckpt.append_jsonl

        def append(path, obj):
            if path.endswith("metrics.jsonl") and obj.get("step") == k:
                line = json.dumps(obj, default=float) + "\n"
                with open(path, "a") as fh:
                    fh.write(line[: len(line) // 2])
                    fh.flush()
                _die()
            return orig_append(path, obj)

        ckpt.append_jsonl = append
    elif name == "model_write":
        orig_save_file = transformers.modeling_utils.safe_save_file

        def save_file(tensors, filename, *args, **kwargs):
            orig_save_file(tensors, filename, *args, **kwargs)
            if tmp_k in filename:
                with open(filename, "r+b") as fh:
                    fh.truncate(os.path.getsize(filename) // 2)
                _die()

        transformers.modeling_utils.safe_save_file = save_file
    elif name == "optimizer_write":
        orig_torch_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(f, str) and f.endswith("optimizer.pt") and tmp_k in f:
                buf = io.BytesIO()
                orig_torch_save(obj, buf, *args, **kwargs)
                with open(f, "wb") as fh:
                    fh.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                    fh.flush()
                _die()
            return orig_torch_save(obj, f, *args, **kwargs)

        torch.save = save
    elif name == "state_write":
        orig_write = ckpt.write_json_atomic

        def write(path, obj):
            if path.endswith(ckpt.STATE_FILE) and tmp_k in path:
                text = json.dumps(obj)
                with open(path + ".tmp", "w") as fh:
                    fh.write(text[: len(text) // 2])
                    fh.flush()
                _die()
            return orig_write(path, obj)

        ckpt.write_json_atomic = write
    elif name == "before_commit":
        orig_commit = ckpt.commit

        def commit(tmp, final, state):
            if final.endswith(f"checkpoint-{k}"):
                _die()
            return orig_commit(tmp, final, state)

        ckpt.commit = commit
    elif name == "after_rename":
        orig_rotate = ckpt.rotate

        def rotate(out, keep):
            if _latest_step(out) == k:
                _die()
            return orig_rotate(out, keep)

        ckpt.rotate = rotate
    elif name == "rotation":
        import shutil

        orig_rmtree = shutil.rmtree
        state = {"out": None}
        orig_rotate = ckpt.rotate

        def rotate(out, keep):
            state["out"] = out if _latest_step(out) == k else None
            return orig_rotate(out, keep)

        def rmtree(path, *args, **kwargs):
            base = os.path.basename(os.path.normpath(str(path)))
            if state["out"] and (base.startswith("checkpoint-") or base.startswith(ckpt.REMOVING_PREFIX)):
                # the deletion has begun: the weights are gone, the rest (trainer_state.json) not yet
                weights = os.path.join(path, "model.safetensors")
                if os.path.exists(weights):
                    os.remove(weights)
                _die()
            return orig_rmtree(path, *args, **kwargs)

        ckpt.rotate = rotate
        shutil.rmtree = rmtree
    elif name == "final_save":
        orig_replace = os.replace
        moved = []

        def replace(src, dst, *args, **kwargs):
            if ".tmp-final" in str(src):
                if moved:
                    _die()
                moved.append(src)
            return orig_replace(src, dst, *args, **kwargs)

        os.replace = replace
    else:
        raise ValueError(f"unknown kill point {spec!r}")


def _pause(sync: str, name: str) -> None:
    """Tell the driver we reached ``name`` and wait until it releases us."""
    open(os.path.join(sync, name + ".reached"), "w").close()
    release = os.path.join(sync, name + ".release")
    deadline = time.monotonic() + 120
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise RuntimeError(f"pause {name!r} was never released")
        time.sleep(0.01)


def install_pauses(sync: str, score_step: int | None, commit_step: int | None) -> None:
    T = tr.GTPOTrainer
    if score_step is not None:
        orig_score = T.score

        def score(self, rows, rollout):
            if self.global_step + 1 == score_step:
                _pause(sync, "score")
            return orig_score(self, rows, rollout)

        T.score = score
    if commit_step is not None:
        orig_commit = ckpt.commit

        def commit(tmp, final, state):
            if final.endswith(f"checkpoint-{commit_step}"):
                _pause(sync, "commit")
            return orig_commit(tmp, final, state)

        ckpt.commit = commit


def install_fsize_limit(after_step: int, limit: int) -> None:
    """After checkpoint-<after_step> is complete, make the kernel refuse writes beyond ``limit`` bytes."""
    import resource

    orig_rotate = ckpt.rotate

    def rotate(out, keep):
        orig_rotate(out, keep)
        if _latest_step(out) == after_step:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
            _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    ckpt.rotate = rotate


def record_resume(path: str) -> None:
    orig_load = tr.GTPOTrainer.load_checkpoint

    def load_checkpoint(self, checkpoint):
        with open(path, "w") as fh:
            fh.write(str(checkpoint))
        return orig_load(self, checkpoint)

    tr.GTPOTrainer.load_checkpoint = load_checkpoint


def child_main(argv: list[str], log: str, setup: dict) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    # the child is `gtpo train` in a terminal, where Ctrl-C raises KeyboardInterrupt; a suite started in the
    # background (`cmd &` in a non-interactive shell) inherits SIGINT ignored, and the trainer's second-signal
    # path (the previous handler) would then ignore it too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        record_resume(log + ".resumed_from")
        if setup.get("kill"):
            install_kill(setup["kill"])
        if setup.get("pause_score") or setup.get("pause_commit"):
            install_pauses(setup["sync"], setup.get("pause_score"), setup.get("pause_commit"))
        if setup.get("fsize_after"):
            install_fsize_limit(setup["fsize_after"], setup["fsize_limit"])
        rc = gtpo.cli.main(["train", *argv])
    except BaseException:  # noqa: BLE001 -- report in the log, exit with a recognisable code
        traceback.print_exc()
        rc = 99
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


# ----------------------------------------------------------------------------- in the driver
class Scenario:
    def __init__(self, name: str, work: str, config: str):
        self.name, self.config = name, config
        self.dir = os.path.join(work, re.sub(r"[^A-Za-z0-9_.-]", "_", name))
        os.makedirs(self.dir, exist_ok=True)
        self.out = os.path.join(self.dir, "out")
        self.sync = os.path.join(self.dir, "sync")
        os.makedirs(self.sync, exist_ok=True)
        self.attempts: list[dict] = []

    def start(self, argv: list[str], **setup):
        log = os.path.join(self.dir, f"attempt{len(self.attempts)}.log")
        proc = mp.get_context("fork").Process(target=child_main, args=(argv, log, {"sync": self.sync, **setup}))
        proc.start()
        return proc, log

    def finish(self, proc, log: str, argv: list[str], timeout: float = 300) -> dict:
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise RuntimeError(f"{self.name}: attempt {len(self.attempts)} hung; see {log}")
        resumed = None
        if os.path.isfile(log + ".resumed_from"):
            resumed = open(log + ".resumed_from").read()
        complete, incomplete = [], []
        for _step, path in ckpt.list_checkpoints(self.out):
            names = set(os.listdir(path))
            need = {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth", ckpt.STATE_FILE}
            (complete if need <= names else incomplete).append(os.path.basename(path))
        info = {"argv": argv, "exitcode": proc.exitcode, "log": log, "resumed_from": resumed,
                "complete_checkpoints": complete, "incomplete_checkpoints": incomplete,
                "entries": sorted(os.listdir(self.out)) if os.path.isdir(self.out) else [],
                "output": open(log, errors="replace").read()[-6000:]}
        self.attempts.append(info)
        return info

    def run(self, argv: list[str], **setup) -> dict:
        proc, log = self.start(argv, **setup)
        return self.finish(proc, log, argv)

    def first_argv(self) -> list[str]:
        return [self.config, "--output_dir", self.out]

    def resume_argv(self) -> list[str]:
        return [self.config, "--output_dir", self.out, "--resume_from_checkpoint", "true"]

    def resume_until_done(self, limit: int = 3) -> None:
        for _ in range(limit):
            if self.run(self.resume_argv())["exitcode"] == 0:
                return

    def wait_for(self, proc, path: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the child never reached {os.path.basename(path)}")
            time.sleep(0.01)

    def wait_for_text(self, proc, log: str, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in open(log, errors="replace").read():
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {text!r} never appeared in {log}")
            time.sleep(0.01)

    def release(self, name: str) -> None:
        open(os.path.join(self.sync, name + ".release"), "w").close()

    def result(self) -> dict:
        return {"out": self.out, "attempts": self.attempts}


def printed_resume_argv(output: str) -> list[str] | None:
    """The arguments of the ``resume with: gtpo train ...`` line the CLI printed."""
    found = re.findall(r"^resume with: gtpo train (.*)$", output, flags=re.M)
    return shlex.split(found[-1]) if found else None


def scenario_signal(s: Scenario, sig: int, *, twice: bool) -> None:
    """Signal during step 3; ``twice``: again while checkpoint-3 is being written."""
    proc, log = s.start(s.first_argv(), pause_score=3, pause_commit=3 if twice else None)
    s.wait_for(proc, os.path.join(s.sync, "score.reached"))
    os.kill(proc.pid, sig)
    s.wait_for_text(proc, log, f"received {signal.Signals(sig).name}")
    s.release("score")
    if twice:
        s.wait_for(proc, os.path.join(s.sync, "commit.reached"))
        os.kill(proc.pid, sig)
        # the second signal must stop the child while it is held inside the commit; releasing the
        # hold at once would race with the signal handler (the commit could finish first)
        proc.join(60)
        s.release("commit")  # only matters if it did not stop: the test then fails on the exit code
    info = s.finish(proc, log, s.first_argv())
    argv = printed_resume_argv(info["output"]) or s.resume_argv()
    info["printed_resume_argv"] = printed_resume_argv(info["output"])
    s.run(argv)


def run_scenario(name: str, work: str, config: str) -> dict:
    s = Scenario(name, work, config)
    if name == "reference":
        s.run(s.first_argv())
    elif name.startswith("kill:"):
        s.run(s.first_argv(), kill=name[5:])
        s.resume_until_done()
    elif name == "chain":
        s.run(s.first_argv(), kill=CHAIN[0])
        for spec in CHAIN[1:]:
            s.run(s.resume_argv(), kill=spec)
        s.resume_until_done()
    elif name in ("sigterm", "sigint"):
        scenario_signal(s, SIGNALS[name], twice=False)
    elif name in ("sigterm_twice", "sigint_twice"):
        scenario_signal(s, SIGNALS[name.split("_")[0]], twice=True)
    elif name == "write_failure":
        # after checkpoint-2, files may not grow beyond 64 KiB: writing checkpoint-4 fails for real
        s.run(s.first_argv(), fsize_after=2, fsize_limit=64 * 1024)
        s.resume_until_done()
    elif name == "control_no_rng":
        # sensitivity check: losing the RNG state must change the result (the comparison can fail)
        s.run(s.first_argv(), kill="step_end@3")
        os.remove(os.path.join(s.out, "checkpoint-2", "rng_state_0.pth"))
        s.resume_until_done()
    else:
        raise ValueError(f"unknown scenario {name!r}")
    return s.result()


# the longest first (chain: four attempts), so that the lanes end close together
SCENARIOS = (["chain", "reference"] + [f"kill:{k}" for k in KILL_POINTS] + ["sigterm", "sigint", "sigterm_twice",
                                                                            "sigint_twice", "write_failure",
                                                                            "control_no_rng"])
LANES = 4  # at most, and no more than the cores this process may use


def run_lane(work: str, config: str, names: list[str], lane_path: str) -> None:
    """One lane (a process forked from the driver): claims the next unclaimed scenario of ``names`` (an exclusive
    file under ``work/claims``), runs it, and writes what its scenarios gave to ``lane_path`` after each."""
    done: dict = {}
    claims = os.path.join(work, "claims")
    for name in names:
        try:
            os.close(os.open(os.path.join(claims, re.sub(r"[^A-Za-z0-9_.-]", "_", name)), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue  # another lane runs it
        t0 = time.monotonic()
        try:
            done[name] = run_scenario(name, work, config)
        except Exception as err:  # noqa: BLE001 -- recorded; the test fails on it with the message
            done[name] = {"error": f"{type(err).__name__}: {err}"}
        done[name]["seconds"] = round(time.monotonic() - t0, 1)
        with open(lane_path, "w") as fh:
            json.dump(done, fh, indent=1)


def main() -> None:
    """The scenarios are independent (a directory each; torch on one thread in every attempt): they run in up to
    ``LANES`` processes at once, no more than the cores this process may use, each lane taking the next scenario
    when it is done. Every scenario's attempts still run one after the other."""
    model_dir, work, which, result_path = sys.argv[1:5]
    os.makedirs(os.path.join(work, "claims"), exist_ok=True)
    config = write_inputs(model_dir, work)
    names = SCENARIOS if which == "all" else which.split(",")
    results = {"max_steps": MAX_STEPS, "kill_points": KILL_POINTS, "chain": CHAIN, "chain_resumes": CHAIN_RESUMES,
               "scenarios": {}}
    n = max(1, min(LANES, len(os.sched_getaffinity(0)), len(names)))
    lanes = [(mp.get_context("fork").Process(target=run_lane, args=(work, config, names, path)), path)
             for path in (os.path.join(work, f"lane{i}.json") for i in range(n))]
    for proc, _path in lanes:
        proc.start()
    for proc, path in lanes:
        proc.join()
        if os.path.isfile(path):
            with open(path) as fh:
                results["scenarios"].update(json.load(fh))
    for name in names:  # a lane that died (its exit code) leaves its scenario without a result
        results["scenarios"].setdefault(name, {"error": "its lane exited with "
                                                        f"{[proc.exitcode for proc, _ in lanes]}"})
    with open(result_path, "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
