#!/bin/sh
# tool-34: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-34 1.0 ($(runtime_version))" ;;
*) say "tool-34: hello from $(hostname)" ;;
esac
