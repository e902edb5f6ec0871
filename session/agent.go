package session

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image/ext4"
)

// AgentShell is the --agent name of a plain login shell.
const AgentShell = "shell"

// AgentOptions says which coding agent a session starts.
type AgentOptions struct {
	// Name is claude, codex, opencode or shell.
	Name string
	// Args are passed to the agent after vibedom's own flags.
	Args []string
	// HomeDir is the host user's home, where the agent's settings are
	// read from; "" means os.UserHomeDir.
	HomeDir string
}

// agentLayerLabel is the ext4 label of an agent's layer image.
const agentLayerLabel = "vibedom-agent"

// prepareAgent finds the agent's installed binary and its layer image,
// and turns the session's command into the agent's. It runs before the
// guest boots.
func (s *sess) prepareAgent(context.Context) error {
	a := s.opts.Agent
	if a == nil {
		return nil
	}
	if a.Name == AgentShell {
		if len(a.Args) > 0 {
			s.plan.command = a.Args
		}
		return nil
	}
	flags, ok := agents.Flags(a.Name)
	if !ok {
		return fmt.Errorf("unknown agent %q: use %s, npm:PACKAGE or shell", a.Name, strings.Join(agents.AllNames(), ", "))
	}
	if s.rootImage == "" {
		return fmt.Errorf("--agent %s needs the guest image, which this home does not have: run `vibedom init`", a.Name)
	}
	arch, err := agents.GuestArch(string(s.opts.Arch))
	if err != nil {
		return err
	}
	libc := s.guestLibc
	if libc == "" {
		libc = agents.LibcMusl
	}
	var inst *agents.Installed
	if agents.IsNode(a.Name) {
		// The lockfile and every package's files are checked again now.
		inst, err = agents.FindNode(string(s.opts.Home), a.Name)
	} else {
		inst, err = agents.FindAgent(string(s.opts.Home), a.Name, arch, libc)
	}
	if err != nil {
		return err
	}
	layer, err := agentLayer(s.opts.Home, inst)
	if err != nil {
		return err
	}
	s.layers = append(s.layers, layerDisk{path: layer, label: agentLayerLabel, mount: proto.AgentMount})
	cmd := []string{path.Join(proto.AgentMount, inst.Binary)}
	if inst.Runtime == agents.RuntimeNode {
		cmd = []string{"/usr/bin/node", cmd[0]} // the image's nodejs
	}
	s.plan.command = append(append(cmd, flags...), a.Args...)
	s.agentTTY = len(a.Args) == 0 || s.opts.Terminal != nil
	s.log.Info("agent", "name", a.Name, "version", inst.Version, "libc", libc, "layer", layer)
	return nil
}

// layerDisk is a read-only layer image attached to the VM.
type layerDisk struct {
	path, label, mount string
}

// agentLayer returns the agent's layer image, <dir>.ext4 beside its
// directory, building it when it is missing or older than the directory's
// manifest. Its content comes from the verified, read-only directory.
func agentLayer(h home.Home, inst *agents.Installed) (string, error) {
	img := inst.Dir + ".ext4"
	mf, err := os.Stat(filepath.Join(inst.Dir, agents.ManifestFile))
	if err != nil {
		return "", fmt.Errorf("%w: run `vibedom init --agents %s`", agents.ErrNotInstalled, inst.Agent)
	}
	if fi, err := os.Stat(img); err == nil && fi.Mode().IsRegular() && !fi.ModTime().Before(mf.ModTime()) {
		return img, nil
	}
	tree, err := ext4.TreeFromDir(inst.Dir, inst.Installed)
	if err != nil {
		return "", err
	}
	os.Remove(img + ".tmp") // left by a version that built under this name
	f, err := atomicfile.New(img, 0o444)
	if err != nil {
		return "", err
	}
	defer f.Abort()
	sum := sha256.Sum256([]byte(inst.Integrity))
	var uuid [16]byte
	copy(uuid[:], sum[:])
	uuid[6], uuid[8] = uuid[6]&0x0f|0x40, uuid[8]&0x3f|0x80
	_, err = ext4.Write(f.File, tree, ext4.Options{Label: agentLayerLabel, UUID: uuid, Time: inst.Installed})
	if err == nil {
		err = f.Commit()
	}
	if err != nil {
		return "", fmt.Errorf("build the %s layer: %w", inst.Agent, err)
	}
	return img, nil
}

// copyAgentSettings copies the agent's settings (sanitized) into the agent
// user's home in the root image, owned by the agent.
func (s *sess) copyAgentSettings(ctx context.Context) error {
	a := s.opts.Agent
	if a == nil || s.rootImage == "" {
		return nil
	}
	home := a.HomeDir
	if home == "" {
		var err error
		if home, err = os.UserHomeDir(); err != nil {
			return nil
		}
	}
	files, skipped := agents.Settings(a.Name, home)
	for _, sk := range skipped {
		s.log.Warn("agent settings file skipped", "file", sk.Path, "err", sk.Err)
	}
	if len(files) == 0 {
		return nil
	}
	sc, err := s.client.SFTP()
	if err != nil {
		return fmt.Errorf("copy the agent's settings: %w", err)
	}
	defer sc.Close()
	guestHome := path.Join(proto.RootDir, "home", proto.RootAgentUser)
	for _, f := range files {
		b := f.Data
		dst := path.Join(guestHome, f.Rel)
		// Make the parents, owned by the agent.
		for d := path.Dir(dst); len(d) > len(guestHome); d = path.Dir(d) {
			defer func(d string) { _ = sc.Chown(d, 1000, 1000) }(d)
		}
		if err := sc.MkdirAll(path.Dir(dst)); err != nil {
			return fmt.Errorf("copy the agent's settings: %w", err)
		}
		w, err := sc.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			return fmt.Errorf("copy the agent's settings: %w", err)
		}
		_, err = w.Write(b)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("copy the agent's settings: %w", err)
		}
		_ = sc.Chown(dst, 1000, 1000)
		_ = sc.Chmod(dst, 0o600)
		s.log.Info("agent settings copied", "file", f.Rel)
	}
	return nil
}
