package guest

import (
	"encoding/json"
	"io"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/overlay"
)

// WriteChanges writes the overlay's change set (what the agent changed in
// /work against the read-only workspace) to w as one JSON document, with
// the base of each modified file the guest recorded at copy-up (see
// recordBases). The host runs it as proto.ChangesCommand and trusts none of
// it: the patch is built and checked host-side.
func WriteChanges(w io.Writer) error {
	bases, err := readBases(basesFile)
	if err != nil {
		return err
	}
	cs, err := overlay.ScanChangesFrom(proto.WorkspaceMount, proto.UpperDir, bases)
	if err != nil {
		return err
	}
	return json.NewEncoder(w).Encode(cs)
}
