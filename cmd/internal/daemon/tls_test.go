package daemon

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// Connect to a server that speaks TLS, verifies client certificates and
// admits only credentials issued from its keys: with the CA, the client's
// certificate and the node's credentials it connects; without the CA, or
// without the client certificate, the server is not reached.
func TestConnectTLSWithCredentials(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCert(t, nil, nil, "meshbuild test CA", true)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	srv, srvKey := newCert(t, ca, caKey, "nats", false)
	cli, cliKey := newCert(t, ca, caKey, "m1", false)
	writePEM(t, filepath.Join(dir, "client.pem"), "CERTIFICATE", cli.Raw)
	b, _ := x509.MarshalECPrivateKey(cliKey)
	writePEM(t, filepath.Join(dir, "client-key.pem"), "EC PRIVATE KEY", b)

	k, err := creds.Init(filepath.Join(dir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := k.ServerOptions()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	opts.TLS, opts.TLSVerify = true, true
	opts.TLSConfig = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{srv.Raw}, PrivateKey: srvKey}},
		ClientCAs:    pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}
	s := natstest.Server(t, opts)
	nodeCreds := filepath.Join(dir, "m1.creds")
	if err := k.IssueFile(mesh.NodePermissions("m1"), "", nodeCreds); err != nil {
		t.Fatal(err)
	}

	full := TLS{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "client.pem"), Key: filepath.Join(dir, "client-key.pem")}
	topts, err := full.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, _, err := Connect(s.ClientURL(), nodeCreds, "m1", "test", append(topts, nats.MaxReconnects(0))...)
	if err != nil {
		t.Fatalf("TLS with the CA, a client certificate and the node's credentials: %v", err)
	}
	if !nc.TLSRequired() {
		t.Error("the connection is not TLS")
	}
	nc.Close()

	for _, tc := range []struct {
		name string
		tls  TLS
	}{
		{"no CA", TLS{Cert: full.Cert, Key: full.Key}},
		{"no client certificate", TLS{CA: full.CA}},
	} {
		topts, err := tc.tls.Options()
		if err != nil {
			t.Fatal(err)
		}
		if nc, _, err := Connect(s.ClientURL(), nodeCreds, "m1", "test", append(topts, nats.MaxReconnects(0))...); err == nil {
			nc.Close()
			t.Errorf("%s: connected", tc.name)
		}
	}

	// Flags that cannot make a connection are refused before dialling.
	if _, err := (TLS{Cert: full.Cert}).Options(); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Errorf("--tls-cert without --tls-key: %v", err)
	}
	if _, err := (TLS{CA: filepath.Join(dir, "nosuch.pem")}).Options(); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "--tls-ca") {
		t.Errorf("a missing --tls-ca: %v", err)
	}
	if _, _, err := Connect(s.ClientURL(), filepath.Join(dir, "nosuch.creds"), "m1", "test", topts...); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing credentials file: %v", err)
	}
}

// newCert makes a certificate for 127.0.0.1 signed by parent (self-signed
// when nil).
func newCert(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, cn string, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:        isCA, BasicConstraintsValid: true,
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
