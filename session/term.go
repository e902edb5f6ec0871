package session

import (
	"context"
	"os"

	"golang.org/x/term"
)

// WindowSize is a terminal size in character cells.
type WindowSize struct {
	Cols, Rows int
}

// Terminal is the user's terminal when both stdin and stdout are one.
type Terminal struct {
	In, Out *os.File
}

// NewTerminal returns the terminal behind in and out, or nil when either is
// not a terminal (a pipe, a file, CI).
func NewTerminal(in, out *os.File) *Terminal {
	if in == nil || out == nil || !term.IsTerminal(int(in.Fd())) || !term.IsTerminal(int(out.Fd())) {
		return nil
	}
	return &Terminal{In: in, Out: out}
}

// Size reports the terminal's size, 80x24 when it cannot be read.
func (t *Terminal) Size() WindowSize {
	cols, rows, err := term.GetSize(int(t.Out.Fd()))
	if err != nil || cols <= 0 || rows <= 0 {
		return WindowSize{Cols: 80, Rows: 24}
	}
	return WindowSize{Cols: cols, Rows: rows}
}

// MakeRaw puts the terminal in raw mode and returns the function that puts it
// back as it was.
func (t *Terminal) MakeRaw() (restore func(), err error) {
	old, err := term.MakeRaw(int(t.In.Fd()))
	if err != nil {
		return nil, err
	}
	return func() { _ = term.Restore(int(t.In.Fd()), old) }, nil
}

// TermName is the $TERM to give the guest's pseudo-terminal.
func TermName() string {
	if v := os.Getenv("TERM"); v != "" {
		return v
	}
	return "xterm-256color"
}

// Resizes delivers the terminal's new size each time it changes, until ctx
// ends.
func (t *Terminal) Resizes(ctx context.Context) <-chan WindowSize {
	out := make(chan WindowSize, 1)
	sig := notifyWinch()
	go func() {
		defer close(out)
		defer stopWinch(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
				select {
				case out <- t.Size():
				default: // the reader is behind; it will read the latest size next
					select {
					case <-out:
					default:
					}
					out <- t.Size()
				}
			}
		}
	}()
	return out
}
