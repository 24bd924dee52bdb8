#!/bin/sh
# tool-24: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-24 1.0 ($(runtime_version))" ;;
*) say "tool-24: hello from $(hostname)" ;;
esac
