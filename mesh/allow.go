package mesh

import "strings"

// AllowList is subjects as a server is given them (ServerPermissions,
// JWTPermissions): less every subject another of them already allows — the
// controller's $JS.API.STREAM.INFO.KV_x under its $JS.API.>, say. The
// server allows exactly what the derived set allows; the list is shorter,
// and a user's JWT must fit in the line it connects with (4 KiB by
// default), which a long catalogue's controller would otherwise pass.
func AllowList(subjects []string) []string {
	out := make([]string, 0, len(subjects))
	for _, s := range subjects {
		covered := false
		for _, w := range subjects {
			if w != s && subjectCovers(w, s) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, s)
		}
	}
	return out
}

// subjectCovers reports whether pattern w matches every subject pattern s
// matches: token by token, "*" covers any one token but ">", and ">" covers
// one or more tokens.
func subjectCovers(w, s string) bool {
	wt, st := strings.Split(w, "."), strings.Split(s, ".")
	for i, t := range wt {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) {
			return false
		}
		switch {
		case t == "*" && st[i] != ">":
		case t != st[i]:
			return false
		}
	}
	return len(st) == len(wt)
}
