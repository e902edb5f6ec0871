package session

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/keys"
)

// InitResult reports what Init found and made.
type InitResult struct {
	Home          string `json:"home"`
	DeployKey     string `json:"deploy_key"`      // authorized_keys line
	DeployKeyPath string `json:"deploy_key_path"` // private key file
	DeployKeyNew  bool   `json:"deploy_key_created"`
	CAFingerprint string `json:"ca_fingerprint"`
	CACert        string `json:"ca_cert_path"`
	TrustedFile   string `json:"trusted_domains_path"`
	AuditKey      string `json:"audit_key_path"`   // decrypts dlp_audit.jsonl.enc
	AuditPublic   string `json:"audit_public_key"` // age1…
	Driver        string `json:"driver"`
	// Image is the guest image built or checked (nil when skipped or when
	// it could not be built: then ImageError says why).
	Image      *image.GuestResult `json:"image,omitempty"`
	ImageError string             `json:"image_error,omitempty"`
	// Fallback names the image sessions use instead when the guest image
	// could not be built ("debian-test": the Linux test kernels).
	Fallback string   `json:"image_fallback,omitempty"`
	Problems []string `json:"problems,omitempty"` // what still stops `vibedom run`, with the fix
}

// InitOptions says what Init does beyond keys and folders.
type InitOptions struct {
	// NoImage skips the guest image (keys and folders only).
	NoImage bool
	// Image says where packages come from; its Arch defaults to the host's.
	Image image.GuestOptions
}

const trustedTemplate = `# vibedom egress allowlist: one rule a line.
#   example.com          this name, ports 443 and 80
#   *.example.com        any name below example.com (not example.com itself)
#   example.com:22       this name, port 22 only
#   !bad.example.com     deny (beats every allow)
# The agent APIs (api.anthropic.com, api.openai.com) are allowed by default.
# A workspace can add rules in <workspace>/.vibedom/trusted_domains.txt;
# one run can add some with --allow.
`

// Init prepares h for sessions: the folders, the MITM CA, the deploy key and
// an allowlist file to edit. It is idempotent and never replaces a key. It
// also checks the hypervisor and the guest image, reporting what is missing
// rather than failing.
func Init(ctx context.Context, h home.Home, o InitOptions) (*InitResult, error) {
	if err := ensureDir(string(h)); err != nil {
		return nil, err
	}
	for _, d := range []string{h.Sessions(), h.Logs(), h.Keys()} {
		if err := ensureDir(d); err != nil {
			return nil, err
		}
	}
	r := &InitResult{Home: string(h), TrustedFile: h.TrustedDomains()}
	ca, err := keys.EnsureCA(h.CA())
	if err != nil {
		return nil, fmt.Errorf("make the MITM CA: %w", err)
	}
	r.CAFingerprint = ca.Fingerprint()
	r.CACert = h.CA() + "/" + keys.CACertFile
	dk, created, err := keys.EnsureDeployKey(h.Keys())
	if err != nil {
		return nil, fmt.Errorf("make the deploy key: %w", err)
	}
	r.DeployKey, r.DeployKeyPath, r.DeployKeyNew = dk.AuthorizedKey(), dk.Path(), created
	ak, _, err := keys.EnsureAuditKey(h.Keys())
	if err != nil {
		return nil, fmt.Errorf("make the DLP audit key: %w", err)
	}
	r.AuditKey, r.AuditPublic = ak.Path(), ak.PublicKey()
	if _, err := os.Stat(r.TrustedFile); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(r.TrustedFile, []byte(trustedTemplate), 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", r.TrustedFile, err)
		}
	}
	if o.Image.Arch == "" {
		o.Image.Arch = HostArch()
	}
	d, err := DefaultDriver(h)
	if err != nil {
		r.Problems = append(r.Problems, err.Error())
		return r, nil
	}
	r.Driver = d.Name()
	if err := d.Available(ctx, o.Image.Arch); err != nil {
		r.Problems = append(r.Problems, err.Error())
	}
	if o.NoImage {
		if _, err := image.LoadGuest(ctx, h, o.Image.Arch, testKeyring()); err != nil {
			if _, aerr := assets.Locate(o.Image.Arch); aerr != nil {
				r.Problems = append(r.Problems, err.Error())
			}
		}
		return r, nil
	}
	img, err := image.BuildGuest(ctx, h, o.Image)
	if err == nil {
		r.Image = img
		return r, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.ImageError = err.Error()
	// On Linux the Debian test kernels (make assets) can stand in.
	if _, aerr := assets.Locate(o.Image.Arch); aerr == nil {
		r.Fallback = "debian-test"
		return r, nil
	}
	r.Problems = append(r.Problems, "the guest image: "+err.Error())
	return r, nil
}
