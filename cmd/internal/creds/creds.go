// Package creds keeps a mesh's NATS keys and issues its credentials:
// decentralized JWT user credentials (.creds files) whose permissions are
// exactly a principal's derived set (mesh.Catalogue.PrincipalPermissions),
// signed with an account key the operator keeps, and the server
// configuration — the operator, the mesh's account and a system account,
// resolved from memory — a NATS server or cluster is pointed at.
//
// A key directory holds:
//
//	operator.nk, account.nk, system.nk   the seeds (0600): keep them secret
//	operator.jwt, account.jwt, system.jwt
//	server.conf                           include it in nats-server's configuration
//
// Init makes one, Open reads it, Ensure does whichever is needed; Keys.Issue
// writes a principal's .creds file (0600).
package creds

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/meshbuild/meshbuild/mesh"
)

// The files of a key directory.
const (
	OperatorSeed = "operator.nk"
	AccountSeed  = "account.nk"
	SystemSeed   = "system.nk"
	OperatorJWT  = "operator.jwt"
	AccountJWT   = "account.jwt"
	SystemJWT    = "system.jwt"
	ServerConf   = "server.conf"
)

// AccountName is the name of the mesh's account in its JWT.
const AccountName = "meshbuild"

// ErrNoKeys is returned by Open when a directory holds no keys.
var ErrNoKeys = errors.New("no NATS keys")

// ErrExists is returned by Init when a directory already holds keys.
var ErrExists = errors.New("NATS keys already exist")

// Keys are a key directory's operator, account and system account.
type Keys struct {
	Dir string

	operator, account, system          nkeys.KeyPair
	operatorJWT, accountJWT, systemJWT string
}

// Init makes a key directory: new operator, account and system account
// keys, their JWTs (the account with JetStream, unlimited), and the server
// configuration. It refuses a directory that already holds keys.
func Init(dir string) (*Keys, error) {
	if _, err := os.Stat(filepath.Join(dir, AccountSeed)); err == nil {
		return nil, fmt.Errorf("%w in %s: issue credentials from them, or choose another directory", ErrExists, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("key directory: %w", err)
	}
	k := &Keys{Dir: dir}
	var err error
	if k.operator, err = nkeys.CreateOperator(); err != nil {
		return nil, err
	}
	if k.account, err = nkeys.CreateAccount(); err != nil {
		return nil, err
	}
	if k.system, err = nkeys.CreateAccount(); err != nil {
		return nil, err
	}
	opPub, _ := k.operator.PublicKey()
	accPub, _ := k.account.PublicKey()
	sysPub, _ := k.system.PublicKey()

	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "meshbuild operator"
	oc.SystemAccount = sysPub
	if k.operatorJWT, err = oc.Encode(k.operator); err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = AccountName
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{
		MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
		Streams: jwt.NoLimit, Consumer: jwt.NoLimit, MaxAckPending: jwt.NoLimit,
	}
	if k.accountJWT, err = ac.Encode(k.operator); err != nil {
		return nil, fmt.Errorf("account JWT: %w", err)
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	if k.systemJWT, err = sc.Encode(k.operator); err != nil {
		return nil, fmt.Errorf("system account JWT: %w", err)
	}
	for _, f := range []struct {
		name string
		kp   nkeys.KeyPair
	}{{OperatorSeed, k.operator}, {AccountSeed, k.account}, {SystemSeed, k.system}} {
		seed, _ := f.kp.Seed()
		if err := writeSecret(filepath.Join(dir, f.name), append(seed, '\n')); err != nil {
			return nil, err
		}
	}
	for name, j := range map[string]string{OperatorJWT: k.operatorJWT, AccountJWT: k.accountJWT, SystemJWT: k.systemJWT} {
		if err := writeSecret(filepath.Join(dir, name), []byte(j+"\n")); err != nil {
			return nil, err
		}
	}
	if err := writeSecret(filepath.Join(dir, ServerConf), []byte(k.ServerConfig())); err != nil {
		return nil, err
	}
	return k, nil
}

// Open reads a key directory Init made.
func Open(dir string) (*Keys, error) {
	if _, err := os.Stat(filepath.Join(dir, AccountSeed)); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s: make them with `builds creds init %s`", ErrNoKeys, dir, dir)
	}
	k := &Keys{Dir: dir}
	var err error
	seed := func(name string, want nkeys.PrefixByte) (nkeys.KeyPair, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("key directory %s: %w", dir, err)
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			return nil, fmt.Errorf("%s: not an nkey seed: %w", filepath.Join(dir, name), err)
		}
		if p, _ := kp.PublicKey(); !nkeys.IsValidPublicKey(p) || nkeys.Prefix(p) != want {
			return nil, fmt.Errorf("%s: not the kind of key this file holds", filepath.Join(dir, name))
		}
		return kp, nil
	}
	token := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("key directory %s: %w", dir, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if k.operator, err = seed(OperatorSeed, nkeys.PrefixByteOperator); err != nil {
		return nil, err
	}
	if k.account, err = seed(AccountSeed, nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if k.system, err = seed(SystemSeed, nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if k.operatorJWT, err = token(OperatorJWT); err != nil {
		return nil, err
	}
	if k.accountJWT, err = token(AccountJWT); err != nil {
		return nil, err
	}
	if k.systemJWT, err = token(SystemJWT); err != nil {
		return nil, err
	}
	ac, err := jwt.DecodeAccountClaims(k.accountJWT)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, AccountJWT), err)
	}
	if pub, _ := k.account.PublicKey(); ac.Subject != pub {
		return nil, fmt.Errorf("%s is not the JWT of the key in %s", filepath.Join(dir, AccountJWT), filepath.Join(dir, AccountSeed))
	}
	return k, nil
}

