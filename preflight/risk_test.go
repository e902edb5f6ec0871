package preflight

import (
	"slices"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	ghp := githubPAT("1")
	tests := []struct {
		name               string
		file, rule, secret string
		match, line        string
		want               Risk
		reasonHas          string
		reasonLacks        string
	}{
		// HIGH: private keys.
		{name: "private-key rule", file: "keys/id_rsa", rule: "private-key", secret: pemKey(), match: pemKey(), want: RiskHigh, reasonHas: "private key"},
		{name: "pkcs12 file", file: "certs/client.p12", rule: "pkcs12-file", want: RiskHigh, reasonHas: "private key"},
		{name: "age secret key", file: "age.txt", rule: "age-secret-key", secret: "AGE-SECRET-KEY-1X", want: RiskHigh, reasonHas: "private key"},
		{name: "user rule naming private-key", file: "a.txt", rule: "acme-private-key", secret: "x", want: RiskHigh, reasonHas: "private key"},
		{name: "PEM block found by another rule", file: "a.txt", rule: "generic-api-key", secret: "x", match: "-----BEGIN EC " + "PRIVATE KEY-----abc", want: RiskHigh, reasonHas: "private key"},
		// HIGH: cloud provider keys.
		{name: "aws", file: "src/app.py", rule: "aws-access-token", secret: awsKey(), want: RiskHigh, reasonHas: "cloud provider key (aws)"},
		{name: "gcp", file: "src/app.py", rule: "gcp-api-key", secret: "x", want: RiskHigh, reasonHas: "(gcp)"},
		{name: "azure", file: "src/app.py", rule: "azure-ad-client-secret", secret: "x", want: RiskHigh, reasonHas: "(azure)"},
		{name: "alibaba", file: "src/app.py", rule: "alibaba-secret-key", secret: "x", want: RiskHigh, reasonHas: "(alibaba)"},
		{name: "digitalocean", file: "src/app.py", rule: "digitalocean-pat", secret: "x", want: RiskHigh, reasonHas: "(digitalocean)"},
		{name: "cloudflare", file: "src/app.py", rule: "cloudflare-api-key", secret: "x", want: RiskHigh, reasonHas: "(cloudflare)"},
		{name: "heroku", file: "src/app.py", rule: "heroku-api-key-v2", secret: "x", want: RiskHigh, reasonHas: "(heroku)"},
		{name: "yandex", file: "src/app.py", rule: "yandex-api-key", secret: "x", want: RiskHigh, reasonHas: "(yandex)"},
		{name: "flyio", file: "src/app.py", rule: "flyio-access-token", secret: "x", want: RiskHigh, reasonHas: "(flyio)"},
		{name: "terraform cloud", file: "infra/main.tf", rule: "hashicorp-tf-api-token", secret: "x", want: RiskHigh, reasonHas: "cloud infrastructure key (hashicorp-tf)"},
		{name: "pulumi", file: "Pulumi.yaml", rule: "pulumi-api-token", secret: "x", want: RiskHigh, reasonHas: "(pulumi)"},
		{name: "vault", file: "ci.yml", rule: "vault-service-token", secret: "x", want: RiskHigh, reasonHas: "(vault)"},
		{name: "openshift", file: "kube.yml", rule: "openshift-user-token", secret: "x", want: RiskHigh, reasonHas: "(openshift)"},
		{name: "scalingo", file: "deploy.sh", rule: "scalingo-api-token", secret: "x", want: RiskHigh, reasonHas: "(scalingo)"},
		{name: "a SaaS token is not cloud", file: "src/app.py", rule: "slack-bot-token", secret: "x", want: RiskMedium},
		// HIGH: live markers.
		{name: "sk_live secret", file: "pay.py", rule: "stripe-access-token", secret: stripeLive(), want: RiskHigh, reasonHas: "sk_live_"},
		{name: "rk_live secret", file: "pay.py", rule: "stripe-access-token", secret: "rk" + "_live_abc", want: RiskHigh, reasonHas: "rk_live_"},
		{name: "sk_test is not live", file: "pay.py", rule: "stripe-access-token", secret: "sk" + "_test_abc", want: RiskMedium},
		// HIGH: paths naming production.
		{name: ".env.production", file: ".env.production", rule: "generic-api-key", secret: "x", want: RiskHigh, reasonHas: "(production)"},
		{name: "config/prod dir", file: "config/prod/db.yml", rule: "generic-api-key", secret: "x", want: RiskHigh, reasonHas: "(prod)"},
		{name: "live dir", file: "deploy/live/values.yaml", rule: "generic-api-key", secret: "x", want: RiskHigh, reasonHas: "(live)"},
		{name: "prod in file name", file: "settings_prod.py", rule: "generic-api-key", secret: "x", want: RiskHigh, reasonHas: "(prod)"},
		{name: "camelCase prodConfig", file: "src/prodConfig.ts", rule: "generic-api-key", secret: "x", want: RiskHigh, reasonHas: "(prod)"},
		{name: "upper-case PRODUCTION", file: "deploy/PRODUCTION/app.env", rule: "generic-api-key", secret: "x", want: RiskHigh},
		{name: "products is not prod", file: "src/products/list.go", rule: "generic-api-key", secret: "x", want: RiskMedium},
		{name: "delivery is not live", file: "delivery.go", rule: "generic-api-key", secret: "x", want: RiskMedium},
		{name: "productivity is not prod", file: "docs/productivity.md", rule: "generic-api-key", secret: "x", want: RiskMedium},
		// LOW: local env files.
		{name: ".env.local", file: ".env.local", rule: "generic-api-key", secret: "x", want: RiskLow, reasonHas: "local development env file"},
		{name: ".env.development", file: "web/.env.development", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: ".env.test", file: ".env.test", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: ".env.development.local", file: ".env.development.local", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: ".env.staging is MEDIUM", file: ".env.staging", rule: "generic-api-key", secret: "x", want: RiskMedium, reasonHas: "environment file"},
		{name: ".env is MEDIUM", file: ".env", rule: "generic-api-key", secret: "x", want: RiskMedium, reasonHas: "environment file"},
		{name: ".env.local.backup is MEDIUM", file: ".env.local.backup", rule: "generic-api-key", secret: "x", want: RiskMedium},
		// LOW: test fixtures.
		{name: "test dir", file: "test/config.yml", rule: "generic-api-key", secret: "x", want: RiskLow, reasonHas: "test fixture path (test/)"},
		{name: "tests dir", file: "a/tests/b.py", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: "testdata dir", file: "pkg/testdata/in.json", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: "fixtures dir", file: "db/fixtures/x.yml", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: "__tests__ dir", file: "src/__tests__/api.js", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: "spec dir", file: "spec/models/user_spec.rb", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: "_test.go", file: "api/client_test.go", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: ".test.ts", file: "src/client.test.ts", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: ".spec.js", file: "src/client.spec.js", rule: "generic-api-key", secret: "x", want: RiskLow},
		{name: "testing.go is not a fixture", file: "src/testing.go", rule: "generic-api-key", secret: "x", want: RiskMedium},
		{name: "latest/ is not test/", file: "latest/config.yml", rule: "generic-api-key", secret: "x", want: RiskMedium},
		{name: ".test alone is not *.test.*", file: "src/app.test", rule: "generic-api-key", secret: "x", want: RiskMedium},
		// LOW: local values.
		{name: "URL to localhost holding the secret", file: "svc.sh", rule: "github-pat", secret: ghp,
			line: "URL=https://bob:" + ghp + "@localhost:8443/", want: RiskLow, reasonHas: "(localhost)"},
		{name: "URL to 127.0.0.1", file: "svc.sh", rule: "generic-api-key", secret: passValue,
			line: "X=http://u:" + passValue + "@127.0.0.1/", want: RiskLow, reasonHas: "(loopback address)"},
		{name: "URL to [::1]", file: "svc.sh", rule: "generic-api-key", secret: passValue,
			line: "X=http://u:" + passValue + "@[::1]:8080/", want: RiskLow, reasonHas: "(loopback address)"},
		{name: "URL to 0.0.0.0", file: "svc.sh", rule: "generic-api-key", secret: passValue,
			line: "X=http://u:" + passValue + "@0.0.0.0:8080/", want: RiskLow, reasonHas: "(unspecified address)"},
		{name: "URL to example.com", file: "docs.md", rule: "generic-api-key", secret: passValue,
			line: "see https://api.example.com/v1?token=" + passValue, want: RiskLow, reasonHas: "(*.example.com)"},
		{name: "secret in a localhost subdomain is not shown", file: "a.sh", rule: "generic-api-key", secret: passValue,
			line: "URL=http://" + passValue + ".localhost/", want: RiskLow, reasonHas: "(*.localhost)"},
		{name: "URL to .test name", file: "a.sh", rule: "generic-api-key", secret: passValue,
			line: "http://myapp.test/?key=" + passValue, want: RiskLow},
		{name: "user:pass@localhost in match", file: "a.yml", rule: "generic-api-key", secret: passValue,
			match: "dsn: admin:" + passValue + "@localhost:5432", want: RiskLow},
		{name: "URL to a real host", file: "svc.sh", rule: "github-pat", secret: ghp,
			line: "URL=https://bob:" + ghp + "@api.github.com/", want: RiskMedium},
		{name: "localhost URL not holding the secret", file: "svc.sh", rule: "github-pat", secret: ghp,
			line: "TOKEN=" + ghp + " # try http://localhost:3000", want: RiskMedium},
		{name: "example.com.evil.io is not example", file: "a.sh", rule: "generic-api-key", secret: passValue,
			line: "https://example.com.evil.io/?k=" + passValue, want: RiskMedium},
		// Precedence: HIGH beats LOW, and says so.
		{name: "private key in a fixture dir", file: "tests/keys/id_rsa", rule: "private-key", secret: pemKey(), match: pemKey(),
			want: RiskHigh, reasonHas: "HIGH despite: test fixture path (tests/)"},
		{name: "aws key in .env.local", file: ".env.local", rule: "aws-access-token", secret: awsKey(), want: RiskHigh, reasonHas: "despite: local development env file"},
		{name: "live key in a fixture", file: "testdata/pay.json", rule: "stripe-access-token", secret: stripeLive(), want: RiskHigh},
		{name: "prod path inside tests", file: "tests/prod/app.env", rule: "generic-api-key", secret: "x", want: RiskHigh, reasonHas: "despite"},
		{name: ".env.production.local", file: ".env.production.local", rule: "generic-api-key", secret: "x", want: RiskHigh},
		{name: "aws key with a localhost URL", file: "a.sh", rule: "aws-access-token", secret: awsKey(),
			line: "http://" + awsKey() + "@localhost/", want: RiskHigh},
		// MEDIUM otherwise: the rule's description is the reason.
		{name: "unclassified", file: "src/app.go", rule: "github-pat", secret: ghp, want: RiskMedium, reasonHas: "GitHub"},
	}
	descs := map[string]string{"github-pat": "GitHub Personal Access Token"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			match := tt.match
			if match == "" {
				match = tt.secret
			}
			got, reason := classify(tt.file, tt.rule, descs[tt.rule], tt.secret, match, tt.line)
			if got != tt.want {
				t.Errorf("classify(%q, %q): got %v (%s), want %v", tt.file, tt.rule, got, reason, tt.want)
			}
			if reason == "" {
				t.Errorf("classify(%q, %q): empty reason", tt.file, tt.rule)
			}
			if tt.reasonHas != "" && !strings.Contains(reason, tt.reasonHas) {
				t.Errorf("classify(%q, %q): reason %q lacks %q", tt.file, tt.rule, reason, tt.reasonHas)
			}
			if tt.secret != "" && len(tt.secret) > 4 && strings.Contains(strings.ToLower(reason), strings.ToLower(tt.secret)) {
				t.Errorf("reason %q contains the secret", reason)
			}
		})
	}
}

