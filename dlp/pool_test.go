package dlp

import (
	"bytes"
	"fmt"
	"testing"
)

// Segments take their escape, match and view scratch from a pool that
// earlier bodies filled: a body must scrub the same whether its scratch
// is fresh or left over from bodies of other shapes (escape-heavy JSON,
// plain text), including the findings.
func TestScrubPooledScratchIdentical(t *testing.T) {
	secrets := benchSecrets(50)
	e, err := New(Config{Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	pol := e.PolicyForClass(ClassPublic)
	scrub := func(body []byte, ct string) (string, string) {
		var out bytes.Buffer
		rep := &Report{}
		if err := e.Scrub(&out, bytes.NewReader(body), &pol, StreamOptions{ContentType: ct}, rep); err != nil {
			t.Fatal(err)
		}
		return out.String(), fmt.Sprint(rep.Findings())
	}
	big := benchBody(200<<10, secrets)
	small := benchBody(8<<10, secrets[10:])
	// A body whose views are built: a secret percent-encoded and wrapped.
	s := secrets[3].Value
	views := []byte(`{"a":"` + fmt.Sprintf("%%%02X", s[0]) + s[1:] + `","b":"x\\u0041` + s + `"}`)
	type body struct {
		b  []byte
		ct string
	}
	bodies := []body{{big, "application/json"}, {small, "application/json"}, {views, "application/json"}, {big, "text/plain"}}
	var want [][2]string
	for _, b := range bodies {
		o, f := scrub(b.b, b.ct)
		want = append(want, [2]string{o, f})
	}
	for round := range 3 {
		for i := len(bodies) - 1; i >= 0; i-- {
			o, f := scrub(bodies[i].b, bodies[i].ct)
			if o != want[i][0] || f != want[i][1] {
				t.Fatalf("round %d, body %d scrubbed differently after other bodies (findings %s, first time %s)", round, i, f, want[i][1])
			}
		}
	}
	if o, _ := scrub(views, "application/json"); bytes.Contains([]byte(o), []byte(s)) {
		t.Fatalf("the secret survived in %q", o)
	}
}
