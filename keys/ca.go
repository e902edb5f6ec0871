package keys

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/vibedom/vibedom/atomicfile"
	"io/fs"
	"log/slog"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CA file names inside the directory given to EnsureCA.
const (
	// CAKeyFile holds the CA private key and its certificate (PEM, 0600).
	// It is the only file EnsureCA trusts; it never enters the VM.
	CAKeyFile = "ca-key.pem"
	// CACertFile holds the CA certificate alone (PEM, 0644), for the guest's
	// trust store. EnsureCA rewrites it from CAKeyFile when it differs.
	CACertFile = "ca.pem"
)

// Validity periods of the certificates this file makes.
const (
	caValidity = 5 * 365 * 24 * time.Hour
	// DefaultLeafValidity is how long a leaf certificate minted by IssueLeaf
	// is valid when the caller passes 0.
	DefaultLeafValidity = 24 * time.Hour
	// clockSkew backdates NotBefore so a guest whose clock runs a little
	// behind still accepts fresh certificates.
	clockSkew = time.Hour
)

// ErrKeyPermissions is returned by EnsureCA when the CA key file is readable
// or writable by group or others or is not a regular file, or when the CA
// directory is writable by group or others.
var ErrKeyPermissions = errors.New("CA key file has unsafe permissions")

// ErrCAInvalid is returned by EnsureCA when the stored CA cannot be used
// (unparsable, not a CA, expired, or key and certificate disagree).
var ErrCAInvalid = errors.New("stored CA is not usable")

// CA is vibedom's MITM certificate authority: an ECDSA P-256 key and a
// self-signed certificate. The guest trusts the certificate; the proxy
// terminates the guest's TLS with leaf certificates the CA signs. The private
// key never leaves this type: String and LogValue show only the certificate's
// fingerprint. A CA is safe for concurrent use.
type CA struct {
	key     *ecdsa.PrivateKey
	cert    *x509.Certificate
	certPEM []byte
}

// EnsureCA loads the CA kept in dir, or creates one there when dir holds
// none. dir is created 0700 when missing and refused when group or others
// may write to it. The key file is written 0600 and refused
// (ErrKeyPermissions, with the chmod to run) when group or others may read
// it. The certificate alone is kept in CACertFile for the guest. Concurrent
// callers on the same dir end up with the same CA.
func EnsureCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create CA directory %q: %w", dir, err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("stat CA directory %q: %w", dir, err)
	} else if fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("CA directory %q is writable by others (mode %04o): %w; run `chmod 700 %s`",
			dir, fi.Mode().Perm(), ErrKeyPermissions, dir)
	}
	keyPath := filepath.Join(dir, CAKeyFile)
	ca, err := loadCA(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		ca, err = createCA(dir, keyPath)
	}
	if err != nil {
		return nil, err
	}
	if err := ca.writeCertFile(filepath.Join(dir, CACertFile)); err != nil {
		return nil, err
	}
	return ca, nil
}

func loadCA(keyPath string) (*CA, error) {
	fi, err := os.Lstat(keyPath)
	if err != nil {
		return nil, fmt.Errorf("stat CA key %q: %w", keyPath, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("CA key %q is not a regular file (%s): %w; remove it and run `vibedom init` again",
			keyPath, fi.Mode().Type(), ErrKeyPermissions)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("CA key %q is accessible by others (mode %04o): %w; run `chmod 600 %s`",
			keyPath, fi.Mode().Perm(), ErrKeyPermissions, keyPath)
	}
	data, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read CA key %q: %w", keyPath, err)
	}
	ca, err := parseCA(data)
	if err != nil {
		return nil, fmt.Errorf("load CA from %q: %w; move the directory aside and run `vibedom init` to make a new CA", keyPath, err)
	}
	return ca, nil
}

