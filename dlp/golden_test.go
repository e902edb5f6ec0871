package dlp

import (
	"encoding/base64"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// goldenFixtures fill the templates' {{placeholders}}: the fixtures are
// built at run time, so no file of the project holds one (the outputs hold
// only placeholders).
func goldenFixtures(t *testing.T) map[string]string {
	return map[string]string{
		"known":     knownSecret,
		"known_b64": base64.StdEncoding.EncodeToString([]byte("API_KEY=" + knownSecret + "\n")),
		"known_hex": hex.EncodeToString([]byte(knownSecret)),
		"dbpass":    j("Zq8#mK2", "vL9xW"),
		"aws":       awsKey,
		"stripe":    stripeKey,
		"bearer":    bearerValue,
		"jwt":       jwtToken,
		"assigned":  j("f83kd92L", "sQx0P"),
		"github":    ghToken,
		"gitlab":    glToken,
		"slack":     slackToken,
		"pem":       strings.TrimSpace(pemKey(t)),
	}
}

// TestGolden scrubs each template under testdata/golden (content type by
// extension: .json, .form, .txt) for an external destination and compares
// the result with its .golden file; -update rewrites them.
func TestGolden(t *testing.T) {
	fx := goldenFixtures(t)
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: ".env:1 API_KEY"}}})
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*"))
	types := map[string]string{".json": "application/json", ".form": "application/x-www-form-urlencoded", ".txt": "text/plain"}
	n := 0
	for _, f := range files {
		ct, ok := types[filepath.Ext(f)]
		if !ok {
			continue
		}
		n++
		t.Run(filepath.Base(f), func(t *testing.T) {
			tmpl, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in := string(tmpl)
			for k, v := range fx {
				in = strings.ReplaceAll(in, "{{"+k+"}}", v)
			}
			if strings.Contains(in, "{{") {
				t.Fatalf("unfilled placeholder in %s", f)
			}
			pol := e.PolicyForClass(ClassExternal)
			out, _, err := e.ScrubBytes(&pol, []byte(in), StreamOptions{ContentType: ct})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range fx {
				if strings.Contains(string(out), v) {
					t.Errorf("fixture %s survived", k)
				}
			}
			golden := f + ".golden"
			if *update {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./dlp -run TestGolden -update)", err)
			}
			if string(out) != string(want) {
				t.Errorf("%s differs from %s:\ngot\n%s\nwant\n%s", f, golden, out, want)
			}
		})
	}
	if n == 0 {
		t.Fatal("no golden templates found")
	}
}
