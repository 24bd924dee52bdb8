#!/bin/sh
# tool-28: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-28 1.0 ($(runtime_version))" ;;
*) say "tool-28: hello from $(hostname)" ;;
esac
