#!/bin/sh
# tool-15: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-15 1.0 ($(runtime_version))" ;;
*) say "tool-15: hello from $(hostname)" ;;
esac
