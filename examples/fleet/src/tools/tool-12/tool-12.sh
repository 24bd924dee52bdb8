#!/bin/sh
# tool-12: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-12 1.0 ($(runtime_version))" ;;
*) say "tool-12: hello from $(hostname)" ;;
esac
