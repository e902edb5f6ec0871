package overlay

import (
	"bufio"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// zeroID is git's all-zero object id, the "index" of a side that is absent.
const zeroID = "0000000000000000000000000000000000000000"

// blobID is the git blob id (SHA-1 of "blob <len>\0" + data) of data. It
// names content in patches and the object store; it is an integrity check
// against accidents and mix-ups, not against an adversary (SHA-1).
func blobID(data []byte) string {
	h := sha1.New()
	h.Write([]byte("blob " + strconv.Itoa(len(data)) + "\x00"))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

func validBlobID(s string) bool {
	if len(s) != 40 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ErrObjectMissing means the object store has no content for a blob id.
var ErrObjectMissing = errors.New("object not in store")

// objectStore keeps file contents by git blob id in a directory of the
// session folder, so a patch's old sides can be recovered after the VM and
// the user's edits have moved on. Each writer appends to its own pack file
// (pack-N.pack) and, when closed, writes the pack's index (pack-N.idx,
// JSON: id -> offset and length). Reads verify the id.
type objectStore struct {
	dir string

	// writing
	pack  *os.File
	w     *bufio.Writer
	n     int64
	index map[string]backupRef

	// reading
	loaded bool
	refs   map[string]packRef
}

type packRef struct {
	pack string
	backupRef
}

// put stores data (once per id) and returns its id. Nothing is readable
// before close.
func (o *objectStore) put(data []byte) (string, error) {
	id := blobID(data)
	if o.dir == "" {
		return id, nil
	}
	if o.pack == nil {
		if err := os.MkdirAll(o.dir, 0o700); err != nil {
			return "", fmt.Errorf("store object: %w", err)
		}
		for i := 0; ; i++ {
			f, err := os.OpenFile(filepath.Join(o.dir, fmt.Sprintf("pack-%d.pack", i)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if errors.Is(err, fs.ErrExist) && i < 10000 {
				continue
			}
			if err != nil {
				return "", fmt.Errorf("store object: %w", err)
			}
			o.pack, o.w, o.index = f, bufio.NewWriterSize(f, 1<<20), map[string]backupRef{}
			break
		}
	}
	if _, ok := o.index[id]; ok {
		return id, nil
	}
	if _, err := o.w.Write(data); err != nil {
		return "", fmt.Errorf("store object: %w", err)
	}
	o.index[id] = backupRef{Off: o.n, Len: int64(len(data))}
	o.n += int64(len(data))
	return id, nil
}

// close finishes the pack being written: data, then its index.
func (o *objectStore) close() error {
	if o.pack == nil {
		return nil
	}
	name := strings.TrimSuffix(o.pack.Name(), ".pack") + ".idx"
	err := errors.Join(o.w.Flush(), o.pack.Sync(), o.pack.Close())
	o.pack = nil
	if err != nil {
		return fmt.Errorf("store objects: %w", err)
	}
	data, _ := json.Marshal(o.index)
	if err := os.WriteFile(name, data, 0o600); err != nil {
		return fmt.Errorf("store objects: %w", err)
	}
	return nil
}

// get returns the content of id, verified, or ErrObjectMissing.
func (o *objectStore) get(id string) ([]byte, error) {
	if o.dir == "" || !validBlobID(id) {
		return nil, ErrObjectMissing
	}
	if !o.loaded {
		o.loaded, o.refs = true, map[string]packRef{}
		idx, _ := filepath.Glob(filepath.Join(o.dir, "pack-*.idx"))
		for _, f := range idx {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			var m map[string]backupRef
			if json.Unmarshal(data, &m) != nil {
				continue
			}
			for k, r := range m {
				o.refs[k] = packRef{strings.TrimSuffix(f, ".idx") + ".pack", r}
			}
		}
	}
	r, ok := o.refs[id]
	if !ok || r.Off < 0 || r.Len < 0 || r.Len > maxBinarySize {
		return nil, ErrObjectMissing
	}
	f, err := os.Open(r.pack)
	if err != nil {
		return nil, ErrObjectMissing
	}
	defer f.Close()
	data := make([]byte, r.Len)
	if _, err := f.ReadAt(data, r.Off); err != nil && !(errors.Is(err, io.EOF) && r.Len == 0) {
		return nil, ErrObjectMissing
	}
	if blobID(data) != id {
		return nil, fmt.Errorf("object %s is corrupt (content hashes to %s)", id, blobID(data))
	}
	return data, nil
}
