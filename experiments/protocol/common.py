"""Shared helpers: paths, the environment of a run, compressed jsonl I/O, the workers' job locks, and what every
declared design records (:class:`Design`)."""

from __future__ import annotations

import gzip
import json
import os
import resource
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.dirname(HERE)
ROOT = os.path.dirname(EXPERIMENTS)
RUNS = os.path.join(EXPERIMENTS, "runs", "protocol")   # git-ignored working directories
DATA = os.path.join(EXPERIMENTS, "data")               # committed raw data (compressed jsonl)
DESIGNS = os.path.join(HERE, "designs")                # each design's declaration, as committed before its runs


@dataclass(frozen=True)
class Design:
    """What every design of the protocol records, beside its own parameters (the subclasses in the claim modules).

    ``name``: its name on the command line; ``text``: its declaration under ``designs/`` (arms, grids, seeds, test,
    threshold, stopping rule and amendments, word for word as committed before its runs); ``declared_in``: the file
    whose commits its committed runs record as ``declared_in`` (``git log -- <file>`` finds them; the file has since
    moved into its claim's module); ``module``: the module that holds the design now (what a new snapshot declares,
    :func:`experiments.protocol.declare.run_stamp`); ``data``: its committed data file; ``runs``: its working
    directories (git-ignored)."""

    name: str
    text: str
    declared_in: str
    module: str
    data: str
    runs: str

    def declaration(self) -> str:
        """The declaration's text (``designs/<text>``)."""
        with open(os.path.join(DESIGNS, self.text), encoding="utf-8") as f:
            return f.read()

    # The subclasses define jobs() -> [(arm, seed)], done(arm, seed) -> bool, run_dir(arm, seed) -> str and
    # run_job(arm, seed); the worker loop below is the same for all of them.
    def committed(self) -> set[tuple[str, int]]:
        """(arm, seed) of every run in the committed data file: finished (on this machine or another one) and
        exported, so not run again."""
        if not os.path.isfile(self.data):
            return set()
        return {(r["arm"], int(r["seed"])) for r in read_jsonl_gz(self.data)
                if "started_at" in r and "arm" in r and "seed" in r}

    def work_loop(self) -> None:
        """One worker (two at most run side by side): the first job in :meth:`jobs` order that is neither done in
        its folder nor in the committed data file and that no other worker holds (a lock file beside its folder,
        :func:`take_lock`) is run or resumed; then the jobs are listed again (a design's jobs may depend on
        finished runs), until none is left to take. A ``STOP`` file in ``runs`` ends the worker before its next
        job."""
        committed = self.committed()
        while True:
            for arm, seed in self.jobs():
                if (arm, seed) in committed or self.done(arm, seed):
                    continue
                if os.path.exists(os.path.join(self.runs, "STOP")):
                    return
                d = self.run_dir(arm, seed)
                os.makedirs(os.path.dirname(d), exist_ok=True)
                lock = d + ".lock"
                if not take_lock(lock):
                    continue
                try:
                    self.run_job(arm, seed)
                finally:
                    os.remove(lock)
                break
            else:
                return


def setup_env(threads: int = 1) -> None:
    """Offline, one torch thread (the machine is shared)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_jsonl_gz(path: str, records) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def read_jsonl_gz(path: str) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def take_lock(lock: str) -> bool:
    """Create ``lock`` (this process's pid) for a job run by one of several workers; a lock whose process is
    gone is taken over. False when another live process holds it."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(open(lock).read() or 0), 0)
                return False
            except (ProcessLookupError, ValueError):
                os.remove(lock)
                continue
            except PermissionError:
                return False
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False
