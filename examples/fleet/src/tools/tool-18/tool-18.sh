#!/bin/sh
# tool-18: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-18 1.0 ($(runtime_version))" ;;
*) say "tool-18: hello from $(hostname)" ;;
esac
