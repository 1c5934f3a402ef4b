"""Integrations of GTPO with other training engines.

* :mod:`gtpo.integrations.trl` -- GTPO as a drop-in TRL trainer (``TRLGTPOConfig``,
  ``TRLGTPOTrainer``): TRL's generation (vLLM), distributed training (DeepSpeed, FSDP), PEFT and
  logging, with GTPO's conflict weights, entropy control and loss from this package's functions.
  Needs ``pip install trl``.

Importing :mod:`gtpo` or this package never imports TRL; only ``gtpo.integrations.trl`` does.
"""

from __future__ import annotations

__all__ = ["trl_option_defaults", "trl_option_names"]


def trl_option_names() -> frozenset[str]:
    """Field names of ``trl.GRPOConfig`` (empty when TRL is not installed); used by the CLI to
    say that an option belongs to ``engine: trl``."""
    try:
        import dataclasses

        from trl import GRPOConfig
    except ImportError:
        return frozenset()
    return frozenset(f.name for f in dataclasses.fields(GRPOConfig))


def trl_option_defaults() -> dict[str, object]:
    """``{field: default}`` of ``trl.GRPOConfig`` (empty when TRL is not installed); gtpo's engine takes a TRL option
    at its default value as asking for nothing (:mod:`gtpo.app.trl_options`)."""
    try:
        import dataclasses

        from trl import GRPOConfig
    except ImportError:
        return {}
    out: dict[str, object] = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out
