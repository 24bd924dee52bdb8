#!/bin/sh
# tool-16: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-16 1.0 ($(runtime_version))" ;;
*) say "tool-16: hello from $(hostname)" ;;
esac
