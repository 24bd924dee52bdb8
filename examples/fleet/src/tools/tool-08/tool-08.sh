#!/bin/sh
# tool-08: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-08 1.0 ($(runtime_version))" ;;
*) say "tool-08: hello from $(hostname)" ;;
esac
