package mesh

import (
	"sort"
	"strconv"
	"strings"
)

// Problem is one thing wrong with a catalogue: where it is (file, line,
// field) and, in plain words, what to write instead. A Problem with Warning
// set does not stop a catalogue from being used; any other does.
type Problem struct {
	// File is the manifest's path ("" for a manifest checked in memory).
	File string `json:"file"`
	// Line is the 1-based line of the field in File; 0 when unknown.
	Line int `json:"line"`
	// Field is the path of the field in the manifest, such as
	// "seats[0].accepts[1]", "build.on[2]" or "consumes[0]"; "" for the
	// file as a whole.
	Field string `json:"field"`
	// Message says what is wrong and what to write instead.
	Message string `json:"message"`
	// Warning marks a problem that does not refuse the catalogue.
	Warning bool `json:"warning"`
}

// String formats the problem as "FILE:LINE: FIELD: message", leaving out the
// line when it is unknown and the field when the problem is about the whole
// file. It does not say whether the problem is a warning: a caller that
// prints both kinds marks the warnings.
func (p Problem) String() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(p.Line))
		}
		b.WriteString(": ")
	}
	if p.Field != "" {
		b.WriteString(p.Field)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// HasErrors reports whether any of the problems is an error, not a warning.
func HasErrors(problems []Problem) bool {
	for _, p := range problems {
		if !p.Warning {
			return true
		}
	}
	return false
}

// sortProblems orders problems by file, then line; problems on the same
// line keep the order in which they were found.
func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].File != ps[j].File {
			return ps[i].File < ps[j].File
		}
		return ps[i].Line < ps[j].Line
	})
}
