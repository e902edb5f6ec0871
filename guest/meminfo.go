package guest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/guest/proto"
)

// readMemInfo reads the guest's memory from /proc/meminfo.
func readMemInfo() (proto.MemInfo, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return proto.MemInfo{}, err
	}
	return parseMemInfo(data)
}

// parseMemInfo takes MemTotal and MemAvailable ("Name:   123 kB" lines)
// from /proc/meminfo's text.
func parseMemInfo(data []byte) (proto.MemInfo, error) {
	var mi proto.MemInfo
	var total, avail bool
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "MemTotal" && name != "MemAvailable") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return proto.MemInfo{}, fmt.Errorf("/proc/meminfo: malformed %s line", name)
		}
		kb, err := strconv.ParseUint(f[0], 10, 44) // < 16 EiB in bytes
		if err != nil {
			return proto.MemInfo{}, fmt.Errorf("/proc/meminfo: %s: %w", name, err)
		}
		if name == "MemTotal" {
			mi.Total, total = kb<<10, true
		} else {
			mi.Available, avail = kb<<10, true
		}
	}
	if !total || !avail {
		return proto.MemInfo{}, fmt.Errorf("/proc/meminfo has no MemTotal or no MemAvailable")
	}
	return mi, nil
}
