package guest

import (
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// Linux input event constants.
const (
	evKey        = 0x01
	keyPower     = 116
	inputEventSz = 24 // struct input_event on 64-bit kernels
)

// watchPowerButton calls onPress when any input device reports the power
// key (the hypervisor's "power button": ACPI on x86, GPIO keys on arm64
// virt), so a host's graceful stop powers the guest off cleanly.
func watchPowerButton(ctx context.Context, log *slog.Logger, onPress func()) {
	// Devices can appear a little after their modules load.
	deadline := time.Now().Add(5 * time.Second)
	watched := map[string]bool{}
	for ctx.Err() == nil {
		devs, _ := filepath.Glob("/dev/input/event*")
		for _, d := range devs {
			if watched[d] {
				continue
			}
			watched[d] = true
			f, err := os.Open(d)
			if err != nil {
				continue
			}
			go func() {
				defer f.Close()
				buf := make([]byte, inputEventSz)
				for {
					if _, err := readFull(f, buf); err != nil {
						return
					}
					typ := binary.LittleEndian.Uint16(buf[16:])
					code := binary.LittleEndian.Uint16(buf[18:])
					val := int32(binary.LittleEndian.Uint32(buf[20:]))
					if typ == evKey && code == keyPower && val == 1 {
						log.Info("power button pressed")
						onPress()
						return
					}
				}
			}()
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func readFull(f *os.File, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := f.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
