#!/bin/sh
# tool-33: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-33 1.0 ($(runtime_version))" ;;
*) say "tool-33: hello from $(hostname)" ;;
esac
