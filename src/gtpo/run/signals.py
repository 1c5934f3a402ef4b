"""Stopping a run of gtpo's trainer cleanly (docs/fault-tolerance.md): SIGTERM / SIGINT finish the current step,
the trainer saves a checkpoint and returns; a second signal reaches the previous handler (default: exit at once;
checkpoints are atomic, so nothing is corrupted)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Callable

import torch

logger = logging.getLogger("gtpo")

__all__ = ["install_stop_handlers", "restore_handlers", "stop_requested"]


def install_stop_handlers(on_stop: Callable[[int], None]) -> dict:
    """Install the SIGTERM/SIGINT handler that calls ``on_stop(signum)`` and gives the signals back to their previous
    handlers (so a second one stops at once); returns those previous handlers (:func:`restore_handlers`). Outside
    the main thread (where Python cannot install handlers) nothing is installed."""
    previous = {}

    def handler(signum, _frame):
        on_stop(signum)
        for s, h in previous.items():
            signal.signal(s, h)
        logger.warning("received %s: finishing the current step, then saving a checkpoint "
                       "(send it again to stop at once)", signal.Signals(signum).name)

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGINT):
            previous[s] = signal.getsignal(s)
            signal.signal(s, handler)
    return previous


def restore_handlers(previous: dict) -> None:
    """Give the signals of :func:`install_stop_handlers` back to the handlers it returned."""
    for s, h in previous.items():
        signal.signal(s, h)


def stop_requested(received: bool, accelerator) -> bool:
    """Whether a stop signal reached any process (``received``: this one's; one collective per step with several
    processes)."""
    flag = received
    if accelerator.num_processes > 1:
        t = torch.tensor(float(flag), device=accelerator.device)
        flag = bool(accelerator.reduce(t, "max"))
    return flag
