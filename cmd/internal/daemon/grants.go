package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/mesh"
)

// grantedPlatforms keeps, of platforms, those the credentials in file grant
// a holder of the build seat: the platform's holders' consumer's ack grant
// (mesh.AckSubject) is among the subjects they may publish. The others are
// dropped, said once, so that the agent never binds a queue it may not
// read (each would be a permission violation and a request timing out). An
// error when none is granted, or the file is not a user's credentials.
// Credentials with no publish allow-list grant everything.
func grantedPlatforms(file string, platforms []string, log *slog.Logger) ([]string, error) {
	uc, err := userClaims(file)
	if err != nil {
		return nil, err
	}
	var keep, dropped []string
	for _, p := range platforms {
		if granted(uc.Pub, mesh.AckSubject(mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(p))) {
			keep = append(keep, p)
		} else {
			dropped = append(dropped, p)
		}
	}
	if len(keep) == 0 {
		return nil, fmt.Errorf("%w: the credentials in %s grant none of this machine's platforms %v: issue them from the catalogue that builds for them (`builds creds issue KEYS --catalogue DIR --principal agent …`), or set --platforms",
			agent.ErrConfig, file, platforms)
	}
	if len(dropped) > 0 {
		log.Info("taking asks only for the platforms the credentials grant", "platforms", keep, "not_granted", dropped, "creds", file)
	}
	return keep, nil
}

// userClaims reads the user's claims of the credentials in file.
func userClaims(file string) (*jwt.UserClaims, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: credentials %s: %w", agent.ErrConfig, file, err)
	}
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		return nil, fmt.Errorf("%w: credentials %s: %w (want a .creds file `builds creds issue` wrote)", agent.ErrConfig, file, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("%w: credentials %s: %w (want a user's .creds file `builds creds issue` wrote)", agent.ErrConfig, file, err)
	}
	return uc, nil
}

// handBacksGranted reports whether the credentials in file let machine
// publish the build seat's handed-back event (credentials issued from a
// catalogue older than the event do not: the agent then announces no
// hand-back, rather than wait out a refused publish each time), and says
// so when they do not.
func handBacksGranted(file, machine string, log *slog.Logger) bool {
	uc, err := userClaims(file)
	if err != nil {
		return true // grantedPlatforms said why
	}
	subj := mesh.HolderEventSubject(mesh.BuildSeat, machine, mesh.EventHandedBack)
	if granted(uc.Pub, subj) {
		return true
	}
	log.Warn("these credentials may not announce hand-backs: `builds show` will not say why an ask waits; reissue them from the catalogue of this version (`builds creds issue KEYS --catalogue DIR --principal agent …`)",
		"subject", subj, "creds", file)
	return false
}

// granted reports whether a permission lets subject through: allowed (no
// allow-list allows everything) and not denied.
func granted(p jwt.Permission, subject string) bool {
	for _, d := range p.Deny {
		if covers(d, subject) {
			return false
		}
	}
	if len(p.Allow) == 0 {
		return true
	}
	for _, a := range p.Allow {
		if covers(a, subject) {
			return true
		}
	}
	return false
}

// covers reports whether the subject pattern p matches every subject the
// pattern s does (NATS wildcards: * one token, > the rest).
func covers(p, s string) bool {
	pt, st := strings.Split(p, "."), strings.Split(s, ".")
	for i, tok := range pt {
		if tok == ">" {
			return i < len(st)
		}
		if i >= len(st) {
			return false
		}
		switch {
		case st[i] == ">":
			return false
		case tok == "*":
		case tok != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}
