package dlp

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"strings"
)

// Values that look like secrets but protect nothing: public keys and the
// examples that providers publish in their documentation. A recognizer's
// match equal to one is not redacted, for any destination (placeholderValue).
// Known values are not affected: a value the user named is always scrubbed.

// docExampleTokens are published example credentials, exactly.
var docExampleTokens = map[string]bool{
	// AWS's documented access key pair.
	"AKIAIOSFODNN7" + "EXAMPLE":                     true,
	"wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY": true,
	// Stripe's documentation test keys.
	"sk_test_" + "4eC39HqLyjWDarjtT1zdp7dc": true,
	"pk_test_" + "TYooMQauvdEDq54NiTphI7jx": true,
	"sk_test_" + "BQokikJOvBiI2HlWgH4olfQ2": true,
	"pk_test_" + "6pRNASCoBOKtIshFeQd4XMUh": true,
	"sk_test_" + "26PHem9AhJZvU623DfE1x4sd": true,
}

// jwtIOExample is the header and payload of jwt.io's example token
// ({"sub":"1234567890","name":"John Doe","iat":1516239022}); its
// signature depends on the secret the page shows, so any is accepted.
const jwtIOExample = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."

// testCards are the test card numbers of payment providers' documentation
// that code and examples are full of (Stripe's): they charge nothing.
// Other famous test numbers (4111 1111 1111 1111) are still redacted: they
// also stand in for real cards in logs and tickets.
var testCards = map[string]bool{"4242424242424242": true}

// docExample reports a published example value of category c.
func docExample(c Category, v string) bool {
	switch c {
	case CatCreditCard:
		var d [32]byte
		n := 0
		for i := 0; i < len(v) && n < len(d); i++ {
			if isDigit(v[i]) {
				d[n] = v[i]
				n++
			}
		}
		return testCards[string(d[:n])]
	}
	// A JWT is also taken as a bearer token or an assigned secret.
	return docExampleTokens[v] || strings.HasPrefix(v, jwtIOExample)
}

// sshKeyTypes are the key type names of OpenSSH public keys.
var sshKeyTypes = []string{"ssh-rsa", "ssh-dss", "ssh-ed25519", "ssh-ed448", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
	"ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"}

// publicKey reports a public key, or a part of one a recognizer would take
// for a secret: an OpenSSH key type name (ssh-ed25519), the base64 blob of
// an OpenSSH public key (AAAAC3NzaC1lZDI1NTE5…, which names its type in
// its first bytes), or the base64 DER of a PEM "PUBLIC KEY" block (a
// SubjectPublicKeyInfo that parses). Private keys never parse as either.
func publicKey(v string) bool {
	for _, t := range sshKeyTypes {
		if strings.HasPrefix(v, t) && (len(v) == len(t) || strings.HasPrefix(v[len(t):], "-cert-v01@openssh.com")) {
			return true
		}
	}
	// A blob starts with its type name's length (AAAA…); DER with a
	// SEQUENCE (M…). Anything else is not decoded.
	if len(v) < 24 || len(v) > 8<<10 || !strings.HasPrefix(v, "AAAA") && v[0] != 'M' {
		return false
	}
	var buf [6 << 10]byte
	enc := base64.StdEncoding
	if len(v)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	n, err := enc.Decode(buf[:], []byte(v))
	if err != nil {
		return false
	}
	raw := buf[:n]
	if len(raw) > 4 {
		if l := int(binary.BigEndian.Uint32(raw)); l >= 7 && l <= 64 && 4+l <= len(raw) {
			name := raw[4 : 4+l]
			for _, t := range sshKeyTypes {
				if bytes.HasPrefix(name, []byte(t)) && (len(name) == len(t) || bytes.HasPrefix(name[len(t):], []byte("-cert-"))) {
					return true
				}
			}
		}
	}
	if len(raw) > 32 && raw[0] == 0x30 {
		// (A copy: the parsed key may keep it, and buf stays on the
		// stack.)
		if _, err := x509.ParsePKIXPublicKey(bytes.Clone(raw)); err == nil {
			return true
		}
	}
	return false
}

// genericHostLabels are single-label host names that name no one's
// network: localhost and its kin, the placeholders of documentation
// (http://host:port/, http://server/), and the default service names of
// common software that docker-compose files and tutorials use
// (redis://redis:6379, http://db:5432). A company's own names (buildbox,
// ldap01, jenkins-prod) are not among them.
var genericHostLabels = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`localhost localhost4 localhost6 ip6-localhost ip6-loopback broadcasthost
		host hostname myhost yourhost your-host my-host server servername myserver your-server my-server remote
		domain example url name addr address ip test dummy foo bar baz qux target upstream origin evil attacker
		app api web www backend frontend worker proxy gateway cache db database
		redis postgres postgresql pg mysql mariadb mongo mongodb rabbitmq kafka zookeeper nats memcached
		elasticsearch opensearch kibana logstash minio localstack nginx traefik caddy haproxy envoy
		vault consul etcd prometheus grafana jaeger zipkin otel-collector collector selenium chrome
		mailhog mailpit smtp keycloak registry docker kubernetes`) {
		m[w] = true
	}
	return m
}()

// genericHostLabel reports a label of genericHostLabels (in any case) or a
// placeholder (xxxx, your-…).
func genericHostLabel(l []byte) bool {
	if len(l) == 9 && bytes.EqualFold(l, []byte("localhost")) {
		return true // the most frequent, without the map
	}
	if len(l) > 24 {
		return placeholder(l)
	}
	var b [24]byte
	for i, c := range l {
		b[i] = fold(c)
	}
	return genericHostLabels[string(b[:len(l)])] || placeholder(l)
}

// notPhoneWords say that the dashed 3-3-4 number after them (within 32
// bytes) is an id, not a phone number: order 415-555-2671.
var notPhoneWords = []string{"order", "invoice", "ticket", "isbn", "issn", "sku", "part", "serial", "model", "ref",
	"reference", "case", "lot", "batch", "tracking", "build", "version", "id"}
