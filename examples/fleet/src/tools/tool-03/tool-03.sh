#!/bin/sh
# tool-03: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-03 1.0 ($(runtime_version))" ;;
*) say "tool-03: hello from $(hostname)" ;;
esac
