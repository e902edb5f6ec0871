package netstack

import (
	"io"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// BenchmarkStackTCP measures the userspace network alone: a second gVisor
// stack plays the guest over the frame socket pair and moves bulk data
// through the Stack to an engine that discards it (upload) or sends it
// (download). Each iteration moves 64 MiB; the figure is Gbit/s of TCP
// payload.
func BenchmarkStackTCP(b *testing.B) {
	const perOp = 64 << 20
	for _, dir := range []string{"upload", "download"} {
		for _, mtu := range []int{1500, 9000} {
			b.Run(dir+"/mtu"+strconv.Itoa(mtu), func(b *testing.B) {
				eng := newNSEngine()
				if dir == "upload" {
					eng.discard = true
				} else {
					eng.send = perOp
				}
				n := startNSNet(b, StackConfig{MTU: mtu}, testPolicyAllow(), eng)
				api, _ := n.stack.dns.pool.addr("api.example.com")
				g := n.guest(b)
				buf := make([]byte, 256<<10)
				b.SetBytes(perOp)
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					c, err := g.Dial(b.Context(), netip.AddrPortFrom(api, 443))
					if err != nil {
						b.Fatal(err)
					}
					if dir == "upload" {
						for left := perOp; left > 0; {
							w, err := c.Write(buf[:min(left, len(buf))])
							if err != nil {
								b.Fatal(err)
							}
							left -= w
						}
						c.CloseWrite()
						// The engine closes once it has read everything.
						if _, err := io.Copy(io.Discard, c); err != nil {
							b.Fatal(err)
						}
					} else {
						got, err := io.CopyBuffer(io.Discard, c, buf)
						if err != nil || got != perOp {
							b.Fatalf("download: got %d bytes, %v", got, err)
						}
					}
					c.Close()
				}
				elapsed := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(perOp)*float64(b.N)*8/elapsed.Seconds()/1e9, "Gbit/s")
			})
		}
	}
}
