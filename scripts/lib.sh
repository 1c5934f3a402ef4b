# Sourced by the install scripts. pip_locked CMD...: run CMD holding .pip-install.lock (flock, where the machine
# has it), so that editable installs of this checkout into several venvs at once (scripts/test.sh builds the
# vLLM and verl venvs in the background) do not write its build metadata concurrently.
pip_locked() {
  if command -v flock >/dev/null 2>&1; then
    flock .pip-install.lock "$@"
  else
    "$@"
  fi
}
