"""The science protocol of issue 16: runs whose outcome can decide the paper's claims.

Modules: ``stats`` (exact tests: Wilcoxon signed-rank, Mann-Whitney, Fisher, log-rank, bootstrap),
``smol`` (SmolLM2 on the default task: the default-run decision and claim 7's SmolLM2 part),
``onestep`` (claim 1: paired one-step updates), ``stress`` (claim 2), ``claim7`` (claim 7: accuracy
with power on the tiny task), ``tinyruns`` (resumable tiny-model runs), ``report`` (docs/results.md from the committed raw data under
``experiments/data/``, no training).
"""
