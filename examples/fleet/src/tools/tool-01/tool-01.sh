#!/bin/sh
# tool-01: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-01 1.0 ($(runtime_version))" ;;
*) say "tool-01: hello from $(hostname)" ;;
esac
