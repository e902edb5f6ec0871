package mitm

import (
	"errors"
	"io"
	"net/http"
	"strings"
)

// IsWebSocketUpgrade reports a request asking to switch to WebSocket.
func IsWebSocketUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// scrubHeaderWriter scrubs the header blocks an http.ResponseWriter sends
// before the final response (1xx, e.g. 103 Early Hints), which the
// reverse proxy copies from upstream without a ModifyResponse.
type scrubHeaderWriter struct {
	http.ResponseWriter
	scrub func(http.Header)
}

func (w *scrubHeaderWriter) WriteHeader(code int) {
	if code < 200 {
		w.scrub(w.ResponseWriter.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *scrubHeaderWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// wsConn is the upstream side of an upgraded connection whose writes (the
// guest's frames) go through a scrubber.
type wsConn struct {
	io.ReadWriteCloser                // the upstream connection (counted)
	w                  io.WriteCloser // the scrubber in front of its writes
}

func (c *wsConn) Write(p []byte) (int, error) { return c.w.Write(p) }

func (c *wsConn) Close() error {
	return errors.Join(c.w.Close(), c.ReadWriteCloser.Close())
}

func (c *wsConn) CloseWrite() error {
	return errors.Join(c.w.Close(), closeWrite(c.ReadWriteCloser))
}

// wsReadConn is an upgraded connection whose reads (upstream's frames)
// come through r.
type wsReadConn struct {
	io.ReadWriteCloser
	r io.Reader
}

func (c *wsReadConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *wsReadConn) CloseWrite() error {
	return closeWrite(c.ReadWriteCloser)
}