func parseCA(data []byte) (*CA, error) {
	var keyDER, certDER []byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		switch b.Type {
		case "PRIVATE KEY":
			keyDER = b.Bytes
		case "CERTIFICATE":
			certDER = b.Bytes
		}
	}
	if keyDER == nil || certDER == nil {
		return nil, fmt.Errorf("%w: want a PRIVATE KEY and a CERTIFICATE block", ErrCAInvalid)
	}
	raw, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("%w: parse key: %v", ErrCAInvalid, err)
	}
	key, ok := raw.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: key is %T, want ECDSA P-256", ErrCAInvalid, raw)
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("%w: parse certificate: %v", ErrCAInvalid, err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%w: certificate is not a CA", ErrCAInvalid)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("%w: certificate does not match the key", ErrCAInvalid)
	}
	now := time.Now()
	if now.After(cert.NotAfter) {
		return nil, fmt.Errorf("%w: certificate expired on %s", ErrCAInvalid, cert.NotAfter.Format(time.DateOnly))
	}
	return &CA{key: key, cert: cert, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER})}, nil
}

func createCA(dir, keyPath string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	cn := "vibedom MITM CA"
	if host != "" {
		cn += " (" + host + ")"
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"vibedom"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal CA key: %w", err)
	}
	var buf bytes.Buffer
	pem.Encode(&buf, &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: der})

	// Write to a temporary file, then link it into place: the link fails if
	// another process created the CA first, in which case theirs wins.
	tmp, err := os.CreateTemp(dir, ".ca-key-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("create CA key in %q: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("chmod CA key: %w", err)
	}
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("write CA key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("sync CA key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("close CA key: %w", err)
	}
	if err := os.Link(tmp.Name(), keyPath); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadCA(keyPath)
		}
		return nil, fmt.Errorf("install CA key %q: %w", keyPath, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse new CA certificate: %w", err)
	}
	return &CA{key: key, cert: cert, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// writeCertFile keeps the public certificate file in step with the key file.
func (ca *CA) writeCertFile(path string) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, ca.certPEM) {
		return nil
	}
	return atomicfile.WriteFile(path, ca.certPEM, 0o644)
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("random serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// CertPEM is the CA certificate in PEM form, for the guest's trust store.
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// Certificate is the parsed CA certificate. Callers must not modify it.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Pool is a fresh certificate pool holding only the CA certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Fingerprint is the SHA-256 of the CA certificate, in hex.
func (ca *CA) Fingerprint() string {
	sum := sha256.Sum256(ca.cert.Raw)
	return hex.EncodeToString(sum[:])
}

// IssueLeaf mints a TLS server certificate for host, which is a DNS name
// (already normalised: lower case, punycode, no trailing dot) or an IP
// literal. The leaf has its own fresh ECDSA P-256 key, is valid from an hour
// ago until validity from now (DefaultLeafValidity when 0, never past the
// CA's own expiry) and is good for server authentication only. The returned
// certificate's Leaf field is set; its chain holds the leaf alone (the guest
// trusts the CA as a root).
func (ca *CA) IssueLeaf(host string, validity time.Duration) (*tls.Certificate, error) {
	if host == "" || strings.ContainsAny(host, " *") {
		return nil, fmt.Errorf("issue leaf certificate for %q: not a host name", host)
	}
	if validity <= 0 {
		validity = DefaultLeafValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate leaf key for %q: %w", host, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: host, Organization: []string{"vibedom MITM"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.Unmap().AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign leaf certificate for %q: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse leaf certificate for %q: %w", host, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// String shows the CA's subject and fingerprint, never the key.
func (ca *CA) String() string {
	return "keys.CA{" + ca.cert.Subject.CommonName + ", sha256 " + ca.Fingerprint() + "}"
}

// LogValue shows the CA's subject and fingerprint in structured logs, never
// the key.
func (ca *CA) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("subject", ca.cert.Subject.CommonName),
		slog.String("sha256", ca.Fingerprint()),
		slog.Time("not_after", ca.cert.NotAfter),
	)
}

// GoString keeps %#v from printing the key.
func (ca *CA) GoString() string { return ca.String() }
