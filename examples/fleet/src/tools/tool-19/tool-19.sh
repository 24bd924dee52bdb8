#!/bin/sh
# tool-19: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-19 1.0 ($(runtime_version))" ;;
*) say "tool-19: hello from $(hostname)" ;;
esac
