package alpine

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Resolve selects the packages that world (package names, optionally
// with a version constraint such as "git>=2.40") needs from indexes, with
// all their dependencies.
//
// Selection is deterministic. For each dependency, in breadth-first order
// from the sorted world:
//  1. a package already selected that satisfies it is used;
//  2. otherwise, with a previous lock (and update false), the locked
//     package that satisfies it, so a rebuild reproduces the lock;
//  3. otherwise a package of that exact name, highest version first (on a
//     tie, the earlier repository in Repositories);
//  4. otherwise a provider (p: so:, cmd:, pc:, a path): highest
//     provider_priority (k:), then the lowest name, then the highest
//     version.
//
// A dependency nothing provides is ErrMissing, naming the chain that
// needs it. "!name" conflicts are checked over the final set (ErrConflict).
// There is no backtracking: a dependency that needs another version than
// the one already selected under its name is ErrConflict.
//
// With prev set and update false, the result must equal prev; when the
// indexes no longer allow that, Resolve returns the new set and an error
// wrapping ErrLockDrift that lists every change. With update true, Resolve
// picks the newest packages, but refuses to move any package to an older
// version than prev has (an older, still validly signed index replayed by
// a mirror), wrapping ErrLockDrift.
func Resolve(indexes []*Index, world []string, prev *Lock, update bool) (*Lock, error) {
	if len(indexes) == 0 {
		return nil, fmt.Errorf("resolve: no indexes")
	}
	arch := indexes[0].Arch
	r := newResolver(indexes)
	if prev != nil && !update {
		r.locked = map[string]LockedPackage{}
		for _, p := range prev.Packages {
			r.locked[p.Name] = p
		}
	}
	w := slices.Clone(world)
	sort.Strings(w)
	w = slices.Compact(w)
	type item struct {
		c     constraint
		chain []string
	}
	var queue []item
	for _, n := range w {
		c := parseConstraint(n)
		if c.conflict || c.name == "" {
			return nil, fmt.Errorf("resolve: %q is not a package name", n)
		}
		queue = append(queue, item{c, nil})
	}
	selected := map[string]*Package{}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		if it.c.conflict {
			continue
		}
		p, err := r.pick(it.c, selected)
		if err == errSelected {
			return nil, fmt.Errorf("resolve: %w: %s needs %s, but %s is already selected; name the version you want in the package list", ErrConflict, strings.Join(it.chain, " -> "), it.c, p)
		}
		if err != nil {
			why := "in the package list"
			if len(it.chain) > 0 {
				why = "needed by " + strings.Join(append(slices.Clone(it.chain), it.c.String()), " -> ")
			}
			return nil, fmt.Errorf("resolve: %w %q (%s); check the package name, or that it exists in Alpine %s %s for %s", ErrMissing, it.c.String(), why, Branch, strings.Join(Repositories, "+"), arch)
		}
		if q, ok := selected[p.Name]; ok {
			if q != p {
				return nil, fmt.Errorf("resolve: %w: %s needs %s, but %s is already selected", ErrConflict, strings.Join(it.chain, " -> "), it.c, q)
			}
			continue
		}
		selected[p.Name] = p
		chain := append(slices.Clone(it.chain), p.Name)
		for _, d := range p.Depends {
			queue = append(queue, item{parseConstraint(d), chain})
		}
	}
	// Conflicts over the final set.
	names := make([]string, 0, len(selected))
	for n := range selected {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, d := range selected[n].Depends {
			c := parseConstraint(d)
			if !c.conflict {
				continue
			}
			for _, m := range names {
				if m != n && satisfies(selected[m], c) {
					return nil, fmt.Errorf("resolve: %w: %s conflicts with %s (%s)", ErrConflict, selected[n], selected[m], d)
				}
			}
		}
	}
	lock := &Lock{Branch: Branch, Arch: arch, World: w}
	for _, n := range names {
		p := selected[n]
		lock.Packages = append(lock.Packages, LockedPackage{
			Name: p.Name, Version: p.Version, Arch: p.Arch, Repo: p.Repo, Checksum: p.Checksum, Size: p.Size,
		})
	}
	if prev != nil {
		if update {
			var back []string
			for _, c := range Diff(prev, lock) {
				if c.Kind == Changed && compareVersions(c.New.Version, c.Old.Version) < 0 {
					back = append(back, c.String())
				}
			}
			if len(back) > 0 {
				return lock, fmt.Errorf("resolve: %w: the mirror's index is older than the lock (%s); it may be replaying an old index: try another mirror", ErrLockDrift, strings.Join(back, "; "))
			}
		} else if d := Diff(prev, lock); len(d) > 0 {
			lines := make([]string, len(d))
			for i, c := range d {
				lines[i] = c.String()
			}
			return lock, fmt.Errorf("resolve: %w: %s; run with --update to accept the new set", ErrLockDrift, strings.Join(lines, "; "))
		}
	}
	return lock, nil
}

