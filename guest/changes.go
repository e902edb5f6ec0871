package guest

import (
	"encoding/json"
	"io"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/overlay"
)

// WriteChanges writes the overlay's change set (what the agent changed in
// /work against the read-only workspace) to w as one JSON document. The
// host runs it as proto.ChangesCommand and trusts none of it: the patch is
// built and checked host-side.
func WriteChanges(w io.Writer) error {
	cs, err := overlay.ScanChanges(proto.WorkspaceMount, proto.UpperDir)
	if err != nil {
		return err
	}
	return json.NewEncoder(w).Encode(cs)
}
