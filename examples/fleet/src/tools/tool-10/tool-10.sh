#!/bin/sh
# tool-10: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-10 1.0 ($(runtime_version))" ;;
*) say "tool-10: hello from $(hostname)" ;;
esac
