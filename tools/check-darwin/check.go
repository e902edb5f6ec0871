package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// Target platform the checker type-checks for: the vz backend's platform.
const (
	targetOS   = "darwin"
	targetArch = "arm64"
)

// Diag is one type error located in a package of the main module.
type Diag struct {
	Pos token.Position
	Msg string
}

func (d Diag) String() string { return fmt.Sprintf("%s: %s", d.Pos, d.Msg) }

// Stats describes one run, for -v.
type Stats struct {
	Packages     int           // packages type-checked
	ModulePkgs   int           // of which in the main module
	Files        int           // files parsed
	List         time.Duration // go list
	Check        time.Duration // parse + type-check
	IgnoredDiags int           // errors in packages outside the main module
}

// listedPackage holds the fields of `go list -json` the checker uses.
type listedPackage struct {
	ImportPath string
	ForTest    string // set on a package recompiled for a test
	Dir        string
	Standard   bool
	GoFiles    []string
	CgoFiles   []string
	ImportMap  map[string]string
	Imports    []string
	Module     *struct {
		Path string
		Main bool
	}
	Error *struct {
		Pos string
		Err string
	}
}

func (p *listedPackage) inMainModule() bool { return p.Module != nil && p.Module.Main }

// check lists patterns (relative to dir) with their dependencies for
// darwin/arm64 with cgo on, type-checks every package in dependency order
// and returns the errors found in the main module's packages, sorted by
// position. A non-nil error means the check itself could not run.
func check(ctx context.Context, dir string, patterns []string, tests bool) ([]Diag, Stats, error) {
	var st Stats
	t0 := time.Now()
	pkgs, err := goList(ctx, dir, patterns, tests)
	if err != nil {
		return nil, st, err
	}
	st.List = time.Since(t0)

	t1 := time.Now()
	c := newChecker(pkgs)
	diags := c.run()
	st.Check = time.Since(t1)
	st.Packages = len(pkgs)
	for _, p := range pkgs {
		if p.inMainModule() {
			st.ModulePkgs++
		}
	}
	st.Files = c.files
	st.IgnoredDiags = c.ignored

	// A file shared by a package and its test variant is checked twice.
	seen := make(map[string]bool, len(diags))
	uniq := diags[:0]
	for _, d := range diags {
		if k := d.String(); !seen[k] {
			seen[k] = true
			uniq = append(uniq, d)
		}
	}
	diags = uniq
	sort.Slice(diags, func(i, j int) bool {
		a, b := diags[i].Pos, diags[j].Pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Column != b.Column {
			return a.Column < b.Column
		}
		return diags[i].Msg < diags[j].Msg
	})
	return diags, st, nil
}

// goList runs `go list -e -deps -json` for the target platform, with -test
// when tests is set. Its output lists every dependency before the packages
// that import it. Generated test mains are left out.
func goList(ctx context.Context, dir string, patterns []string, tests bool) ([]*listedPackage, error) {
	args := []string{"list", "-e", "-deps", "-json=ImportPath,Dir,Standard,GoFiles,CgoFiles,ImportMap,Imports,Module,Error,ForTest"}
	if tests {
		args = append(args, "-test")
	}
	args = append(append(args, "--"), patterns...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS="+targetOS, "GOARCH="+targetArch, "CGO_ENABLED=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %v for %s/%s: %w: %s", patterns, targetOS, targetArch, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var pkgs []*listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(listedPackage)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		if p.ForTest == "" && strings.HasSuffix(p.ImportPath, ".test") {
			continue // the generated test main: nothing of ours to check
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// checker type-checks a dependency-ordered package list concurrently: each
// package starts as soon as the packages it imports are done.
type checker struct {
	fset  *token.FileSet
	pkgs  []*listedPackage
	byIP  map[string]*node
	sizes types.Sizes

	mu      sync.Mutex
	diags   []Diag
	files   int
	ignored int
}

type node struct {
	lp   *listedPackage
	done chan struct{}
	pkg  *types.Package // nil if the package could not be checked at all
}

func newChecker(pkgs []*listedPackage) *checker {
	c := &checker{
		fset:  token.NewFileSet(),
		pkgs:  pkgs,
		byIP:  make(map[string]*node, len(pkgs)),
		sizes: types.SizesFor("gc", targetArch),
	}
	for _, p := range pkgs {
		c.byIP[p.ImportPath] = &node{lp: p, done: make(chan struct{})}
	}
	return c
}

func (c *checker) run() []Diag {
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for _, p := range c.pkgs {
		n := c.byIP[p.ImportPath]
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(n.done)
			for _, imp := range p.Imports {
				if d := c.byIP[imp]; d != nil {
					<-d.done
				}
			}
			sem <- struct{}{}
			defer func() { <-sem }()
			n.pkg = c.checkOne(p)
		}()
	}
	wg.Wait()
	return c.diags
}

func (c *checker) report(p *listedPackage, d Diag) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.inMainModule() {
		c.diags = append(c.diags, d)
	} else {
		c.ignored++
	}
}

