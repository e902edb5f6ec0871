package vz

import (
	"context"
	"fmt"
	"sync"

	"github.com/vibedom/vibedom/vm"
)

// hvState mirrors vz.VirtualMachineState so the mapping to vm.State is plain
// Go, tested everywhere. The darwin file asserts at compile time that each
// value equals vz's.
type hvState int

const (
	hvStopped hvState = iota
	hvRunning
	hvPaused
	hvError
	hvStarting
	hvPausing
	hvResuming
	hvStopping
	hvSaving
	hvRestoring
)

// mapState maps a hypervisor state to the vm.State callers see. ok is false
// for transitions vm.State has no word for (pausing, resuming, saving,
// restoring): the machine keeps reporting the state it is leaving.
func mapState(s hvState) (st vm.State, ok bool) {
	switch s {
	case hvStopped:
		return vm.StateStopped, true
	case hvRunning:
		return vm.StateRunning, true
	case hvPaused:
		return vm.StatePaused, true
	case hvError:
		return vm.StateError, true
	case hvStarting:
		return vm.StateStarting, true
	case hvStopping:
		return vm.StateStopping, true
	case hvPausing, hvResuming, hvSaving, hvRestoring:
		return "", false
	default:
		return "", false
	}
}

// isFinal reports whether s ends a machine's life.
func isFinal(s vm.State) bool { return s == vm.StateStopped || s == vm.StateError }

// stateFeed records a machine's states and hands them out as the
// vm.Machine contract asks: State, StateChanges and Wait. It is safe for
// concurrent use.
type stateFeed struct {
	mu      sync.Mutex
	cur     vm.State
	queue   []vm.State // not yet handed to out
	out     chan vm.State
	pumping bool          // the goroutine feeding out runs
	wake    chan struct{} // nudges the pump, capacity 1
	done    chan struct{} // closed once a final state is recorded
	err     error         // why the machine ended; nil for a clean power-off
}

func newStateFeed(initial vm.State) *stateFeed {
	return &stateFeed{
		cur:   initial,
		queue: []vm.State{initial},
		out:   make(chan vm.State, 16),
		wake:  make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
}

// set records s as the new state unless it is the current one or the
// machine has ended. A final state records cause as the reason Wait
// returns. It reports whether s was recorded.
func (f *stateFeed) set(s vm.State, cause error) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s == f.cur || isFinal(f.cur) {
		return false
	}
	f.cur = s
	f.queue = append(f.queue, s)
	if isFinal(s) {
		f.err = cause
		close(f.done)
	}
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return true
}

// current returns the last recorded state.
func (f *stateFeed) current() vm.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

// ended is closed once the machine has reached a final state.
func (f *stateFeed) ended() <-chan struct{} { return f.done }

// changes returns the channel of states. The goroutine feeding it starts on
// the first call, so a machine nobody watches holds no goroutine.
func (f *stateFeed) changes() <-chan vm.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pumping {
		f.pumping = true
		go f.pump()
	}
	return f.out
}

// pump moves queued states to out in order and closes out after the final
// one.
func (f *stateFeed) pump() {
	for {
		f.mu.Lock()
		batch := f.queue
		f.queue = nil
		f.mu.Unlock()
		for _, s := range batch {
			f.out <- s
			if isFinal(s) {
				close(f.out)
				return
			}
		}
		<-f.wake
	}
}

// wait blocks until the machine has ended or ctx ends.
func (f *stateFeed) wait(ctx context.Context) error {
	select {
	case <-f.done:
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.err
	case <-ctx.Done():
		return fmt.Errorf("wait for machine: %w", ctx.Err())
	}
}
