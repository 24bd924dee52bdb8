#!/bin/sh
# tool-35: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-35 1.0 ($(runtime_version))" ;;
*) say "tool-35: hello from $(hostname)" ;;
esac