// checkOne parses and type-checks one package whose imports are all done.
func (c *checker) checkOne(p *listedPackage) *types.Package {
	if p.ImportPath == "unsafe" {
		return types.Unsafe
	}
	if p.Error != nil {
		// A package go list could not load: a pattern naming nothing, or an
		// import nobody provides. Outside a module it can only come from
		// this module's patterns or imports, so it is reported.
		pos := token.Position{Filename: p.ImportPath}
		if p.Error.Pos != "" {
			pos = token.Position{Filename: p.Error.Pos}
		}
		d := Diag{Pos: pos, Msg: p.Error.Err}
		if p.Module == nil && !p.Standard {
			c.mu.Lock()
			c.diags = append(c.diags, d)
			c.mu.Unlock()
		} else {
			c.report(p, d)
		}
	}
	names := append(append([]string(nil), p.GoFiles...), p.CgoFiles...)
	if len(names) == 0 {
		return nil
	}
	// Dependencies outside the module only need their declarations: skip
	// comments and, below, function bodies.
	mode := parser.SkipObjectResolution
	if p.inMainModule() {
		mode |= parser.ParseComments
	}
	files := make([]*ast.File, 0, len(names))
	for _, name := range names {
		f, err := parser.ParseFile(c.fset, filepath.Join(p.Dir, name), nil, mode)
		if err != nil {
			var list scanner.ErrorList
			if errors.As(err, &list) {
				for _, e := range list {
					c.report(p, Diag{Pos: e.Pos, Msg: e.Msg})
				}
			} else {
				c.report(p, Diag{Pos: token.Position{Filename: filepath.Join(p.Dir, name)}, Msg: err.Error()})
			}
		}
		if f != nil {
			files = append(files, f)
		}
	}
	c.mu.Lock()
	c.files += len(files)
	c.mu.Unlock()

	conf := types.Config{
		Importer:         importerFunc(func(path string) (*types.Package, error) { return c.importFor(p, path) }),
		FakeImportC:      true,
		IgnoreFuncBodies: !p.inMainModule(),
		Sizes:            c.sizes,
		Error: func(err error) {
			var te types.Error
			if errors.As(err, &te) {
				c.report(p, Diag{Pos: te.Fset.Position(te.Pos), Msg: te.Msg})
				return
			}
			c.report(p, Diag{Pos: token.Position{Filename: p.Dir}, Msg: err.Error()})
		},
	}
	pkg, _ := conf.Check(p.ImportPath, c.fset, files, nil)
	return pkg
}

// importFor resolves an import of package p to an already-checked package.
func (c *checker) importFor(p *listedPackage, path string) (*types.Package, error) {
	if path == "unsafe" {
		return types.Unsafe, nil
	}
	if mapped, ok := p.ImportMap[path]; ok {
		path = mapped
	}
	n := c.byIP[path]
	if n == nil {
		return nil, fmt.Errorf("package %q is not in the go list output", path)
	}
	<-n.done
	if n.pkg == nil {
		return nil, fmt.Errorf("package %q could not be type-checked", path)
	}
	return n.pkg, nil
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
