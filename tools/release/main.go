// Command release builds vibedom's release archives into one folder: for
// each target a tar.gz holding the vibedom binary (built with the
// vibedom_embedguest tag, so it carries its guest agents), the README and
// docs/install.md; an SPDX SBOM per binary from its Go build information;
// and SHA256SUMS over all of them. `make release` runs it after `make
// embed-guest`.
//
// Linux targets are built without cgo anywhere; darwin/arm64 needs cgo and
// so a Mac, where the binary is signed with entitlements.plist (identity
// $CODESIGN_IDENTITY, ad hoc "-" when unset, hardened runtime) before it
// is archived. Notarization happens after, in the release workflow, and
// does not change the bytes.
//
// Archives are reproducible for one commit: entries are sorted, owned by
// 0:0, stamped with -date, and gzip carries no name or time.
//
// It does not tag, upload or notarize.
package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Target is one release archive's platform.
type Target struct{ OS, Arch string }

func (t Target) String() string { return t.OS + "/" + t.Arch }

// defaultTargets are the Linux archives, plus darwin/arm64 on a Mac.
func defaultTargets(hostOS string) []Target {
	ts := []Target{{"linux", "amd64"}, {"linux", "arm64"}}
	if hostOS == "darwin" {
		ts = append(ts, Target{"darwin", "arm64"})
	}
	return ts
}

// embedTag is the build tag that builds the guest agents in.
const embedTag = "vibedom_embedguest"

// docs are the files every archive carries beside the binary: source
// path in the repository and name in the archive.
var docs = [][2]string{{"README.md", "README.md"}, {"docs/install.md", "INSTALL.md"}}

