package cascade

// Counts are how many modules of a plan are in each state.
type Counts struct {
	Waiting    int `json:"waiting"`
	Ready      int `json:"ready"`
	Queued     int `json:"queued"`
	Building   int `json:"building"`
	Built      int `json:"built"`
	Unchanged  int `json:"unchanged,omitempty"`
	Failed     int `json:"failed"`
	Blocked    int `json:"blocked"`
	Cancelling int `json:"cancelling,omitempty"`
	Cancelled  int `json:"cancelled"`
	Superseded int `json:"superseded,omitempty"`
	Total      int `json:"total"`
}

// add is the sum of two counts.
func (c Counts) add(o Counts) Counts {
	return Counts{Waiting: c.Waiting + o.Waiting, Ready: c.Ready + o.Ready, Queued: c.Queued + o.Queued,
		Building: c.Building + o.Building, Built: c.Built + o.Built, Unchanged: c.Unchanged + o.Unchanged,
		Failed: c.Failed + o.Failed, Blocked: c.Blocked + o.Blocked, Cancelling: c.Cancelling + o.Cancelling,
		Cancelled: c.Cancelled + o.Cancelled, Superseded: c.Superseded + o.Superseded, Total: c.Total + o.Total}
}

// ByState is the counts by module state name, every state present.
func (c Counts) ByState() map[string]int {
	return map[string]int{
		string(Waiting): c.Waiting, string(Ready): c.Ready, string(Queued): c.Queued, string(Building): c.Building,
		string(Built): c.Built, string(Unchanged): c.Unchanged, string(Failed): c.Failed, string(Blocked): c.Blocked,
		string(Cancelling): c.Cancelling, string(Cancelled): c.Cancelled, string(Superseded): c.Superseded,
	}
}

// Settled reports whether nothing can progress any more: no module waiting,
// ready, queued, building or cancelling. (Failed and blocked modules wait for
// a Retry, which un-settles the plan.)
func (s *State) Settled() bool { return s.Counts().inFlight() == 0 }

// Finished counts the modules that have their result (ModuleState.Finished).
func (c Counts) Finished() int {
	return c.Built + c.Unchanged + c.Failed + c.Blocked + c.Cancelled + c.Superseded
}

// inFlight counts the modules that can still progress.
func (c Counts) inFlight() int { return c.Waiting + c.Ready + c.Queued + c.Building + c.Cancelling }

// Counts counts the modules in each state.
func (s *State) Counts() Counts {
	s.ensure()
	n := s.ix.census
	return Counts{
		Total: len(s.Modules), Waiting: n[Waiting], Ready: n[Ready], Queued: n[Queued], Building: n[Building],
		Built: n[Built], Unchanged: n[Unchanged], Failed: n[Failed], Blocked: n[Blocked],
		Cancelling: n[Cancelling], Cancelled: n[Cancelled], Superseded: n[Superseded],
	}
}

// Outcome is the plan's result: running until settled; then cancelled if it
// was cancelled, built if every module is built (or unchanged, or
// superseded), failed otherwise. An empty plan is built.
func (s *State) Outcome() Outcome {
	c := s.Counts()
	switch {
	case c.inFlight() > 0:
		return OutcomeRunning
	case !s.Cancelled.IsZero():
		return OutcomeCancelled
	case c.Built+c.Unchanged+c.Superseded == c.Total:
		return OutcomeBuilt
	default:
		return OutcomeFailed
	}
}
