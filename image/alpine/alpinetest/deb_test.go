package alpinetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// arFile makes an ar archive of members.
func arFile(members ...[2]string) []byte {
	var b bytes.Buffer
	b.WriteString("!<arch>\n")
	for _, m := range members {
		fmt.Fprintf(&b, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", m[0], 0, 0, 0, "100644", len(m[1]))
		b.WriteString(m[1])
		if len(m[1])%2 == 1 {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func tarGz(t *testing.T, files ...File) string {
	b, err := GzipTar(files, true)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadDeb reads a well-formed .deb and refuses broken and hostile ones.
func TestReadDeb(t *testing.T) {
	t.Parallel()
	control := tarGz(t, File{Name: "./control", Body: []byte("Package: tool\nVersion: 1:2.3.4-5+deb12u1\nArchitecture: amd64\nDescription: a tool\n more text\n")})
	data := tarGz(t, File{Name: "./", Type: tar.TypeDir}, File{Name: "./usr/", Type: tar.TypeDir}, File{Name: "./usr/bin/tool", Mode: 0o755, Body: []byte("x")},
		File{Name: "./usr/bin/alias", Type: tar.TypeLink, Link: "./usr/bin/tool"})
	write := func(b []byte) string {
		p := filepath.Join(t.TempDir(), "x.deb")
		os.WriteFile(p, b, 0o644)
		return p
	}
	d, err := readDeb(write(arFile([2]string{"debian-binary", "2.0\n"}, [2]string{"control.tar.gz", control}, [2]string{"data.tar.gz", data})))
	if err != nil {
		t.Fatal(err)
	}
	if d.control["Package"] != "tool" || d.control["Description"] != "a tool" || len(d.files) != 3 || d.files[1].Name != "usr/bin/tool" || d.files[2].Link != "usr/bin/tool" {
		t.Fatalf("read %+v %+v", d.control, d.files)
	}
	if v, err := alpineVersion(d.control["Version"]); v != "2.3.4-r0" || err != nil {
		t.Errorf("alpineVersion = %q, %v", v, err)
	}
	good := arFile([2]string{"debian-binary", "2.0\n"}, [2]string{"control.tar.gz", control}, [2]string{"data.tar.gz", data})
	for name, b := range map[string][]byte{
		"not ar":      []byte("PK\x03\x04"),
		"truncated":   good[:len(good)-40],
		"no data":     arFile([2]string{"debian-binary", "2.0\n"}, [2]string{"control.tar.gz", control}),
		"no control":  arFile([2]string{"data.tar.gz", data}),
		"dot-dot":     arFile([2]string{"control.tar.gz", control}, [2]string{"data.tar.gz", tarGz(t, File{Name: "./../../etc/passwd", Body: []byte("x")})}),
		"absolute":    arFile([2]string{"control.tar.gz", control}, [2]string{"data.tar.gz", tarGz(t, File{Name: "/etc/passwd", Body: []byte("x")})}),
		"device":      arFile([2]string{"control.tar.gz", control}, [2]string{"data.tar.gz", tarGz(t, File{Name: "dev/mem", Type: tar.TypeChar})}),
		"bad size":    []byte("!<arch>\ndata.tar.gz     0           0     0     100644  99999999  `\n"),
		"lzma member": arFile([2]string{"control.tar.gz", control}, [2]string{"data.tar.lzma", "x"}),
	} {
		if _, err := readDeb(write(b)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := alpineVersion("~rc1"); err == nil {
		t.Error("alpineVersion accepted a version with no number")
	}
}

// TestMirrorHandlerStaysInRoot: the handler serves files under Root only,
// no dot files (half-written ones), no directories, GET and HEAD only.
func TestMirrorHandlerStaysInRoot(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	os.WriteFile(filepath.Join(parent, "secret"), []byte("no"), 0o644)
	m, err := NewMirror(filepath.Join(parent, "root"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.PutFile("main", "x86_64", "a.apk", []byte("apk")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(m.Dir("main", "x86_64"), ".a.apk.tmp"), []byte("half"), 0o644)
	for _, bad := range []string{"../x", "a/b", "", ".."} {
		if err := m.PutFile("main", "x86_64", bad, nil); err == nil {
			t.Errorf("PutFile(%q) accepted", bad)
		}
	}
	srv := m.Serve()
	defer srv.Close()
	get := func(method, p string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+p, nil)
		req.URL.Opaque = p // keep "..": no client-side cleaning
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	base := "/" + m.branch() + "/main/x86_64/"
	if code, body := get("GET", base+"a.apk"); code != 200 || body != "apk" {
		t.Fatalf("GET a.apk: %d %q", code, body)
	}
	for _, p := range []string{"/../secret", base + "../../../../secret", base + ".a.apk.tmp", base, "/%2e%2e/secret"} {
		if code, body := get("GET", p); code == 200 || strings.Contains(body, "no") && code < 400 {
			t.Errorf("GET %s: %d %q", p, code, body)
		}
	}
	if code, _ := get("PUT", base+"a.apk"); code != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d", code)
	}
}

// TestBusyboxPathsRefused: an applet list that would place links outside
// the usual absolute paths is refused, as is one too short to be real.
func TestBusyboxPathsRefused(t *testing.T) {
	t.Parallel()
	for name, list := range map[string]string{
		"dot-dot":  "/bin/../etc/passwd\n" + strings.Repeat("/bin/x\n", 60),
		"relative": "bin/sh\n" + strings.Repeat("/bin/x\n", 60),
		"space":    "/bin/s h\n" + strings.Repeat("/bin/x\n", 60),
		"short":    "/bin/sh\n",
	} {
		dir := t.TempDir()
		os.MkdirAll(filepath.Join(dir, "debs"), 0o755)
		os.WriteFile(filepath.Join(dir, ".complete"), []byte("busybox busybox-static 1:1.35.0-4\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "busybox"), []byte("\x7fELF"), 0o755)
		os.WriteFile(filepath.Join(dir, "debs", "busybox.paths"), []byte(list), 0o644)
		b := &repoBuilder{arch: "x86_64", debArch: "amd64", assets: dir}
		if err := b.busybox(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got := StandInNames([]string{"git>=2.40", "curl", "make<5", "busybox", "curl"}); strings.Join(got, " ") != "curl make" {
		t.Errorf("StandInNames = %v", got)
	}
}
