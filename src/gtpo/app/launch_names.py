"""The options of ``accelerate launch`` a YAML may hold (a leaf: :mod:`gtpo.app.spec` and :mod:`gtpo.app.launch`
both ask it, neither imports the other)."""

from __future__ import annotations

import functools

__all__ = ["launch_option_names"]

# accelerate launch's own plumbing, never a YAML key
_NOT_OPTIONS = {"help", "training_script", "training_script_args", "module", "no_python", "main_training_function"}


@functools.lru_cache(maxsize=1)
def launch_option_names() -> frozenset[str]:
    """The options of ``accelerate launch`` (its parser's destinations), and ``accelerate_config`` (TRL's key for
    ``--config_file``)."""
    from accelerate.commands.launch import launch_command_parser

    names = {action.dest for action in launch_command_parser()._actions} - _NOT_OPTIONS
    return frozenset(names | {"accelerate_config"})
