package dlp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// pipelineBodies are large bodies of every walker the pipeline serves,
// with findings of every kind in segments of every size: tiny strings,
// strings of a few KiB, strings longer than a window (scanned window by
// window, in turn), a card number written as a JSON number, a password
// under a secret-named key, known values raw and encoded.
func pipelineBodies(t *testing.T, secrets []Secret) map[string][]byte {
	r := rand.New(rand.NewPCG(7, 8))
	findings := []string{knownSecret, awsKey, jwtToken, "bob@corp.io", "4111 1111 1111 1111", strings.TrimSpace(pemKey(t)),
		url.QueryEscape(knownSecret), base64.StdEncoding.EncodeToString([]byte(knownSecret)), secrets[5].Value,
		"password=" + j("Zq8#mK2", "vL9x"), "ssn 123-45-6789", "call +1 415-555-2671", "10.1.2.3"}
	text := func(n int) string {
		s := benchText(r, n)
		for k := r.IntN(4); k > 0 && n > 0; k-- {
			at := r.IntN(len(s))
			s = s[:at] + " " + findings[r.IntN(len(findings))] + " " + s[at:]
		}
		return s
	}
	sizes := []int{0, 5, 300, 4 << 10, 20 << 10, 40 << 10, 70 << 10, 150 << 10}
	var js, form bytes.Buffer
	js.WriteString(`{"model":"m","messages":[`)
	for i := 0; js.Len() < 1<<20; i++ {
		if i > 0 {
			js.WriteByte(',')
		}
		s, _ := json.Marshal(text(sizes[r.IntN(len(sizes))]))
		fmt.Fprintf(&js, `{"role":"user","n":%d,"content":%s`, i, s)
		switch r.IntN(4) {
		case 0:
			js.WriteString(`,"card":4111111111111111`)
		case 1:
			fmt.Fprintf(&js, `,"db_password":%q`, j("Zq8#mK2", "vL9x!Tq", fmt.Sprint(i)))
		}
		js.WriteString(`}`)
	}
	js.WriteString(`]}`)
	for i := 0; form.Len() < 600<<10; i++ {
		if i > 0 {
			form.WriteByte('&')
		}
		fmt.Fprintf(&form, "f%d=%s", i, url.QueryEscape(text(sizes[r.IntN(6)])))
		if i%5 == 0 {
			fmt.Fprintf(&form, "&password=%s", url.QueryEscape(j("Zq8#mK2", "vL9x!Tq", fmt.Sprint(i))))
		}
	}
	return map[string][]byte{"application/json": js.Bytes(), "application/x-www-form-urlencoded": form.Bytes()}
}

// pipelineEngines builds an engine on n random secrets and knownSecret,
// and a copy of it that scans every segment in turn.
func pipelineEngines(t *testing.T, n int) (e, inTurn *Engine, secrets []Secret) {
	secrets = append(benchSecrets(n), Secret{Value: knownSecret, Source: "t"})
	e = mustEngine(t, Config{Secrets: secrets})
	c := *e
	c.inTurn = true
	return e, &c, secrets
}

// TestPipelineSameAsInTurn: a body scrubbed through the pipeline (a
// worker searching known values while the caller walks on, batches taken
// back, segments settled later) comes out byte for byte as when each
// segment is scanned and settled in turn, with the same findings in the
// same order, whatever the read and write sizes.
func TestPipelineSameAsInTurn(t *testing.T) {
	t.Parallel()
	e, inTurn, secrets := pipelineEngines(t, 200)
	before := testPipeBatches.Load()
	for ct, body := range pipelineBodies(t, secrets) {
		for _, class := range []Class{ClassPublic, ClassExternal, ClassInternal} {
			pol := e.PolicyForClass(class)
			for _, seed := range seeds(t) {
				want, wrep := scrubChunked(t, inTurn, &pol, body, ct, seed)
				got, grep := scrubChunked(t, e, &pol, body, ct, seed)
				if got != want {
					t.Fatalf("%s to %s, seed %d: the pipeline scrubbed differently; %s", ct, class, seed, diffContext(got, want))
				}
				if g, w := fmt.Sprint(grep.Findings()), fmt.Sprint(wrep.Findings()); g != w {
					t.Fatalf("%s to %s, seed %d: findings differ:\npipeline %s\nin turn  %s", ct, class, seed, g, w)
				}
				if class != ClassInternal && len(wrep.Findings()) < 10 {
					t.Fatalf("%s to %s: only %d findings: the fixture lost its findings", ct, class, len(wrep.Findings()))
				}
			}
		}
	}
	if testPipeBatches.Load() == before {
		t.Fatal("no batch went through the pipeline")
	}
}

// TestPipelineConcurrentBodies: many bodies at once (every worker busy,
// batches taken back by their callers, hand-overs of batches already
// taken) each come out as when scrubbed alone.
func TestPipelineConcurrentBodies(t *testing.T) {
	t.Parallel()
	e, inTurn, secrets := pipelineEngines(t, 100)
	pol := e.PolicyForClass(ClassPublic)
	body := pipelineBodies(t, secrets)["application/json"]
	want, _, err := inTurn.ScrubBytes(&pol, body, StreamOptions{ContentType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				got, _, err := e.ScrubBytes(&pol, body, StreamOptions{ContentType: "application/json"})
				if err != nil {
					errs <- err.Error()
					return
				}
				if !bytes.Equal(got, want) {
					errs <- fmt.Sprintf("goroutine %d: %s", g, diffContext(string(got), string(want)))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}
