package farm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// StateEnv names the state directory of `builds up` (and where `builds`
// finds the operator's credentials).
const StateEnv = "MESHBUILD_STATE"

// DefaultStateDir is where `builds up` keeps its state when not told
// otherwise, as Docker, BuildKit and registries keep theirs: $MESHBUILD_STATE,
// else $XDG_STATE_HOME/meshbuild/up, else ~/.local/state/meshbuild/up (the
// XDG base directory specification's default).
func DefaultStateDir() (string, error) {
	if d := os.Getenv(StateEnv); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "meshbuild", "up"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no state directory: set %s or XDG_STATE_HOME, or HOME (%w)", StateEnv, err)
	}
	return filepath.Join(home, ".local", "state", "meshbuild", "up"), nil
}

// lockName is the file in a state directory that the farm using it holds
// locked (flock), with its pid written in it.
const lockName = "farm.lock"

// ErrStateInUse is wrapped by the error of a farm started on a state
// directory another farm holds.
var ErrStateInUse = errors.New("state directory in use")

// StateInUseError names the farm that holds a state directory.
type StateInUseError struct {
	Dir string
	PID int // 0 when the holder's pid could not be read
}

func (e *StateInUseError) Error() string {
	who := "another farm"
	if e.PID > 0 {
		who = "the farm of pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("state directory %s is in use by %s (builds up): stop it first, or pass --state DIR or --ephemeral for another farm", e.Dir, who)
}

func (e *StateInUseError) Unwrap() error { return ErrStateInUse }

// stateLock is a state directory's lock, held while the farm runs. The
// kernel releases it when the process ends, however it ends.
type stateLock struct{ f *os.File }

// lockState takes dir's lock, or returns a *StateInUseError naming the
// pid that holds it.
func lockState(dir string) (*stateLock, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			data, _ := os.ReadFile(path)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
			return nil, &StateInUseError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &stateLock{f: f}, nil
}

// release gives the lock up.
func (l *stateLock) release() {
	if l == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	_ = l.f.Close()
}
