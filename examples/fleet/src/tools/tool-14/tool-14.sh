#!/bin/sh
# tool-14: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-14 1.0 ($(runtime_version))" ;;
*) say "tool-14: hello from $(hostname)" ;;
esac
