"""Crash-safe checkpoints: written under a temporary name, fsynced, renamed when complete.

Layout of ``output_dir``::

    checkpoint-<step>/          complete checkpoints (the rename is the commit point)
        model files             save_pretrained of the model (or the peft adapter) + tokenizer
        optimizer.pt scheduler.pt rng_state_<rank>.pth
        trainer_state.json      written last inside the temporary directory
    .tmp-checkpoint-<step>/     a checkpoint being written; never loaded, removed on the next save

A checkpoint counts as complete only when its directory has the final name *and* holds
``trainer_state.json``; a kill at any moment leaves either the previous complete checkpoints
untouched or a temporary directory that resume ignores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

STATE_FILE = "trainer_state.json"
_CKPT = re.compile(r"^checkpoint-(\d+)$")
TMP_PREFIX = ".tmp-checkpoint-"


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
    """Write JSON to ``path`` through a temporary file and ``os.replace``."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


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
    """Remove temporary checkpoint directories left by a killed run."""
    if not os.path.isdir(output_dir):
        return
    for name in os.listdir(output_dir):
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def commit(tmp_dir: str, final_dir: str, state: dict[str, Any]) -> None:
    """Finish a checkpoint: write the state file last, fsync everything, rename into place."""
    write_json_atomic(os.path.join(tmp_dir, STATE_FILE), state)
    fsync_tree(tmp_dir)
    if os.path.exists(final_dir):
        shutil.rmtree(final_dir)
    os.replace(tmp_dir, final_dir)
    fsync_dir(os.path.dirname(os.path.abspath(final_dir)))


def rotate(output_dir: str, keep: int | None) -> None:
    """Delete the oldest complete checkpoints beyond ``keep``."""
    if keep is None or keep <= 0:
        return
    found = list_checkpoints(output_dir)
    for _step, path in found[: max(0, len(found) - keep)]:
        shutil.rmtree(path, ignore_errors=True)


def read_state(checkpoint_dir: str) -> dict[str, Any]:
    path = os.path.join(checkpoint_dir, STATE_FILE)
    if not os.path.isfile(path):
        raise ValueError(
            f"{checkpoint_dir} is not a complete checkpoint (no {STATE_FILE}); "
            "pass a checkpoint-<step> directory written by gtpo, or resume_from_checkpoint=True for the newest"
        )
    with open(path) as fh:
        return json.load(fh)
