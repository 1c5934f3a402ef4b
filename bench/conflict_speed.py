"""Benchmark: vectorised ``conflict_weights`` vs the slow obvious reference, and its memory.

Measures, in one run on the same inputs (P = 8 prompts, G = 16 completions, T = 1024 tokens):

1. speed: the vectorised ``gtpo.maths.conflict.conflict_weights`` against ``tests/reference_impl.py``'s
   ``ref_conflict`` (Python loops, the literal transcription of gtpo-method.md §4: conflicting
   tokens per position, then the runs), alternating A/B, several repeats, median time of each;
   goal: at least 50x faster. Also shown, for information: ``ref_conflict_walk``, a smarter loop
   that walks each run and stops at its first non-conflicting position;
2. memory: the peak of CPU memory allocated by torch during one ``conflict_weights`` call, read
   from the torch profiler's allocation events (every allocation and free with the running total
   "Total Allocated"), for token ids drawn from ranges of 1e3, 1e6, 1e9 and 2^62; goal: the
   same peak whatever the range (nothing depends on the vocabulary). For contrast, the same
   measurement for the released code's algorithm (vocabulary-sized ``bincount``s per group,
   ``reference_impl.bincount_conflict_runs``) at V = 1e3 and 1e4.

Usage: ``python bench/conflict_speed.py [--repeats 5] [--threads 1] [--check]``; ``--check``
exits non-zero when a goal is missed. Absolute times are not comparable between runs on shared
machines; the ratio is. Both sides run on one thread by default (the reference is single-threaded
Python; on an oversubscribed 2-core machine torch's 2 OpenMP threads make these sub-millisecond
ops 10-100x slower, which measures the machine's load, not the algorithm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from reference_impl import bincount_conflict_runs, ref_conflict, ref_conflict_walk  # noqa: E402

from gtpo.maths.conflict import conflict_weights  # noqa: E402

P, G, T = 8, 16, 1024
SPEED_GOAL = 50.0


def make_batch(seed: int, id_range: int, vocab_used: int = 64):
    """A rollout-like batch: each group shares a template (common prefix / format tokens and a
    common ending), completions have random lengths (including 1) and differ in places.
    Token ids are ``vocab_used`` distinct values spread over ``[0, id_range)``."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randperm(min(id_range, 10**6), generator=g)[:vocab_used].to(torch.int64)
    if id_range > 10**6:  # spread the values over the whole range
        values = values * (id_range // 10**6)
    N = P * G
    template = torch.randint(0, vocab_used, (P, 1, T), generator=g).expand(P, G, T).reshape(N, T)
    noise = torch.randint(0, vocab_used, (N, T), generator=g)
    keep = torch.rand(N, T, generator=g) < 0.8
    idx = torch.where(keep, template, noise)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[::17] = 1
    lengths[::5] = T
    # a shared ending of 8 tokens right-aligned on each completion
    k = torch.arange(T)
    tail = (k[None, :] >= (lengths[:, None] - 8)) & (k[None, :] < lengths[:, None])
    ending = torch.randint(0, vocab_used, (P, 1, 8), generator=g).expand(P, G, 8).reshape(N, 8)
    pos_in_tail = (k[None, :] - (lengths[:, None] - 8)).clamp(0, 7)
    idx = torch.where(tail, ending.gather(1, pos_in_tail), idx)
    ids = values[idx]
    mask = k[None, :] < lengths[:, None]
    rewards = torch.randint(0, 3, (N,), generator=g).to(torch.float32)
    rewards[:G] = 1.0  # one zero-variance group
    grouped = rewards.view(P, G)
    adv = (grouped - grouped.mean(1, keepdim=True)).reshape(N)
    return ids, mask, adv


def time_once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak_allocated_bytes(fn) -> tuple[int, int]:
    """(peak of live bytes allocated during fn above the level at its start, largest single
    allocation), from the torch profiler's CPU allocation events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    if not mem:
        return 0, 0
    start_level = mem[0]["args"]["Total Allocated"] - mem[0]["args"]["Bytes"]
    peak = max(e["args"]["Total Allocated"] for e in mem) - start_level
    largest = max(e["args"]["Bytes"] for e in mem)
    return peak, largest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, see the docstring)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; P={P} G={G} T={T}")
    ids, mask, adv = make_batch(0, 10**9)
    ids_l, mask_l, adv_l = ids.tolist(), mask.int().tolist(), adv.tolist()

    # correctness on the benchmark batch itself
    w, n = conflict_weights(ids, mask, adv, G)
    for reference in (ref_conflict, ref_conflict_walk):
        w_ref, n_ref, _, _ = reference(ids_l, mask_l, adv_l, G)
        assert w.tolist() == w_ref and n.tolist() == n_ref, f"vectorised and {reference.__name__} disagree"
    print(f"tokens in a conflict run: {((w != 1) & mask).float().mean():.3f} of masked tokens; "
          f"mean n_conflict {n.float().mean():.1f}, max {int(n.max())}")

    def run_reference(fn):
        return lambda: fn(ids.tolist(), mask.int().tolist(), adv.tolist(), G)

    fast_reps = 20
    conflict_weights(ids, mask, adv, G)  # warm-up
    times = {"ref_conflict": [], "ref_conflict_walk": [], "conflict_weights": []}
    for _ in range(args.repeats):  # alternate A/B
        times["ref_conflict"].append(time_once(run_reference(ref_conflict)))
        times["conflict_weights"].append(
            time_once(lambda: [conflict_weights(ids, mask, adv, G) for _ in range(fast_reps)]) / fast_reps
        )
        times["ref_conflict_walk"].append(time_once(run_reference(ref_conflict_walk)))
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, values in times.items():
        print(f"{name:18s}: median {med[name] * 1e3:9.2f} ms  ({', '.join(f'{t * 1e3:.2f}' for t in values)})")
    speedup = med["ref_conflict"] / med["conflict_weights"]
    print(f"speed-up vs ref_conflict (slow reference): {speedup:.0f}x (goal >= {SPEED_GOAL:.0f}x)")
    print(f"speed-up vs ref_conflict_walk (early-exit loop, information): "
          f"{med['ref_conflict_walk'] / med['conflict_weights']:.0f}x")

    print("peak torch CPU allocation during one call (profiler allocation events):")
    peaks = {}
    for id_range in (10**3, 10**6, 10**9, 2**62):
        b_ids, b_mask, b_adv = make_batch(1, id_range)
        peak, largest = peak_allocated_bytes(lambda: conflict_weights(b_ids, b_mask, b_adv, G))
        peaks[id_range] = peak
        print(f"  conflict_weights, ids in [0, {id_range:.0e}): peak {peak / 2**20:7.2f} MiB, "
              f"largest tensor {largest / 2**20:6.2f} MiB")
    for vocab in (10**3, 10**4):
        b_ids, b_mask, b_adv = make_batch(1, vocab)
        peak, largest = peak_allocated_bytes(lambda: bincount_conflict_runs(b_ids, b_mask, b_adv, G, vocab))
        print(f"  released code's bincount algorithm, V = {vocab:.0e}: peak {peak / 2**20:7.2f} MiB, "
              f"largest tensor {largest / 2**20:6.2f} MiB (grows with V * T)")
    same_peak = len(set(peaks.values())) == 1
    print(f"memory independent of the token-id range: {same_peak}")

    ok = speedup >= SPEED_GOAL and same_peak
    if args.check and not ok:
        print("GOAL MISSED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
