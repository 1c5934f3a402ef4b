"""The maths of GTPO, as pure tensor functions: ``ops`` (masked reductions, ``aggregate``, the chunked
log-prob + entropy head), ``advantages`` (group advantages, entropy control), ``conflict`` (conflict runs and
weights), ``losses`` (every policy loss, one signature, ``POLICY_LOSSES``) and ``method`` (the GTPO composition,
once, for every engine).

Nothing here imports transformers or a logger, prints, or orchestrates (docs/architecture.md).
"""
