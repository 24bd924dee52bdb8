#!/bin/sh
# tool-26: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-26 1.0 ($(runtime_version))" ;;
*) say "tool-26: hello from $(hostname)" ;;
esac
