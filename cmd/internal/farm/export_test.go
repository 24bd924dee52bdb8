package farm

// SplitAddr is splitAddr, for the external tests.
var SplitAddr = splitAddr

// StopBuildkitd stops the i-th buildkitd the farm started, as if it had
// exited on its own.
func StopBuildkitd(f *Farm, i int) error { return f.buildkitd(i).Stop() }
