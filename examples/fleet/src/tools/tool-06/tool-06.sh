#!/bin/sh
# tool-06: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-06 1.0 ($(runtime_version))" ;;
*) say "tool-06: hello from $(hostname)" ;;
esac
