"""The run directory: crash-safe checkpoints, resume, logs and the final model.

Checkpoints are written under a temporary name, fsynced, renamed when complete;
:class:`RunDirectory` is what the trainer uses (every process): it checks and prepares
``output_dir``, appends the logs, writes and loads checkpoints (weights, optimizer, scheduler, RNG)
and saves the final model (:func:`save_model_atomically`).

Layout of ``output_dir``::

    checkpoint-<step>/          complete checkpoints (the rename is the commit point)
        model files             save_pretrained of the model (or the peft adapter) + tokenizer
        optimizer.pt scheduler.pt rng_state_<rank>.pth
                                absent from a checkpoint written with save_only_model (its state says
                                so: "save_only_model": true), which cannot be resumed
        gtpo_trainer_state.json written last inside the temporary directory (gtpo's own schema, so
                                not Hugging Face's trainer_state.json name; older checkpoints that
                                used that name are still read)
    .tmp-checkpoint-<step>/     a checkpoint being written; never loaded, removed on the next start
    .tmp-checkpoint-removing-*  a checkpoint being deleted (rotation, overwrite); removed likewise

A checkpoint counts as complete only when its directory has the final name *and* holds
its state file; a kill at any moment leaves either the previous complete checkpoints
untouched or a temporary directory that resume ignores. Deleting goes the other way: a
checkpoint is first renamed out of the ``checkpoint-<step>`` namespace, then removed, so a kill
in the middle of a deletion never leaves a half-deleted directory that looks complete.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
from typing import Any

from ..errors import CheckpointError

logger = logging.getLogger("gtpo")

STATE_FILE = "gtpo_trainer_state.json"
#: the state file's name in checkpoints written before it was renamed (read, never written)
LEGACY_STATE_FILE = "trainer_state.json"
_ATOMIC_TEMP = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # atomic_write's temporary files
_CKPT = re.compile(r"^checkpoint-(\d+)$")
TMP_PREFIX = ".tmp-checkpoint-"
REMOVING_PREFIX = TMP_PREFIX + "removing-"


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
        if match and _state_path(path) is not None:
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


def move_into_place(tmp_dir: str, final_dir: str, complete) -> None:
    """Rename the finished directory ``tmp_dir`` to ``final_dir`` where several processes may build the same one (a
    converted model, a benchmark model): where ``final_dir`` already exists, keep it when ``complete()`` says it is
    whole (another process finished first; ``tmp_dir`` is discarded), else replace it (an older or partial build)."""
    try:
        os.replace(tmp_dir, final_dir)
        return
    except OSError:
        pass
    if complete():
        shutil.rmtree(tmp_dir, ignore_errors=True)
        return
    shutil.rmtree(final_dir, ignore_errors=True)
    try:
        os.replace(tmp_dir, final_dir)
    except OSError:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if not complete():
            raise


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


def load_torch_file(path: str, map_location: Any = "cpu") -> Any:
    """``torch.load`` a checkpoint file with ``weights_only=True``: tensors, numbers, strings,
    containers and numpy arrays only; its tensors land on ``map_location`` (default the CPU: not the
    device they were saved from, which on a GPU run is the main process's GPU for every process; a CPU device
    with an index, as a CPU DDP process's ``cpu:<rank>``, is the CPU).

    Unpickling anything else could run arbitrary code from a checkpoint someone else wrote, so a
    file holding other Python objects is refused with a ``ValueError`` that names it.
    """
    import pickle

    import torch

    if isinstance(map_location, torch.device) and map_location.type == "cpu":
        map_location = "cpu"  # a CPU DDP process's device is cpu:<rank>, which torch.load cannot restore to
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, weights_only=True, map_location=map_location)
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


def _state_path(checkpoint_dir: str) -> str | None:
    """The state file of a gtpo checkpoint (:data:`STATE_FILE`, or :data:`LEGACY_STATE_FILE` of an older one), or
    None. A ``trainer_state.json`` in Hugging Face's schema (``log_history``: a checkpoint of TRL's engine) is not
    gtpo's."""
    path = os.path.join(checkpoint_dir, STATE_FILE)
    if os.path.isfile(path):
        return path
    legacy = os.path.join(checkpoint_dir, LEGACY_STATE_FILE)
    if os.path.isfile(legacy) and not _hf_trainer_state(legacy):
        return legacy
    return None


