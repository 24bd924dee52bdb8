package planner

import "errors"

// Errors returned by the planner; match them with errors.Is. Each is wrapped
// with what was wrong and what to do instead.
var (
	// ErrTrigger is wrapped when a trigger is malformed: an unknown kind, a
	// push without repository or commit, a rebuild without modules or id.
	ErrTrigger = errors.New("malformed trigger")
	// ErrUnknownModule is wrapped when a rebuild names a module that is not
	// in the catalogue.
	ErrUnknownModule = errors.New("unknown module")
	// ErrNotBuilt is wrapped when a rebuild names a module that is in the
	// catalogue but has no build section.
	ErrNotBuilt = errors.New("module is not built into an image")
	// ErrCycle is wrapped when build.on forms a cycle among planned modules.
	// A checked catalogue has none; this guards an unchecked one.
	ErrCycle = errors.New("build.on cycle")
)
