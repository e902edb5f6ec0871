package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
)

// qmp is a minimal QEMU Machine Protocol client: one command at a time,
// events delivered to a callback.
type qmp struct {
	conn    net.Conn
	mu      sync.Mutex // one command at a time
	replies chan qmpMessage
	onEvent func(name string, data json.RawMessage)
	done    chan struct{}
}

type qmpMessage struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
	QMP   json.RawMessage `json:"QMP"`
}

// dialQMP reads the greeting, negotiates capabilities and starts the reader.
func dialQMP(ctx context.Context, conn net.Conn, onEvent func(string, json.RawMessage)) (*qmp, error) {
	q := &qmp{conn: conn, replies: make(chan qmpMessage, 1), onEvent: onEvent, done: make(chan struct{})}
	r := bufio.NewReaderSize(conn, 64<<10)
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	var greet qmpMessage
	if err := readMsg(r, &greet); err != nil {
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	if greet.QMP == nil {
		return nil, errors.New("QMP greeting missing")
	}
	if _, err := conn.Write([]byte(`{"execute":"qmp_capabilities"}` + "\n")); err != nil {
		return nil, fmt.Errorf("QMP capabilities: %w", err)
	}
	for {
		var m qmpMessage
		if err := readMsg(r, &m); err != nil {
			return nil, fmt.Errorf("QMP capabilities: %w", err)
		}
		if m.Event != "" {
			continue
		}
		if m.Error != nil {
			return nil, fmt.Errorf("QMP capabilities: %s", m.Error.Desc)
		}
		break
	}
	_ = conn.SetDeadline(timeZero)
	go q.read(r)
	return q, nil
}

func readMsg(r *bufio.Reader, m *qmpMessage) error {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, m)
}

func (q *qmp) read(r *bufio.Reader) {
	defer close(q.done)
	for {
		var m qmpMessage
		if err := readMsg(r, &m); err != nil {
			return
		}
		if m.Event != "" {
			if q.onEvent != nil {
				q.onEvent(m.Event, m.Data)
			}
			continue
		}
		select {
		case q.replies <- m:
		default: // a reply nobody waits for (timed-out command)
		}
	}
}

// execute runs one QMP command and returns its "return" value.
func (q *qmp) execute(ctx context.Context, cmd string) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	// Drop a stale reply of an earlier command that timed out.
	select {
	case <-q.replies:
	default:
	}
	msg, _ := json.Marshal(map[string]string{"execute": cmd})
	if _, err := q.conn.Write(append(msg, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	select {
	case m := <-q.replies:
		if m.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", cmd, m.Error.Class, m.Error.Desc)
		}
		return m.Return, nil
	case <-q.done:
		return nil, fmt.Errorf("QMP %s: %w", cmd, errExited)
	case <-ctx.Done():
		return nil, fmt.Errorf("QMP %s: %w", cmd, ctx.Err())
	}
}

func (q *qmp) close() error { return q.conn.Close() }
