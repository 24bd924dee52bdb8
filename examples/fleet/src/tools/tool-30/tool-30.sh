#!/bin/sh
# tool-30: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-30 1.0 ($(runtime_version))" ;;
*) say "tool-30: hello from $(hostname)" ;;
esac
