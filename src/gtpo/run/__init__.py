"""A run of gtpo's trainer around the method: building it (``build``: precision, model, PEFT, reference,
optimizer; ``models``: loading models and tokenizers), its run directory (``checkpoint``), what it records
(``trackers``, ``metric_names``, ``step_metrics``, ``diagnostics``), what an update takes and gives back (``update``)
and stopping on a signal (``signals``).
"""
