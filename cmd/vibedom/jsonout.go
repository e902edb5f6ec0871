package main

import (
	"bytes"
	"encoding/json"
	"io"

	"github.com/vibedom/vibedom/termtext"
)

// writeJSON prints v as indented JSON, the form of every report's --json,
// with what is unsafe on a terminal written as JSON escapes (termtext.JSON):
// names, paths and errors in it may come from state.json or a workspace.
func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(termtext.JSON(b.Bytes()))
	return err
}