func TestPathTokens(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []string
	}{
		{".env.production", []string{"env", "production"}},
		{"config/prod/db.yml", []string{"config", "prod", "db", "yml"}},
		{"src/prodConfig.ts", []string{"src", "prod", "config", "ts"}},
		{"API_KEYS-live.json", []string{"api", "keys", "live", "json"}},
		{"HTTPServer.go", []string{"httpserver", "go"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := pathTokens(tt.in); !slices.Equal(got, tt.want) {
				t.Errorf("pathTokens(%q): got %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestRiskRuleIDsExist keeps the HIGH lists honest when gitleaks renames
// its rules.
func TestRiskRuleIDsExist(t *testing.T) {
	t.Parallel()
	rs, err := loadRules("")
	if err != nil {
		t.Fatal(err)
	}
	for id := range privateKeyRules {
		t.Run(id, func(t *testing.T) {
			if _, ok := rs.cfg.Rules[id]; !ok {
				t.Errorf("private key rule %q: not in the default gitleaks rules", id)
			}
		})
	}
	for _, p := range slices.Concat(cloudRulePrefixes, infraRulePrefixes) {
		t.Run(p, func(t *testing.T) {
			n := 0
			for id := range rs.cfg.Rules {
				if strings.HasPrefix(id, p) {
					n++
				}
			}
			if n == 0 {
				t.Errorf("cloud prefix %q: matches no default gitleaks rule", p)
			}
		})
	}
}