// errSelected: the dependency's name is taken by a selected package of a
// version that does not satisfy it.
var errSelected = errors.New("selected version does not fit")

type resolver struct {
	byName   map[string][]*Package
	provides map[string][]provider
	locked   map[string]LockedPackage
}

type provider struct {
	pkg     *Package
	version string // "" when provided without a version
}

func newResolver(indexes []*Index) *resolver {
	r := &resolver{byName: map[string][]*Package{}, provides: map[string][]provider{}}
	for _, idx := range indexes {
		for _, p := range idx.Packages {
			r.byName[p.Name] = append(r.byName[p.Name], p)
			for _, pr := range p.Provides {
				n, v, _ := strings.Cut(pr, "=")
				r.provides[n] = append(r.provides[n], provider{p, v})
			}
		}
	}
	// Stable: highest version first, repository order kept on ties.
	for _, ps := range r.byName {
		sort.SliceStable(ps, func(i, j int) bool { return compareVersions(ps[i].Version, ps[j].Version) > 0 })
	}
	for _, ps := range r.provides {
		sort.SliceStable(ps, func(i, j int) bool {
			a, b := ps[i].pkg, ps[j].pkg
			if a.Priority != b.Priority {
				return a.Priority > b.Priority
			}
			if a.Name != b.Name {
				return a.Name < b.Name
			}
			return compareVersions(a.Version, b.Version) > 0
		})
	}
	return r
}

// satisfies reports whether p meets c by name or by what it provides.
func satisfies(p *Package, c constraint) bool {
	if p.Name == c.name && c.matches(p.Version) {
		return true
	}
	for _, pr := range p.Provides {
		n, v, _ := strings.Cut(pr, "=")
		if n == c.name && c.matches(v) {
			return true
		}
	}
	return false
}

func (r *resolver) candidates(c constraint) []*Package {
	var out []*Package
	for _, p := range r.byName[c.name] {
		if c.matches(p.Version) {
			out = append(out, p)
		}
	}
	for _, pr := range r.provides[c.name] {
		if c.matches(pr.version) && !slices.Contains(out, pr.pkg) {
			out = append(out, pr.pkg)
		}
	}
	return out
}

func (r *resolver) pick(c constraint, selected map[string]*Package) (*Package, error) {
	cands := r.candidates(c)
	if len(cands) == 0 {
		return nil, ErrMissing
	}
	for _, p := range cands {
		if selected[p.Name] == p {
			return p, nil
		}
	}
	// A selected package of the same name that does not fit: no
	// backtracking, the conflict is reported.
	if q, ok := selected[c.name]; ok {
		return q, errSelected
	}
	if r.locked != nil {
		for _, p := range cands {
			if l, ok := r.locked[p.Name]; ok && l.Version == p.Version && l.Checksum == p.Checksum {
				return p, nil
			}
		}
	}
	return cands[0], nil
}
