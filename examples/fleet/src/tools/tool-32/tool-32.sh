#!/bin/sh
# tool-32: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-32 1.0 ($(runtime_version))" ;;
*) say "tool-32: hello from $(hostname)" ;;
esac