func main() {
	out := flag.String("out", "dist", "output folder (must not exist or be empty)")
	version := flag.String("version", "dev", "version (a leading v is dropped from file names)")
	ldflags := flag.String("ldflags", "", "go build -ldflags")
	date := flag.String("date", "", "RFC 3339 time stamped on archive entries and the SBOMs (default: now)")
	targets := flag.String("targets", "", "comma-separated os/arch list (default: linux/amd64,linux/arm64, and darwin/arm64 on a Mac)")
	flag.Parse()
	if err := run(*out, *version, *ldflags, *date, *targets); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(out, version, ldflags, date, targets string) error {
	when := time.Now().UTC().Truncate(time.Second)
	if date != "" {
		t, err := time.Parse(time.RFC3339, date)
		if err != nil {
			return fmt.Errorf("-date %q: %w", date, err)
		}
		when = t.UTC()
	}
	ts := defaultTargets(runtime.GOOS)
	if targets != "" {
		ts = nil
		for _, s := range strings.Split(targets, ",") {
			os_, arch, ok := strings.Cut(strings.TrimSpace(s), "/")
			if !ok {
				return fmt.Errorf("target %q: want os/arch", s)
			}
			ts = append(ts, Target{os_, arch})
		}
	}
	if ents, err := os.ReadDir(out); err == nil && len(ents) > 0 {
		return fmt.Errorf("%s is not empty: remove it first (make clean)", out)
	}
	if err := os.MkdirAll(filepath.Join(out, "stage"), 0o755); err != nil {
		return err
	}
	ver := strings.TrimPrefix(version, "v")
	var files []string
	for _, t := range ts {
		name := fmt.Sprintf("vibedom_%s_%s_%s", ver, t.OS, t.Arch)
		bin := filepath.Join(out, "stage", name, "vibedom")
		if err := build(t, ldflags, bin); err != nil {
			return err
		}
		if t.OS == "darwin" {
			if err := sign(bin); err != nil {
				return err
			}
		}
		entries := []entry{{name + "/vibedom", bin, 0o755}}
		for _, d := range docs {
			entries = append(entries, entry{name + "/" + d[1], d[0], 0o644})
		}
		archive := name + ".tar.gz"
		if err := writeTarGz(filepath.Join(out, archive), entries, when); err != nil {
			return err
		}
		sbom := name + ".spdx.json"
		if err := writeSBOM(filepath.Join(out, sbom), bin, name, version, when); err != nil {
			return err
		}
		files = append(files, archive, sbom)
		fmt.Printf("release: %s, %s\n", archive, sbom)
	}
	return writeSums(out, files)
}

// build compiles vibedom for t with the guest agents built in.
func build(t Target, ldflags, bin string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-tags", embedTag, "-ldflags", ldflags, "-o", bin, "./cmd/vibedom")
	cgo := "0"
	if t.OS == "darwin" {
		cgo = "1"
	}
	cmd.Env = append(os.Environ(), "GOOS="+t.OS, "GOARCH="+t.Arch, "CGO_ENABLED="+cgo)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build %s: %w (run `make embed-guest` first; darwin needs a Mac with Xcode's command line tools)", t, err)
	}
	return nil
}

// sign signs a darwin binary with the virtualization entitlement and the
// hardened runtime (notarization requires it).
func sign(bin string) error {
	id := os.Getenv("CODESIGN_IDENTITY")
	if id == "" {
		id = "-"
	}
	args := []string{"--force", "--options", "runtime", "--timestamp", "--entitlements", "entitlements.plist", "-s", id, bin}
	if id == "-" {
		args = slices.DeleteFunc(args, func(s string) bool { return s == "--timestamp" })
	}
	cmd := exec.Command("codesign", args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("codesign %s with %q: %w", bin, id, err)
	}
	return nil
}

// entry is one file of an archive: its name there, its source, its mode.
type entry struct {
	name, src string
	mode      int64
}

// writeTarGz writes entries (sorted by name) as a reproducible tar.gz.
func writeTarGz(path string, entries []entry, when time.Time) error {
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(gz)
	dirs := map[string]bool{}
	for _, e := range entries {
		if d := filepath.ToSlash(filepath.Dir(e.name)); d != "." && !dirs[d] {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: when, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		b, err := os.ReadFile(e.src)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: e.mode, Size: int64(len(b)), ModTime: when, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return f.Close()
}

// writeSums writes out/SHA256SUMS over files, in sha256sum's format.
func writeSums(out string, files []string) error {
	slices.Sort(files)
	var b strings.Builder
	for _, name := range files {
		f, err := os.Open(filepath.Join(out, name))
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), name)
	}
	return os.WriteFile(filepath.Join(out, "SHA256SUMS"), []byte(b.String()), 0o644)
}

// SPDX 2.3, the fields this SBOM uses.
type (
	spdxDoc struct {
		SPDXVersion       string         `json:"spdxVersion"`
		DataLicense       string         `json:"dataLicense"`
		SPDXID            string         `json:"SPDXID"`
		Name              string         `json:"name"`
		DocumentNamespace string         `json:"documentNamespace"`
		CreationInfo      spdxCreation   `json:"creationInfo"`
		Packages          []spdxPackage  `json:"packages"`
		Relationships     []spdxRelation `json:"relationships"`
	}
	spdxCreation struct {
		Created  string   `json:"created"`
		Creators []string `json:"creators"`
	}
	spdxPackage struct {
		Name             string         `json:"name"`
		SPDXID           string         `json:"SPDXID"`
		VersionInfo      string         `json:"versionInfo,omitempty"`
		DownloadLocation string         `json:"downloadLocation"`
		FilesAnalyzed    bool           `json:"filesAnalyzed"`
		Checksums        []spdxChecksum `json:"checksums,omitempty"`
		ExternalRefs     []spdxRef      `json:"externalRefs,omitempty"`
		Comment          string         `json:"comment,omitempty"`
	}
	spdxChecksum struct {
		Algorithm string `json:"algorithm"`
		Value     string `json:"checksumValue"`
	}
	spdxRef struct {
		Category string `json:"referenceCategory"`
		Type     string `json:"referenceType"`
		Locator  string `json:"referenceLocator"`
	}
	spdxRelation struct {
		Element string `json:"spdxElementId"`
		Type    string `json:"relationshipType"`
		Related string `json:"relatedSpdxElement"`
	}
)

// writeSBOM writes an SPDX SBOM of the Go binary bin: the binary, its Go
// toolchain and every module its build information lists (what `go
// version -m` prints). The embedded guest agents are built from the same
// module at the same commit; their modules are a subset.
func writeSBOM(path, bin, name, version string, when time.Time) error {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("read build info of %s: %w", bin, err)
	}
	sum, err := fileSum(bin)
	if err != nil {
		return err
	}
	doc := spdxDoc{SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT", Name: name,
		DocumentNamespace: "https://github.com/vibedom/vibedom/releases/" + version + "/" + name + "-" + sum[:16],
		CreationInfo:      spdxCreation{Created: when.Format(time.RFC3339), Creators: []string{"Tool: vibedom tools/release", "Tool: " + bi.GoVersion}}}
	doc.Packages = append(doc.Packages, spdxPackage{Name: "vibedom", SPDXID: "SPDXRef-vibedom", VersionInfo: version,
		DownloadLocation: "https://github.com/vibedom/vibedom", Checksums: []spdxChecksum{{"SHA256", sum}},
		ExternalRefs: []spdxRef{purl(bi.Main.Path, version)},
		Comment:      "the vibedom binary; it carries vibedom-guest for linux/amd64 and linux/arm64, built from the same module"})
	doc.Relationships = append(doc.Relationships, spdxRelation{"SPDXRef-DOCUMENT", "DESCRIBES", "SPDXRef-vibedom"})
	doc.Packages = append(doc.Packages, spdxPackage{Name: "go", SPDXID: "SPDXRef-go", VersionInfo: strings.TrimPrefix(bi.GoVersion, "go"),
		DownloadLocation: "https://go.dev/dl/", ExternalRefs: []spdxRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/stdlib@" + bi.GoVersion}}})
	doc.Relationships = append(doc.Relationships, spdxRelation{"SPDXRef-vibedom", "DEPENDS_ON", "SPDXRef-go"})
	for i, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		id := fmt.Sprintf("SPDXRef-module-%d", i)
		p := spdxPackage{Name: d.Path, SPDXID: id, VersionInfo: d.Version, DownloadLocation: "NOASSERTION",
			ExternalRefs: []spdxRef{purl(d.Path, d.Version)}}
		if strings.HasPrefix(d.Sum, "h1:") {
			p.Comment = "go.sum " + d.Sum
		}
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelation{"SPDXRef-vibedom", "DEPENDS_ON", id})
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// purl is a Go module's package URL.
func purl(path, version string) spdxRef {
	return spdxRef{"PACKAGE-MANAGER", "purl", "pkg:golang/" + path + "@" + version}
}

func fileSum(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}
