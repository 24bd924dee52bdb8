#!/bin/sh
# tool-07: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-07 1.0 ($(runtime_version))" ;;
*) say "tool-07: hello from $(hostname)" ;;
esac
