package agents

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
)

// Node agents: a JavaScript CLI from the npm registry, its whole
// dependency tree resolved by vibedom from the registry's packuments
// (semver, no npm on the host), every tarball verified against its
// dist.integrity (SHA-512), unpacked without running any install script,
// and pinned in a lockfile written at init and checked on every run. The
// guest runs it with its own node.

// NPMPrefix starts an --agent or --agents name that is an npm package.
const NPMPrefix = "npm:"

// RuntimeNode is Manifest.Runtime for an agent the guest's node runs.
const RuntimeNode = "node"

// LockFile is the lockfile's name in a node agent's directory.
const LockFile = "npm-lock.json"

// Bounds on what a dependency tree may hold.
var (
	maxNPMPackages = 3000
	// MaxNPMTarball bounds one tarball's bytes (the registry does not say
	// a tarball's size before it is fetched).
	MaxNPMTarball int64 = 256 << 20
)

// NPMAgent is a node agent vibedom knows by name, pinned like the native
// ones: its package, exact version and tarball integrity.
type NPMAgent struct {
	Agent, Package, Version, Integrity string
}

// NPMAgents are the named node agents. Gemini CLI ships one bundled
// script (bundle/gemini.js) with no required dependencies; its optional
// native ones (node-pty, keytar) need install scripts and are left out.
var NPMAgents = []NPMAgent{
	{"gemini", "@google/gemini-cli", "0.61.0",
		"sha512-dbQ9A0qBtFJNi6XBkHvfZ6Azpn6PNgH/P8h2MZ67RLlX8hSAVjup39CRWqdRxZv7YXIuhrFaytr8y0jKnkoxnQ=="},
}

// LookupNPMAgent returns the named node agent.
func LookupNPMAgent(name string) (NPMAgent, bool) {
	for _, a := range NPMAgents {
		if a.Agent == name {
			return a, true
		}
	}
	return NPMAgent{}, false
}

// NPMSpec is "npm:NAME[@VERSION]" parsed.
type NPMSpec struct{ Name, Version string }

func (s NPMSpec) String() string {
	if s.Version == "" {
		return NPMPrefix + s.Name
	}
	return NPMPrefix + s.Name + "@" + s.Version
}

