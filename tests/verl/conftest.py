"""tests/verl run in the verl venv (bash scripts/test-verl.sh): verl pins its own transformers. Elsewhere (gtpo's main
venv, no verl) the folder is not collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("verl") is not None else ["*.py"]
