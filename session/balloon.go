package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/vm"
)

// The memory balloon policy: while the agent works, the session host reads
// the guest's memory every balloonEvery and sets the balloon's target
// (vm.Ballooner) to what the guest uses plus a generous headroom, so an idle
// guest gives the rest back to the host. It shrinks the guest only after it
// has been calm for a while; it grows it at the first reading that finds it
// ate into its headroom, to all of its memory when little is left. A guest
// that allocates faster than that (its headroom within one reading) can
// still run out of memory: vibedom does not count on the balloon deflating
// by itself on OOM (QEMU's deflate-on-oom is off; vz documents none).
//
// It runs by default only on drivers whose hypervisor does not take freed
// memory back by itself (vm.Info.FreePageReporting false: vz). On QEMU free
// page reporting already returns every page the guest frees, without ever
// taking capacity from it; a lowered target would add only the guest's page
// cache to that, at the price of a guest that allocates faster than the
// policy reads running out of memory. Options.Balloon (or $VIBEDOM_BALLOON)
// turns it on there for tests.
//
// The readings are the guest's word. A lying guest can only move its own
// target between the floor and its configured memory: it gets less memory
// (its loss) or keeps all of it (as without the policy).

// BalloonMode says whether the session steers the memory balloon.
type BalloonMode string

// Balloon modes.
const (
	// BalloonAuto steers it where the hypervisor does not return freed
	// memory by itself.
	BalloonAuto BalloonMode = "auto"
	BalloonOn   BalloonMode = "on"
	BalloonOff  BalloonMode = "off"
)

// BalloonEnv names the variable that sets Options.Balloon.
const BalloonEnv = "VIBEDOM_BALLOON"

// parseBalloonMode reads a BalloonMode; "" is BalloonAuto.
func parseBalloonMode(s string) (BalloonMode, error) {
	switch m := BalloonMode(s); m {
	case "":
		return BalloonAuto, nil
	case BalloonAuto, BalloonOn, BalloonOff:
		return m, nil
	}
	return "", fmt.Errorf("balloon mode %q: want auto, on or off", s)
}

// balloonWanted reports whether mode asks for the policy on a driver that
// reports info.
func balloonWanted(mode BalloonMode, info vm.Info) bool {
	return mode == BalloonOn || mode == BalloonAuto && !info.FreePageReporting
}

// balloonEvery is how often the policy reads the guest's memory. A reading
// is one small SSH request, less than the control channel's keepalives.
const balloonEvery = 2 * time.Second

// balloonPolicy decides the balloon's target, in MiB of guest memory, from
// one reading at a time.
type balloonPolicy struct {
	ceiling     int // the VM's memory: the target never goes above it
	floor       int // the target never goes below it
	headroom    int // kept available above what the guest uses
	low         int // less available than this grows the guest to ceiling at once
	step        int // smaller changes are not worth making (the guest's own noise)
	shrinkAfter int // readings in a row that would shrink before it shrinks

	target int // the target last set
	calm   int // readings in a row that would shrink
}

// newBalloonPolicy is the policy for a VM of memMiB: a floor of a quarter
// of its memory, at least 512 MiB; a headroom of an eighth, at least 384
// MiB; changes of at least a sixteenth of its memory (64 MiB or more);
// growing back to all of it when less than half the headroom is available;
// shrinking after 30 s of readings that agree.
func newBalloonPolicy(memMiB int) *balloonPolicy {
	headroom := max(384, memMiB/8)
	return &balloonPolicy{
		ceiling:     memMiB,
		floor:       min(max(512, memMiB/4), memMiB),
		headroom:    headroom,
		low:         headroom / 2,
		step:        max(64, memMiB/16),
		shrinkAfter: int(30 * time.Second / balloonEvery),
		target:      memMiB,
	}
}

// useful reports whether the policy can ever lower the target.
func (p *balloonPolicy) useful() bool { return p.floor < p.ceiling }

// decide takes one reading, size (the guest's memory size as the machine
// reports it) and avail (the guest's MemAvailable), both in MiB, and
// returns the target the balloon should have. The caller records it with
// set once the machine took it.
func (p *balloonPolicy) decide(size, avail int) int {
	used := max(0, size-avail) // the kernel's own share counts as used
	want := min(max(used+p.headroom, p.floor), p.ceiling)
	switch {
	case avail < p.low:
		p.calm = 0
		return p.ceiling
	case want >= p.target+p.step:
		p.calm = 0
		return want
	case want <= p.target-p.step:
		if p.calm++; p.calm >= p.shrinkAfter {
			p.calm = 0
			return want
		}
	default:
		p.calm = 0
	}
	return p.target
}

// set records the target the machine now has.
func (p *balloonPolicy) set(mib int) { p.target = mib }

// errNoBalloonReadings ends the policy: the guest cannot tell its memory.
var errNoBalloonReadings = errors.New("the guest agent does not report its memory: the balloon stays as it is")

// balloonRun carries the policy out on one machine.
type balloonRun struct {
	policy  *balloonPolicy
	balloon vm.Ballooner
	state   func() vm.State // the machine's
	read    func(context.Context) (proto.MemInfo, error)
	log     *slog.Logger
}

// step takes one reading and sets the target when the policy changes it.
// It reads nothing from a machine that is not running (a paused guest
// answers nothing). It returns errNoBalloonReadings when the policy must
// end.
func (b *balloonRun) step(ctx context.Context) error {
	if b.state() != vm.StateRunning {
		return nil
	}
	size, err := b.balloon.MemoryTarget(ctx)
	if err != nil {
		return err
	}
	mi, err := b.read(ctx)
	if errors.Is(err, guestlink.ErrNoMemInfo) {
		return errNoBalloonReadings
	}
	if err != nil {
		return err
	}
	avail := int(min(mi.Available>>20, uint64(b.policy.ceiling)))
	t := b.policy.decide(size, avail)
	if t == b.policy.target {
		return nil
	}
	if err := b.balloon.SetMemoryTarget(ctx, t); err != nil {
		return err
	}
	b.log.Info("balloon target", "target_mib", t, "was_mib", b.policy.target, "guest_mib", size, "available_mib", avail)
	b.policy.set(t)
	return nil
}

// run takes a reading at every tick until ctx ends or the guest cannot
// tell its memory. A failed reading is logged and the next one tried.
func (b *balloonRun) run(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := b.step(sctx)
		cancel()
		switch {
		case errors.Is(err, errNoBalloonReadings):
			b.log.Info(err.Error())
			return
		case err != nil && ctx.Err() == nil:
			b.log.Debug("balloon policy: reading skipped", "err", err)
		}
	}
}

// startBalloon runs the balloon policy in the background when the session's
// machine has a balloon the host must steer (see the top of this file). It
// registers its end with the cleanups; stopBalloon ends it earlier.
func (s *sess) startBalloon() {
	bm, ok := s.machine.(vm.Ballooner)
	if !ok || !balloonWanted(s.opts.Balloon, s.plan.driver.Info()) {
		return
	}
	p := newBalloonPolicy(s.opts.MemoryMiB)
	if !p.useful() {
		return
	}
	r := &balloonRun{policy: p, balloon: bm, state: s.machine.State, read: s.client.MemInfo, log: s.log}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(balloonEvery)
		defer t.Stop()
		r.run(ctx, t.C)
	}()
	var once sync.Once
	s.stopBalloon = func() { once.Do(func() { cancel(); <-done }) }
	s.cleanup.add("stop the balloon policy", func() error { s.stopBalloon(); return nil })
	s.log.Info("balloon policy on", "floor_mib", p.floor, "headroom_mib", p.headroom, "every", balloonEvery)
}
