package atomicfile

import (
	"fmt"
	"io"
	"os"
)

// ReadLimited reads the whole file at path when it holds at most max bytes,
// and refuses it ("… is larger than max bytes") otherwise, reading no more
// than max+1 bytes either way: the bounded read of a small file (a manifest,
// a settings file, /etc/passwd) that may come from a hostile source.
func ReadLimited(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return b, nil
}
