package alpine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// Lock is a resolved package set: what an image is built from. Its JSON
// form (Marshal) is deterministic, so equal sets give equal bytes.
type Lock struct {
	Branch   string          `json:"branch"`
	Arch     string          `json:"arch"`
	World    []string        `json:"world"`
	Packages []LockedPackage `json:"packages"`
}

// LockedPackage pins one package by its index checksum and size.
type LockedPackage struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	Arch     string `json:"arch"`
	Repo     string `json:"repo"`
	Checksum string `json:"checksum"`
	Size     int64  `json:"size"`
}

func (p LockedPackage) String() string { return p.Name + "-" + p.Version }

func (p LockedPackage) pkg() *Package {
	return &Package{Name: p.Name, Version: p.Version, Arch: p.Arch, Repo: p.Repo, Checksum: p.Checksum, Size: p.Size}
}

// Marshal returns the lock's canonical JSON (packages sorted by name).
func (l *Lock) Marshal() []byte {
	c := *l
	c.Packages = append([]LockedPackage(nil), l.Packages...)
	sort.Slice(c.Packages, func(i, j int) bool { return c.Packages[i].Name < c.Packages[j].Name })
	b, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		panic(err) // plain strings and ints
	}
	return append(b, '\n')
}

// ParseLock reads a lock written by Marshal and checks every entry.
func ParseLock(b []byte) (*Lock, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var l Lock
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("parse alpine lock: %w (delete it and run vibedom init --update to make a new one)", err)
	}
	if err := l.validate(); err != nil {
		return nil, fmt.Errorf("parse alpine lock: %w", err)
	}
	return &l, nil
}

// validate checks every entry, so names and versions are safe in URLs
// and cache paths.
func (l *Lock) validate() error {
	if !validArch(l.Arch) {
		return fmt.Errorf("arch %q", l.Arch)
	}
	seen := map[string]bool{}
	for _, p := range l.Packages {
		if !validName(p.Name) || seen[p.Name] || p.Size <= 0 || !validArch(p.Arch) && p.Arch != "noarch" {
			return fmt.Errorf("bad entry %q", p.Name)
		}
		if _, err := parseVersion(p.Version); err != nil {
			return fmt.Errorf("%s: %w", p.Name, err)
		}
		if _, err := p.pkg().controlSHA1(); err != nil {
			return err
		}
		found := false
		for _, r := range Repositories {
			found = found || r == p.Repo
		}
		if !found {
			return fmt.Errorf("%s: repository %q", p.Name, p.Repo)
		}
		seen[p.Name] = true
	}
	return nil
}

// ChangeKind says how a package differs between two locks.
type ChangeKind string

const (
	Added   ChangeKind = "added"
	Removed ChangeKind = "removed"
	Changed ChangeKind = "changed"
)

// Change is one difference between two locks.
type Change struct {
	Kind     ChangeKind
	Old, New LockedPackage
}

func (c Change) String() string {
	switch c.Kind {
	case Added:
		return "added " + c.New.String()
	case Removed:
		return "removed " + c.Old.String()
	}
	if c.Old.Version == c.New.Version {
		return fmt.Sprintf("%s: rebuilt (checksum %s -> %s, repo %s -> %s)", c.Old, c.Old.Checksum, c.New.Checksum, c.Old.Repo, c.New.Repo)
	}
	return fmt.Sprintf("%s %s -> %s", c.Old.Name, c.Old.Version, c.New.Version)
}

// Diff lists what changed from old to new, sorted by package name. World
// changes show up as the packages they add or remove.
func Diff(old, new *Lock) []Change {
	om, nm := map[string]LockedPackage{}, map[string]LockedPackage{}
	var names []string
	for _, p := range old.Packages {
		om[p.Name] = p
		names = append(names, p.Name)
	}
	for _, p := range new.Packages {
		nm[p.Name] = p
		if _, ok := om[p.Name]; !ok {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	var out []Change
	for _, n := range names {
		o, inOld := om[n]
		w, inNew := nm[n]
		switch {
		case !inNew:
			out = append(out, Change{Kind: Removed, Old: o})
		case !inOld:
			out = append(out, Change{Kind: Added, New: w})
		case o != w:
			out = append(out, Change{Kind: Changed, Old: o, New: w})
		}
	}
	return out
}
