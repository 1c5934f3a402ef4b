"""Crash-safe checkpoints: written under a temporary name, fsynced, renamed when complete.

Layout of ``output_dir``::

    checkpoint-<step>/          complete checkpoints (the rename is the commit point)
        model files             save_pretrained of the model (or the peft adapter) + tokenizer
        optimizer.pt scheduler.pt rng_state_<rank>.pth
        trainer_state.json      written last inside the temporary directory
    .tmp-checkpoint-<step>/     a checkpoint being written; never loaded, removed on the next start
    .tmp-checkpoint-removing-*  a checkpoint being deleted (rotation, overwrite); removed likewise

A checkpoint counts as complete only when its directory has the final name *and* holds
``trainer_state.json``; a kill at any moment leaves either the previous complete checkpoints
untouched or a temporary directory that resume ignores. Deleting goes the other way: a
checkpoint is first renamed out of the ``checkpoint-<step>`` namespace, then removed, so a kill
in the middle of a deletion never leaves a half-deleted directory that looks complete.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from typing import Any

STATE_FILE = "trainer_state.json"
_CKPT = re.compile(r"^checkpoint-(\d+)$")
TMP_PREFIX = ".tmp-checkpoint-"
REMOVING_PREFIX = TMP_PREFIX + "removing-"


class CheckpointError(RuntimeError):
    """A checkpoint (or the final model, or a log file) could not be written.

    The message names what was being written, where, and the newest checkpoint that is intact;
    the original exception (e.g. ``OSError(ENOSPC)``) is chained as ``__cause__``.
    """


def describe_write_error(err: BaseException) -> str:
    """A short description of a write failure: ``'no space left on device'``, ``'file too large'``...

    Writers report the OS error differently: ``OSError.errno``, or a text such as safetensors'
    ``"... (os error 28)"``; anything else is described by its type and first line.
    """
    errno_ = getattr(err, "errno", None)
    if not errno_:
        found = re.search(r"os error (\d+)", str(err))
        errno_ = int(found.group(1)) if found else None
    if not errno_ and ("No space left" in str(err) or "StorageFull" in str(err)):
        errno_ = 28  # ENOSPC
    if errno_:
        return os.strerror(errno_).lower()
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename inside it is durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every file below ``path`` and the directories themselves."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(root)


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON (indent 2, sorted keys, ``default=str``) with :func:`atomic_write`."""
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints in ``output_dir`` as ``(step, path)``, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = _CKPT.match(name)
        path = os.path.join(output_dir, name)
        if match and os.path.isfile(os.path.join(path, STATE_FILE)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(output_dir: str) -> str | None:
    """Path of the newest complete checkpoint, or None."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def temp_dir_for(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"{TMP_PREFIX}{step}")


def remove_stale_temps(output_dir: str) -> None:
    """Remove temporary checkpoint directories left by a killed run (being written or deleted)."""
    if not os.path.isdir(output_dir):
        return
    for name in os.listdir(output_dir):
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def remove_checkpoint(path: str) -> None:
    """Delete a checkpoint directory: rename it out of the ``checkpoint-*`` namespace, then remove it.

    A kill during the removal leaves a ``.tmp-checkpoint-removing-*`` directory (ignored by
    resume, removed by :func:`remove_stale_temps`), never a half-deleted ``checkpoint-<step>``.
    """
    if not os.path.exists(path):
        return
    parent, name = os.path.split(os.path.abspath(path))
    aside = os.path.join(parent, f"{REMOVING_PREFIX}{name}")
    if os.path.exists(aside):
        shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)
    fsync_dir(parent)
    shutil.rmtree(aside, ignore_errors=True)


def commit(tmp_dir: str, final_dir: str, state: dict[str, Any]) -> None:
    """Finish a checkpoint: write the state file last, fsync everything, rename into place.

    An existing ``final_dir`` (a checkpoint of the same step from an earlier attempt) is moved
    aside first and deleted after the rename.
    """
    write_json_atomic(os.path.join(tmp_dir, STATE_FILE), state)
    fsync_tree(tmp_dir)
    parent, name = os.path.split(os.path.abspath(final_dir))
    aside = None
    if os.path.exists(final_dir):
        aside = os.path.join(parent, f"{REMOVING_PREFIX}{name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final_dir, aside)
    os.replace(tmp_dir, final_dir)
    fsync_dir(parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def rotate(output_dir: str, keep: int | None) -> None:
    """Delete the oldest complete checkpoints beyond ``keep`` (None or 0 keeps all)."""
    if keep is None or keep <= 0:
        return
    found = list_checkpoints(output_dir)
    for _step, path in found[: max(0, len(found) - keep)]:
        remove_checkpoint(path)


def _numpy_globals() -> list:
    """The numpy types a pickled RNG state holds (``np.random.get_state()`` is an ndarray)."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_torch_file(path: str) -> Any:
    """``torch.load`` a checkpoint file with ``weights_only=True``: tensors, numbers, strings,
    containers and numpy arrays only.

    Unpickling anything else could run arbitrary code from a checkpoint someone else wrote, so a
    file holding other Python objects is refused with a ``ValueError`` that names it.
    """
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        what = f" (it holds {found.group(1)})" if found else ""
        raise ValueError(
            f"{path} holds pickled Python objects besides tensors, numbers and containers{what}; gtpo loads "
            "checkpoint files with torch.load(weights_only=True) and refuses it, because unpickling it could "
            "run arbitrary code. Resume only from checkpoints written by gtpo"
        ) from err


def rng_state() -> dict[str, Any]:
    """The Python, numpy, torch (and CUDA) random states, in a form :func:`load_torch_file` accepts."""
    import random

    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    import random

    import numpy as np
    import torch

    python = state["python"]  # a tuple pickled as a list of lists by some writers: back to tuples
    random.setstate((python[0], tuple(python[1]), python[2]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_state(checkpoint_dir: str) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint; ValueError naming the path if absent or unreadable."""
    path = os.path.join(checkpoint_dir, STATE_FILE)
    if not os.path.isfile(path):
        hint = ""
        newest = latest_checkpoint(checkpoint_dir)
        if newest is not None:  # an output_dir was given instead of one of its checkpoints
            hint = f" It holds checkpoints; the newest complete one is {newest}."
        raise ValueError(
            f"{checkpoint_dir} is not a complete checkpoint (no {STATE_FILE}).{hint} "
            "Pass a checkpoint-<step> directory written by gtpo, or resume_from_checkpoint=True "
            "(--resume_from_checkpoint true) for the newest complete checkpoint of output_dir"
        )
    try:
        with open(path) as fh:
            state = json.load(fh)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {type(err).__name__}: {err}") from err
    if not isinstance(state, dict) or "global_step" not in state:
        raise ValueError(f"{path} is not a gtpo trainer state (no 'global_step')")
    return state


def atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    """Replace the file ``path`` by ``data``, atomically and durably.

    ``data`` (a ``str`` is written as UTF-8, ``bytes`` as they are) goes into a new temporary file
    ``.<name>.<random hex>.tmp`` in the same directory, which is fsynced, renamed over ``path``
    (``os.replace``, atomic on POSIX and Windows), and the directory is fsynced so that the rename
    survives a power cut. A reader sees the old file or the new one, never a part of either.

    The temporary file is created with mode ``0o666`` minus the process umask (``0o644`` under
    the usual umask 022), the permissions an ordinary ``open(path, "w")`` gives; ``tempfile``
    would leave ``0o600``. Every call has its own temporary name, so two writers of one path
    never write into the same temporary file (the last rename wins).

    Args:
        path: the destination; its directory must exist (the file need not).
        data: the whole new content.

    Raises:
        OSError: the write, the fsync or the rename failed (e.g. ENOSPC); ``UnicodeEncodeError``:
            ``data`` is a ``str`` that is not valid Unicode. On any error (a
            ``KeyboardInterrupt`` too) the temporary file is removed and ``path`` is untouched.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(directory)