def _hf_trainer_state(path: str) -> bool:
    """Whether ``path`` is a Hugging Face ``TrainerState`` file (it has ``log_history``)."""
    try:
        with open(path) as fh:
            return "log_history" in json.load(fh)
    except (OSError, ValueError, TypeError):
        return False


def read_state(checkpoint_dir: str) -> dict[str, Any]:
    """The gtpo state file of a checkpoint; ValueError naming the path if absent or unreadable."""
    path = _state_path(checkpoint_dir)
    if path is None:
        legacy = os.path.join(checkpoint_dir, LEGACY_STATE_FILE)
        if os.path.isfile(legacy):
            raise ValueError(
                f"{checkpoint_dir} is a checkpoint of TRL's engine (Hugging Face's {LEGACY_STATE_FILE}), not of gtpo's "
                "trainer: resume it with the same engine (engine: trl, --engine trl)"
            )
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


def refuse_model_only(path: str, state: dict[str, Any]) -> None:
    """ValueError when the checkpoint ``path`` (its ``state``) was written with ``save_only_model``: it has no
    optimizer, scheduler or RNG state, so a run cannot resume from it (transformers' Trainer cannot either)."""
    if not state.get("save_only_model"):
        return
    parent = os.path.dirname(os.path.abspath(path))
    full = [p for _s, p in list_checkpoints(parent) if not _model_only(p)]
    other = (f" The complete checkpoints of {parent}: {', '.join(full)}; resume from one of them with "
             "resume_from_checkpoint=PATH (--resume_from_checkpoint PATH)." if full else "")
    raise ValueError(
        f"cannot resume from {path}: it was written with save_only_model: true, so it holds the model and tokenizer "
        f"but no optimizer, scheduler or RNG state (transformers' Trainer cannot resume from such a checkpoint "
        f"either).{other} To train its weights further, start a new run from it as a model (model: {path}); to "
        "write resumable checkpoints, set save_only_model: false"
    )


def _model_only(path: str) -> bool:
    try:
        return bool(read_state(path).get("save_only_model"))
    except ValueError:
        return True


