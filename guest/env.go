package guest

import (
	"sort"
	"strings"

	"github.com/vibedom/vibedom/guest/proto"
)

// CAPath is where the guest keeps the system trust bundle that includes the
// vibedom CA.
const CAPath = "/etc/ssl/certs/ca-certificates.crt"

// SessionEnv is the environment every command and shell in the guest gets:
// sane defaults, the CA variables the usual runtimes read, the proxy for
// tools that want one, and the boot data's own variables (which win).
func SessionEnv(bc *proto.BootConfig) []string {
	env := map[string]string{
		"PATH":    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":    "/root",
		"USER":    "root",
		"LOGNAME": "root",
		"SHELL":   "/bin/sh",
		"LANG":    "C.UTF-8",
	}
	if bc.Network != nil {
		for _, k := range []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"} {
			env[k] = CAPath
		}
		if p := bc.Network.ProxyURL; p != "" {
			for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
				env[k] = p
			}
		}
		if n := bc.Network.NoProxy; n != "" {
			env["NO_PROXY"], env["no_proxy"] = n, n
		}
	}
	for k, v := range bc.Env {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// profileScript is /etc/profile.d/vibedom.sh: the same environment for
// login shells started some other way.
func profileScript(env []string) string {
	var b strings.Builder
	b.WriteString("# Written by vibedom-guest at boot.\n")
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "PATH" || k == "HOME" {
			continue
		}
		b.WriteString("export " + k + "='" + strings.ReplaceAll(v, "'", `'\''`) + "'\n")
	}
	return b.String()
}
