package dlp

import (
	"encoding/base32"
	"strings"
	"testing"
)

// TestAWSKeyBoundaries: an AWS access key id glued to '-', '_', '.',
// lower-case letters or any other byte that cannot continue it is found
// (id=100-AKIA…, x_AKIA…, creds.AKIA….json, keyAKIA…); its twins, where the
// key would be part of a longer run of upper-case letters and digits (a
// base32 blob, a longer identifier), or where AKIA is followed by fewer
// than 16 such bytes (base64 holding AKIA by chance), pass byte for byte.
func TestAWSKeyBoundaries(t *testing.T) {
	e := mustEngine(t, Config{})
	const red = "[REDACTED:CLOUD_KEY]"
	asia := j("ASIA", "Q4ZT7MX2", "PL5KRW3D")
	found := []struct{ name, in, want string }{
		{"after a dash", "id=100-" + awsKey, "id=100-" + red},
		{"after an underscore", "x_" + awsKey, "x_" + red},
		{"after lower case", "key" + awsKey + " end", "key" + red + " end"},
		{"after a dot", "creds." + awsKey + ".json", "creds." + red + ".json"},
		{"before a dash", awsKey + "-backup", red + "-backup"},
		{"before an underscore", awsKey + "_old", red + "_old"},
		{"before lower case", awsKey + "xyz", red + "xyz"},
		{"between dashes", "user-" + asia + "-2024", "user-" + red + "-2024"},
		{"in a file name", "/tmp/" + awsKey + "_creds.csv", "/tmp/" + red + "_creds.csv"},
	}
	for _, tc := range found {
		t.Run(tc.name, func(t *testing.T) {
			for _, class := range []Class{ClassExternal, ClassPublic} {
				if got, _ := scrubText(t, e, class, tc.in); got != tc.want {
					t.Errorf("%v: got %q, want %q", class, got, tc.want)
				}
			}
		})
	}

	// An upper-case base32 blob (a TOTP seed, a content id) with AKIA
	// inside it, still all base32.
	b32 := base32.StdEncoding.EncodeToString([]byte("vibedom: a base32 blob of forty bytes, ok"))
	b32 = b32[:24] + "AKIA" + b32[28:]
	benign := []struct{ name, in string }{
		{"glued to an upper-case letter", "X" + awsKey},
		{"glued to a digit", "7" + awsKey},
		{"followed by an upper-case letter", awsKey + "Q"},
		{"followed by a digit", awsKey + "7"},
		{"base32 blob holding AKIA", "seed " + b32 + "\n"},
		{"long upper-case identifier", "REGION_" + j("ASIA", "PACIFICSOUTHEASTREGION") + "_NAME"},
		{"AKIA and fewer than 16", "ID_" + j("AKIA", "B2C3D4E5F6") + "_X"},
		{"base64 holding AKIA by chance", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAKIAb3JkQ2xvdWRGaWxlS0VZ"},
		{"lower case", "x_" + strings.ToLower(awsKey)},
	}
	for _, tc := range benign {
		t.Run("benign/"+tc.name, func(t *testing.T) {
			if !strings.Contains(tc.in, "AKIA") && !strings.Contains(tc.in, "ASIA") && !strings.Contains(tc.in, "akia") {
				t.Fatalf("twin %q holds no prefix", tc.in)
			}
			for _, class := range []Class{ClassExternal, ClassPublic} {
				if got, rep := scrubText(t, e, class, tc.in); got != tc.in || len(rep.Findings()) > 0 {
					t.Errorf("%v: %q became %q (%v)", class, tc.in, got, rep.Findings())
				}
			}
		})
	}
}
