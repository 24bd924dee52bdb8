#!/bin/sh
# tool-05: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-05 1.0 ($(runtime_version))" ;;
*) say "tool-05: hello from $(hostname)" ;;
esac
