package sshagent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// LogFile is the agent log's name in a session's log folder.
const LogFile = "ssh_agent.jsonl"

// maxLogBytes caps the agent log: a guest that asks for signatures in a loop
// fills at most this much; later events are counted and the count is the
// last line.
const maxLogBytes = 8 << 20

// Log writes Events as JSON lines to the session's agent log. It is safe for
// concurrent use.
type Log struct {
	mu      sync.Mutex
	f       *os.File
	size    int64
	limit   int64
	dropped int64
	err     error
}

var _ Recorder = (*Log)(nil)

// OpenLog opens (creating, 0600, appending) dir/LogFile.
func OpenLog(dir string) (*Log, error) {
	f, err := os.OpenFile(filepath.Join(dir, LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the SSH agent log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open the SSH agent log: %w", err)
	}
	return &Log{f: f, size: fi.Size(), limit: maxLogBytes}, nil
}

// Record writes e as one line, synchronously, unless the log is full.
func (l *Log) Record(e Event) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil || l.err != nil || l.size+int64(len(b)) > l.limit {
		l.dropped++
		return
	}
	n, err := l.f.Write(b)
	l.size += int64(n)
	if err != nil {
		l.err = err
		l.dropped++
	}
}

// Close writes how many events were not logged (when any) and closes the
// file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	if l.dropped > 0 && l.err == nil {
		fmt.Fprintf(l.f, `{"op":"dropped","decision":"deny","reason":"%d events not logged: the log reached its cap"}`+"\n", l.dropped)
	}
	err := l.f.Close()
	l.f = nil
	return err
}
