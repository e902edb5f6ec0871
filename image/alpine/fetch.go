package alpine

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/progress"
)

// FetchOptions says where Fetch downloads from and caches to.
type FetchOptions struct {
	Options
	// CacheDir holds verified packages (and, under partial/, downloads
	// being resumed). Typically ~/.vibedom/cache/apk.
	CacheDir string
	// Client is the HTTP client; nil means one with connect and
	// response-header timeouts (a body that stalls waits for ctx).
	Client *http.Client
	// Parallel bounds concurrent downloads; 0 means 4.
	Parallel int
	// Attempts is how often one package is tried, resuming where the
	// last attempt stopped; 0 means 3.
	Attempts int
	// Progress, when set, is told about every byte and file.
	Progress progress.Progress
}

// retryDelay is the wait before a second attempt (doubled for a third).
const retryDelay = 500 * time.Millisecond

// partialDir holds downloads that have not been verified yet. Nothing
// there is ever used; Fetch resumes from it and deletes what fails.
const partialDir = "partial"

// CachePath is where a verified package is kept: its name, version and
// index checksum, so a rebuilt package never takes an older one's place.
func CachePath(cacheDir string, p LockedPackage) string {
	sum, _ := p.pkg().controlSHA1()
	return filepath.Join(cacheDir, p.Name+"-"+p.Version+"."+hex.EncodeToString(sum)+".apk")
}

// Fetch makes sure every package of lock is in the cache, verified, and
// returns their paths in lock order. A cached package is verified again
// and used without network; a missing one is downloaded (resuming a
// partial download with a Range request), verified, and only then moved
// into the cache. A package that fails verification is deleted and
// reported with its file name; Fetch then returns the first error after
// the other downloads have stopped.
func Fetch(ctx context.Context, o FetchOptions, lock *Lock) ([]string, error) {
	opts, err := o.Options.normalized()
	if err != nil {
		return nil, err
	}
	if opts.Arch != lock.Arch {
		return nil, fmt.Errorf("fetch: lock is for %s, options for %s", lock.Arch, opts.Arch)
	}
	if err := lock.validate(); err != nil {
		return nil, fmt.Errorf("fetch: lock: %w", err)
	}
	if lock.Branch != opts.Branch {
		return nil, fmt.Errorf("fetch: the lock is for Alpine %s, vibedom uses %s: run vibedom init --update to resolve again", lock.Branch, opts.Branch)
	}
	o.Options = opts
	if o.CacheDir == "" {
		return nil, fmt.Errorf("fetch: no cache directory")
	}
	if o.Client == nil {
		o.Client = defaultClient
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.Progress == nil {
		o.Progress = progress.Nop{}
	}
	if err := os.MkdirAll(filepath.Join(o.CacheDir, partialDir), 0o755); err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	var total int64
	for _, p := range lock.Packages {
		total += p.Size
	}
	o.Progress.Begin(len(lock.Packages), total)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	paths := make([]string, len(lock.Packages))
	errs := make([]error, len(lock.Packages))
	sem := make(chan struct{}, o.Parallel)
	var wg sync.WaitGroup
	for i, p := range lock.Packages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			paths[i], errs[i] = fetchOne(ctx, o, p)
			o.Progress.End(p.String(), errs[i])
			if errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	o.Progress.Close()
	// The first real error, not the cancellations it caused.
	var first error
	for _, e := range errs {
		if e != nil && !errors.Is(e, context.Canceled) {
			return nil, e
		}
		if e != nil && first == nil {
			first = e
		}
	}
	if first != nil {
		return nil, first
	}
	return paths, nil
}

func fetchOne(ctx context.Context, o FetchOptions, p LockedPackage) (string, error) {
	final := CachePath(o.CacheDir, p)
	if VerifyFile(final, o.Arch, p, o.Keys) == nil {
		o.Progress.Advance(p.String(), p.Size)
		return final, nil
	}
	os.Remove(final) // absent, or failing verification: never used
	part := filepath.Join(o.CacheDir, partialDir, filepath.Base(final)+".part")
	u := o.repoURL(p.Repo) + "/" + p.pkg().File()
	if st, err := os.Stat(part); err == nil && st.Size() <= p.Size {
		o.Progress.Advance(p.String(), st.Size()) // from an earlier run
	}
	var err error
	for attempt := 0; attempt < o.Attempts; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt) * retryDelay):
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		err = download(ctx, o, u, part, p)
		if err == nil || errors.Is(err, ErrChecksum) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		if errors.Is(err, ErrChecksum) {
			os.Remove(part)
		}
		return "", err
	}
	if err := VerifyFile(part, o.Arch, p, o.Keys); err != nil {
		os.Remove(part)
		return "", fmt.Errorf("fetch %s: %w", u, err)
	}
	if err := atomicfile.Move(part, final); err != nil {
		os.Remove(part)
		return "", fmt.Errorf("fetch %s: %w", u, err)
	}
	return final, nil
}

// download brings part up to p.Size bytes, resuming from what it holds.
// More bytes than the index promises is ErrChecksum; fewer is a
// retryable error that keeps part for the next attempt.
func download(ctx context.Context, o FetchOptions, u, part string, p LockedPackage) error {
	have := int64(0)
	if st, err := os.Stat(part); err == nil {
		have = st.Size()
	}
	if have > p.Size {
		os.Remove(part)
		have = 0
	}
	if have == p.Size {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if have > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
	}
	resp, err := o.Client.Do(req)
	if err != nil {
		return fmt.Errorf("fetch %s: %w (run again to resume; --mirror / %s chooses another mirror)", u, err, MirrorEnv)
	}
	defer resp.Body.Close()
	flags := os.O_WRONLY | os.O_CREATE
	switch {
	case resp.StatusCode == http.StatusPartialContent && have > 0 && strings.HasPrefix(resp.Header.Get("Content-Range"), "bytes "+strconv.FormatInt(have, 10)+"-"):
		flags |= os.O_APPEND
	case resp.StatusCode == http.StatusOK:
		flags |= os.O_TRUNC
		if have > 0 {
			o.Progress.Advance(p.String(), -have)
		}
		have = 0
	case resp.StatusCode == http.StatusPartialContent:
		os.Remove(part) // a range we did not ask for: start over next time
		return fmt.Errorf("fetch %s: the server answered range %q for bytes=%d-; retrying from the start", u, resp.Header.Get("Content-Range"), have)
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("fetch %s: %w: the server's file is shorter than the index's %d bytes", u, ErrChecksum, p.Size)
	default:
		return fmt.Errorf("fetch %s: %s", u, resp.Status)
	}
	if resp.ContentLength >= 0 && have+resp.ContentLength > p.Size {
		return fmt.Errorf("fetch %s: %w: server sends %d bytes, the index says %d", u, ErrChecksum, have+resp.ContentLength, p.Size)
	}
	f, err := os.OpenFile(part, flags, 0o644)
	if err != nil {
		return err
	}
	n, cerr := io.Copy(f, progress.Reader(io.LimitReader(resp.Body, p.Size-have+1), p.String(), o.Progress))
	if err := f.Close(); err != nil && cerr == nil {
		cerr = err
	}
	switch {
	case have+n > p.Size:
		return fmt.Errorf("fetch %s: %w: more than the index's %d bytes", u, ErrChecksum, p.Size)
	case cerr != nil:
		return fmt.Errorf("fetch %s: truncated at %d of %d bytes: %w (run again to resume)", u, have+n, p.Size, cerr)
	case have+n < p.Size:
		return fmt.Errorf("fetch %s: truncated at %d of %d bytes (run again to resume)", u, have+n, p.Size)
	}
	return nil
}