// Ensure opens the key directory, or makes it when it holds no keys.
func Ensure(dir string) (*Keys, error) {
	k, err := Open(dir)
	if errors.Is(err, ErrNoKeys) {
		return Init(dir)
	}
	return k, err
}

// Account is the mesh account's public key.
func (k *Keys) Account() string { p, _ := k.account.PublicKey(); return p }

// ServerConfig is the server configuration that trusts the operator and
// resolves the mesh's account and the system account from memory: include
// it in a NATS server's configuration (every server of a cluster the same).
// The operator JWT is inline, so the file stands alone.
func (k *Keys) ServerConfig() string {
	sysPub, _ := k.system.PublicKey()
	var b strings.Builder
	fmt.Fprintf(&b, "# meshbuild: trust this operator; the mesh's account is %s.\n", k.Account())
	fmt.Fprintf(&b, "# Made by `builds creds init`; include it in nats-server's configuration.\n")
	fmt.Fprintf(&b, "operator: %q\n", k.operatorJWT)
	fmt.Fprintf(&b, "system_account: %s\n", sysPub)
	fmt.Fprintf(&b, "resolver: MEMORY\n")
	fmt.Fprintf(&b, "resolver_preload: {\n")
	fmt.Fprintf(&b, "  %s: %q\n", k.Account(), k.accountJWT)
	fmt.Fprintf(&b, "  %s: %q\n", sysPub, k.systemJWT)
	fmt.Fprintf(&b, "}\n")
	return b.String()
}

// ServerOptions are a server's options from the key directory's
// server.conf, read as nats-server reads it; the caller adds where it
// listens and its JetStream store.
func (k *Keys) ServerOptions() (*server.Options, error) {
	path := filepath.Join(k.Dir, ServerConf)
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, fmt.Errorf("NATS server configuration %s: %w", path, err)
	}
	return o, nil
}

// Issue makes the credentials of a principal with permission set p: a new
// user key, its JWT signed by the account key with p's allow lists, as a
// .creds file's contents. The user's name in the JWT is p.Principal (the
// principal's one id, mesh.PrincipalID: what PrincipalOf reads back);
// name, who it is for people (e.g. "build-agent m1"), is used when the set
// names no principal.
func (k *Keys) Issue(p mesh.Permissions, name string) ([]byte, error) {
	if p.Principal != "" {
		name = p.Principal
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	uc.Permissions = p.JWTPermissions()
	token, err := uc.Encode(k.account)
	if err != nil {
		return nil, fmt.Errorf("credentials of %s: %w", name, err)
	}
	seed, _ := user.Seed()
	return jwt.FormatUserConfig(token, seed)
}

// IssueFile writes Issue's credentials to path, readable by its owner only.
func (k *Keys) IssueFile(p mesh.Permissions, name, path string) error {
	b, err := k.Issue(p, name)
	if err != nil {
		return err
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("credentials %s: %w", path, err)
		}
	}
	return writeSecret(path, b)
}

// writeSecret writes a file only its owner can read, replacing any.
func writeSecret(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil { // an existing tmp kept its mode
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// PrincipalOf reads the principal a .creds file speaks for: the id its JWT
// was issued under (mesh.PrincipalID), e.g. "agent_m1".
func PrincipalOf(path string) (string, error) {
	uc, err := UserClaims(path)
	if err != nil {
		return "", err
	}
	return uc.Name, nil
}

// UserClaims reads the user's claims in a .creds file's JWT: its name, what
// it may publish and subscribe to, who issued it.
func UserClaims(path string) (*jwt.UserClaims, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", path, err)
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", path, err)
	}
	return uc, nil
}

// ConnectJWTBudget is the longest JWT whose CONNECT nats-server's default
// max_control_line (4096 bytes) is sure to take: the CONNECT also carries
// the nonce's signature, the client's options and the connection's name (a
// daemon's is its module and machine, daemon.Connect). Credentials past it
// need max_control_line raised on every server (`builds creds issue` says
// so).
const ConnectJWTBudget = 3700

// JWTSize is the length of the JWT in the credentials file at path.
func JWTSize(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("credentials %s: %w", path, err)
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return 0, fmt.Errorf("credentials %s: %w", path, err)
	}
	return len(token), nil
}
