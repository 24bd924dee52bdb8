package mesh

import "regexp"

// nameRE is the grammar of a local name: module, seat, verb, tool, bucket.
var nameRE = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// eventRE is the grammar of a local event name: dotted names, each part a
// name or a wildcard (* one name, ** the rest, last only).
var eventRE = regexp.MustCompile(`^([a-z0-9]+(-[a-z0-9]+)*|\*)(\.([a-z0-9]+(-[a-z0-9]+)*|\*))*(\.\*\*)?$`)

// ValidName reports whether s is a valid local name.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// ValidEvent reports whether s is a valid local event name.
func ValidEvent(s string) bool { return eventRE.MatchString(s) }
