#!/bin/sh
# tool-17: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-17 1.0 ($(runtime_version))" ;;
*) say "tool-17: hello from $(hostname)" ;;
esac
