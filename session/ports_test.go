package session

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
)

func TestParsePortSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PortSpec
		err  error // nil: ok unless bad
		bad  bool
	}{
		{in: "3000", want: PortSpec{"127.0.0.1", 3000, 3000}},
		{in: "8080:3000", want: PortSpec{"127.0.0.1", 8080, 3000}},
		{in: "0.0.0.0:8080:3000", want: PortSpec{"0.0.0.0", 8080, 3000}},
		{in: "[::1]:8080:3000", want: PortSpec{"::1", 8080, 3000}},
		{in: "[::]:3000", want: PortSpec{"::", 3000, 3000}},
		{in: "80", err: ErrPortPrivileged},
		{in: "1023:3000", err: ErrPortPrivileged},
		{in: "8080:80", want: PortSpec{"127.0.0.1", 8080, 80}},
		{in: "0", bad: true},
		{in: "70000", bad: true},
		{in: "x", bad: true},
		{in: "a:b:c:d", bad: true},
		{in: "example.com:8080:3000", bad: true},
		{in: "[::1]3000", bad: true},
		{in: "[]:3000:3000", bad: true},
		{in: "", bad: true},
	} {
		got, err := ParsePortSpec(tc.in)
		switch {
		case tc.err != nil:
			if !errors.Is(err, tc.err) {
				t.Errorf("%q: %v, want %v", tc.in, err, tc.err)
			}
		case tc.bad:
			if err == nil {
				t.Errorf("%q: accepted as %+v", tc.in, got)
			}
		case err != nil || got != tc.want:
			t.Errorf("%q: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
	}
	for in, exposed := range map[string]bool{"3000": false, "127.0.0.2:3000:3000": false, "[::1]:3000:3000": false, "0.0.0.0:3000:3000": true, "192.168.1.5:3000:3000": true} {
		if p, _ := ParsePortSpec(in); p.Exposed() != exposed {
			t.Errorf("%q exposed = %v", in, p.Exposed())
		}
	}
}

// TestCheckPorts: the detached host's options file is checked as the flags
// were: a privileged or out-of-range port, or a name for an address, is refused.
func TestCheckPorts(t *testing.T) {
	if err := checkPorts([]PortSpec{{"127.0.0.1", 3000, 3000}, {"::1", 8080, 80}, {"0.0.0.0", 9000, 9000}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []PortSpec{{"127.0.0.1", 80, 80}, {"127.0.0.1", 3000, 0}, {"127.0.0.1", 70000, 3000}, {"example.com", 3000, 3000}, {"", 3000, 3000}} {
		if err := checkPorts([]PortSpec{p}); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

// TestPortRmForms: rm finds a port by its host port, by the spec add took,
// and by the host address list prints, IPv6 included.
func TestPortRmForms(t *testing.T) {
	free := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	for _, form := range []func(p PortSpec) string{
		func(p PortSpec) string { return strconv.Itoa(p.HostPort) },
		func(p PortSpec) string { return fmt.Sprintf("%d:%d", p.HostPort, p.GuestPort) },
		func(p PortSpec) string { return p.Host() },
		func(p PortSpec) string { return p.String() },
	} {
		tb := newPortTable()
		p := PortSpec{HostAddr: "127.0.0.1", HostPort: free(), GuestPort: 3000}
		if err := tb.add(p); err != nil {
			t.Fatal(err)
		}
		spec := form(p)
		if got, err := tb.rm(spec); err != nil || got != p {
			t.Errorf("rm %q: %+v, %v; want %+v removed", spec, got, err, p)
		}
		if len(tb.list()) != 0 {
			t.Errorf("rm %q left %+v", spec, tb.list())
		}
		tb.closeAll()
	}
	tb := newPortTable()
	defer tb.closeAll()
	p := PortSpec{HostAddr: "127.0.0.1", HostPort: free(), GuestPort: 3000}
	if err := tb.add(p); err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{"1", "127.0.0.2:" + strconv.Itoa(p.HostPort), "[::1]:" + strconv.Itoa(p.HostPort)} {
		if _, err := tb.rm(other); err == nil {
			t.Errorf("rm %q removed %+v", other, p)
		}
	}
}
