// Package planner turns a change into a plan: which modules to build, in
// which order, and why. It does no I/O; a plan is a pure, immutable value,
// checkable without a bus, a registry or a daemon (as BuildKit's client/llb
// states are). Executing a plan is the cascade package's job.
//
// # Vocabulary
//
// A trigger is what happened: a push (a repository, a commit, optionally the
// changed paths) or a rebuild (modules an operator asked for, under a request
// id). The plan id is derived from the trigger alone ([PlanID]), so the same
// push always gives the same plan id, and the asks of a plan submitted twice
// are deduplicated by the bus.
//
// The selection is the set of modules the trigger names directly:
//
//   - push: every built module whose build.repo is the pushed repository
//     (compared after [NormaliseRepo]: a trailing ".git" and trailing "/" do
//     not matter). When the trigger lists changed paths, only modules whose
//     build.path is a directory containing a changed path (or whose Dockerfile
//     is a changed path) are selected; build.path "" or "." is the whole
//     repository.
//   - rebuild: the named modules. A name that is not in the catalogue is
//     [ErrUnknownModule]; a module without a build section is [ErrNotBuilt].
//
// The plan is the selection plus every module built on it, transitively,
// through build.on. A trigger that selects nothing gives an empty plan and
// no error; [Plan.Empty] tells, and the caller says so.
//
// A node's in-plan bases are the bases (from build.on) that are themselves in
// the plan: the module is built after them, pinned to the digests they are
// built at. Its other bases are external: they are not rebuilt and stay at
// their current digest, which the caller resolves from the registry
// ([Plan.External] lists each with the plan modules that need it).
//
// A node's tier is its longest path from a module with no in-plan base:
// tier 0 has no in-plan base; a→b→c and a→c put c in tier 2. Tiers are a
// view (for `builds explain`); the cascade does not wait for a tier to
// finish before starting the next.
//
// # Commits
//
// A node's source commit is the trigger's commit when the module is built
// from the triggering repository. For a module from any other repository
// (one built on a changed module, or any module of a rebuild without a
// commit) the commit is left empty, meaning "its current commit": the caller
// resolves it (the commit of the module's current image, or its repository's
// default branch) before it asks for a build.
//
// # Example
//
// A catalogue with runtime (built from https://git.example/fleet.git, path
// runtime) and tool-a and tool-b built on runtime. A push to fleet.git
// changing runtime/Dockerfile plans:
//
//	TIER  MODULE   REASON                            COMMIT
//	0     runtime  changed path runtime/Dockerfile   9fceb02
//	1     tool-a   built on runtime (in plan)        (current)
//	      tool-b   built on runtime (in plan)        (current)
//
// Building the index of a catalogue ([NewIndex]) is done once; an [Index] is
// immutable and plans any number of triggers, concurrently.
package planner
