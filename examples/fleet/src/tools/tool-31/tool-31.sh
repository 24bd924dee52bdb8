#!/bin/sh
# tool-31: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-31 1.0 ($(runtime_version))" ;;
*) say "tool-31: hello from $(hostname)" ;;
esac
