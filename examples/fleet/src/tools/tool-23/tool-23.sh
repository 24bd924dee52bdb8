#!/bin/sh
# tool-23: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-23 1.0 ($(runtime_version))" ;;
*) say "tool-23: hello from $(hostname)" ;;
esac
