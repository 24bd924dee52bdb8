package mesh

import "time"

// GitSeat is the mesh's own seat whose holder announces pushes.
const GitSeat = "mesh-git"

// EventPushed is the event mesh-git emits for every push.
const EventPushed = "pushed"

// Pushed is mesh-git's event: a ref of a repository moved to a commit.
// Paths, when given, are the paths the push changed (relative to the
// repository root); empty means anything may have changed.
type Pushed struct {
	Version int       `json:"version"`
	Repo    string    `json:"repo"`
	Ref     string    `json:"ref,omitempty"`
	Commit  string    `json:"commit"`
	Paths   []string  `json:"paths,omitempty"`
	At      time.Time `json:"at"`
	// Schedule is what the push asks of the scheduler (optional).
	Schedule *Schedule `json:"schedule,omitempty"`
}
