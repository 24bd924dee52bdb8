#!/bin/sh
# tool-11: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-11 1.0 ($(runtime_version))" ;;
*) say "tool-11: hello from $(hostname)" ;;
esac
