"""`gtpo train` whose process group has a short timeout; run under `accelerate launch` (2 CPU processes).

Usage: accelerate launch ... ddp_timeout_train.py TIMEOUT_S train CONFIG.yaml [--option value ...]
The process state is a singleton: made here first with ``timeout``, it is the one the run's trainer then uses
(as ``Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=...)])`` would set it), so a process that waits
in a collective longer than TIMEOUT_S aborts the run, as one waiting past the default 30 minutes would on a GPU.
"""

import datetime
import sys

from accelerate import PartialState


def main():
    timeout, *argv = sys.argv[1:]
    PartialState(cpu=True, timeout=datetime.timedelta(seconds=float(timeout)))
    from gtpo.cli import main as gtpo

    return gtpo(argv)


if __name__ == "__main__":
    sys.exit(main())
