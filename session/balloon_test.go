package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/vm"
)

// balloonGuest is a fake machine and guest: the machine reports the target
// last set, as vz does, and the guest uses a fixed amount of it.
type balloonGuest struct {
	size    int // the balloon's target, MiB
	used    int // what the guest uses, MiB
	state   vm.State
	sets    []int
	readErr error
	setErr  error
	// lie, when set, is the guest's MemAvailable in bytes.
	lie uint64
}

func (g *balloonGuest) SetMemoryTarget(_ context.Context, mib int) error {
	if g.setErr != nil {
		return g.setErr
	}
	g.sets = append(g.sets, mib)
	g.size = mib
	return nil
}

func (g *balloonGuest) MemoryTarget(context.Context) (int, error) { return g.size, nil }

func (g *balloonGuest) read(context.Context) (proto.MemInfo, error) {
	if g.readErr != nil {
		return proto.MemInfo{}, g.readErr
	}
	if g.lie != 0 {
		return proto.MemInfo{Total: uint64(g.size) << 20, Available: g.lie}, nil
	}
	return proto.MemInfo{Total: uint64(g.size) << 20, Available: uint64(max(0, g.size-g.used)) << 20}, nil
}

func newBalloonTest(memMiB int) (*balloonGuest, *balloonRun) {
	g := &balloonGuest{size: memMiB, state: vm.StateRunning}
	return g, &balloonRun{policy: newBalloonPolicy(memMiB), balloon: g, state: func() vm.State { return g.state },
		read: g.read, log: slog.New(slog.DiscardHandler)}
}

// TestBalloonPolicy drives the policy of a 2 GiB guest (floor 512 MiB,
// headroom 384 MiB, growing back below 192 MiB available, shrinking after 15
// calm readings) through a day of work and checks the target after each
// phase. Changes smaller than a step (128 MiB) are not made.
func TestBalloonPolicy(t *testing.T) {
	g, r := newBalloonTest(2048)
	calm := r.policy.shrinkAfter
	phases := []struct {
		name     string
		used     int // what the guest uses in this phase
		readings int
		want     int // the target after them
	}{
		{"busy at first: no shrink before the guest is calm long enough", 300, calm - 1, 2048},
		{"idle: shrink to what it uses plus the headroom", 300, 1, 684},
		{"steady: no change", 300, 3 * calm, 684},
		{"a nibble of the headroom: not worth a change", 350, 3 * calm, 684},
		{"a build eats the headroom: back to all of it at once", 700, 1, 2048},
		{"the build settles: shrink again, after a calm while", 700, calm, 1084},
		{"a little more: grow by what it needs at once", 850, 1, 1234},
		{"a change smaller than the step is not made", 800, 2 * calm, 1234},
		{"nothing used: never below the floor", 0, calm, 512},
		{"more than it has: all of it at once", 1900, 1, 2048},
		{"near all of it: never above its memory", 1700, 1, 2048},
	}
	for _, ph := range phases {
		g.used = ph.used
		for range ph.readings {
			if err := r.step(t.Context()); err != nil {
				t.Fatalf("%s: step: %v", ph.name, err)
			}
		}
		if g.size != ph.want || r.policy.target != ph.want {
			t.Fatalf("%s: target %d MiB (policy thinks %d), want %d; targets set: %v", ph.name, g.size, r.policy.target, ph.want, g.sets)
		}
	}
	if want := []int{684, 2048, 1084, 1234, 512, 2048}; fmt.Sprint(g.sets) != fmt.Sprint(want) {
		t.Errorf("targets set %v, want %v", g.sets, want)
	}
}

// TestBalloonPolicyHostileGuest: whatever the guest claims, the target stays
// between the floor and the VM's memory.
func TestBalloonPolicyHostileGuest(t *testing.T) {
	for _, lie := range []uint64{1 << 62, 1, 3 << 20} {
		g, r := newBalloonTest(4096)
		g.lie = lie
		for range 3 * r.policy.shrinkAfter {
			if err := r.step(t.Context()); err != nil {
				t.Fatal(err)
			}
			if g.size < r.policy.floor || g.size > 4096 {
				t.Fatalf("MemAvailable %d bytes: target %d MiB, outside [%d, 4096]", lie, g.size, r.policy.floor)
			}
		}
	}
}

// TestBalloonStep: a paused machine is not read; an agent that cannot tell
// its memory ends the policy; a target the machine refused is not recorded.
func TestBalloonStep(t *testing.T) {
	t.Run("paused", func(t *testing.T) {
		g, r := newBalloonTest(2048)
		g.state, g.readErr = vm.StatePaused, errors.New("read a paused guest")
		if err := r.step(t.Context()); err != nil {
			t.Fatalf("step on a paused machine: %v", err)
		}
	})
	t.Run("older agent", func(t *testing.T) {
		g, r := newBalloonTest(2048)
		g.readErr = fmt.Errorf("ask: %w", guestlink.ErrNoMemInfo)
		if err := r.step(t.Context()); !errors.Is(err, errNoBalloonReadings) {
			t.Fatalf("step = %v, want errNoBalloonReadings", err)
		}
	})
	t.Run("refused target", func(t *testing.T) {
		g, r := newBalloonTest(2048)
		g.used = 100
		r.policy.shrinkAfter = 1
		g.setErr = errors.New("no balloon driver")
		if err := r.step(t.Context()); err == nil {
			t.Fatal("step hid the machine's refusal")
		}
		if r.policy.target != 2048 {
			t.Fatalf("policy recorded target %d the machine refused", r.policy.target)
		}
	})
}

// TestBalloonPolicyUseless: a VM no bigger than the floor has nothing to
// give back, so the policy does not run.
func TestBalloonPolicyUseless(t *testing.T) {
	for mem, want := range map[int]bool{512: false, 256: false, 513: true, 2048: true} {
		if got := newBalloonPolicy(mem).useful(); got != want {
			t.Errorf("%d MiB: useful = %v, want %v", mem, got, want)
		}
	}
}

func TestParseBalloonMode(t *testing.T) {
	for in, want := range map[string]BalloonMode{"": BalloonAuto, "auto": BalloonAuto, "on": BalloonOn, "off": BalloonOff} {
		if got, err := parseBalloonMode(in); err != nil || got != want {
			t.Errorf("parseBalloonMode(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := parseBalloonMode("yes"); err == nil {
		t.Error(`parseBalloonMode("yes") took it`)
	}
}

// TestBalloonWanted: by default the policy runs only where the hypervisor
// does not take freed memory back by itself.
func TestBalloonWanted(t *testing.T) {
	vzInfo, qemuInfo := vm.Info{}, vm.Info{FreePageReporting: true}
	for _, c := range []struct {
		mode BalloonMode
		info vm.Info
		want bool
	}{
		{BalloonAuto, vzInfo, true}, {BalloonAuto, qemuInfo, false},
		{BalloonOn, qemuInfo, true}, {BalloonOn, vzInfo, true},
		{BalloonOff, vzInfo, false}, {BalloonOff, qemuInfo, false},
	} {
		if got := balloonWanted(c.mode, c.info); got != c.want {
			t.Errorf("balloonWanted(%s, %+v) = %v, want %v", c.mode, c.info, got, c.want)
		}
	}
}
