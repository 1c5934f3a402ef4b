"""A run of gtpo's trainer around the method: building it (``build``: precision, model, PEFT, reference,
optimizer; ``models``: loading models and tokenizers), its run directory (``checkpoint``) and what it records
(``trackers``, ``metric_names``, ``diagnostics``).
"""
