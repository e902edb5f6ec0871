package overlay

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update", false, "rewrite the generated table in docs/overlay.md")

const (
	docTableStart = "<!-- attention table: generated from overlay.AttentionRules; go test ./overlay -run TestAttentionTableDocumented -update -->"
	docTableEnd   = "<!-- end of attention table -->"
)

// attentionTableMarkdown renders AttentionRules as the docs show them: one
// row per reason, its patterns together, in the table's order.
func attentionTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| pattern | level | why |\n|---|---|---|\n")
	var pats []string
	flush := func(r AttentionRule) {
		why := r.Why
		if r.Check != nil {
			why = "only when the content says so: " + why
		}
		b.WriteString("| `" + strings.Join(pats, "`, `") + "` | " + r.Level.String() + " | " + why + " |\n")
		pats = nil
	}
	for i, r := range AttentionRules {
		pats = append(pats, r.Pattern)
		if i+1 == len(AttentionRules) {
			flush(r)
			break
		}
		n := AttentionRules[i+1]
		if n.Why != r.Why || n.Level != r.Level || (n.Check == nil) != (r.Check == nil) {
			flush(r)
		}
	}
	return b.String()
}

// TestAttentionTableDocumented keeps the table in docs/overlay.md the
// table the code applies (STYLE habit 14: one table, a reason per row).
func TestAttentionTableDocumented(t *testing.T) {
	t.Parallel()
	const doc = "../docs/overlay.md"
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i, j := strings.Index(text, docTableStart), strings.Index(text, docTableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the generated table's markers", doc)
	}
	want := attentionTableMarkdown()
	got := text[i+len(docTableStart)+1 : j]
	if got == want {
		return
	}
	if !*updateDocs {
		t.Fatalf("the attention table in %s is not AttentionRules: run go test ./overlay -run TestAttentionTableDocumented -update", doc)
	}
	text = text[:i+len(docTableStart)+1] + want + text[j:]
	if err := os.WriteFile(doc, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
