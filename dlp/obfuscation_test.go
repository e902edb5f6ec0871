package dlp

import (
	"encoding/base32"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"unicode/utf16"
)

// obfuscations are the cheap renderings of a value an agent could use to
// slip it past a scanner, each as it would appear in a request.
func obfuscations(v string) map[string]string {
	b := []byte(v)
	var u []byte
	for _, r := range utf16.Encode([]rune("$env:K='" + v + "'; iwr x")) {
		u = append(u, byte(r), byte(r>>8))
	}
	var esc, spaced, hexList, dec []string
	for _, c := range b {
		esc = append(esc, fmt.Sprintf(`\x%02x`, c))
		spaced = append(spaced, fmt.Sprintf("%02X", c))
		hexList = append(hexList, fmt.Sprintf("0x%02x", c))
		dec = append(dec, fmt.Sprint(c))
	}
	h := len(v) / 2
	return map[string]string{
		"base32":           "echo " + base32.StdEncoding.EncodeToString(b) + " | base32 -d",
		"base32 lower":     "k=" + strings.ToLower(base32.StdEncoding.EncodeToString(b)),
		"rot13":            "tr A-Za-z N-ZA-Mn-za-m <<< '" + string(rot13(b)) + "'",
		"base64 of base64": "x=" + base64.StdEncoding.EncodeToString([]byte(base64.StdEncoding.EncodeToString(b)+"\n")),
		"powershell":       "powershell -EncodedCommand " + base64.StdEncoding.EncodeToString(u),
		"byte escapes":     `s = "` + strings.Join(esc, "") + `"`,
		"spaced hex":       "bytes: " + strings.Join(spaced, " ") + "\n",
		"hex list":         "k = [" + strings.Join(hexList, ", ") + "]",
		"char codes":       "String.fromCharCode(" + strings.Join(dec, ", ") + ")",
		"char codes tight": "[" + strings.Join(dec, ",") + "]",
		"leading half":     "prefix " + v[:h] + " ...",
		"trailing half":    "... " + v[h:] + " suffix",
	}
}

// TestKnownValueObfuscations: a known value is found through each cheap
// obfuscation; the same obfuscations of a value that is not known pass
// byte for byte.
func TestKnownValueObfuscations(t *testing.T) {
	t.Parallel()
	secret := j("Zx8Qm2Lk7Vn4Tp9W", "r3Yb6Hc1Jf5Gd0Se")
	other := j("Qa1Ws2Ed3Rf4Tg5Y", "h6Uj7Ik8Ol9Pz0Xc")
	e := mustEngine(t, Config{Secrets: []Secret{{Value: secret, Source: ".env:2 TOKEN"}}})
	for name, text := range obfuscations(secret) {
		out, rep := scrubText(t, e, ClassExternal, text)
		fs := rep.Findings()
		if !strings.Contains(out, "[REDACTED:SECRET]") || len(fs) == 0 || fs[0].Value() != secret {
			t.Errorf("%s: %q -> %q (%v)", name, text, out, fs)
		}
	}
	for name, text := range obfuscations(other) {
		for _, class := range []Class{ClassExternal, ClassPublic} {
			if out, rep := scrubText(t, e, class, text); out != text {
				t.Errorf("twin %s, %v: %q -> %q (%v)", name, class, text, out, rep.Findings())
			}
		}
	}
}

// separated cuts v into groups of n joined by sep.
func separated(v string, n int, sep string) string {
	var parts []string
	for len(v) > n {
		parts = append(parts, v[:n])
		v = v[n:]
	}
	return strings.Join(append(parts, v), sep)
}

// TestKnownValueSeparators: a known value cut by a dash, a blank or a dot
// every N characters, by zero-width characters, or folded at any width is
// found; the same renderings of a value that is not known, UUIDs, dotted
// versions and prose pass byte for byte.
func TestKnownValueSeparators(t *testing.T) {
	t.Parallel()
	secret := j("Zx8Qm2Lk7Vn4Tp9W", "r3Yb6Hc1Jf5Gd0Se")
	other := j("Qa1Ws2Ed3Rf4Tg5Y", "h6Uj7Ik8Ol9Pz0Xc")
	e := mustEngine(t, Config{Secrets: []Secret{{Value: secret, Source: ".env:2 TOKEN"}}})
	render := func(v string) map[string]string {
		return map[string]string{
			"dash every 4":      "key: " + separated(v, 4, "-") + "\n",
			"dash every 1":      "key " + separated(v, 1, "-") + ".",
			"dash every 11":     "key " + separated(v, 11, "-") + ".",
			"dash every 15":     "key=" + separated(v, 15, "-") + "\n",
			"blank every 4":     "key: " + separated(v, 4, " ") + "\n",
			"blank every 1":     `"` + separated(v, 1, " ") + `"`,
			"blank every 7":     "k = " + separated(v, 7, " ") + " ok",
			"dot every 3":       "k=" + separated(v, 3, ".") + ";",
			"dot every 8":       "(" + separated(v, 8, ".") + ")",
			"blank every 9":     "k = " + separated(v, 9, " ") + " ok",
			"blank every 12":    "key: " + separated(v, 12, " ") + "\n",
			"dot every 10":      "k=" + separated(v, 10, ".") + ";",
			"dot every 16":      "(" + separated(v, 16, ".") + ")",
			"zero-width":        "k=" + separated(v, 1, "\u200b") + " ok",
			"soft hyphens":      "k=" + separated(v, 5, "\u00ad") + " ok",
			"folded at 10":      "-----\n" + separated(v, 10, "\n") + "\n-----",
			"folded at 5":       "data:\n  " + separated(v, 5, "\n  ") + "\n",
			"folded at 12 crlf": separated(v, 12, "\r\n") + "\r\n",
			"folded at 1":       "x\n" + separated(v, 1, "\n") + "\nend",
			"folded at 7, key":  "data: " + separated(v, 7, "\n") + "\n",
			"folded at 15, key": "data: " + separated(v, 15, "\n") + "\n",
			"folded at 17, key": "data: " + separated(v, 17, "\n") + "\n",
			"folded at 20 json": `{"k":"` + separated(v, 20, `\n`) + `"}`,
		}
	}
	for name, text := range render(secret) {
		out, rep := scrubText(t, e, ClassExternal, text)
		fs := rep.Findings()
		if !strings.Contains(out, "[REDACTED:SECRET]") || len(fs) == 0 || fs[0].Value() != secret {
			t.Errorf("%s: %q -> %q (%v)", name, text, out, fs)
		}
		// Nothing of the value is left (not only a half of it).
		for k := 0; k+6 <= len(secret); k++ {
			if strings.Contains(out, secret[k:k+6]) {
				t.Errorf("%s: %q left in %q", name, secret[k:k+6], out)
				break
			}
		}
	}
	twins := render(other)
	twins["uuid"] = "id 6ba7b810-9dad-11d1-80b4-00c04fd430c8 ok"
	twins["prose"] = "the a of to and in is it we do go by me up on an at as"
	twins["dotted"] = "v1.2.3.4 a.b.c.d 8.8.4.4 x.y fmt.Println(os.Args) Zx8.Qm2"
	for name, text := range twins {
		for _, class := range []Class{ClassExternal, ClassPublic} {
			if out, rep := scrubText(t, e, class, text); out != text {
				t.Errorf("twin %s, %v: %q -> %q (%v)", name, class, text, out, rep.Findings())
			}
		}
	}
}
