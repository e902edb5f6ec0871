package guest

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"os"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/overlay"
)

// basesFile is where the guest records, for each workspace file, the lower
// version last opened in /work before the overlay copied the path up (one
// JSON object a line, appended; the last line for a path wins). It lives on
// the scratch disk beside the upper dir, so it survives a guest restart as
// the upper dir does.
const basesFile = proto.ScratchMount + "/copyup-bases.jsonl"

// baseRecord is one line of basesFile. An empty SHA256 means the version is
// not known (too large to hash on open, or it changed while hashed).
type baseRecord struct {
	Path   string `json:"p"`
	SHA256 string `json:"h,omitempty"`
	Mode   uint32 `json:"m"`
}

// readBases reads basesFile into the map overlay.ScanChangesFrom takes. A
// missing file is no bases; a torn or damaged line is skipped, and reading
// stops at an overlong one: fewer bases only turn merges into conflicts.
func readBases(path string) (map[string]overlay.Base, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bases := map[string]overlay.Base{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		var r baseRecord
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.Path == "" {
			continue
		}
		if r.SHA256 == "" {
			delete(bases, r.Path)
			continue
		}
		bases[r.Path] = overlay.Base{SHA256: r.SHA256, Mode: r.Mode}
	}
	return bases, nil
}
