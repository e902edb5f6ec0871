package main

import (
	"encoding/json"
	"io"
)

// writeJSON prints v as indented JSON, the form of every report's --json.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
