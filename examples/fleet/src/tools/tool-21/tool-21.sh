#!/bin/sh
# tool-21: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-21 1.0 ($(runtime_version))" ;;
*) say "tool-21: hello from $(hostname)" ;;
esac
