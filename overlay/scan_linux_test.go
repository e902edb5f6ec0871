package overlay

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// overlayMount makes lower (from tr), upper and work dirs, mounts an
// OverlayFS on merged, runs do on it, unmounts, and returns the dirs. It
// skips when not root or when the kernel refuses the mount.
func overlayMount(t *testing.T, tr tree, do func(t *testing.T, merged string)) (lower, upper string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("OverlayFS mounts need root")
	}
	root := t.TempDir()
	lower, upper = filepath.Join(root, "lower"), filepath.Join(root, "upper")
	work, merged := filepath.Join(root, "work"), filepath.Join(root, "merged")
	for _, d := range []string{lower, upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeTree(t, lower, tr)
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off", lower, upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("cannot mount OverlayFS here: %v", err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			unix.Unmount(merged, 0)
		}
	})
	do(t, merged)
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	mounted = false
	return lower, upper
}

func sh(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sh %q: %v\n%s", script, err, out)
	}
}

// summary renders a change set as "op type path [extra]" lines.
func summary(cs *ChangeSet) []string {
	var out []string
	for _, c := range cs.Changes {
		s := fmt.Sprintf("%s %s %s", c.Op, c.Type, c.Path)
		switch {
		case c.Op == OpSkip:
		case c.Type == TypeSymlink && c.Op != OpDelete:
			s += " -> " + c.Target
		case c.Type == TypeFile && c.Op != OpDelete:
			s += fmt.Sprintf(" %04o", c.Mode)
		}
		out = append(out, s)
	}
	return out
}

