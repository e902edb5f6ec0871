package mitm

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/vibedom/vibedom/netfilter/egress"
)

// RefusedHeader is set on every answer the proxy gives instead of
// forwarding a request: its value is the refused "name:port" (or "-" when
// the request named no valid destination), so a program can tell a
// refusal by the host's policy from an upstream's answer.
const RefusedHeader = "X-Vibedom-Refused"

// refusalJSON is the body of a refusal when the request asked for JSON.
type refusalJSON struct {
	Error  string `json:"error"` // always "vibedom_refused"
	Host   string `json:"host,omitempty"`
	Port   uint16 `json:"port,omitempty"`
	Status int    `json:"status"`
	Reason string `json:"reason"`
	// Allow is the command the user runs to allow it, when a rule can.
	Allow string `json:"allow,omitempty"`
	Note  string `json:"note"`
}

// refusalNote is what every refusal tells the agent.
const refusalNote = "refused by the vibedom sandbox's host, by the user's policy: this is not a network fault. " +
	"Do not work around it (other hosts, addresses or proxies); ask the user."

// wantsJSON reports whether an Accept header prefers JSON to text.
func wantsJSON(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		if mt == "application/json" || strings.HasSuffix(mt, "+json") {
			return true
		}
		if mt == "text/plain" || mt == "text/*" || mt == "text/html" {
			return false
		}
	}
	return false
}

// refusal is the answer to a request the proxy refuses: its content type,
// the value of RefusedHeader and the body. name and port are the refused
// destination ("" when the request named none); session names the session
// for the `vibedom allow` hint ("" leaves it general); a policy refusal
// (allowable) offers the command.
func Refusal(accept, name string, port uint16, status int, reason, session string, allowable bool) (ctype, refused string, body []byte) {
	refused = "-"
	if name != "" {
		refused = egress.HostPort(name, port)
	}
	hint := ""
	if allowable && name != "" {
		s := session
		if s == "" {
			s = "SESSION"
		}
		rule := name
		if port != 80 && port != 443 {
			rule = egress.HostPort(name, port)
		}
		hint = fmt.Sprintf("vibedom allow %s %s", s, rule)
	}
	if wantsJSON(accept) {
		b, _ := json.Marshal(refusalJSON{Error: "vibedom_refused", Host: name, Port: port, Status: status, Reason: reason, Allow: hint, Note: refusalNote})
		return "application/json", refused, append(b, '\n')
	}
	text := "vibedom: " + reason + "\n" + "vibedom: " + refusalNote + "\n"
	if hint != "" {
		text += "vibedom: the user can allow it with: " + hint + "\n"
	}
	return "text/plain; charset=utf-8", refused, []byte(text)
}

// writeRefusal answers w with the refusal of r.
func writeRefusal(w http.ResponseWriter, r *http.Request, name string, port uint16, status int, reason, session string, allowable bool) {
	ctype, refused, body := Refusal(r.Header.Get("Accept"), name, port, status, reason, session, allowable)
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("X-Vibedom", "refused")
	w.Header().Set(RefusedHeader, refused)
	w.WriteHeader(status)
	w.Write(body)
}
