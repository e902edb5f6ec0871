// Command bootbench measures the time from `vibedom run` to a ready guest
// for this checkout against another commit (by default where this branch
// left main), in one run: it builds both (vibedom and its guest agent),
// gives each a fresh home with the Debian test image, then runs
//
//	vibedom run WS --no-network --preflight=off --no-review -- true
//
// N times for each, alternating which goes first, so that load from other
// jobs falls on both alike. "To ready" is the time from starting the command
// to its "ready in" progress line. It prints every run, the medians and
// the ratio, and the median of each part of the new build's breakdown (the
// "boot timings" line of its session.log).
//
//	go run ./tools/bootbench [-base REF] [-n 5] [-memory 2G] [-arch amd64]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

func main() {
	base := flag.String("base", "", "commit to compare with (default: git merge-base HEAD main)")
	n := flag.Int("n", 5, "runs of each build")
	memory := flag.String("memory", "2G", "guest memory (vibedom run --memory)")
	arch := flag.String("arch", runtime.GOARCH, "guest architecture")
	keep := flag.Bool("keep", false, "keep the temporary folder")
	flag.Parse()
	if err := run(*base, *n, *memory, *arch, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bootbench:", err)
		os.Exit(1)
	}
}

func sh(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// build builds vibedom and its guest agent from src into dir.
func build(src, dir, arch string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "vibedom")
	if _, err := sh(src, nil, "go", "build", "-trimpath", "-o", bin, "./cmd/vibedom"); err != nil {
		return "", err
	}
	guest := filepath.Join(dir, "vibedom-guest-linux-"+arch)
	// Stripped, as the Makefile and the release build it: the guest agent
	// is most of the initramfs the guest kernel unpacks.
	if _, err := sh(src, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + arch}, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", guest, "./cmd/vibedom-guest"); err != nil {
		return "", err
	}
	return bin, nil
}

type variant struct {
	name, bin, home string
	ready           []time.Duration
	cpu             []time.Duration // CPU time of vibedom and its children (QEMU) at the ready line
	parts           map[string][]time.Duration
}

// cpuTime is the user and system time of pid and of its children, read
// from /proc (children are listed per thread).
func cpuTime(pid int) time.Duration {
	var total time.Duration
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) > 12 {
		var u, s int64
		fmt.Sscan(f[11], &u)
		fmt.Sscan(f[12], &s)
		total += time.Duration(u+s) * 10 * time.Millisecond // USER_HZ = 100
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, c := range strings.Fields(string(b)) {
			var cp int
			fmt.Sscan(c, &cp)
			total += cpuTime(cp)
		}
	}
	return total
}

var (
	readyLine = regexp.MustCompile(`vibedom: ready in`)
	timingsKV = regexp.MustCompile(`(total|prepare|vm_start|guest_answer|handshake)=([0-9.]+[a-zµ]+)`)
	guestKV   = regexp.MustCompile(`([a-z_]+) ([0-9.]+[a-zµ]+)`)
)

// once runs one session and returns the time to its ready line and the
// CPU time spent by then.
func (v *variant) once(ws, memory, arch string) (time.Duration, time.Duration, error) {
	cmd := exec.Command(v.bin, "run", ws, "--arch", arch, "--memory", memory, "--no-network", "--preflight=off", "--no-review", "--", "true")
	cmd.Env = append(os.Environ(), "VIBEDOM_HOME="+v.home, "NO_COLOR=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, 0, err
	}
	var out strings.Builder
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	var ready, cpu time.Duration
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if ready == 0 && readyLine.MatchString(sc.Text()) {
			ready = time.Since(start)
			cpu = cpuTime(cmd.Process.Pid)
		}
		out.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		return 0, 0, fmt.Errorf("%s run: %w\n%s", v.name, err, out.String())
	}
	if ready == 0 {
		return 0, 0, fmt.Errorf("%s run printed no ready line:\n%s", v.name, out.String())
	}
	v.readParts()
	return ready, cpu, nil
}

// readParts adds the last session's breakdown, when its log has one.
func (v *variant) readParts() {
	logs, _ := filepath.Glob(filepath.Join(v.home, "logs", "*", "session.log"))
	sort.Strings(logs)
	if len(logs) == 0 {
		return
	}
	data, _ := os.ReadFile(logs[len(logs)-1])
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, `msg="boot timings"`) {
			continue
		}
		for _, m := range timingsKV.FindAllStringSubmatch(line, -1) {
			if d, err := time.ParseDuration(m[2]); err == nil {
				v.parts[m[1]] = append(v.parts[m[1]], d)
			}
		}
		if i := strings.Index(line, `guest="`); i >= 0 {
			g := line[i+len(`guest="`):]
			g = g[:strings.IndexByte(g, '"')]
			for _, m := range guestKV.FindAllStringSubmatch(g, -1) {
				if d, err := time.ParseDuration(m[2]); err == nil {
					v.parts["guest "+m[1]] = append(v.parts["guest "+m[1]], d)
				}
			}
		}
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

