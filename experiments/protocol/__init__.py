"""The science protocol of issue 16: runs whose outcome can decide the paper's claims.

One module per claim, each design a record of its module (its parameters as data) with its declaration under
``designs/``: ``claim1`` (paired one-step updates), ``claim2`` (the stress model's collapse grid; the released
optimiser), ``claim7`` (accuracy with power; the attribution of GTPO's gain), ``smol`` (SmolLM2 on the default
task: the default run's choice). Beside them: ``startmodels`` (the models the claims start from), ``tinyruns``
(training runs through ``gtpo.app``, resumable), ``declare`` (a design committed before its runs, checked against
git), ``stats`` (the tests), ``common`` (paths, data files, locks) and ``report`` (docs/results.md from the
committed raw data under ``experiments/data/``, no training).
"""
