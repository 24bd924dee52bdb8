#!/bin/sh
# tool-29: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-29 1.0 ($(runtime_version))" ;;
*) say "tool-29: hello from $(hostname)" ;;
esac
