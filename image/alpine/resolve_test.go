package alpine

import (
	"errors"
	"strings"
	"testing"
)

func pk(name, ver string, deps, provides []string) *Package {
	return &Package{Name: name, Version: ver, Arch: "x86_64", Size: 10, Repo: "main",
		Checksum: "Q1" + strings.Repeat("A", 27) + "=", Depends: deps, Provides: provides}
}

func names(l *Lock) string {
	var s []string
	for _, p := range l.Packages {
		s = append(s, p.String())
	}
	return strings.Join(s, " ")
}

func TestResolve(t *testing.T) {
	t.Parallel()
	base := []*Package{
		pk("git", "2.45.0-r0", []string{"so:libcurl.so.4", "so:libc.musl-x86_64.so.1", "/bin/sh"}, nil),
		pk("libcurl", "8.9-r0", []string{"so:libc.musl-x86_64.so.1"}, []string{"so:libcurl.so.4=4.8.0"}),
		pk("musl", "1.2.5-r0", nil, []string{"so:libc.musl-x86_64.so.1=1"}),
		pk("busybox-binsh", "1.36-r0", nil, []string{"/bin/sh", "cmd:sh=1.36-r0"}),
		pk("bash-binsh", "5.2-r0", nil, []string{"/bin/sh"}),
		pk("tool", "2.0-r0", nil, nil),
		pk("tool", "2.10-r0", nil, nil),
		pk("tool", "2.9_rc1-r0", nil, nil),
	}
	prio := pk("zz-binsh", "1-r0", nil, []string{"/bin/sh"})
	prio.Priority = 100
	cases := []struct {
		name  string
		pkgs  []*Package
		world []string
		want  string
		err   error
		msg   string
	}{
		{"dependencies through so: and a path; lowest provider name", base, []string{"git"},
			"bash-binsh-5.2-r0 git-2.45.0-r0 libcurl-8.9-r0 musl-1.2.5-r0", nil, ""},
		{"highest version", base, []string{"tool"}, "tool-2.10-r0", nil, ""},
		{"version constraint", base, []string{"tool<2.10"}, "tool-2.9_rc1-r0", nil, ""},
		{"provider priority wins over name order", append(append([]*Package{}, base...), prio), []string{"git"},
			"git-2.45.0-r0 libcurl-8.9-r0 musl-1.2.5-r0 zz-binsh-1-r0", nil, ""},
		{"a selected provider is reused", base, []string{"busybox-binsh", "git"},
			"busybox-binsh-1.36-r0 git-2.45.0-r0 libcurl-8.9-r0 musl-1.2.5-r0", nil, ""},
		{"missing dependency names the chain", base[:1], []string{"git"}, "", ErrMissing, "git -> so:libcurl.so.4"},
		{"missing world package", base, []string{"nope"}, "", ErrMissing, `"nope"`},
		{"a selected version that does not fit", append(append([]*Package{}, base...), pk("needs-old", "1-r0", []string{"tool<2.10"}, nil)), []string{"needs-old", "tool"},
			"", ErrConflict, "needs-old needs tool<2.10, but tool-2.10-r0 is already selected"},
		{"conflict", append(append([]*Package{}, base...), pk("bad", "1-r0", []string{"!tool"}, nil)), []string{"bad", "tool"},
			"", ErrConflict, "bad-1-r0 conflicts with tool-2.10-r0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := Resolve([]*Index{{Repo: "main", Arch: "x86_64", Packages: c.pkgs}}, c.world, nil, false)
			if c.err != nil {
				if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.msg) {
					t.Fatalf("error %v, want %v saying %q", err, c.err, c.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := names(l); got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
		})
	}
}

// TestResolveLock: a lock reproduces while the index still has it,
// reports every change when not, and --update refuses a replayed older
// index.
func TestResolveLock(t *testing.T) {
	t.Parallel()
	idx := func(p ...*Package) []*Index { return []*Index{{Repo: "main", Arch: "x86_64", Packages: p}} }
	a1 := pk("a", "1.0-r0", []string{"b"}, nil)
	b1 := pk("b", "1.0-r0", nil, nil)
	lock, err := Resolve(idx(a1, b1), []string{"a"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	a2 := pk("a", "1.1-r0", []string{"b", "c"}, nil)
	c1 := pk("c", "1-r0", nil, nil)

	// Newer versions appear, old ones remain: the lock still wins.
	got, err := Resolve(idx(a1, a2, b1, c1), []string{"a"}, lock, false)
	if err != nil || string(got.Marshal()) != string(lock.Marshal()) {
		t.Fatalf("lock not reproduced: %v\n%s", err, got.Marshal())
	}
	// The old version is gone: every change is reported.
	_, err = Resolve(idx(a2, b1, c1), []string{"a"}, lock, false)
	if !errors.Is(err, ErrLockDrift) || !strings.Contains(err.Error(), "a 1.0-r0 -> 1.1-r0") || !strings.Contains(err.Error(), "added c-1-r0") {
		t.Fatalf("drift: %v", err)
	}
	// A rebuilt package with the same version but other bytes.
	b1x := pk("b", "1.0-r0", nil, nil)
	b1x.Checksum = "Q1" + strings.Repeat("B", 27) + "="
	_, err = Resolve(idx(a1, b1x), []string{"a"}, lock, false)
	if !errors.Is(err, ErrLockDrift) || !strings.Contains(err.Error(), "rebuilt") {
		t.Fatalf("rebuild: %v", err)
	}
	// Update moves to the newest.
	up, err := Resolve(idx(a1, a2, b1, c1), []string{"a"}, lock, true)
	if err != nil || names(up) != "a-1.1-r0 b-1.0-r0 c-1-r0" {
		t.Fatalf("update: %v %s", err, names(up))
	}
	// An older, validly signed index replayed against the updated lock.
	_, err = Resolve(idx(a1, b1), []string{"a"}, up, true)
	if !errors.Is(err, ErrLockDrift) || !strings.Contains(err.Error(), "older than the lock") {
		t.Fatalf("replay: %v", err)
	}
}

func TestLockMarshalDeterministic(t *testing.T) {
	t.Parallel()
	l := &Lock{Branch: Branch, Arch: "x86_64", World: []string{"a"}, Packages: []LockedPackage{
		{Name: "b", Version: "1-r0", Arch: "x86_64", Repo: "main", Checksum: "Q1" + strings.Repeat("A", 27) + "=", Size: 1},
		{Name: "a", Version: "1-r0", Arch: "x86_64", Repo: "community", Checksum: "Q1" + strings.Repeat("A", 27) + "=", Size: 2},
	}}
	m := l.Marshal()
	l2, err := ParseLock(m)
	if err != nil {
		t.Fatal(err)
	}
	if string(l2.Marshal()) != string(m) || strings.Index(string(m), `"a"`) > strings.Index(string(m), `"b"`) {
		t.Fatalf("not canonical:\n%s", m)
	}
	for _, bad := range []string{
		strings.Replace(string(m), `"main"`, `"testing"`, 1),
		strings.Replace(string(m), `"name": "b"`, `"name": "../b"`, 1),
		strings.Replace(string(m), `"branch"`, `"extra": 1, "branch"`, 1),
	} {
		if _, err := ParseLock([]byte(bad)); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
}

func TestCompareVersions(t *testing.T) {
	t.Parallel()
	ordered := []string{
		"1.0_alpha1-r0", "1.0_beta-r0", "1.0_rc2-r0", "1.0-r0", "1.0-r1", "1.0_p1-r0",
		"1.0a-r0", "1.0b-r0", "1.0.1-r0", "1.2-r0", "1.10-r0", "2-r0",
	}
	for i := range ordered {
		for j := range ordered {
			got := compareVersions(ordered[i], ordered[j])
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got != want {
				t.Errorf("compare(%s, %s) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
	if compareVersions("0.99f7-r1", "0.99f7-r0") != 1 || compareVersions("0.99f10-r0", "0.99f7-r0") != 1 {
		t.Error("letter-digit versions misordered")
	}
}
