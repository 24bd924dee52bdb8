#!/bin/sh
# tool-27: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-27 1.0 ($(runtime_version))" ;;
*) say "tool-27: hello from $(hostname)" ;;
esac
