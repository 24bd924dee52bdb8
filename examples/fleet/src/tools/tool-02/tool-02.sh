#!/bin/sh
# tool-02: prints its version, or greets; run by the runtime's run-tool.
. /opt/runtime/lib.sh
case "${1:-}" in
--version) echo "tool-02 1.0 ($(runtime_version))" ;;
*) say "tool-02: hello from $(hostname)" ;;
esac
