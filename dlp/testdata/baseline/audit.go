package baseline

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"filippo.io/age"
)

// AuditFile is the name of the encrypted audit log in a session's log
// folder.
const AuditFile = "dlp_audit.jsonl.enc"

// AuditRecord is one finding with its original value, as the encrypted
// audit log keeps it.
type AuditRecord struct {
	Time     time.Time `json:"time"`
	Dest     string    `json:"dest"`
	Method   string    `json:"method,omitempty"`
	URL      string    `json:"url,omitempty"`
	Category string    `json:"category"`
	Action   string    `json:"action"`
	Where    string    `json:"where"`
	Form     string    `json:"form,omitempty"`
	Source   string    `json:"source,omitempty"`
	// Value is the original value: the reason the file is encrypted.
	Value string `json:"value"`
}

// String never shows the value.
func (r AuditRecord) String() string {
	return fmt.Sprintf("%s %s %s in %s (%d chars)", r.Dest, r.Action, r.Category, r.Where, len(r.Value))
}

// AuditLog appends records to an encrypted audit log: each call to Record
// writes one line, the base64 of an age message (to the log's recipient)
// holding its records as JSON lines. A line is complete or absent, so a
// crash loses at most the records being written. Safe for concurrent use.
type AuditLog struct {
	mu   sync.Mutex
	f    *os.File
	rcpt age.Recipient
}

// CreateAuditLog opens (creating, mode 0600) the log at path for
// appending, encrypting to rcpt.
func CreateAuditLog(path string, rcpt age.Recipient) (*AuditLog, error) {
	if rcpt == nil {
		return nil, errors.New("audit log: no recipient key")
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the audit log: %w", err)
	}
	return &AuditLog{f: f, rcpt: rcpt}, nil
}

// Record encrypts recs as one line of the log.
func (a *AuditLog) Record(recs ...AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	var plain bytes.Buffer
	enc := json.NewEncoder(&plain)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	var sealed bytes.Buffer
	w, err := age.Encrypt(&sealed, a.rcpt)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	if _, err := w.Write(plain.Bytes()); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	clear(plain.Bytes())
	line := make([]byte, base64.StdEncoding.EncodedLen(sealed.Len())+1)
	base64.StdEncoding.Encode(line, sealed.Bytes())
	line[len(line)-1] = '\n'
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.f.Write(line); err != nil {
		return fmt.Errorf("write the audit log: %w", err)
	}
	return nil
}

// Close closes the log file.
func (a *AuditLog) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.f.Close()
}

// ReadAuditLog decrypts a log written by AuditLog with the identities and
// calls fn for each record. A damaged line (a crash mid-write) is reported
// with its number after the good lines are read.
func ReadAuditLog(r io.Reader, fn func(AuditRecord) error, ids ...age.Identity) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var bad []error
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		sealed, err := base64.StdEncoding.DecodeString(string(line))
		if err != nil {
			bad = append(bad, fmt.Errorf("line %d: not base64: %w", n, err))
			continue
		}
		pr, err := age.Decrypt(bytes.NewReader(sealed), ids...)
		if err != nil {
			var nm *age.NoIdentityMatchError
			if errors.As(err, &nm) {
				return fmt.Errorf("line %d: this log was encrypted to another key than the one given (a session's log is encrypted to the audit key of the vibedom home that ran it): %w", n, err)
			}
			bad = append(bad, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		dec := json.NewDecoder(pr)
		for {
			var rec AuditRecord
			if err := dec.Decode(&rec); err == io.EOF {
				break
			} else if err != nil {
				bad = append(bad, fmt.Errorf("line %d: %w", n, err))
				break
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		bad = append(bad, err)
	}
	return errors.Join(bad...)
}
