package kernel

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/vibedom/vibedom/vm"
)

// scanAliasesWhole is byAlias's index as it was built before modules were
// read in place and memoized: every module unpacked and read whole. The
// tests hold the new index to it.
func scanAliasesWhole(t *moduleTree) (map[string][]string, error) {
	out := map[string][]string{}
	for _, n := range slices.Sorted(maps.Keys(t.files)) {
		rel := t.files[n]
		if compressed(rel) && !hasGz(rel) {
			continue
		}
		raw, err := readModuleFS(t.fsys, rel)
		if err != nil {
			return nil, err
		}
		mi, err := parseModinfo(bytes.NewReader(raw), rel)
		if err != nil {
			return nil, err
		}
		for _, al := range mi.aliases {
			out[al] = append(out[al], n)
		}
	}
	return out, nil
}

func hasGz(rel string) bool { return filepath.Ext(rel) == ".gz" }

// gzTree is the Debian module tree of dir with the modules for which keep
// is true packed as .ko.gz (the others dropped), in memory, as
// AlpineBoot holds linux-virt.
func gzTree(tb testing.TB, dir string, keep func(rel string) bool) fstest.MapFS {
	tb.Helper()
	fsys := fstest.MapFS{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		isKO := filepath.Ext(rel) == ".ko"
		if isKO && !keep(rel) {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if isKO {
			var b bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
			zw.Write(data)
			zw.Close()
			rel, data = rel+".gz", b.Bytes()
		}
		fsys[rel] = &fstest.MapFile{Data: data, Mode: 0o644}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	// modules.order lists the kept modules only, by their .ko names as
	// kbuild writes them.
	var order []string
	for _, l := range strings.Split(string(fsys["modules.order"].Data), "\n") {
		if _, ok := fsys[l+".gz"]; ok {
			order = append(order, l)
		}
	}
	fsys["modules.order"] = &fstest.MapFile{Data: []byte(strings.Join(order, "\n") + "\n"), Mode: 0o644}
	return fsys
}

// TestByAliasMatchesWholeScan: on the real Debian kernels of both arches,
// uncompressed and as .ko.gz (a sample, read twice so the second read
// comes from the memo), the alias index and the resolved guest module set
// are exactly those of reading every module whole.
func TestByAliasMatchesWholeScan(t *testing.T) {
	t.Parallel()
	for _, arch := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
		t.Run(string(arch), func(t *testing.T) {
			dir := debianModules(t, arch)
			release := filepath.Base(dir)
			// A sample of the modules, with every module the guest set
			// needs (ext4's alias soft dependency among them).
			full, err := ResolveModules(dir, arch, DefaultModules)
			if err != nil {
				t.Fatal(err)
			}
			i := 0
			sample := gzTree(t, dir, func(rel string) bool {
				i++
				return i%8 == 0 || slices.Contains(full.Order, rel)
			})
			trees := []struct {
				name string
				open func() (*moduleTree, error)
				n    int
			}{
				{"ko", func() (*moduleTree, error) { return openModuleTree(dir, release, arch) }, 1},
				{"ko.gz", func() (*moduleTree, error) { return openModuleFS(sample, release, arch) }, 2},
			}
			for _, tr := range trees {
				for range tr.n {
					ref, err := tr.open()
					if err != nil {
						t.Fatal(err)
					}
					want, err := scanAliasesWhole(ref)
					if err != nil {
						t.Fatal(err)
					}
					if len(want["crc32c"]) == 0 {
						t.Fatalf("%s: no module declares alias crc32c: the comparison would prove nothing", tr.name)
					}
					ref.aliases = want
					wantMods, err := ref.resolve(GuestModules.Required, GuestModules.Optional)
					if err != nil {
						t.Fatal(err)
					}
					tree, err := tr.open()
					if err != nil {
						t.Fatal(err)
					}
					if _, err := tree.byAlias("crc32c"); err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(tree.aliases, want) {
						t.Errorf("%s: alias index differs from a whole scan (%d vs %d aliases)", tr.name, len(tree.aliases), len(want))
					}
					tree.aliases = nil
					got, err := tree.resolve(GuestModules.Required, GuestModules.Optional)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(got.Order, wantMods.Order) || !reflect.DeepEqual(got.Needs, wantMods.Needs) ||
						!slices.Equal(got.Builtin, wantMods.Builtin) || !slices.Equal(got.Unresolved, wantMods.Unresolved) ||
						!slices.Equal(got.Missing, wantMods.Missing) {
						t.Errorf("%s: resolved module set differs:\n got %v\nwant %v", tr.name, got.Order, wantMods.Order)
					}
				}
			}
		})
	}
}

// TestGzModinfoKeyedByContent: a .ko.gz whose bytes change under the same
// path is read anew, never answered from what the old bytes declared.
func TestGzModinfoKeyedByContent(t *testing.T) {
	t.Parallel()
	tree := func(alias string) string {
		return fakeTree(t, []fakeModule{
			{path: "kernel/fs/ext4/ext4.ko.gz", info: []string{"depends=", "softdep=pre: crypto-crc32c"}},
			{path: "kernel/crypto/crc.ko.gz", info: []string{"alias=" + alias, "depends="}},
		}, nil, nil)
	}
	for _, c := range []struct{ alias, want string }{
		{"crypto-crc32c", "kernel/crypto/crc.ko.gz"},
		{"crypto-other", ""}, // same paths, other bytes: unresolved
		{"crypto-crc32c", "kernel/crypto/crc.ko.gz"},
	} {
		m, err := ResolveModuleList(tree(c.alias), vm.ArchAMD64, ModuleList{Required: []string{"ext4"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(m.Order, "kernel/crypto/crc.ko.gz"); got != (c.want != "") {
			t.Errorf("alias %s: order %v, unresolved %v", c.alias, m.Order, m.Unresolved)
		}
	}
}

// BenchmarkByAlias builds the alias index of the real amd64 Debian kernel
// the old way (every module read whole) and the new way, uncompressed and
// as .ko.gz (a sample; memo warm, and cold), and reports old/new.
func BenchmarkByAlias(b *testing.B) {
	dir := debianModules(b, vm.ArchAMD64)
	release := filepath.Base(dir)
	i := 0
	sample := gzTree(b, dir, func(string) bool { i++; return i%4 == 0 })
	for _, c := range []struct {
		name string
		open func() (*moduleTree, error)
	}{
		{"ko", func() (*moduleTree, error) { return openModuleTree(dir, release, vm.ArchAMD64) }},
		{"ko.gz", func() (*moduleTree, error) { return openModuleFS(sample, release, vm.ArchAMD64) }},
		{"ko.gz-cold", func() (*moduleTree, error) {
			gzModinfo.Lock()
			gzModinfo.m = nil
			gzModinfo.Unlock()
			return openModuleFS(sample, release, vm.ArchAMD64)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var old, cur time.Duration
			for range b.N {
				t1, err := c.open()
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				if _, err := scanAliasesWhole(t1); err != nil {
					b.Fatal(err)
				}
				old += time.Since(start)
				t2, err := c.open()
				if err != nil {
					b.Fatal(err)
				}
				start = time.Now()
				if _, err := t2.byAlias("crc32c"); err != nil {
					b.Fatal(err)
				}
				cur += time.Since(start)
			}
			b.ReportMetric(float64(old.Milliseconds())/float64(b.N), "old-ms/op")
			b.ReportMetric(float64(cur.Milliseconds())/float64(b.N), "new-ms/op")
			b.ReportMetric(float64(old)/float64(cur), "old/new")
		})
	}
}

// TestByAliasFirstFailureInNameOrder: the alias scan reads modules in
// parallel, yet a tree with unreadable modules is refused naming the first
// of them in name order, every time, and a readable tree's index is the
// same as a sequential scan's.
func TestByAliasFirstFailureInNameOrder(t *testing.T) {
	t.Parallel()
	mods := []fakeModule{{path: "kernel/fs/ext4/ext4.ko.gz", info: []string{"depends=", "softdep=pre: crypto-crc32c"}}}
	for i := range 40 {
		mods = append(mods, fakeModule{path: fmt.Sprintf("kernel/m/m%02d.ko.gz", i), info: []string{"alias=crypto-crc32c", "depends="}})
	}
	dir := fakeTree(t, mods, nil, nil)
	tree, err := openModuleTree(dir, fakeRelease, vm.ArchAMD64)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tree.byAlias("crypto-crc32c")
	if err != nil {
		t.Fatal(err)
	}
	want, err := scanAliasesWhole(tree)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want["crypto-crc32c"]) || len(got) != 40 {
		t.Errorf("providers %v, a whole scan finds %v", got, want["crypto-crc32c"])
	}
	for _, bad := range []string{"m31", "m07"} {
		if err := os.WriteFile(filepath.Join(dir, "kernel/m", bad+".ko.gz"), []byte("not gzip"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		_, err := ResolveModuleList(dir, vm.ArchAMD64, ModuleList{Required: []string{"ext4"}})
		if err == nil || !strings.Contains(err.Error(), "m07.ko.gz") {
			t.Fatalf("unreadable modules m07 and m31: %v, want an error naming m07", err)
		}
	}
}
