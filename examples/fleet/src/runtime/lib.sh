# The fleet runtime's shell library: every tool is run with it loaded.
RUNTIME_HOME=/opt/runtime

runtime_version() { cat "$RUNTIME_HOME/VERSION"; }

# say MESSAGE: one line of output, with the time.
say() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*"; }
