package dlp

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// publicKeyTexts are public keys as they appear in code and config:
// authorized_keys lines, assignments of a key or its blob, PEM blocks.
func publicKeyTexts(t *testing.T) []string {
	t.Helper()
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, pub := range []any{edPub, &rsaKey.PublicKey, &ecKey.PublicKey} {
		sp, err := ssh.NewPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
		blob := base64.StdEncoding.EncodeToString(sp.Marshal())
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		block := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
		out = append(out,
			line+" alice@laptop\n",
			"deploy_token: "+line+"\n",
			"secret_key = "+blob+"\n",
			`{"ssh_key_secret":"`+blob+`","access_token":"`+line+`"}`,
			block,
			`{"credential":"`+strings.ReplaceAll(block, "\n", `\n`)+`"}`,
			"public_secret = "+base64.StdEncoding.EncodeToString(der)+"\n",
		)
	}
	return out
}

// docExampleTexts hold the credentials providers publish in their
// documentation, built at run time.
func docExampleTexts() []string {
	jwtIO := j("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.", "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.")
	return []string{
		"aws_access_key_id = " + j("AKIAIOSFODNN7", "EXAMPLE") + "\naws_secret_access_key = " + j("wJalrXUtnFEMI/K7MDENG/", "bPxRfiCYEXAMPLEKEY") + "\n",
		"Authorization: Bearer " + jwtIO + j("SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV", "_adQssw5c"),
		`{"token":"` + jwtIO + j("KMUFsIDTnFmyG3nMiGM6H9FNFUROf3wh7", "SmqJp-QV30") + `"}`,
		"stripe.api_key = '" + j("sk_test_", "4eC39HqLyjWDarjtT1zdp7dc") + "'",
		"STRIPE_SECRET_KEY=" + j("sk_test_", "BQokikJOvBiI2HlWgH4olfQ2") + "\n",
		"pay with 4242 4242 4242 " + "4242, exp 12/34, cvc 123",
		`{"number":"4242424242424242","exp_month":12}`,
	}
}

// TestNotSecrets: public keys and published documentation examples pass
// to every destination class, byte for byte; their twins (a private key's
// blob, a live-looking token of the same shape, a real-looking card) are
// still redacted.
func TestNotSecrets(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{})
	for _, in := range append(publicKeyTexts(t), docExampleTexts()...) {
		for _, class := range []Class{ClassExternal, ClassPublic} {
			if out, rep := scrubText(t, e, class, in); out != in {
				t.Errorf("%v: %q\n -> %q (%v)", class, in, out, rep.Findings())
			}
		}
	}
	_, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	twins := []struct{ text, value string }{
		{"secret_key = " + base64.StdEncoding.EncodeToString(edPriv) + "\n", base64.StdEncoding.EncodeToString(edPriv)},
		{"stripe.api_key = '" + j("sk_test_", "4eC39HqLyjWDarjtT1zdp7dX") + "'", j("sk_test_", "4eC39HqLyjWDarjtT1zdp7dX")},
		{"Authorization: Bearer " + j("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.", "eyJzdWIiOiI5ODc2NTQzMjEwIiwibmFtZSI6IkphbmUgUm9lIn0.", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"), "eyJzdWIiOiI5ODc2NTQzMjEwIiwibmFtZSI6IkphbmUgUm9lIn0"},
		{"pay with 4242 4242 4242 " + "4259 today", "4242 4242 4242 4259"},
	}
	for _, tw := range twins {
		out, _ := scrubText(t, e, ClassExternal, tw.text)
		if strings.Contains(out, tw.value) {
			t.Errorf("twin passed: %q -> %q", tw.text, out)
		}
	}
}
