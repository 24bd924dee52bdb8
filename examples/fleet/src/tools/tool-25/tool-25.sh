#!/bin/sh
# tool-25: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-25 1.0 ($(runtime_version))" ;;
*) say "tool-25: hello from $(hostname)" ;;
esac
