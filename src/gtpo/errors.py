"""Every exception class of the package (torch-free; imported by the modules that raise them).

* :class:`ConfigValueError` -- a :class:`gtpo.GTPOConfig` value is wrong (``field`` names it).
* :class:`ConfigError` -- the command line or a YAML file is wrong (printed without a traceback).
* :class:`RewardFunctionError` -- a reward function raised or returned something unusable.
* :class:`TrainingStopped` -- the run stopped on purpose (too many non-finite steps, sampling
  from non-finite probabilities); the last good checkpoint is kept.
* :class:`CheckpointError` -- a checkpoint, the final model or a log could not be written; the
  previous checkpoint is intact.
* :class:`HubUploadError` -- ``push_to_hub``: the repository could not be created, or the final model could not be
  uploaded (it is saved locally).
"""

from __future__ import annotations


class ConfigValueError(ValueError):
    """A config value that is wrong; ``field`` names the field (None when it is about several)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class ConfigError(ValueError):
    """A problem with the run configuration (command line, YAML), reported without a traceback."""


class RewardFunctionError(ValueError):
    """A reward function raised or returned something unusable; the message names the function,
    the completion, its prompt index in the step and its dataset row."""


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is kept."""


class CheckpointError(RuntimeError):
    """A checkpoint (or the final model, or a log file) could not be written.

    The message names what was being written, where, and the newest checkpoint that is intact;
    the original exception (e.g. ``OSError(ENOSPC)``) is chained as ``__cause__``.
    """


class HubUploadError(RuntimeError):
    """``push_to_hub``: creating the Hub repository at the start or uploading the final model at the end failed.

    The message names the repository, what failed and, at the end, where the model is saved locally and the command
    that uploads it; the original exception is chained as ``__cause__``.
    """
