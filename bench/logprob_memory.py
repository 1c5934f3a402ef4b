"""Benchmark: chunked ``token_logprobs_and_entropy`` vs the naive full-logits path.

Problem: SmolLM2-sized LM head (V = 49,152, D = 576), 8 completions x 512 tokens, fp32.
Each variant runs forward (log-probs of the sampled tokens + full-vocabulary entropy) and
backward (gradients for the hidden states and the LM-head weight) once:

* ``naive``: ``logits = hidden @ W.T`` (8 x 512 x 49,152 floats = 805 MB), ``log_softmax``,
  ``gather``, entropy from the log-probs (no gradient), backward;
* ``chunked``: ``gtpo.maths.ops.token_logprobs_and_entropy`` (default chunk size), backward.

Every measurement runs in a FRESH subprocess so that memory numbers are honest: the peak RSS
growth is ``ru_maxrss`` after the run minus the RSS just before it (inputs allocated, a tiny
warm-up done); the forward+backward time is measured in the same run. The variants alternate
in ABBA order (naive, chunked, chunked, naive, ...) for ``--repeats`` rounds, which cancels a
linear drift of the machine's load; the medians are compared. Goals: chunked peak memory growth
<= 25% of naive, forward+backward time <= 1.3x.
The workers also print checksums of the outputs and gradients; the parent checks that both
variants computed the same thing.

Usage: ``python bench/logprob_memory.py [--repeats 2] [--threads N] [--check]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

N, T, D, V = 8, 512, 576, 49_152
MEMORY_GOAL = 0.25
TIME_GOAL = 1.3


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def worker(variant: str, threads: int | None) -> dict:
    import torch

    from gtpo.maths.ops import token_logprobs_and_entropy

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from reference_impl import naive_token_logprobs_and_entropy

    if threads:
        torch.set_num_threads(threads)
    fn = {"naive": naive_token_logprobs_and_entropy, "chunked": token_logprobs_and_entropy}[variant]

    # tiny warm-up (kernels, thread pool) that does not raise the peak
    h = torch.randn(1, 8, D, requires_grad=True)
    w = torch.randn(1024, D, requires_grad=True)
    logp, _ = fn(h, w, torch.randint(0, 1024, (1, 8)))
    logp.sum().backward()
    del h, w, logp

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, T, D, generator=g).requires_grad_(True)
    weight = torch.randn(V, D, generator=g).mul_(0.05).requires_grad_(True)  # in place: no temporary
    targets = torch.randint(0, V, (N, T), generator=g)
    coef = torch.randn(N, T, generator=g)  # upstream gradient, like a per-token policy loss

    rss_before = _rss_bytes()
    max_rss_before = _max_rss_bytes()
    t0 = time.perf_counter()
    logp, entropy = fn(hidden, weight, targets)
    (logp * coef).sum().backward()
    elapsed = time.perf_counter() - t0
    peak = _max_rss_bytes()
    return {
        "variant": variant,
        "threads": torch.get_num_threads(),
        "time_s": elapsed,
        "peak_growth_bytes": peak - rss_before,
        "pre_run_peak_excess_bytes": max(0, max_rss_before - rss_before),
        "checksums": {
            "logp_sum": float(logp.detach().double().sum()),
            "entropy_sum": float(entropy.double().sum()),
            "grad_hidden_norm": float(hidden.grad.double().norm()),
            "grad_weight_norm": float(weight.grad.double().norm()),
        },
    }


def run_worker(variant: str, threads: int | None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant]
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (A, B); ABBA order")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument("--worker", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads)))
        return 0

    print(f"N={N} T={T} D={D} V={V}: full logits {N * T * V * 4 / 2**20:.0f} MiB (fp32); "
          f"LM-head weight {V * D * 4 / 2**20:.0f} MiB")
    results = {"naive": [], "chunked": []}
    for r in range(args.repeats):
        for variant in (("naive", "chunked") if r % 2 == 0 else ("chunked", "naive")):
            res = run_worker(variant, args.threads)
            results[variant].append(res)
            print(f"  round {r + 1} {variant:8s}: {res['time_s']:6.2f} s, peak RSS growth "
                  f"{res['peak_growth_bytes'] / 2**20:7.0f} MiB  ({res['threads']} threads)", flush=True)
            if res["pre_run_peak_excess_bytes"] > 16 * 2**20:
                print(f"    warning: the peak before the run exceeded the baseline by "
                      f"{res['pre_run_peak_excess_bytes'] / 2**20:.0f} MiB (growth may be under-estimated)")

    # both variants computed the same thing
    a, b = results["naive"][0]["checksums"], results["chunked"][0]["checksums"]
    for key in a:
        rel = abs(a[key] - b[key]) / max(abs(a[key]), 1e-12)
        print(f"  check {key:17s}: naive {a[key]: .6e}  chunked {b[key]: .6e}  rel. diff {rel:.1e}")
        assert rel < 1e-4, f"{key} differs between the variants"

    med = {
        v: (statistics.median(x["time_s"] for x in rs), statistics.median(x["peak_growth_bytes"] for x in rs))
        for v, rs in results.items()
    }
    mem_ratio = med["chunked"][1] / med["naive"][1]
    time_ratio = med["chunked"][0] / med["naive"][0]
    print(f"naive  : median {med['naive'][0]:6.2f} s, peak growth {med['naive'][1] / 2**20:7.0f} MiB")
    print(f"chunked: median {med['chunked'][0]:6.2f} s, peak growth {med['chunked'][1] / 2**20:7.0f} MiB")
    print(f"memory ratio chunked/naive: {mem_ratio:.3f} (goal <= {MEMORY_GOAL})")
    print(f"time ratio chunked/naive  : {time_ratio:.2f} (goal <= {TIME_GOAL})")
    ok = mem_ratio <= MEMORY_GOAL and time_ratio <= TIME_GOAL
    if args.check and not ok:
        print("GOAL MISSED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
