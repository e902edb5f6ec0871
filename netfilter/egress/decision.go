package egress

import "time"

// Decision is the outcome of a policy check.
type Decision struct {
	// Allow is true when the name and port may be reached.
	Allow bool `json:"allow"`
	// Rule is the rule text that decided, e.g. "*.example.com:443" or
	// "!evil.example.com"; empty when no rule matched (default deny).
	Rule string `json:"rule,omitempty"`
	// Source says where the rule came from: "builtin", a file path with its
	// line ("~/.vibedom/trusted_domains.txt:12"), or "--allow".
	Source string `json:"source,omitempty"`
	// Reason is a short human explanation, e.g. "no rule allows this name".
	Reason string `json:"reason"`
	// Pending: not allowed yet, because the user is being asked (ask
	// mode); the DNS server answers SERVFAIL, a failure resolvers retry.
	Pending bool `json:"pending,omitempty"`
}

// Finding is one thing a RequestFilter changed, as it may be logged: never
// the value itself.
type Finding struct {
	Category string `json:"category"`
	// Prefix is at most the first 4 characters of the value.
	Prefix string `json:"prefix"`
	Length int    `json:"length"`
	// Where is "body", "url" or "header:<name>".
	Where string `json:"where"`
	// Action is "redact" (replaced by a placeholder) or "log" (let
	// through, recorded).
	Action string `json:"action,omitempty"`
	// Form is the encoding a known value was found in; Source where it
	// came from (".env:3 API_KEY").
	Form   string `json:"form,omitempty"`
	Source string `json:"source,omitempty"`
}

// Event is one line of network.jsonl; events whose Decision is "deny" (or
// that carry Findings) are also written to alerts.jsonl. The schema is
// documented in docs/logs.md.
type Event struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"` // "dns", "connect", "request", "udp", "icmp", "proxy"
	Name     string    `json:"name,omitempty"`
	Port     uint16    `json:"port,omitempty"`
	Src      string    `json:"src,omitempty"`
	Dst      string    `json:"dst,omitempty"`
	Method   string    `json:"method,omitempty"`
	URL      string    `json:"url,omitempty"` // query values redacted
	Decision string    `json:"decision"`      // "allow", "deny", "scrub", "error"
	Rule     string    `json:"rule,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Status   int       `json:"status,omitempty"`
	BytesUp  int64     `json:"bytes_up,omitempty"`
	BytesDn  int64     `json:"bytes_down,omitempty"`
	Findings []Finding `json:"findings,omitempty"`
}

// EventSink records events. Implementations are safe for concurrent use and
// never block the caller for long.
type EventSink interface {
	Record(Event)
}

// DiscardEvents is the EventSink used when none is configured.
type DiscardEvents struct{}

func (DiscardEvents) Record(Event) {}

// EventSinkFunc adapts a function to EventSink. The function must be safe
// for concurrent use and return quickly.
type EventSinkFunc func(Event)

// Record implements EventSink.
func (f EventSinkFunc) Record(e Event) { f(e) }

// IsAlert reports whether e belongs in alerts.jsonl: a denial, or an event
// whose request was changed by a filter.
func IsAlert(e Event) bool {
	return e.Decision == "deny" || e.Decision == "scrub" || len(e.Findings) > 0
}
