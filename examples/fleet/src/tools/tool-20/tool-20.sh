#!/bin/sh
# tool-20: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-20 1.0 ($(runtime_version))" ;;
*) say "tool-20: hello from $(hostname)" ;;
esac
