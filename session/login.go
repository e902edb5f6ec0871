package session

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path"
	"strconv"
	"time"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/guest/proto"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
)

// loadLogin returns the subscription login the session's agent uses (nil
// for none): the host's login of the agent's own kind (claude, codex).
func (s *sess) loadLogin() (*credentials.LoginSession, error) {
	a := s.opts.Agent
	if a == nil {
		return nil, nil
	}
	k, err := credentials.LookupLogin(a.Name)
	if err != nil {
		return nil, nil // an agent without subscription logins
	}
	l, err := credentials.LoadLogin(string(s.opts.Home), k)
	if errors.Is(err, credentials.ErrNoLogin) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return credentials.NewLoginSession(string(s.opts.Home), l, &credentials.RefreshClient{}, s.log.With("part", "login"))
}

// refreshClient is the HTTP client of the host's own refreshes: it
// reaches the vendor's token endpoint as the proxy would (the session's
// --resolve for that name and port, the system roots plus --ca-file),
// always verifying TLS.
func refreshClient(resolve []nfegress.Resolve, roots []*x509.Certificate) (*http.Client, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	for _, c := range roots {
		pool.AddCert(c)
	}
	d := &net.Dialer{Timeout: 15 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		p, _ := strconv.Atoi(port)
		for _, r := range resolve {
			if r.Name == host && int(r.Port) == p {
				return d.DialContext(ctx, network, r.Addr.String())
			}
		}
		return d.DialContext(ctx, network, addr)
	}
	return &http.Client{Transport: &http.Transport{
		DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true, TLSHandshakeTimeout: 15 * time.Second, Proxy: nil,
	}, Timeout: 30 * time.Second}, nil
}

// startLogins gives the session's logins their refresh client and
// refreshes the tokens that are due before the agent starts: a refresh
// token the vendor refuses stops the session with what to run.
func (s *sess) startLogins(ctx context.Context, resolve []nfegress.Resolve, roots []*x509.Certificate) error {
	if s.creds == nil || len(s.creds.Logins()) == 0 {
		return nil
	}
	hc, err := refreshClient(resolve, roots)
	if err != nil {
		return err
	}
	s.creds.SetRefreshHTTP(hc)
	if err := s.creds.RefreshDue(ctx); err != nil {
		if errors.Is(err, credentials.ErrRefreshRefused) {
			return err
		}
		s.progress("warning: %v", err)
	}
	return nil
}

// copyLoginFiles writes the logins' placeholder credentials files into
// the agent user's home (0600, owned by the agent).
func (s *sess) copyLoginFiles() error {
	if s.creds == nil || s.rootImage == "" {
		return nil
	}
	files := s.creds.GuestFiles()
	if len(files) == 0 {
		return nil
	}
	sc, err := s.client.SFTP()
	if err != nil {
		return fmt.Errorf("write the agent's login: %w", err)
	}
	defer sc.Close()
	guestHome := path.Join(proto.RootDir, "home", proto.RootAgentUser)
	for rel, b := range files {
		dst := path.Join(guestHome, rel)
		dir := path.Dir(dst)
		if err := sc.MkdirAll(dir); err != nil {
			return fmt.Errorf("write the agent's login: %w", err)
		}
		_ = sc.Chown(dir, 1000, 1000)
		_ = sc.Chmod(dir, 0o700)
		w, err := sc.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			return fmt.Errorf("write the agent's login: %w", err)
		}
		_, err = w.Write(b)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write the agent's login: %w", err)
		}
		_ = sc.Chown(dst, 1000, 1000)
		_ = sc.Chmod(dst, 0o600)
		s.log.Info("the agent's login written with placeholders", "file", rel)
	}
	return nil
}