func uptime() string {
	out, err := exec.Command("uptime").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

func run(base string, n int, memory, arch string, keep bool) error {
	repo, err := sh("", nil, "git", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	if base == "" {
		if base, err = sh(repo, nil, "git", "merge-base", "HEAD", "main"); err != nil {
			return err
		}
	}
	baseRev, err := sh(repo, nil, "git", "rev-parse", "--short", base)
	if err != nil {
		return err
	}
	head, _ := sh(repo, nil, "git", "describe", "--always", "--dirty")
	tmp, err := os.MkdirTemp("", "bootbench-")
	if err != nil {
		return err
	}
	wt := filepath.Join(tmp, "base-src")
	defer func() {
		_, _ = sh(repo, nil, "git", "worktree", "remove", "--force", wt)
		if !keep {
			os.RemoveAll(tmp)
		} else {
			fmt.Println("kept", tmp)
		}
	}()
	if _, err := sh(repo, nil, "git", "worktree", "add", "--detach", wt, baseRev); err != nil {
		return err
	}
	fmt.Printf("building %s (before) and %s (now)\n", baseRev, head)
	baseBin, err := build(wt, filepath.Join(tmp, "base"), arch)
	if err != nil {
		return err
	}
	curBin, err := build(repo, filepath.Join(tmp, "now"), arch)
	if err != nil {
		return err
	}
	assets := os.Getenv("VIBEDOM_ASSETS")
	if assets == "" {
		assets = filepath.Join(repo, ".cache", "assets")
	}
	os.Setenv("VIBEDOM_ASSETS", assets)
	ws := filepath.Join(tmp, "ws")
	os.MkdirAll(filepath.Join(ws, "src"), 0o755)
	for i := 0; i < 20; i++ {
		os.WriteFile(filepath.Join(ws, "src", fmt.Sprintf("f%02d.go", i)), []byte("package src\n"), 0o644)
	}
	if _, err := sh(ws, nil, "sh", "-c", "git init -q && git add -A && git -c user.name=b -c user.email=b@example.invalid commit -qm init"); err != nil {
		return err
	}
	vs := []*variant{
		{name: "before " + baseRev, bin: baseBin, home: filepath.Join(tmp, "home-base"), parts: map[string][]time.Duration{}},
		{name: "now " + head, bin: curBin, home: filepath.Join(tmp, "home-now"), parts: map[string][]time.Duration{}},
	}
	for _, v := range vs {
		if _, err := sh("", []string{"VIBEDOM_HOME=" + v.home}, v.bin, "init", "--no-image"); err != nil {
			return err
		}
		// The first run builds the image; it is not counted.
		if _, _, err := v.once(ws, memory, arch); err != nil {
			return err
		}
		v.parts = map[string][]time.Duration{}
		// Which kernel each build boots (the guest kernel of `make kernel`,
		// or the distribution's), so the figures say what they compare.
		cmd := exec.Command(v.bin, "run", ws, "--arch", arch, "--memory", memory,
			"--no-network", "--preflight=off", "--no-review", "--", "uname", "-r")
		cmd.Env = append(os.Environ(), "VIBEDOM_HOME="+v.home, "NO_COLOR=1")
		rel, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("%s: uname -r in the guest: %w", v.name, err)
		}
		fmt.Printf("%-22s boots kernel %s\n", v.name, lastLine(string(rel)))
	}
	fmt.Println("load before:", uptime())
	for i := 0; i < n; i++ {
		order := vs
		if i%2 == 1 {
			order = []*variant{vs[1], vs[0]}
		}
		for _, v := range order {
			d, cpu, err := v.once(ws, memory, arch)
			if err != nil {
				return err
			}
			v.ready = append(v.ready, d)
			v.cpu = append(v.cpu, cpu)
			fmt.Printf("run %d %-22s to ready %8s  CPU %8s\n", i+1, v.name, ms(d), ms(cpu))
		}
	}
	fmt.Println("load after: ", uptime())
	b, c := median(vs[0].ready), median(vs[1].ready)
	fmt.Printf("\nmedian to ready (%d runs each, %s, %s guest, TCG unless KVM works):\n", n, memory, arch)
	fmt.Printf("  %-22s %s\n  %-22s %s\n  ratio (before / now)   %.2fx\n", vs[0].name, ms(b), vs[1].name, ms(c), float64(b)/float64(c))
	bc, cc := median(vs[0].cpu), median(vs[1].cpu)
	fmt.Printf("median CPU time to ready (vibedom and QEMU; moves less with load than wall time):\n")
	fmt.Printf("  %-22s %s\n  %-22s %s\n  ratio (before / now)   %.2fx\n", vs[0].name, ms(bc), vs[1].name, ms(cc), float64(bc)/float64(cc))
	for _, v := range vs {
		if len(v.parts) == 0 {
			continue
		}
		fmt.Printf("\nmedian breakdown, %s:\n", v.name)
		keys := []string{"total", "prepare", "vm_start", "guest_answer", "handshake"}
		var guest []string
		for k := range v.parts {
			if strings.HasPrefix(k, "guest ") {
				guest = append(guest, k)
			}
		}
		order := map[string]int{"guest kernel": 0, "guest modules": 1, "guest workspace": 2, "guest scratch": 3, "guest overlay": 4, "guest network": 5, "guest root": 6, "guest setup": 7, "guest agent": 8}
		sort.Slice(guest, func(i, j int) bool { return order[guest[i]] < order[guest[j]] })
		for _, k := range append(keys, guest...) {
			if len(v.parts[k]) > 0 {
				fmt.Printf("  %-22s %s\n", k, ms(median(v.parts[k])))
			}
		}
	}
	return nil
}
