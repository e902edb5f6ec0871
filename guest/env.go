package guest

import (
	"sort"
	"strings"

	"github.com/vibedom/vibedom/guest/proto"
)

// defaultPath is PATH in the guest. Busybox applets are linked where
// `busybox --list-full` puts them, spread over all four directories.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// CAPath is where the guest keeps the system trust bundle that includes the
// vibedom CA.
const CAPath = "/etc/ssl/certs/ca-certificates.crt"

// caVars are the variables through which the usual runtimes (OpenSSL and
// Go, Node, Python requests, curl, git) find extra trusted CAs.
var caVars = []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"}

// SessionEnv is the environment every command and shell in the guest gets,
// sorted: defaults (PATH, HOME=/root, LANG=C.UTF-8 …); when the guest has
// a network, the CA variables pointing at caBundle (unless it is "") and
// HTTP_PROXY, HTTPS_PROXY and NO_PROXY in both cases from bc.Network; then
// the boot data's own variables, which win.
func SessionEnv(bc *proto.BootConfig, caBundle string) []string {
	env := map[string]string{
		"PATH":    defaultPath,
		"HOME":    "/root",
		"USER":    "root",
		"LOGNAME": "root",
		"SHELL":   "/bin/sh",
		"LANG":    "C.UTF-8",
	}
	if bc.Network != nil {
		if caBundle != "" {
			for _, k := range caVars {
				env[k] = caBundle
			}
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
		if validEnvName(k) && !strings.ContainsRune(v, 0) {
			env[k] = v
		}
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// profileScript is /etc/profile.d/vibedom.sh: the same environment for
// login shells started some other way (PATH and HOME are left to the
// image). Values are single-quoted, so nothing in them is expanded.
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

// validEnvName accepts portable environment variable names: letters,
// digits and underscores, not starting with a digit.
func validEnvName(n string) bool {
	if n == "" || len(n) > 256 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
