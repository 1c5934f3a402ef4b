"""One run at a time in an ``output_dir``: an exclusive ``fcntl.flock`` on ``<output_dir>/.gtpo-run.lock``, held by
the run's main process for the run's life (:meth:`gtpo.run.checkpoint.RunDirectory.prepare` takes it on gtpo's engine,
:func:`gtpo.app.trl_run.run_trl_training` on TRL's).

The lock is the open file's, not the file's: the operating system drops it when the process ends however it ends
(killed, out of memory), so a killed run never leaves a stale lock; the file itself stays (it holds the holder's
pid and start time, for the message a second run gets). A process that already holds the lock of a directory
takes it again at once (a second ``train()`` of the same process).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time

__all__ = ["LOCK_NAME", "RunLock", "claim_run_directory", "lock_run_directory"]

LOCK_NAME = ".gtpo-run.lock"
_HELD: dict[str, "RunLock"] = {}  # realpath of output_dir -> this process's lock on it


class RunLock:
    """The held lock of one ``output_dir`` (:func:`lock_run_directory`); :meth:`release` drops it."""

    def __init__(self, key: str, handle, token: str | None = None):
        self.key, self._handle, self.token = key, handle, token

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        if self._handle is not None:
            if _HELD.get(self.key) is self:
                del _HELD[self.key]
            self._handle.close()  # closing the file drops the flock
            self._handle = None


def lock_run_directory(output_dir: str) -> RunLock:
    """Lock ``output_dir`` (created if missing) for this process, or raise ValueError naming the run that holds it
    (its host, pid and start time) and what to do. Not on a file system without ``flock`` (some network file systems:
    the lock is then skipped with no error, as it cannot be held)."""
    import fcntl

    os.makedirs(output_dir, exist_ok=True)
    key = os.path.realpath(output_dir)
    held = _HELD.get(key)
    if held is not None and held.held:
        return held
    path = os.path.join(output_dir, LOCK_NAME)
    handle = open(path, "a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ValueError(
            f"output_dir {output_dir!r} is being written by another run that is still running ({holder}; lock file "
            f"{path}): two runs in one output_dir would overwrite each other's checkpoints and logs. Wait for that run "
            "to finish (or stop it), or choose another output_dir"
        ) from None
    except OSError:  # no flock on this file system: nothing to hold
        handle.close()
        return RunLock(key, None)
    token = secrets.token_hex(8)  # the other processes read it back: do they see this directory? (claim_run_directory)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, started "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime())}\ntoken {token}\n")
        handle.flush()
    except OSError:
        token = None
    lock = _HELD[key] = RunLock(key, handle, token)
    return lock


def _sees_token(output_dir: str, token: str) -> bool:
    """Whether ``<output_dir>/.gtpo-run.lock``, as this process sees it, holds ``token``."""
    try:
        with open(os.path.join(output_dir, LOCK_NAME)) as fh:
            return f"token {token}" in fh.read()
    except OSError:
        return False


def claim_run_directory(output_dir: str, state, *, shared: bool = True) -> RunLock | None:
    """Collective (every process of ``state``, an ``accelerate`` ``PartialState`` or ``Accelerator``, calls it): the
    main process locks ``output_dir`` (:func:`lock_run_directory`) and returns the lock, the others None; every
    process raises the same ValueError when another run holds it (or the directory cannot be created).

    ``shared`` (the run writes its checkpoints and logs from the main process only and every process reads them on
    resume): every process must see the main process's lock file in its own ``output_dir``. A process on another
    node with a directory of its own (no shared file system, or another path) would train on, and after a resume
    load nothing, so every process raises the same ValueError naming the processes that do not see it and the fix.
    """
    error, lock, token = None, None, None
    if state.is_main_process:
        try:
            lock = lock_run_directory(output_dir)
            token = lock.token
        except ValueError as err:
            error = str(err)
        except OSError as err:
            error = f"cannot create output_dir {output_dir!r}: {err.strerror or err}"
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list, gather_object

        error, token = broadcast_object_list([error, token])
        if error is None and shared and token is not None:
            mine = (state.process_index, state.is_main_process or _sees_token(output_dir, token),
                    socket.gethostname(), os.path.abspath(output_dir))
            seen = gather_object([mine])
            blind = [s for s in seen if not s[1]]
            if blind:
                main = next(s for s in seen if s[0] == 0)
                where = "; ".join(f"process {i} on {host} writes to {path!r}" for i, _, host, path in blind)
                error = (f"output_dir is not shared by the run's processes: the main process (on {main[2]}) locked "
                         f"{main[3]!r}, which {len(blind)} process(es) do not see ({where}). The run writes its "
                         "checkpoints and logs from the main process only and every process loads them on a resume, "
                         "so every node must see the same output_dir: put it on a file system all nodes mount (NFS, "
                         "a mounted bucket) and give every node that path; on TRL's engine (engine: trl), "
                         "save_on_each_node: true saves each node's own copy instead")
    if error is not None:
        if lock is not None:
            lock.release()
        raise ValueError(error)
    return lock
