"""docs/results.md from the committed raw data: ``python -m experiments.protocol.report`` (:mod:`.document`).

One module per section (``claim1``, ``claim2``, ``claim2_optimiser``, ``claim7``, ``claim7_attribution``, ``smol``),
the shared formats and figures (``tables``), the generated verdicts (``verdicts``), the hand-written readings
(``prose``), and the document that puts them together (``document``). Imports go one way: ``document`` ->
sections -> ``tables``; no section imports the document.
"""
