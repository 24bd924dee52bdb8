#!/bin/sh
# tool-09: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-09 1.0 ($(runtime_version))" ;;
*) say "tool-09: hello from $(hostname)" ;;
esac