func TestScanChangesOverlay(t *testing.T) {
	t.Parallel()
	lowerTree := tree{
		"keep.txt":         "file:keep\n",
		"edit.txt":         "file:old\n",
		"chmod.sh":         "file:#!/bin/sh\n",
		"touch.txt":        "file:touched\n",
		"append.txt":       "file:append nothing\n",
		"chown.txt":        "file:chown same\n",
		"del.txt":          "file:delete me\n",
		"deldir/a":         "file:a\n",
		"deldir/sub/b":     "file:b\n",
		"repl/x":           "file:x\n",
		"repl/y":           "file:y\n",
		"same/f":           "file:same content\n",
		"link":             "link:keep.txt",
		"f2d":              "file:file to dir\n",
		"d2f/inner":        "file:inner\n",
		"f2l":              "file:file to link\n",
		"l2f":              "link:keep.txt",
		"hard/a":           "file:hard\n",
		"hard/untouched":   "file:x\n",
		"big/huge.bin":     "file:",
		"nested/deep/keep": "file:deep\n",
	}
	tests := []struct {
		name string
		do   string
		want []string
	}{
		{"add", `echo new > new.txt; mkdir -p nd/sub; echo n > nd/sub/n; mkdir emptydir`, []string{
			"add dir emptydir", "add dir nd", "add dir nd/sub", "add file nd/sub/n 0644", "add file new.txt 0644"}},
		{"modify content", `echo new > edit.txt`, []string{"modify file edit.txt 0644"}},
		{"modify mode", `chmod 755 chmod.sh`, []string{"modify file chmod.sh 0755"}},
		{"metadata-only copy-ups are not changes", `touch touch.txt; cat /dev/null >> append.txt; chown 0:0 chown.txt; touch -d 2001-01-01 keep.txt; chmod 644 edit.txt`, nil},
		{"delete file", `rm del.txt`, []string{"delete file del.txt"}},
		{"delete dir", `rm -r deldir`, []string{"delete dir deldir", "delete file deldir/a", "delete dir deldir/sub", "delete file deldir/sub/b"}},
		{"replaced dir is opaque", `rm -r repl; mkdir repl; echo z > repl/z; echo x > repl/x`, []string{"delete file repl/y", "add file repl/z 0644"}},
		{"recreated identical dir is no change", `rm -r same; mkdir same; echo "same content" > same/f`, nil},
		{"symlinks recorded not followed", `ln -sfn edit.txt link; ln -s /etc/shadow escape; ln -s ../../outside rel`, []string{
			"add symlink escape -> /etc/shadow", "modify symlink link -> edit.txt", "add symlink rel -> ../../outside"}},
		{"type changes", `rm f2d; mkdir f2d; echo in > f2d/in; rm -r d2f; echo now a file > d2f; rm f2l; ln -s keep.txt f2l; rm l2f; echo file > l2f`, []string{
			"delete dir d2f", "delete file d2f/inner", "add file d2f 0644",
			"delete file f2d", "add dir f2d", "add file f2d/in 0644",
			"delete file f2l", "add symlink f2l -> keep.txt",
			"delete symlink l2f", "add file l2f 0644"}},
		{"special files skipped", `mkfifo fifo; mknod chardev c 1 3`, []string{"skip special chardev", "skip special fifo"}},
		{"hard links", `echo more >> hard/a; ln hard/untouched hard/linked`, []string{"modify file hard/a 0644", "add file hard/linked 0644"}},
		{"huge file", `truncate -s 64M big/huge.bin; printf x >> big/huge.bin`, []string{"modify file big/huge.bin 0644"}},
		{"deep change keeps parents", `echo changed > nested/deep/keep`, []string{"modify file nested/deep/keep 0644"}},
		{"odd names", `echo q > 'sp ace'; echo u > 'naïve'; printf x > "$(printf 'bad\377name')"; printf x > "$(printf 'tab\tname')"`, []string{
			"add file naïve 0644", `skip special "bad\xffname"`, "add file sp ace 0644", `skip special "tab\tname"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lower, upper := overlayMount(t, lowerTree, func(t *testing.T, merged string) { sh(t, merged, tc.do) })
			// These cases must really have copied up, or they prove nothing.
			copiedUp := map[string][]string{
				"metadata-only copy-ups are not changes": {"touch.txt", "append.txt", "chown.txt", "keep.txt", "edit.txt"},
				"recreated identical dir is no change":   {"same/f"},
			}
			for _, p := range copiedUp[tc.name] {
				if _, err := os.Lstat(filepath.Join(upper, p)); err != nil {
					t.Errorf("%s was not copied up: %v", p, err)
				}
			}
			cs, err := ScanChanges(lower, upper)
			if err != nil {
				t.Fatalf("ScanChanges: %v", err)
			}
			got := summary(cs)
			want := slices.Clone(tc.want)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("changes:\n got %q\nwant %q", got, want)
			}
			// The host accepts what the guest produced.
			data, err := json.Marshal(cs)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ParseChangeSet(data); err != nil {
				t.Errorf("ParseChangeSet of the scan: %v", err)
			}
			for _, c := range cs.Changes {
				if c.Type == TypeFile && c.Op != OpDelete {
					data, err := os.ReadFile(filepath.Join(upper, c.Path))
					if err != nil {
						t.Fatal(err)
					}
					if sha256hex(data) != c.SHA256 || int64(len(data)) != c.Size {
						t.Errorf("%s: hash/size of upper content do not match the change", c.Path)
					}
				}
			}
		})
	}
}

// TestScanChangesWhiteoutMarkers checks the scan sees the overlay's own
// markers: a 0:0 character device for a whiteout and the opaque xattr.
func TestScanChangesWhiteoutMarkers(t *testing.T) {
	t.Parallel()
	_, upper := overlayMount(t, tree{"a": "file:a\n", "d/x": "file:x\n"}, func(t *testing.T, merged string) {
		sh(t, merged, `rm a; rm -r d; mkdir d`)
	})
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(upper, "a"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d, want a 0:0 character device", st.Mode, st.Rdev)
	}
	op, err := platformOverlay{}.opaque(filepath.Join(upper, "d"))
	if err != nil || !op {
		t.Errorf("opaque(d): got %v, %v; want true", op, err)
	}
}