var (
	npmNamePart  = regexp.MustCompile(`^[a-z0-9~-][a-z0-9._~-]*$`)
	exactVersion = regexp.MustCompile(`^(0|[1-9]\d{0,8})\.(0|[1-9]\d{0,8})\.(0|[1-9]\d{0,8})(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)
)

// ValidNPMName reports whether n is an npm package name vibedom accepts:
// "name" or "@scope/name", lower case, URL-safe, at most 214 bytes.
func ValidNPMName(n string) bool {
	if len(n) == 0 || len(n) > 214 {
		return false
	}
	parts := []string{n}
	if strings.HasPrefix(n, "@") {
		scope, name, ok := strings.Cut(n[1:], "/")
		if !ok {
			return false
		}
		parts = []string{scope, name}
	}
	for _, p := range parts {
		if !npmNamePart.MatchString(p) || p == "node_modules" || p == "favicon.ico" {
			return false
		}
	}
	return true
}

// ParseNPMSpec parses "npm:NAME@VERSION" (needVersion: an exact version
// is required, as at init) or "npm:NAME[@VERSION]".
func ParseNPMSpec(s string, needVersion bool) (NPMSpec, error) {
	rest, ok := strings.CutPrefix(s, NPMPrefix)
	if !ok {
		return NPMSpec{}, fmt.Errorf("%q is not an npm agent (npm:PACKAGE@VERSION)", s)
	}
	name, ver := rest, ""
	if i := strings.LastIndexByte(rest, '@'); i > 0 {
		name, ver = rest[:i], rest[i+1:]
		if ver == "" {
			return NPMSpec{}, fmt.Errorf("%q: no version after @ (npm:PACKAGE@1.2.3)", s)
		}
	}
	if !ValidNPMName(name) {
		return NPMSpec{}, fmt.Errorf("%q: %q is not an npm package name (lower case, e.g. npm:@google/gemini-cli@0.61.0)", s, name)
	}
	if ver != "" && !exactVersion.MatchString(ver) {
		return NPMSpec{}, fmt.Errorf("%q: the version must be exact (e.g. 1.2.3), not %q: vibedom pins what it installs", s, ver)
	}
	if needVersion && ver == "" {
		return NPMSpec{}, fmt.Errorf("%q: name the exact version to pin (npm:%s@VERSION; `npm view %s version` says the newest)", s, name, name)
	}
	return NPMSpec{Name: name, Version: ver}, nil
}

// NPMLock is a node agent's lockfile: the whole tree, each package's
// tarball integrity and the digest of the files it unpacked to.
type NPMLock struct {
	LockfileVersion int    `json:"lockfileVersion"`
	Agent           string `json:"agent"` // "gemini", or "npm:NAME"
	Name            string `json:"name"`
	Version         string `json:"version"`
	Registry        string `json:"registry"`
	// Bin is the script node runs, relative to the agent's package/.
	Bin      string          `json:"bin"`
	Packages []LockedPackage `json:"packages"`
}

// LockedPackage is one package of the tree.
type LockedPackage struct {
	// Path is where it is unpacked, relative to package/:
	// "node_modules/a" or "node_modules/a/node_modules/b".
	Path      string `json:"path"`
	Name      string `json:"name"`
	Version   string `json:"version"`
	Resolved  string `json:"resolved"`
	Integrity string `json:"integrity"`
	// Files is the SHA-256 of the unpacked files (see treeDigest).
	Files string `json:"files,omitempty"`
	// InstallScript says the package has install scripts, which vibedom
	// never runs.
	InstallScript bool `json:"installScript,omitempty"`
}

// packument is the part of a registry document the resolver reads.
type packument struct {
	Versions map[string]pkgVersion `json:"versions"`
}

type pkgVersion struct {
	Version          string            `json:"version"`
	Dependencies     map[string]string `json:"dependencies"`
	Bin              json.RawMessage   `json:"bin"`
	HasInstallScript bool              `json:"hasInstallScript"`
	Scripts          map[string]string `json:"scripts"`
	Dist             struct {
		Tarball   string `json:"tarball"`
		Integrity string `json:"integrity"`
	} `json:"dist"`
}

func (v pkgVersion) installScript() bool {
	if v.HasInstallScript {
		return true
	}
	for _, s := range []string{"preinstall", "install", "postinstall"} {
		if v.Scripts[s] != "" {
			return true
		}
	}
	return false
}

type resolver struct {
	ctx   context.Context
	o     Options
	reg   *url.URL
	docs  map[string]*packument
	nodes map[string]*LockedPackage // by Path
	deps  map[string]map[string]string
	read  int64 // packument bytes read so far (maxPackuments)
}

func (r *resolver) packument(name string) (*packument, error) {
	if d, ok := r.docs[name]; ok {
		return d, nil
	}
	u := packumentURL(r.o.Registry, name)
	req, err := http.NewRequestWithContext(r.ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s's packument: %w (check the network, or --registry)", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch %s's packument from %s: %s", name, u, resp.Status)
	}
	limit := min(int64(maxPackument), maxPackuments-r.read)
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("fetch %s's packument: %w", name, err)
	}
	r.read += int64(len(body))
	if r.read > maxPackuments {
		return nil, fmt.Errorf("the dependency tree's packuments from %s are over %d MiB in all (at %s): refused", r.o.Registry, maxPackuments>>20, name)
	}
	if len(body) > maxPackument {
		return nil, fmt.Errorf("%s's packument from %s is over %d MiB: refused", name, u, maxPackument>>20)
	}
	var d packument
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, fmt.Errorf("%s's packument from %s: %w", name, u, err)
	}
	r.docs[name] = &d
	return &d, nil
}

// pick returns the highest version of name matching rng.
func (r *resolver) pick(name, rng string) (pkgVersion, error) {
	d, err := r.packument(name)
	if err != nil {
		return pkgVersion{}, err
	}
	want, ok := parseRange(rng)
	if !ok {
		return pkgVersion{}, fmt.Errorf("dependency %s@%q: not a semver range (git, file, alias and tag dependencies are not supported)", name, rng)
	}
	var best semver
	var bestS string
	for s := range d.Versions {
		v, ok := parseSemver(s)
		// A key that is a version only once trimmed is no version: it
		// would be a file name in the cache and a line in a message.
		if ok && s == strings.TrimSpace(s) && want.match(v) && (bestS == "" || v.compare(best) > 0) {
			best, bestS = v, s
		}
	}
	if bestS == "" {
		return pkgVersion{}, fmt.Errorf("the registry %s has no %s matching %q", r.o.Registry, name, rng)
	}
	v := d.Versions[bestS]
	v.Version = bestS
	return v, nil
}

// add records name@v at p after checking its dist.
func (r *resolver) add(p, name string, v pkgVersion) error {
	if len(r.nodes) >= maxNPMPackages {
		return fmt.Errorf("the dependency tree has more than %d packages: refused", maxNPMPackages)
	}
	if _, ok := sriSHA512(v.Dist.Integrity); !ok {
		return fmt.Errorf("%w: %s@%s: the registry gives no sha512 integrity (%q); refused", ErrIntegrity, name, v.Version, v.Dist.Integrity)
	}
	t, err := url.Parse(v.Dist.Tarball)
	if err != nil || !t.IsAbs() {
		return fmt.Errorf("%s@%s: the registry's tarball address %q is not a URL", name, v.Version, v.Dist.Tarball)
	}
	if !sameOrigin(r.reg, t) {
		return fmt.Errorf("%w: %s@%s: the registry %s points to %s; refused", ErrForeignHost, name, v.Version, r.o.Registry, t.Redacted())
	}
	r.nodes[p] = &LockedPackage{Path: p, Name: name, Version: v.Version, Resolved: t.String(),
		Integrity: v.Dist.Integrity, InstallScript: v.installScript()}
	r.deps[p] = v.Dependencies
	return nil
}

// parentOf is the package path whose node_modules holds p, "" for the top.
func parentOf(p string) string {
	i := strings.LastIndex(p, "/node_modules/")
	if i < 0 {
		return ""
	}
	return p[:i]
}

func under(parent, name string) string {
	if parent == "" {
		return "node_modules/" + name
	}
	return parent + "/node_modules/" + name
}

// place finds where name (wanted by the package at from, in range rng)
// goes: node's lookup from `from` upwards; a match found is reused, a
// conflict nests it just below the conflict, and nothing found hoists it
// to the top.
func (r *resolver) place(from, name, rng string) (string, bool, error) {
	want, ok := parseRange(rng)
	if !ok {
		return "", false, fmt.Errorf("dependency %s@%q: not a semver range (git, file, alias and tag dependencies are not supported)", name, rng)
	}
	var chain []string // from, its parent, …, ""
	for p := from; ; p = parentOf(p) {
		chain = append(chain, p)
		if p == "" {
			break
		}
	}
	target := ""
	for i, p := range chain {
		if n, ok := r.nodes[under(p, name)]; ok {
			v, _ := parseSemver(n.Version)
			if want.match(v) {
				return under(p, name), true, nil
			}
			if i == 0 {
				return "", false, fmt.Errorf("%s needs %s@%s but %s is there", from, name, rng, n.Version)
			}
			return under(chain[i-1], name), false, nil
		}
		target = under(p, name)
	}
	return target, false, nil
}

// ResolveNPM resolves spec's whole dependency tree (dependencies only:
// optional, peer and dev dependencies are left out) from the registry's
// packuments into a lock. integrity, when set, is the root tarball's pin.
func ResolveNPM(ctx context.Context, o Options, agent string, spec NPMSpec, integrity string) (*NPMLock, error) {
	o, reg, err := o.normalized()
	if err != nil {
		return nil, err
	}
	r := &resolver{ctx: ctx, o: o, reg: reg, docs: map[string]*packument{}, nodes: map[string]*LockedPackage{}, deps: map[string]map[string]string{}}
	d, err := r.packument(spec.Name)
	if err != nil {
		return nil, err
	}
	root, ok := d.Versions[spec.Version]
	if !ok {
		return nil, fmt.Errorf("the registry %s has no %s@%s (`npm view %s versions`)", o.Registry, spec.Name, spec.Version, spec.Name)
	}
	root.Version = spec.Version
	if integrity != "" {
		want, _ := sriSHA512(integrity)
		got, ok := sriSHA512(root.Dist.Integrity)
		if !ok || !bytes.Equal(got, want) {
			return nil, fmt.Errorf("%w: %s@%s: the registry says %q, vibedom pins %s; nothing installed", ErrIntegrity, spec.Name, spec.Version, root.Dist.Integrity, integrity)
		}
	}
	bin, err := binOf(spec.Name, root.Bin)
	if err != nil {
		return nil, err
	}
	top := "node_modules/" + spec.Name
	if err := r.add(top, spec.Name, root); err != nil {
		return nil, err
	}
	// Breadth first, dependencies in name order: the same registry
	// answers give the same tree.
	queue := []string{top}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		names := make([]string, 0, len(r.deps[p]))
		for n := range r.deps[p] {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if !ValidNPMName(n) {
				return nil, fmt.Errorf("%s depends on %q, not an npm package name: refused", r.nodes[p].Name, n)
			}
			rng := r.deps[p][n]
			at, found, err := r.place(p, n, rng)
			if err != nil {
				return nil, err
			}
			if found {
				continue
			}
			v, err := r.pick(n, rng)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", r.nodes[p].Name, err)
			}
			if err := r.add(at, n, v); err != nil {
				return nil, err
			}
			queue = append(queue, at)
		}
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	lock := &NPMLock{LockfileVersion: 1, Agent: agent, Name: spec.Name, Version: spec.Version, Registry: reg.String(), Bin: top + "/" + bin}
	for _, n := range r.nodes {
		lock.Packages = append(lock.Packages, *n)
	}
	sort.Slice(lock.Packages, func(i, j int) bool { return lock.Packages[i].Path < lock.Packages[j].Path })
	return lock, nil
}

// check walks the finished tree as node will and confirms every
// dependency resolves to a version in its range (a later hoist cannot
// have shadowed an earlier one).
func (r *resolver) check() error {
	for p, deps := range r.deps {
		for n, rng := range deps {
			want, _ := parseRange(rng)
			found := false
			for q := p; ; q = parentOf(q) {
				if m, ok := r.nodes[under(q, n)]; ok {
					v, _ := parseSemver(m.Version)
					if !want.match(v) {
						return fmt.Errorf("cannot lay out the tree: %s would load %s@%s, it needs %s", p, n, m.Version, rng)
					}
					found = true
					break
				}
				if q == "" {
					break
				}
			}
			if !found {
				return fmt.Errorf("cannot lay out the tree: %s's %s is missing", p, n)
			}
		}
	}
	return nil
}

// binOf picks the package's command: its only bin entry, or the one named
// after the package.
func binOf(name string, raw json.RawMessage) (string, error) {
	var one string
	var many map[string]string
	base := name[strings.LastIndexByte(name, '/')+1:]
	if len(raw) == 0 || string(raw) == "null" {
		return "", fmt.Errorf("%s has no command (no \"bin\" in its package.json): not an agent CLI", name)
	}
	if json.Unmarshal(raw, &one) != nil {
		if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 {
			return "", fmt.Errorf("%s: its \"bin\" is not a path or a map of paths", name)
		}
		if len(many) == 1 {
			for _, v := range many {
				one = v
			}
		} else if one = many[base]; one == "" {
			keys := slices.Sorted(mapsKeys(many))
			return "", fmt.Errorf("%s has several commands (%s) and none named %s", name, strings.Join(keys, ", "), base)
		}
	}
	c := path.Clean(strings.TrimPrefix(one, "./"))
	if one == "" || path.IsAbs(c) || c == ".." || strings.HasPrefix(c, "../") || c == "." || strings.ContainsAny(c, "\\\x00") {
		return "", fmt.Errorf("%s: its command %q is not a path inside the package", name, one)
	}
	return c, nil
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// NPMDir is the directory name of a node agent: <agent>-<version>-node,
// an npm: agent's name made a file name ("npm:@google/gemini-cli" is
// "npm-google+gemini-cli": '+' is in no npm name, so "npm:a-b" and
// "npm:@a/b" do not meet).
func NPMDir(agent, version string) string {
	a := strings.NewReplacer("@", "", "/", "+", ":", "-").Replace(agent)
	return a + "-" + version + "-" + RuntimeNode
}

// agentName is the Manifest.Agent of a node agent: its name, or npm:PACKAGE.
func agentName(agent string, spec NPMSpec) string {
	if agent != "" {
		return agent
	}
	return NPMPrefix + spec.Name
}

// InstallNPM installs a node agent: the lock already in its directory
// (checked), else the one given, else a tree resolved now. agent is the
// named agent ("gemini") or "" for npm:PACKAGE; integrity pins the root
// tarball when set. Every tarball is fetched (or taken from the cache)
// and checked against the lock's integrity, unpacked into a temporary
// directory (the same checks as a native agent's), the lock written
// beside it with each package's file digest, made read-only and renamed
// into place. No install script runs. A failure installs nothing.
func InstallNPM(ctx context.Context, o Options, agent string, spec NPMSpec, integrity string) (Result, error) {
	o, reg, err := o.normalized()
	if err != nil {
		return Result{}, err
	}
	name := agentName(agent, spec)
	unlock, err := lockAgents(o.Home)
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	if i, err := FindNPM(o.Home, name, spec.Version); err == nil {
		if err := VerifyNPM(i); err == nil {
			return Result{Installed: i}, nil
		}
	}
	lock, err := ResolveNPM(ctx, o, name, spec, integrity)
	if err != nil {
		return Result{}, err
	}
	parent := AgentsDir(o.Home)
	dirName := NPMDir(name, spec.Version)
	if old, _ := filepath.Glob(filepath.Join(parent, ".tmp-"+dirName+"-*")); len(old) > 0 {
		for _, d := range old {
			removeTree(d)
		}
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-"+dirName+"-")
	if err != nil {
		return Result{}, fmt.Errorf("install %s: %w", spec, err)
	}
	done := false
	defer func() {
		if !done {
			removeTree(tmp)
		}
	}()
	root, err := os.OpenRoot(tmp)
	if err != nil {
		return Result{}, err
	}
	defer root.Close()
	budget := o.MaxUnpacked
	for i := range lock.Packages {
		lp := &lock.Packages[i]
		if err := checkLockedPath(lp); err != nil {
			return Result{}, err
		}
		tgz, err := fetchNPMTarball(ctx, o, reg, lp)
		if err != nil {
			return Result{}, err
		}
		dst := pkgDir + "/" + lp.Path
		if err := root.MkdirAll(dst, 0o755); err != nil {
			return Result{}, fmt.Errorf("install %s: %w", lp.Name, err)
		}
		n, err := unpackNPM(tgz, root, dst, lp, budget)
		if err != nil {
			return Result{}, err
		}
		budget -= n
	}
	// Digests once every package is in place (a package's node_modules/
	// holds the packages nested in it, which have their own).
	locked := lockedPaths(lock)
	for i := range lock.Packages {
		lp := &lock.Packages[i]
		if lp.Files, err = treeDigest(filepath.Join(tmp, pkgDir), lp.Path, locked); err != nil {
			return Result{}, err
		}
	}
	binRel := pkgDir + "/" + lock.Bin
	bst, err := os.Lstat(filepath.Join(tmp, filepath.FromSlash(binRel)))
	if err != nil || !bst.Mode().IsRegular() {
		return Result{}, fmt.Errorf("%s: its command %s is missing from the package or not a regular file; nothing installed", spec, lock.Bin)
	}
	lb, err := json.MarshalIndent(lock, "", "  ")
	if err != nil {
		return Result{}, err
	}
	lb = append(lb, '\n')
	if err := atomicfile.WriteNew(filepath.Join(tmp, LockFile), lb, 0o644); err != nil {
		return Result{}, err
	}
	bsum, err := fileSHA256(filepath.Join(tmp, filepath.FromSlash(binRel)))
	if err != nil {
		return Result{}, err
	}
	ls := sha256.Sum256(lb)
	m := Manifest{Agent: name, Arch: "any", Libc: "any", Package: spec.Name, Version: spec.Version,
		Integrity: lock.Packages[rootIndex(lock)].Integrity, Binary: binRel, BinarySHA256: bsum, BinarySize: bst.Size(),
		Registry: reg.String(), Installed: time.Now().UTC().Truncate(time.Second),
		Runtime: RuntimeNode, LockSHA256: hex.EncodeToString(ls[:])}
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Result{}, err
	}
	if err := atomicfile.WriteNew(filepath.Join(tmp, ManifestFile), append(mb, '\n'), 0o644); err != nil {
		return Result{}, err
	}
	if err := makeReadOnly(tmp); err != nil {
		return Result{}, fmt.Errorf("install %s: %w", spec, err)
	}
	final := filepath.Join(parent, dirName)
	if _, err := os.Lstat(final); err == nil {
		if err := removeTree(final); err != nil {
			return Result{}, fmt.Errorf("replace %s: %w (remove it by hand and run init again)", final, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return Result{}, fmt.Errorf("install %s: %w", spec, err)
	}
	atomicfile.SyncDir(parent)
	done = true
	i, err := FindNPM(o.Home, name, spec.Version)
	if err != nil {
		return Result{}, err
	}
	return Result{Installed: i, Fresh: true}, nil
}

func rootIndex(l *NPMLock) int {
	for i, p := range l.Packages {
		if p.Path == "node_modules/"+l.Name {
			return i
		}
	}
	return 0
}

// checkLockedPath refuses a lock entry whose path is not node_modules/NAME
// nested only under other packages' node_modules.
func checkLockedPath(lp *LockedPackage) error {
	p := lp.Path
	ok := ValidNPMName(lp.Name) && strings.HasSuffix(p, "node_modules/"+lp.Name) && path.Clean(p) == p
	for rest := p; ok && rest != ""; {
		after, found := strings.CutPrefix(rest, "node_modules/")
		if !found {
			ok = false
			break
		}
		seg := after
		if strings.HasPrefix(after, "@") {
			if i := strings.IndexByte(after, '/'); i > 0 {
				if j := strings.Index(after[i+1:], "/"); j >= 0 {
					seg = after[:i+1+j]
				}
			}
		} else if j := strings.IndexByte(after, '/'); j >= 0 {
			seg = after[:j]
		}
		if !ValidNPMName(seg) {
			ok = false
			break
		}
		rest = strings.TrimPrefix(after[len(seg):], "/")
	}
	if !ok {
		return fmt.Errorf("the lock's package %q at %q is not a node_modules path: refused", lp.Name, lp.Path)
	}
	return nil
}

// fetchNPMTarball returns lp's verified tarball in the cache, fetching it
// (at most MaxNPMTarball bytes) when the cache has none that hashes to
// the lock's integrity.
func fetchNPMTarball(ctx context.Context, o Options, reg *url.URL, lp *LockedPackage) (string, error) {
	want, ok := sriSHA512(lp.Integrity)
	if !ok {
		return "", fmt.Errorf("%w: %s@%s: no sha512 integrity in the lock", ErrIntegrity, lp.Name, lp.Version)
	}
	pin := Pin{Package: lp.Name, Version: lp.Version}
	cache := CacheDir(o.Home)
	final := filepath.Join(cache, TarballName(pin))
	if d, err := fileSHA512(final, MaxNPMTarball); err == nil && bytes.Equal(d, want) {
		return final, nil
	}
	os.Remove(final)
	t, err := url.Parse(lp.Resolved)
	if err != nil || !sameOrigin(reg, t) {
		return "", fmt.Errorf("%w: %s@%s: the lock's tarball %q is not on %s; refused", ErrForeignHost, lp.Name, lp.Version, lp.Resolved, reg)
	}
	if err := os.MkdirAll(filepath.Join(cache, partialDir), 0o755); err != nil {
		return "", fmt.Errorf("make the download cache: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.String(), nil)
	if err != nil {
		return "", err
	}
	resp, err := o.Client.Do(req)
	if err != nil {
		return "", fmt.Errorf("download %s@%s: %w", lp.Name, lp.Version, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("download %s: %s", t.Redacted(), resp.Status)
	}
	if resp.ContentLength > MaxNPMTarball {
		return "", fmt.Errorf("%s@%s: the tarball is %d bytes, over vibedom's %d MiB bound; nothing installed", lp.Name, lp.Version, resp.ContentLength, MaxNPMTarball>>20)
	}
	part := filepath.Join(cache, partialDir, TarballName(pin)+".part")
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return "", err
	}
	h := sha512.New()
	n, cerr := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, MaxNPMTarball+1))
	if err := f.Close(); cerr == nil {
		cerr = err
	}
	switch {
	case n > MaxNPMTarball:
		os.Remove(part)
		return "", fmt.Errorf("%s@%s: the tarball is over vibedom's %d MiB bound; nothing installed", lp.Name, lp.Version, MaxNPMTarball>>20)
	case cerr != nil:
		os.Remove(part)
		return "", fmt.Errorf("download %s@%s: %w (run again)", lp.Name, lp.Version, cerr)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		os.Remove(part)
		return "", fmt.Errorf("%w: %s@%s: the tarball hashes to %s, the lock says %s; nothing installed", ErrIntegrity, lp.Name, lp.Version, sri(got), lp.Integrity)
	}
	if err := atomicfile.Move(part, final); err != nil {
		os.Remove(part)
		return "", err
	}
	return final, nil
}

// unpackNPM unpacks the cached tarball into dst (inside root), hashing
// it again as it is read, and returns the bytes unpacked.
func unpackNPM(tgz string, root *os.Root, dst string, lp *LockedPackage, budget int64) (int64, error) {
	want, _ := sriSHA512(lp.Integrity)
	f, err := os.Open(tgz)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h := sha512.New()
	r := io.TeeReader(io.LimitReader(f, MaxNPMTarball+1), h)
	u, xerr := extractTo(r, root, dst, Pin{Package: lp.Name, Version: lp.Version}, budget)
	if _, err := io.Copy(io.Discard, r); err != nil {
		return 0, err
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		os.Remove(tgz)
		return 0, fmt.Errorf("%w: %s@%s: the cached tarball hashes to %s, the lock says %s; nothing installed (run init again)", ErrIntegrity, lp.Name, lp.Version, sri(got), lp.Integrity)
	}
	return u.total, xerr
}

func lockedPaths(l *NPMLock) map[string]bool {
	m := map[string]bool{}
	for _, p := range l.Packages {
		m[p.Path] = true
	}
	return m
}

// treeDigest is the SHA-256 of a package's unpacked files: for each
// entry below pkgs/pkgPath (not into the other locked packages nested in
// it, which have their own) in path order, its path, kind, mode's
// execute bit, and the SHA-256 of its content or its link target.
func treeDigest(pkgs, pkgPath string, locked map[string]bool) (string, error) {
	h := sha256.New()
	dir := filepath.Join(pkgs, filepath.FromSlash(pkgPath))
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && p != dir && locked[pkgPath+"/"+rel] {
			return fs.SkipDir
		}
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case st.IsDir():
			fmt.Fprintf(h, "d %s\n", rel)
		case st.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "l %s %q\n", rel, t)
		case st.Mode().IsRegular():
			s, err := fileSHA256(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "f %s %v %s\n", rel, st.Mode()&0o100 != 0, s)
		default:
			return fmt.Errorf("%s: %s is not a file, directory or symlink", pkgPath, rel)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func fileSHA256(p string) (string, error) {
	h := sha256.New()
	if err := hashFile(h, p); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func fileSHA512(p string, max int64) ([]byte, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if st.Size() > max {
		return nil, errors.New("too large")
	}
	h := sha512.New()
	if err := hashFile(h, p); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// FindNPM finds the installed node agent (its name: "gemini" or
// "npm:PACKAGE") at version, or its only installed version when version
// is "". It reads the manifest only; VerifyNPM checks the files.
func FindNPM(home, agent, version string) (*Installed, error) {
	notInstalled := func(why string) error {
		v := version
		if v == "" {
			v = "VERSION"
		}
		hint := agent
		if strings.HasPrefix(agent, NPMPrefix) {
			hint = agent + "@" + v
		}
		return fmt.Errorf("%w: %s %s: run `vibedom init --agents %s`", ErrNotInstalled, agent, why, hint)
	}
	var dirs []string
	if version != "" {
		dirs = []string{filepath.Join(AgentsDir(home), NPMDir(agent, version))}
	} else {
		dirs, _ = filepath.Glob(filepath.Join(AgentsDir(home), NPMDir(agent, "*")))
		var keep []string
		for _, d := range dirs {
			if m, err := readManifest(d); err == nil && m.Agent == agent && m.Runtime == RuntimeNode {
				keep = append(keep, d)
			}
		}
		dirs = keep
		if len(dirs) > 1 {
			var vs []string
			for _, d := range dirs {
				m, _ := readManifest(d)
				vs = append(vs, m.Version)
			}
			return nil, fmt.Errorf("%s is installed in versions %s: name one (--agent %s@VERSION)", agent, strings.Join(vs, ", "), agent)
		}
	}
	if len(dirs) == 0 {
		return nil, notInstalled("is not installed")
	}
	m, err := readManifest(dirs[0])
	if err != nil {
		return nil, notInstalled("is not installed")
	}
	if m.Agent != agent || m.Runtime != RuntimeNode || (version != "" && m.Version != version) {
		return nil, notInstalled("does not match its directory")
	}
	return &Installed{Manifest: m, Dir: dirs[0]}, nil
}

func readManifest(dir string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return m, err
	}
	if len(b) > 1<<20 {
		return m, errors.New("manifest too large")
	}
	return m, json.Unmarshal(b, &m)
}

// VerifyNPM checks an installed node agent before it runs: the lockfile
// is the one its manifest recorded, and every package's files still hash
// to the lock's digest. Anything else is a one-line error naming the
// init command that reinstalls it.
func VerifyNPM(i *Installed) error {
	again := fmt.Sprintf("remove %s and run `vibedom init --agents %s`", i.Dir, initName(i))
	lb, err := os.ReadFile(filepath.Join(i.Dir, LockFile))
	if err != nil {
		return fmt.Errorf("%s: its lockfile is missing: %s", i.Agent, again)
	}
	ls := sha256.Sum256(lb)
	if hex.EncodeToString(ls[:]) != i.LockSHA256 {
		return fmt.Errorf("%w: %s: its lockfile %s was changed since init: %s", ErrIntegrity, i.Agent, filepath.Join(i.Dir, LockFile), again)
	}
	var lock NPMLock
	if err := json.Unmarshal(lb, &lock); err != nil {
		return fmt.Errorf("%s: its lockfile: %w: %s", i.Agent, err, again)
	}
	if lock.Name != i.Package || lock.Version != i.Version || pkgDir+"/"+lock.Bin != i.Binary {
		return fmt.Errorf("%w: %s: its lockfile does not match its manifest: %s", ErrIntegrity, i.Agent, again)
	}
	locked := lockedPaths(&lock)
	for _, lp := range lock.Packages {
		if err := checkLockedPath(&lp); err != nil {
			return err
		}
		d, err := treeDigest(filepath.Join(i.Dir, pkgDir), lp.Path, locked)
		if err != nil || d != lp.Files {
			return fmt.Errorf("%w: %s: the files of %s@%s no longer match the lock: %s", ErrIntegrity, i.Agent, lp.Name, lp.Version, again)
		}
	}
	return i.VerifyBinary()
}

func initName(i *Installed) string {
	if strings.HasPrefix(i.Agent, NPMPrefix) {
		return i.Agent + "@" + i.Version
	}
	return i.Agent
}

// NodeRequest is what installing or finding a node agent needs: the
// agent's name (Manifest.Agent), the package and version, and the root
// tarball's pinned integrity ("" for npm:PACKAGE, pinned by the lock at
// init). needVersion: an npm: agent must name its exact version (init).
func NodeRequest(agent string, needVersion bool) (name string, spec NPMSpec, integrity string, err error) {
	if a, ok := LookupNPMAgent(agent); ok {
		return a.Agent, NPMSpec{Name: a.Package, Version: a.Version}, a.Integrity, nil
	}
	spec, err = ParseNPMSpec(agent, needVersion)
	if err != nil {
		return "", NPMSpec{}, "", err
	}
	return NPMPrefix + spec.Name, spec, "", nil
}

// FindNode finds an installed node agent by its --agent name ("gemini",
// npm:PACKAGE or npm:PACKAGE@VERSION) and verifies it (VerifyNPM).
func FindNode(home, agent string) (*Installed, error) {
	name, spec, _, err := NodeRequest(agent, false)
	if err != nil {
		return nil, err
	}
	i, err := FindNPM(home, name, spec.Version)
	if err != nil {
		return nil, err
	}
	if err := VerifyNPM(i); err != nil {
		return nil, err
	}
	return i, nil
}
