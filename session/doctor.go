package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/keys"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/vm"
)

// DoctorReport is what Doctor found: every check, in the order made.
type DoctorReport struct {
	Home   string     `json:"home"`
	Arch   vm.Arch    `json:"guest_arch"`
	Driver string     `json:"driver"`
	Checks []vm.Check `json:"checks"`
}

// Failed reports whether any check failed (a session would not start, or
// not safely).
func (r *DoctorReport) Failed() bool {
	for _, c := range r.Checks {
		if c.Status == vm.CheckFail {
			return true
		}
	}
	return false
}

// Doctor checks this host for sessions: vibedom's home and the permissions
// of its keys, the user's allowlist, the hypervisor and what it offers, the
// guest image, and the tools apply relies on. It changes nothing and never
// fails on a finding: each is a Check with a fix.
func Doctor(ctx context.Context, h home.Home) (*DoctorReport, error) {
	r := &DoctorReport{Home: string(h), Arch: HostArch()}
	add := func(c vm.Check) { r.Checks = append(r.Checks, c) }

	add(homeCheck(h))
	for _, k := range []struct{ name, path string }{
		{"deploy key", filepath.Join(h.Keys(), keys.DeployKeyName)},
		{"DLP audit key", filepath.Join(h.Keys(), keys.AuditKeyName)},
		{"MITM CA key", filepath.Join(h.CA(), keys.CAKeyFile)},
	} {
		add(secretFileCheck(k.name, k.path))
	}
	add(allowlistCheck(h))

	d, err := DefaultDriver(h)
	if err != nil {
		add(vm.Check{Name: "hypervisor", Status: vm.CheckFail, Detail: err.Error()})
	} else {
		r.Driver = d.Name()
		if doc, ok := d.(vm.Doctor); ok {
			for _, c := range doc.Doctor(ctx, r.Arch) {
				add(c)
			}
		} else if err := d.Available(ctx, r.Arch); err != nil {
			add(vm.Check{Name: "hypervisor", Status: vm.CheckFail, Detail: err.Error()})
		}
	}
	add(guestImageCheck(h, r.Arch))
	if p, err := exec.LookPath("git"); err != nil {
		add(vm.Check{Name: "git", Status: vm.CheckWarn,
			Detail: "git not found: apply cannot merge a file both you and the agent changed, so each such file is a conflict",
			Fix:    "install git"})
	} else {
		add(vm.Check{Name: "git", Status: vm.CheckOK, Detail: p})
	}
	return r, nil
}

// homeCheck: the home exists and only its owner can write it (the rule
// ensureDir holds it to; the keys inside are 0600 themselves).
func homeCheck(h home.Home) vm.Check {
	c := vm.Check{Name: "vibedom home"}
	fi, err := os.Stat(string(h))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.Status, c.Detail, c.Fix = vm.CheckFail, string(h)+" does not exist", "run `vibedom init`"
	case err != nil:
		c.Status, c.Detail = vm.CheckFail, err.Error()
	case !fi.IsDir():
		c.Status, c.Detail, c.Fix = vm.CheckFail, string(h)+" is not a folder", "move it away and run `vibedom init`"
	case fi.Mode().Perm()&0o022 != 0:
		c.Status = vm.CheckFail
		c.Detail = fmt.Sprintf("%s has mode %04o: other users can replace its keys, allowlist and sessions", h, fi.Mode().Perm())
		c.Fix = "chmod go-w " + string(h)
	default:
		c.Status, c.Detail = vm.CheckOK, string(h)
	}
	return c
}

// secretFileCheck: a private key exists, is a regular file (not a link
// somewhere else) and only its owner can read it.
func secretFileCheck(name, path string) vm.Check {
	c := vm.Check{Name: name}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.Status, c.Detail, c.Fix = vm.CheckFail, path+" is missing", "run `vibedom init`"
	case err != nil:
		c.Status, c.Detail = vm.CheckFail, err.Error()
	case !fi.Mode().IsRegular():
		c.Status, c.Detail = vm.CheckFail, path+" is not a regular file ("+fi.Mode().Type().String()+")"
		c.Fix = "replace it with the key file itself"
	case fi.Mode().Perm()&0o077 != 0:
		c.Status = vm.CheckFail
		c.Detail = fmt.Sprintf("%s has mode %04o: other users can read it", path, fi.Mode().Perm())
		c.Fix = "chmod 600 " + path
	default:
		c.Status, c.Detail = vm.CheckOK, path
	}
	return c
}

// allowlistCheck: the user's allowlist parses.
func allowlistCheck(h home.Home) vm.Check {
	c := vm.Check{Name: "allowlist"}
	f, err := os.Open(h.TrustedDomains())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.Status, c.Detail = vm.CheckOK, "no "+h.TrustedDomains()+": the built-in rules only"
		return c
	case err != nil:
		c.Status, c.Detail = vm.CheckFail, err.Error()
		return c
	}
	defer f.Close()
	rules, err := nfegress.ParseRules(f, h.TrustedDomains())
	if err != nil {
		c.Status, c.Detail, c.Fix = vm.CheckFail, err.Error(), "fix the line it names in "+h.TrustedDomains()
		return c
	}
	c.Status, c.Detail = vm.CheckOK, fmt.Sprintf("%s: %d rules", h.TrustedDomains(), len(rules))
	return c
}

// guestImageCheck: the guest image `vibedom init` built, its root image
// hashed in full; else, on Linux, the Debian test image's assets.
func guestImageCheck(h home.Home, arch vm.Arch) vm.Check {
	c := vm.Check{Name: "guest image"}
	a, err := alpine.GuestArch(string(arch))
	if err != nil {
		c.Status, c.Detail = vm.CheckFail, err.Error()
		return c
	}
	if err := assets.CheckKernelEnv(); err != nil {
		c.Status, c.Detail, c.Fix = vm.CheckFail, err.Error(), "unset VIBEDOM_KERNEL, or set it to auto or distro"
		return c
	}
	m, merr := image.ReadGuestManifest(h.GuestManifest(a))
	if merr == nil {
		if err := image.VerifyRootImage(h.Images(), m.Root.Path, m.Root.SHA256, true); err != nil {
			c.Status, c.Detail, c.Fix = vm.CheckFail, err.Error(), "run `vibedom init`"
			return c
		}
		c.Status = vm.CheckOK
		c.Detail = fmt.Sprintf("Alpine %s %s, %d packages, root image %s verified; kernel: ", m.Lock.Branch, a, len(m.Lock.Packages), m.Root.SHA256[:12])
		if k := assets.LocateGuestKernel(arch); k != "" {
			c.Detail += "vibedom's guest kernel in " + k
		} else {
			c.Detail += "linux-virt's"
		}
		return c
	}
	if !errors.Is(merr, image.ErrNoGuestImage) {
		c.Status, c.Detail, c.Fix = vm.CheckFail, merr.Error(), "run `vibedom init`"
		return c
	}
	if as, err := assets.Locate(arch); err == nil {
		c.Status = vm.CheckOK
		c.Detail = "no Alpine image; the Linux test image: kernel in " + as.KernelDir + ", guest agent " + as.GuestBinary
		return c
	}
	c.Status, c.Detail, c.Fix = vm.CheckFail, "no guest image for "+string(arch), "run `vibedom init`"
	return c
}
