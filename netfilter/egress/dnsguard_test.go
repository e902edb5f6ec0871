package egress

import (
	"strings"
	"testing"
)

func TestSuspiciousLabels(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		part string
		want bool
	}{
		{"www", false},
		{"api.eu-west-1", false},
		{"d1a2b3c4e5f6", false},
		{"mail-server-backup", false},
		{"mail-server-backup-primary", false},
		{"staging-eu-west-1.internal-api", false},
		{"objects.githubusercontent", false},
		{strings.Repeat("a", 40), true},
		{"k7q2x9zmv4pl8rt5ny3hc6bw", true},
		{"aGVsbG8gd29ybGQhIQ.c2VjcmV0", true},
	} {
		if got := SuspiciousLabels(tt.part); got != tt.want {
			t.Errorf("suspiciousLabels(%q) = %v, want %v (entropy %.2f)", tt.part, got, tt.want, shannon(strings.ReplaceAll(tt.part, ".", "")))
		}
	}
	if got := WildcardPart("*.example.test:443", "a.b.example.test"); got != "a.b" {
		t.Errorf("wildcardPart: %q", got)
	}
}
