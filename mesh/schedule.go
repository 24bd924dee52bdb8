package mesh

// Schedule is what a push or a rebuild asks of the controller's scheduler
// for its plan, beside what to build: carried by the pushed event
// (Pushed.Schedule) and by a rebuild's tool request. Every field is
// optional.
type Schedule struct {
	// Priority is the plan's priority, higher first (MinPriority to
	// MaxPriority); nil takes the default the catalogue declares for the
	// pushed ref (Build.Priority), else 0.
	Priority *int `json:"priority,omitempty"`
	// Owner is whom the plan's machine-time counts to for fair share;
	// empty is the trigger's repository.
	Owner string `json:"owner,omitempty"`
	// Cap is the most machines the plan may hold at once; 0 is no cap.
	Cap int `json:"cap,omitempty"`
	// CancelSuperseded cancels the builds in flight of the older plans
	// this plan supersedes, instead of letting them finish.
	CancelSuperseded bool `json:"cancel_superseded,omitempty"`
}