def load_weights(model, path: str, *, peft: bool) -> None:
    """Load weights saved by ``save_pretrained`` in ``path`` into ``model`` exactly (the adapter only
    for a peft model)."""
    from safetensors.torch import load_file

    if peft:
        from peft import set_peft_model_state_dict

        file = os.path.join(path, "adapter_model.safetensors")
        if not os.path.isfile(file):
            raise ValueError(f"checkpoint {path} has no adapter_model.safetensors (was it saved from a LoRA run?)")
        set_peft_model_state_dict(model, load_file(file))
        return
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"checkpoint {path} has no .safetensors weights")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(os.path.join(path, f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set()
    if getattr(model.config, "tie_word_embeddings", False):
        tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")


@contextlib.contextmanager
def no_transformers_progress_bars():
    """transformers' progress bars off inside the block (``save_pretrained``'s "Writing model shards", drawn inside
    the training bar at every checkpoint), restored afterwards."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# files that say "this directory holds a model": moved into place last, so that a kill while moving
# never leaves them next to partial weights
_MODEL_MARKERS = ("config.json", "adapter_config.json")


def cast_state_dict(model, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``model``'s state dict with its floating-point tensors in ``dtype`` (what ``save_pretrained`` writes for a
    model loaded in ``dtype``): integer and bool buffers, and the modules transformers keeps in float32 at any load
    dtype (``_keep_in_fp32_modules_strict``), as they are; tensors that share memory (tied weights) stay one tensor,
    so that ``save_pretrained`` still recognises the tie. Costs one ``dtype`` copy of the weights in host or device
    memory while saving; the model itself is unchanged."""
    keep = set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    cast: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point() or tensor.dtype == dtype or keep & set(name.split(".")):
            out[name] = tensor
            continue
        key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.device)
        if key not in cast:
            cast[key] = tensor.to(dtype)
        out[name] = cast[key]
    return out


def _set_config_dtype(directory: str, dtype: torch.dtype) -> None:
    """Make ``directory/config.json`` name ``dtype`` (``save_pretrained`` writes the in-memory model's dtype, float32
    master weights, even when given a cast state dict); ``torch_dtype`` too where the file has that older key."""
    path = os.path.join(directory, "config.json")
    with open(path) as fh:
        config = json.load(fh)
    name = str(dtype).removeprefix("torch.")
    config["dtype"] = name
    if "torch_dtype" in config:
        config["torch_dtype"] = name
    with open(path, "w") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
        fh.write("\n")


def save_model_atomically(model, tokenizer, output_dir: str, *, dtype: torch.dtype | None = None) -> None:
    """``save_pretrained`` of ``model`` (or its peft adapter) and ``tokenizer`` into ``output_dir``; with ``dtype``
    (a full model, not an adapter) its floating-point weights are written in ``dtype`` (:func:`cast_state_dict`)
    and ``config.json`` says so, as a model loaded and saved in ``dtype`` by transformers' Trainer would be.

    Everything is written to ``output_dir/.tmp-final`` and fsynced, then moved in file by file with
    ``os.replace``, ``config.json`` / ``adapter_config.json`` last: a crash leaves the previous
    files or the new ones, never a config next to half-written weights. Raises what the writes raise
    (the temporary directory is removed).
    """
    tmp = os.path.join(output_dir, ".tmp-final")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        with no_transformers_progress_bars():
            if dtype is None:
                model.save_pretrained(tmp, safe_serialization=True)
            else:
                model.save_pretrained(tmp, safe_serialization=True, state_dict=cast_state_dict(model, dtype))
                _set_config_dtype(tmp, dtype)
        tokenizer.save_pretrained(tmp)
        fsync_tree(tmp)
        for name in sorted(os.listdir(tmp), key=lambda n: (n in _MODEL_MARKERS, n)):
            os.replace(os.path.join(tmp, name), os.path.join(output_dir, name))
        os.rmdir(tmp)
        fsync_dir(output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def append_jsonl(path: str, obj: dict) -> None:
    """Append one JSON line (flushed; fsynced with the next checkpoint)."""
    with open(path, "a") as fh:
        fh.write(json.dumps(obj, default=float) + "\n")
        fh.flush()


def truncate_jsonl(path: str, step: int) -> None:
    """Keep only the lines of steps <= ``step`` of a JSON-lines log (a resumed run logs the later ones
    again). Starting from step 0 keeps nothing; a line cut by a kill is dropped."""
    if not os.path.isfile(path):
        return
    kept = []
    with open(path) as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if step > 0 and isinstance(obj, dict) and obj.get("step", 0) <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write("".join(kept))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# files of a run in output_dir (what "output_dir already holds a run" means, and what overwriting removes)
RUN_FILES = ("metrics.jsonl", "completions.jsonl", "run_config.json", "summary.json")


def final_model_file(output_dir: str) -> str | None:
    """The file that marks a final model in ``output_dir`` (``config.json`` or ``adapter_config.json``), or None."""
    for name in _MODEL_MARKERS:  # moved into place last: present only next to complete weights
        path = os.path.join(output_dir, name)
        if os.path.isfile(path):
            return path
    return None


def refuse_resuming_a_finished_run(output_dir: str, newest: str | None) -> None:
    """ValueError when ``output_dir`` holds a finished run (its final model): resuming it would train again from a
    checkpoint and replace that model. The message gives the command that continues it into a new ``output_dir``
    from ``newest`` (its newest checkpoint, of whichever engine; None: it saved none)."""
    final = final_model_file(output_dir)
    if final is None:
        return
    how = (f"resume into a new output_dir from its checkpoint: --output_dir <new dir> --resume_from_checkpoint "
           f"{newest} (output_dir=..., resume_from_checkpoint={newest!r})" if newest else
           "start a new run in another output_dir (this run saved no checkpoint)")
    raise ValueError(
        f"output_dir {output_dir!r} holds a finished run (its final model: {final}); resuming would train it again "
        f"from a checkpoint and replace that model. To train it further, {how}; or set "
        "overwrite_output_dir=True (--overwrite) to replace the final model"
    )


def completed_a_step(output_dir: str) -> bool:
    """Whether the run in ``output_dir`` completed a training step: it has a checkpoint (complete or not), a
    final model, ``summary.json``, or a ``metrics.jsonl`` line of a step >= 1 (a line of step 0, the probes
    before training, is not one)."""
    if not os.path.isdir(output_dir):
        return False
    names = os.listdir(output_dir)
    if any(n.startswith(("checkpoint-", TMP_PREFIX)) for n in names) or "summary.json" in names \
            or final_model_file(output_dir) is not None:
        return True
    path = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as fh:
        for line in fh:
            try:
                step = json.loads(line).get("step", 0)
            except (ValueError, AttributeError):
                continue  # a line cut by a kill, or not an object
            if isinstance(step, (int, float)) and step >= 1:
                return True
    return False
RESUME_HINT = "resume with resume_from_checkpoint=True (gtpo train ... --resume_from_checkpoint true)"


class RunDirectory:
    """The output directory of a run as every process sees it: checks, logs, checkpoints, final model.

    Collective methods (every process calls them; they synchronise through ``accelerator``):
    :meth:`prepare`, :meth:`drop_later_checkpoints`, :meth:`save_checkpoint`, :meth:`save_model`.
    Logs and files of the main process are written by it alone.

    Args:
        output_dir: the run's directory.
        accelerator: the ``accelerate.Accelerator`` of the run (process index, collectives).
    """

    def __init__(self, output_dir: str, accelerator):
        self.output_dir = output_dir
        self.acc = accelerator

    def path(self, name: str) -> str:
        return os.path.join(self.output_dir, name)

    # ------------------------------------------------------------------ notes for messages
    def checkpoint_note(self) -> str:
        newest = latest_checkpoint(self.output_dir)
        return "No checkpoint has been written yet." if newest is None else \
            f"The newest complete checkpoint is {newest}."

    def intact_note(self) -> str:
        newest = latest_checkpoint(self.output_dir)
        if newest is None:
            return "no earlier checkpoint exists (the run would restart from step 0)."
        return f"the previous checkpoint {os.path.basename(newest)} is intact ({newest})."

    # ------------------------------------------------------------------ starting a run
    def resolve_resume(self, value) -> str | None:
        """The checkpoint ``resume_from_checkpoint`` points to: True / "true" the newest complete one of
        ``output_dir`` (None, with a warning, if there is none), a path that checkpoint; False/None none."""
        if isinstance(value, str) and value.strip().lower() in ("false", "no", "none", "null", ""):
            value = None
        if value is None or value is False:
            return None
        if value is True or (isinstance(value, str) and value.strip().lower() == "true"):
            path = latest_checkpoint(self.output_dir)
            if path is None:
                logger.warning("resume_from_checkpoint=True but %s has no complete checkpoint: starting from step 0",
                               self.output_dir)
            else:
                refuse_model_only(path, read_state(path))
            return path
        if not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"resume_from_checkpoint must be True, False/None or a checkpoint directory, got {value!r}")
        path = os.fspath(value)
        if not os.path.isdir(path):
            newest = latest_checkpoint(self.output_dir)
            hint = f"; the newest complete checkpoint of output_dir is {newest}" if newest else ""
            raise ValueError(f"resume_from_checkpoint: {path!r} is not a directory{hint}")
        refuse_model_only(path, read_state(path))
        return path

    def prepare(self, *, resuming: bool, overwrite: bool) -> None:
        """Refuse an output_dir holding another run unless resuming or overwriting (whose run files and
        checkpoints are then removed); create it; remove what a killed run left (temporary checkpoints,
        a half-moved final model, half-written logs).

        The files of an earlier attempt that never completed a step (it failed while starting: a bad
        reward function, a model that does not fit) are not a run: they are replaced without
        ``overwrite``. Resuming a finished run (its final model is in ``output_dir``) is refused unless
        ``overwrite``: it would train again from a checkpoint and replace that model; the message says
        how to continue it into a new ``output_dir``."""
        acc, out = self.acc, self.output_dir
        if os.path.exists(out) and not os.path.isdir(out):
            raise ValueError(f"output_dir {out!r} exists and is not a directory; choose another output_dir")
        self.claim()  # before anything is read or removed: another run may be writing out
        if resuming and not overwrite:
            refuse_resuming_a_finished_run(out, latest_checkpoint(out))
        existing = []
        if not resuming and os.path.isdir(out):
            existing = [n for n in os.listdir(out) if n in RUN_FILES or n.startswith("checkpoint-")]
        if existing and not overwrite and not completed_a_step(out):
            logger.info("output_dir %s holds the files of an attempt that completed no step (%s): replacing them",
                        out, ", ".join(sorted(existing)))
            overwrite = True
        if existing and not overwrite:
            raise ValueError(
                f"output_dir {out!r} already holds a run ({', '.join(sorted(existing)[:3])}); "
                "resume it (resume_from_checkpoint=True / --resume_from_checkpoint true), choose another "
                "output_dir, or set overwrite_output_dir=True (--overwrite) to replace it"
            )
        acc.wait_for_everyone()
        if acc.is_main_process:
            for name in existing:
                path = self.path(name)
                remove_checkpoint(path) if os.path.isdir(path) else os.remove(path)
        try:  # every process (no process may wait for one that failed)
            os.makedirs(out, exist_ok=True)
        except OSError as err:
            raise ValueError(f"cannot create output_dir {out!r}: {err.strerror or err}") from err
        if acc.is_main_process:  # leftovers of a killed run: never loaded, removed here
            remove_stale_temps(out)
            shutil.rmtree(self.path(".tmp-final"), ignore_errors=True)
            for name in os.listdir(out):  # truncate_jsonl's <log>.tmp, atomic_write's .<file>.<hex>.tmp
                if name in {f + ".tmp" for f in RUN_FILES} or _ATOMIC_TEMP.match(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(self.path(name))
        acc.wait_for_everyone()

    def claim(self) -> None:
        """Collective: the main process locks ``output_dir`` for this run (:mod:`gtpo.run.lock`; held until
        :meth:`release` or the process ends); every process raises the same ValueError when another run that is
        still running holds it."""
        from .lock import claim_run_directory

        self._lock = claim_run_directory(self.output_dir, self.acc)

    def release(self) -> None:
        """Drop this run's lock on ``output_dir`` (:meth:`claim`); a no-op where none is held."""
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()
            self._lock = None

    def drop_later_checkpoints(self, resumed: str, step: int) -> None:
        """Resuming ``output_dir`` from an older checkpoint (at ``step``) abandons the steps after it:
        their checkpoints are removed, so that a later resume=True cannot pick one of them."""
        if os.path.abspath(os.path.dirname(os.path.abspath(resumed))) != os.path.abspath(self.output_dir):
            return
        later = [p for s, p in list_checkpoints(self.output_dir) if s > step]
        if later and self.acc.is_main_process:
            logger.warning("resuming from step %d: removing the checkpoints of later steps %s (they belong to the "
                           "abandoned continuation of this run)", step, ", ".join(os.path.basename(p) for p in later))
            for path in later:
                remove_checkpoint(path)
        self.acc.wait_for_everyone()

    def start_logs(self, step: int, run_config: dict[str, Any]) -> None:
        """Main process: drop log lines of steps after ``step`` (a resumed run logs them again) and write
        ``run_config.json``."""
        if not self.acc.is_main_process:
            return
        try:
            truncate_jsonl(self.path("metrics.jsonl"), step)
            truncate_jsonl(self.path("completions.jsonl"), step)
            write_json_atomic(self.path("run_config.json"), run_config)
        except OSError as err:
            raise CheckpointError(f"cannot write to output_dir {self.output_dir}: {describe_write_error(err)}") from err

    def append(self, name: str, obj: dict) -> None:
        """Main process: append a line to the log ``name``; a failed write raises CheckpointError."""
        path = self.path(name)
        try:
            append_jsonl(path, obj)
        except OSError as err:
            raise CheckpointError(
                f"{describe_write_error(err)} while appending step {obj.get('step')} to {path}; "
                f"{self.checkpoint_note()} Free some space and {RESUME_HINT}"
            ) from err

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int, *, model, tokenizer, optimizer, scheduler, state: dict[str, Any],
                        save_total_limit: int | None, model_only: bool = False) -> str:
        """Write ``checkpoint-<step>`` atomically (collective); returns its path. ``model_only`` (``save_only_model``):
        the model and tokenizer without the optimizer, scheduler and RNG states, marked ``"save_only_model": true``
        in its state (:meth:`load_checkpoint` and :meth:`resolve_resume` refuse it).

        Everything goes into ``.tmp-checkpoint-<step>``, is fsynced, and the directory is renamed to
        ``checkpoint-<step>`` (the commit point). If writing fails on any process (a full disk, a
        quota, an I/O error), the temporary directory is removed, the older checkpoints are untouched,
        and :class:`CheckpointError` names what failed, where, and the newest intact checkpoint.
        """
        acc = self.acc
        final = self.path(f"checkpoint-{step}")
        tmp = temp_dir_for(self.output_dir, step)

        def stage(write) -> None:
            error = None
            try:
                write()
            except Exception as err:  # noqa: BLE001 -- any write failure (OSError, safetensors', torch's) is reported
                error = err
            self._raise_if_failed(error, final, tmp)

        def make_tmp() -> None:
            if acc.is_main_process:
                for name in ("metrics.jsonl", "completions.jsonl"):  # the logs of these steps become durable first
                    if os.path.isfile(self.path(name)):
                        with open(self.path(name), "rb") as fh:
                            os.fsync(fh.fileno())
                shutil.rmtree(tmp, ignore_errors=True)
                os.makedirs(tmp)

        def write_files() -> None:
            import torch

            if acc.is_main_process:
                with no_transformers_progress_bars():
                    model.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
                if not model_only:
                    torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
                    torch.save(scheduler.state_dict(), os.path.join(tmp, "scheduler.pt"))
            if not model_only:
                torch.save(rng_state(), os.path.join(tmp, f"rng_state_{acc.process_index}.pth"))

        def commit_tmp() -> None:
            if acc.is_main_process:
                commit(tmp, final, {**state, "save_only_model": True} if model_only else state)

        stage(make_tmp)
        stage(write_files)
        stage(commit_tmp)
        if acc.is_main_process:
            try:
                rotate(self.output_dir, save_total_limit)
            except OSError as err:  # the new checkpoint is complete; an old one simply stays
                logger.warning("could not delete old checkpoints in %s: %s", self.output_dir, err)
        acc.wait_for_everyone()
        return final

    def _raise_if_failed(self, error: Exception | None, final: str, tmp: str) -> None:
        """Collective: if writing failed on any process, remove the temporary directory and raise."""
        acc = self.acc
        failed = error is not None
        if acc.num_processes > 1:
            import torch

            failed = bool(acc.reduce(torch.tensor(float(failed), device=acc.device), "max"))
        if not failed:
            return
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        what = describe_write_error(error) if error is not None else "a write failure on another process"
        raise CheckpointError(
            f"{what} while writing {os.path.basename(final)} in {self.output_dir}; {self.intact_note()} "
            f"Free some space (or lower save_total_limit) and {RESUME_HINT}"
        ) from error

    def load_checkpoint(self, path: str, *, model, optimizer, scheduler, peft: bool) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler and this process's RNG from ``path``; returns its
        trainer state (the caller restores its own counters from it). An unreadable checkpoint raises
        ``ValueError`` naming it and the other complete checkpoints."""
        state = read_state(path)
        refuse_model_only(path, state)
        rng = os.path.join(path, f"rng_state_{self.acc.process_index}.pth")
        try:
            load_weights(model, path, peft=peft)
            # straight onto this process's device (the main process saved it from its own GPU)
            optimizer.load_state_dict(load_torch_file(os.path.join(path, "optimizer.pt"), map_location=self.acc.device))
            scheduler.load_state_dict(load_torch_file(os.path.join(path, "scheduler.pt")))
            rng_states = load_torch_file(rng) if os.path.isfile(rng) else None
        except Exception as err:  # noqa: BLE001 -- name the checkpoint and the alternatives
            parent = os.path.dirname(os.path.abspath(path))
            older = [p for _s, p in list_checkpoints(parent) if os.path.abspath(p) != os.path.abspath(path)]
            hint = (f" Other complete checkpoints: {', '.join(older)}; resume from one of them with "
                    "resume_from_checkpoint=PATH (--resume_from_checkpoint PATH)." if older else "")
            raise ValueError(f"cannot load checkpoint {path}: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}.{hint}") from err
        if rng_states is not None:
            set_rng_state(rng_states)
        else:
            logger.warning("%s has no %s: the random streams restart from the seed (the run stays valid but is "
                           "not bitwise identical to an uninterrupted one)", path, os.path.basename(rng))
        return state

    def save_model(self, model, tokenizer, output_dir: str | None = None, *, dtype: torch.dtype | None = None) -> None:
        """Save the final model (or adapter) and tokenizer (collective; the main process writes),
        replacing the old files atomically (:func:`save_model_atomically`; ``dtype``: the full model's weights in
        that dtype, None: as held). Checkpoints keep the weights as held (float32 master weights: what a bitwise
        resume loads). A failure raises
        :class:`CheckpointError`; the checkpoints are untouched, so resuming writes it again."""
        out = output_dir or self.output_dir
        self.acc.wait_for_everyone()
        if not self.acc.is_main_process:
            return
        try:
            save_model_atomically(model, tokenizer, out, dtype=dtype)
        except Exception as err:  # noqa: BLE001 -- any write failure is reported the same way
            raise CheckpointError(
                f"{describe_write_error(err)} while writing the final model to {out}; {self.checkpoint_note()} "
                f"Free some space and {RESUME_HINT} to write it again"
            ) from err


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
