package guestlink

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"

	"golang.org/x/crypto/ssh/agent"
)

// TestBoundedFrames: agent messages up to the bound pass through whole; a
// longer one fails at its header.
func TestBoundedFrames(t *testing.T) {
	t.Parallel()
	frame := func(body []byte) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
		return append(b, body...)
	}
	tests := []struct {
		name    string
		in      []byte
		wantErr bool
	}{
		{"empty message", frame(nil), false},
		{"small messages", append(frame([]byte("abc")), frame(bytes.Repeat([]byte("x"), 90))...), false},
		{"at the bound", frame(make([]byte, 100)), false},
		{"past the bound", frame(make([]byte, 101)), true},
		{"huge length, no body", binary.BigEndian.AppendUint32(nil, 16<<20), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One byte at a time, the worst split for the header.
			got, err := io.ReadAll(&boundedFrames{r: io.LimitReader(&oneByte{bytes.NewReader(tt.in)}, 1<<30), max: 100})
			if tt.wantErr != errors.Is(err, errAgentMessageTooLong) {
				t.Fatalf("err %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr && !bytes.Equal(got, tt.in) {
				t.Errorf("passed %d bytes of %d", len(got), len(tt.in))
			}
		})
	}
	t.Run("a real agent session", func(t *testing.T) {
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		kr := agent.NewKeyring()
		kr.Add(agent.AddedKey{PrivateKey: priv})
		c1, c2 := net.Pipe()
		defer c1.Close()
		defer c2.Close()
		go agent.ServeAgent(kr, struct {
			io.Reader
			io.Writer
		}{&boundedFrames{r: c2, max: maxAgentMessage}, c2})
		ac := agent.NewClient(c1)
		keys, err := ac.List()
		if err != nil || len(keys) != 1 {
			t.Fatalf("List: %v %v", keys, err)
		}
		sig, err := ac.Sign(keys[0], []byte("data"))
		if err != nil || sig == nil {
			t.Errorf("Sign: %v", err)
		}
	})
}

type oneByte struct{ r io.Reader }

func (o *oneByte) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), 1)]) }
