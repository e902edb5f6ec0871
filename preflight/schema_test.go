package preflight

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// schemaField is one documented JSON field.
type schemaField struct {
	typ      string // number, string
	optional bool
}

var backticked = regexp.MustCompile("`([^`]+)`")

// docsSchema reads the field table of docs/preflight.md's JSON section:
// rows "| `a.b`, `.c` | number[, string] [*optional*] | meaning |", where
// ".c" is a sibling of the first name.
func docsSchema(t *testing.T, path string) map[string]schemaField {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read the documented schema: %v", err)
	}
	_, table, ok := strings.Cut(string(b), "| field | type | meaning |\n|---|---|---|\n")
	if !ok {
		t.Fatalf("%s: no JSON field table", path)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	fields := map[string]schemaField{}
	for row := range strings.SplitSeq(table, "\n") {
		cells := strings.Split(strings.Trim(row, "| "), " | ")
		if len(cells) != 3 {
			t.Fatalf("%s: bad table row %q", path, row)
		}
		var names []string
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			n := m[1]
			if strings.HasPrefix(n, ".") {
				first := names[0]
				n = first[:strings.LastIndexByte(first, '.')] + n
			}
			names = append(names, n)
		}
		optional := strings.Contains(cells[1], "*optional*")
		var types []string
		for ty := range strings.SplitSeq(strings.ReplaceAll(cells[1], "*optional*", ""), ",") {
			if ty = strings.TrimSpace(ty); ty != "" {
				types = append(types, ty)
			}
		}
		if len(names) == 0 || (len(types) != 1 && len(types) != len(names)) {
			t.Fatalf("%s: row %q: names %q, types %q", path, row, names, types)
		}
		for i, n := range names {
			ty := types[0]
			if len(types) > 1 {
				ty = types[i]
			}
			fields[n] = schemaField{typ: ty, optional: optional}
		}
	}
	return fields
}

// jsonFields flattens a decoded JSON value into field paths ("a.b",
// "a[].c", "w[]") and the types seen at each.
func jsonFields(prefix string, v any, out map[string][]string) {
	add := func(ty string) {
		if !slices.Contains(out[prefix], ty) {
			out[prefix] = append(out[prefix], ty)
		}
	}
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			jsonFields(p, e, out)
		}
	case []any:
		for _, e := range x {
			jsonFields(prefix+"[]", e, out)
		}
	case float64:
		add("number")
	case string:
		add("string")
	case bool:
		add("bool")
	case nil:
		add("null")
	default:
		add("unknown")
	}
}

// checkSchema compares a JSON report with the documented fields: every
// field output is documented with its type, every documented field is
// output, every element of an array has all its non-optional fields, and
// findings[].number is there exactly for unapproved findings.
func checkSchema(t *testing.T, doc []byte, schema map[string]schemaField) {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("decode: %v\n%s", err, doc)
	}
	got := map[string][]string{}
	jsonFields("", v, got)
	for path, types := range got {
		f, ok := schema[path]
		switch {
		case !ok:
			t.Errorf("output field %q is not documented", path)
		case len(types) != 1 || types[0] != f.typ:
			t.Errorf("field %q: output as %v, documented as %s", path, types, f.typ)
		}
	}
	for path := range schema {
		if _, ok := got[path]; !ok {
			t.Errorf("documented field %q is not in the output (or the test report lacks it)", path)
		}
	}
	for _, arr := range []string{"skipped", "warnings", "findings"} {
		elems, ok := v[arr].([]any)
		if !ok {
			t.Errorf("%s: not an array: %v", arr, v[arr])
			continue
		}
		for i, e := range elems {
			fields := map[string][]string{}
			jsonFields(arr+"[]", e, fields)
			for path, f := range schema {
				if !strings.HasPrefix(path, arr+"[]") || f.optional {
					continue
				}
				if _, ok := fields[path]; !ok {
					t.Errorf("%s[%d] lacks %q", arr, i, path)
				}
			}
			if arr == "findings" {
				m := e.(map[string]any)
				if _, has := m["number"]; has != (m["status"] == "unapproved") {
					t.Errorf("findings[%d]: status %v, number present %v", i, m["status"], has)
				}
			}
		}
	}
}

// TestJSONSchemaMatchesDocs holds the report's JSON (--json and
// gitleaks_report.json) to the table in docs/preflight.md.
func TestJSONSchemaMatchesDocs(t *testing.T) {
	t.Parallel()
	schema := docsSchema(t, filepath.Join("..", "docs", "preflight.md"))
	e := newEnv(t)
	writeTree(t, e.ws, map[string]string{
		"src/aws.py":   "key = '" + awsKey() + "'\n",
		".env.local":   envPassword(passValue),
		"approved.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		"ignored.env":  "GITHUB_TOKEN=" + githubPAT("2") + "\n",
		"big/dump.sql": strings.Repeat("x", 2048) + "\n",
		IgnoreFile:     "ignored.env:github-pat:1\nnot a fingerprint\n",
	})
	opts := e.opts()
	opts.MaxFileSize = 1024
	r, err := Scan(t.Context(), opts)
	must(t, err)
	must(t, r.approve([]Finding{findingByFP(t, r, "approved.env:github-pat:1")}))
	if len(r.Skipped) == 0 || len(r.Warnings) == 0 {
		t.Fatalf("setup: want skipped files and warnings, got %+v, %q", r.Skipped, r.Warnings)
	}
	p := filepath.Join(t.TempDir(), "gitleaks_report.json")
	must(t, r.WriteJSON(p))
	b, err := os.ReadFile(p)
	must(t, err)
	checkSchema(t, b, schema)

	t.Run("a clean report has empty arrays, not null", func(t *testing.T) {
		e := newEnv(t)
		writeTree(t, e.ws, map[string]string{"main.go": "package main\n"})
		b, err := json.Marshal(e.scan(t))
		must(t, err)
		for _, arr := range []string{`"skipped":[]`, `"warnings":[]`, `"findings":[]`} {
			if !strings.Contains(string(b), arr) {
				t.Errorf("clean report lacks %s: %s", arr, b)
			}
		}
	})
}
