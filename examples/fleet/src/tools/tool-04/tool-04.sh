#!/bin/sh
# tool-04: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-04 1.0 ($(runtime_version))" ;;
*) say "tool-04: hello from $(hostname)" ;;
esac
