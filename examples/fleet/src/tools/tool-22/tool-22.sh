#!/bin/sh
# tool-22: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-22 1.0 ($(runtime_version))" ;;
*) say "tool-22: hello from $(hostname)" ;;
esac
