package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// errQMPClosed means the QMP connection ended (QEMU exited or closed it).
var errQMPClosed = errors.New("QMP connection closed")

// maxQMPLine bounds one QMP message. QEMU's replies to the commands this
// client sends are a few hundred bytes; anything near this size is garbage.
const maxQMPLine = 1 << 20

// qmp is a minimal QEMU Machine Protocol client. Commands carry an id and
// each waits for the reply with its id, so a reply that arrives after its
// command gave up is never mistaken for the next command's. Events go to a
// callback, called on the reader goroutine in the order QEMU sent them;
// QEMU sends a command's events before its reply.
type qmp struct {
	conn    net.Conn
	onEvent func(name string, data json.RawMessage)

	wmu sync.Mutex // one writer at a time

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan qmpMessage
	done    chan struct{} // closed when the reader stops
	readErr error         // why the reader stopped; set before done closes
}

// qmpMessage is any message QEMU sends: the greeting, a reply or an event.
type qmpMessage struct {
	QMP    json.RawMessage `json:"QMP,omitempty"`
	ID     *uint64         `json:"id,omitempty"`
	Return json.RawMessage `json:"return,omitempty"`
	Error  *qmpError       `json:"error,omitempty"`
	Event  string          `json:"event,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
}

// qmpError is the error member of a failed command's reply.
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return e.Class + ": " + e.Desc }

// dialQMP reads QEMU's greeting from conn, leaves capabilities negotiation
// mode and starts reading replies and events. It gives up when ctx ends.
// On success the client owns conn.
func dialQMP(ctx context.Context, conn net.Conn, onEvent func(string, json.RawMessage)) (*qmp, error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	r := bufio.NewReaderSize(conn, 64<<10)
	var greet qmpMessage
	if err := readQMP(r, &greet); err != nil {
		return nil, fmt.Errorf("read the QMP greeting: %w", ctxErr(ctx, err))
	}
	if greet.QMP == nil {
		return nil, errors.New("read the QMP greeting: the first message is not a greeting")
	}
	if _, err := conn.Write([]byte(`{"execute":"qmp_capabilities","id":0}` + "\n")); err != nil {
		return nil, fmt.Errorf("negotiate QMP capabilities: %w", ctxErr(ctx, err))
	}
	for {
		var m qmpMessage
		if err := readQMP(r, &m); err != nil {
			return nil, fmt.Errorf("negotiate QMP capabilities: %w", ctxErr(ctx, err))
		}
		if m.Event != "" {
			if onEvent != nil {
				onEvent(m.Event, m.Data)
			}
			continue
		}
		if m.Error != nil {
			return nil, fmt.Errorf("negotiate QMP capabilities: %w", m.Error)
		}
		break
	}
	if !stop() {
		return nil, fmt.Errorf("negotiate QMP capabilities: %w", ctx.Err())
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("negotiate QMP capabilities: %w", err)
	}
	q := &qmp{conn: conn, onEvent: onEvent, nextID: 1, pending: map[uint64]chan qmpMessage{}, done: make(chan struct{})}
	go q.read(r)
	return q, nil
}

// ctxErr prefers ctx's error to the deadline error the cancellation caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func readQMP(r *bufio.Reader, m *qmpMessage) error {
	var line []byte
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return err
		}
		line = append(line, chunk...)
		if len(line) > maxQMPLine {
			return fmt.Errorf("QMP message longer than %d bytes", maxQMPLine)
		}
		if !isPrefix {
			break
		}
	}
	if err := json.Unmarshal(line, m); err != nil {
		return fmt.Errorf("malformed QMP message: %w", err)
	}
	return nil
}

func (q *qmp) read(r *bufio.Reader) {
	var err error
	for {
		var m qmpMessage
		if err = readQMP(r, &m); err != nil {
			break
		}
		if m.Event != "" {
			if q.onEvent != nil {
				q.onEvent(m.Event, m.Data)
			}
			continue
		}
		if m.ID == nil {
			continue // QEMU answers every command that has an id with that id
		}
		q.mu.Lock()
		c := q.pending[*m.ID]
		delete(q.pending, *m.ID)
		q.mu.Unlock()
		if c != nil {
			c <- m // buffered: never blocks
		}
	}
	q.mu.Lock()
	q.readErr = err
	q.pending = nil
	q.mu.Unlock()
	close(q.done)
}

// execute runs command with args (nil for none) and returns its "return"
// value. It gives up when ctx ends; QEMU may still carry the command out.
func (q *qmp) execute(ctx context.Context, command string, args any) (json.RawMessage, error) {
	c := make(chan qmpMessage, 1)
	q.mu.Lock()
	if q.pending == nil {
		q.mu.Unlock()
		return nil, fmt.Errorf("QMP %s: %w", command, errQMPClosed)
	}
	id := q.nextID
	q.nextID++
	q.pending[id] = c
	q.mu.Unlock()
	forget := func() {
		q.mu.Lock()
		if q.pending != nil {
			delete(q.pending, id)
		}
		q.mu.Unlock()
	}
	msg, err := json.Marshal(struct {
		Execute string `json:"execute"`
		Args    any    `json:"arguments,omitempty"`
		ID      uint64 `json:"id"`
	}{command, args, id})
	if err != nil {
		forget()
		return nil, fmt.Errorf("QMP %s: %w", command, err)
	}
	q.wmu.Lock()
	_, err = q.conn.Write(append(msg, '\n'))
	q.wmu.Unlock()
	if err != nil {
		forget()
		return nil, fmt.Errorf("QMP %s: %w", command, err)
	}
	select {
	case m := <-c:
		if m.Error != nil {
			return nil, fmt.Errorf("QMP %s: %w", command, m.Error)
		}
		return m.Return, nil
	case <-q.done:
		select {
		case m := <-c: // the reply came just before the end
			if m.Error != nil {
				return nil, fmt.Errorf("QMP %s: %w", command, m.Error)
			}
			return m.Return, nil
		default:
		}
		return nil, fmt.Errorf("QMP %s: %w", command, errQMPClosed)
	case <-ctx.Done():
		forget()
		return nil, fmt.Errorf("QMP %s: %w", command, ctx.Err())
	}
}

// close ends the connection; the reader stops soon after.
func (q *qmp) close() error { return q.conn.Close() }
