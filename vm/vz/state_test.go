package vz

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

func TestMapState(t *testing.T) {
	tests := []struct {
		in     hvState
		want   vm.State
		wantOK bool
	}{
		{hvStopped, vm.StateStopped, true},
		{hvRunning, vm.StateRunning, true},
		{hvPaused, vm.StatePaused, true},
		{hvError, vm.StateError, true},
		{hvStarting, vm.StateStarting, true},
		{hvStopping, vm.StateStopping, true},
		{hvPausing, "", false},
		{hvResuming, "", false},
		{hvSaving, "", false},
		{hvRestoring, "", false},
		{hvState(99), "", false},
		{hvState(-1), "", false},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(int(tt.in)), func(t *testing.T) {
			got, ok := mapState(tt.in)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("mapState(%d): got %q, %v, want %q, %v", tt.in, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// collect reads every state until the channel closes.
func collect(t *testing.T, ch <-chan vm.State) []vm.State {
	t.Helper()
	var got []vm.State
	for {
		select {
		case s, ok := <-ch:
			if !ok {
				return got
			}
			got = append(got, s)
		case <-t.Context().Done():
			t.Fatalf("state channel never closed; got %v so far", got)
		}
	}
}

func TestStateFeed(t *testing.T) {
	errKilled := errors.New("killed")
	tests := []struct {
		name      string
		sets      []vm.State
		cause     error // given with every final state
		subscribe int   // subscribe to changes after this many sets
		want      []vm.State
		wantErr   error
	}{
		{
			name: "clean life",
			sets: []vm.State{vm.StateRunning, vm.StatePaused, vm.StateRunning, vm.StateStopping, vm.StateStopped},
			want: []vm.State{vm.StateStarting, vm.StateRunning, vm.StatePaused, vm.StateRunning, vm.StateStopping, vm.StateStopped},
		},
		{
			name:    "duplicates dropped, nothing after the end",
			sets:    []vm.State{vm.StateRunning, vm.StateRunning, vm.StateStopped, vm.StateRunning, vm.StateError},
			cause:   errKilled,
			want:    []vm.State{vm.StateStarting, vm.StateRunning, vm.StateStopped},
			wantErr: errKilled,
		},
		{
			name:      "late subscriber misses nothing",
			sets:      []vm.State{vm.StateRunning, vm.StateError},
			cause:     errKilled,
			subscribe: 2,
			want:      []vm.State{vm.StateStarting, vm.StateRunning, vm.StateError},
			wantErr:   errKilled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newStateFeed(vm.StateStarting)
			var ch <-chan vm.State
			for i, s := range tt.sets {
				if i == tt.subscribe {
					ch = f.changes()
				}
				var cause error
				if isFinal(s) {
					cause = tt.cause
				}
				f.set(s, cause)
			}
			if ch == nil {
				ch = f.changes()
			}
			if got := collect(t, ch); !slices.Equal(got, tt.want) {
				t.Errorf("states: got %v, want %v", got, tt.want)
			}
			if got := f.current(); got != tt.want[len(tt.want)-1] {
				t.Errorf("current: got %q, want %q", got, tt.want[len(tt.want)-1])
			}
			if err := f.wait(t.Context()); !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("wait: got %v, want %v", err, tt.wantErr)
			}
			if again := f.changes(); again != ch {
				t.Errorf("changes: a second call returned another channel")
			}
		})
	}
}

// TestStateFeedSlowReader sends more states than the channel buffers before
// anyone reads: the reader still gets each one, in order, and the final one.
func TestStateFeedSlowReader(t *testing.T) {
	f := newStateFeed(vm.StateStarting)
	ch := f.changes()
	want := []vm.State{vm.StateStarting}
	for range 100 {
		f.set(vm.StateRunning, nil)
		f.set(vm.StatePaused, nil)
		want = append(want, vm.StateRunning, vm.StatePaused)
	}
	f.set(vm.StateStopped, nil)
	want = append(want, vm.StateStopped)
	if got := collect(t, ch); !slices.Equal(got, want) {
		t.Errorf("states: got %d states ending %v, want %d ending %v", len(got), got[len(got)-1], len(want), want[len(want)-1])
	}
}

// TestStateFeedConcurrent exercises set and changes from many goroutines
// under the race detector.
func TestStateFeedConcurrent(t *testing.T) {
	f := newStateFeed(vm.StateStarting)
	ch := f.changes()
	done := make(chan struct{})
	for i := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 50 {
				if i%2 == 0 {
					f.set(vm.StateRunning, nil)
				} else {
					f.set(vm.StatePaused, nil)
				}
				_ = f.current()
			}
		}()
	}
	for range 8 {
		<-done
	}
	f.set(vm.StateStopped, nil)
	got := collect(t, ch)
	if got[len(got)-1] != vm.StateStopped {
		t.Errorf("last state: got %q, want %q", got[len(got)-1], vm.StateStopped)
	}
	for i := 1; i < len(got); i++ {
		if got[i] == got[i-1] {
			t.Errorf("state %d repeats %q", i, got[i])
		}
	}
}

func TestStateFeedWaitContext(t *testing.T) {
	f := newStateFeed(vm.StateRunning)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := f.wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("wait: got %v, want context.Canceled", err)
	}
	select {
	case <-f.ended():
		t.Errorf("ended: closed for a running machine")
	default:
	}
}
