#!/bin/sh
# tool-13: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-13 1.0 ($(runtime_version))" ;;
*) say "tool-13: hello from $(hostname)" ;;
esac
