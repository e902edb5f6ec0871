// Command check-darwin type-checks this module's packages as they build for
// darwin/arm64 with cgo on — the vz backend's platform — on any host.
//
//	go run ./tools/check-darwin [-v] [-test=false] [packages…]
//
// Packages are go list patterns, ./... by default. It lists them with their
// dependencies for GOOS=darwin GOARCH=arm64 CGO_ENABLED=1, type-checks every
// package (standard library included, and the packages' _test.go files
// unless -test=false) in dependency order with go/types,
// treating import "C" as opaque, and prints each type error located in a
// package of the main module as file:line:col: message. It exits 1 if there
// is any, 2 if the check could not run.
//
// It catches a wrong method name, a wrong argument type or a missing
// function in code that only builds on a Mac. It does not compile, link or
// run anything, and it does not check the C side of cgo. Errors inside
// dependencies are ignored: Code-Hex/vz itself yields one spurious error
// under FakeImportC, while its types stay usable.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, ".", os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command: it returns the exit status.
func run(ctx context.Context, dir string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check-darwin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	verbose := fs.Bool("v", false, "print timings and counts to stderr")
	tests := fs.Bool("test", true, "check _test.go files too")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: check-darwin [-v] [-test=false] [packages…]\n\n"+
			"Type-checks the packages (default ./...) and their dependencies for %s/%s with cgo on\n"+
			"and prints the type errors found in this module's packages.\n\n", targetOS, targetArch)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	patterns := fs.Args()
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}

	diags, st, err := check(ctx, dir, patterns, *tests)
	if err != nil {
		fmt.Fprintf(stderr, "check-darwin: %v\n", err)
		return 2
	}
	wd, _ := filepath.Abs(dir)
	for _, d := range diags {
		d.Pos.Filename = relPath(wd, d.Pos.Filename)
		fmt.Fprintln(stdout, d)
	}
	if *verbose {
		fmt.Fprintf(stderr, "check-darwin: %d packages (%d in this module), %d files; go list %v, type-check %v; %d errors, %d ignored outside the module\n",
			st.Packages, st.ModulePkgs, st.Files, st.List.Round(1e6), st.Check.Round(1e6), len(diags), st.IgnoredDiags)
	}
	if len(diags) > 0 {
		fmt.Fprintf(stderr, "check-darwin: %d errors in the %s/%s build; fix them before they reach a Mac\n", len(diags), targetOS, targetArch)
		return 1
	}
	return 0
}

// relPath shortens name to a path relative to wd when it lies below it.
func relPath(wd, name string) string {
	if wd == "" || !filepath.IsAbs(name) {
		return name
	}
	rel, err := filepath.Rel(wd, name)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return name
	}
	return rel
}
