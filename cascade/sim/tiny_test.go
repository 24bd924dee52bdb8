package sim

import "os"

// benchTiny: MESHBUILD_BENCH=tiny, which `make test` sets when it runs
// every benchmark once so that the checks inside them keep running.
func benchTiny() bool { return os.Getenv("MESHBUILD_BENCH") == "tiny" }
