// Command egressprobe runs inside a vibedom guest (as root) and tries the
// ways out of the VM the egress tests check. Each argument is one probe;
// each prints one line "PROBE RESULT detail". It never decides what is
// right: the host-side test does.
//
//	https:URL           GET through the transparent path (no proxy variables)
//	proxy:URL           GET through $HTTPS_PROXY / $HTTP_PROXY
//	resolve:NAME        DNS lookup
//	tcp:HOST:PORT       TCP connect
//	udp:HOST:PORT       a DNS query over UDP; does anything answer?
//	icmp:IP             an ICMP echo; does anything answer?
//	sni:NAME:PORT:SNI   TLS to NAME's address with another SNI
//	host:URL:HOST       plain HTTP GET of URL with another Host header
//	post:MODE:FILE:URL  send FILE's content to URL (transparent path) the way
//	                    an exfiltration would: MODE text, json, gzip (gzipped
//	                    JSON), b64 (base64 in JSON), form, query (in the URL)
//	                    or header (in X-Data)
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// main runs the probes one after the other, or with PROBE_PARALLEL=1 all
// at once (most egress probes wait for an answer that should never come),
// and prints their lines in the order given. Each probe has its own
// socket, connected to its own destination, so none reads another's
// answer; tests that count requests in order run them one by one.
func main() {
	args := os.Args[1:]
	lines := make([]string, len(args))
	run := func(i int, a string) {
		kind, arg, _ := strings.Cut(a, ":")
		res, detail := probe(kind, arg)
		lines[i] = fmt.Sprintf("%s %s %s", a, res, strings.ReplaceAll(detail, "\n", " "))
	}
	var wg sync.WaitGroup
	for i, a := range args {
		if os.Getenv("PROBE_PARALLEL") != "1" {
			run(i, a)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(i, a)
		}()
	}
	wg.Wait()
	for _, l := range lines {
		fmt.Println(l)
	}
}

func probe(kind, arg string) (string, string) {
	// A way out that is open must answer however loaded the host is (a
	// guest under TCG beside other jobs can take seconds for one TLS
	// handshake through mitmdump); only probes that expect silence (DNS
	// to an outside server, UDP, ICMP) need a short wait to conclude.
	wait := 8 * time.Second
	switch kind {
	case "https", "proxy", "host", "post":
		wait = 90 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	switch kind {
	case "https", "proxy":
		tr := &http.Transport{Proxy: nil}
		if kind == "proxy" {
			tr.Proxy = http.ProxyFromEnvironment
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", arg, nil)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return "ERR", err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		issuer := ""
		if resp.TLS != nil && len(resp.TLS.VerifiedChains) > 0 {
			ch := resp.TLS.VerifiedChains[0]
			issuer = ch[len(ch)-1].Subject.CommonName
		}
		return "HTTP", fmt.Sprintf("%d root=%q body=%q", resp.StatusCode, issuer, body)
	case "resolve":
		addrs, err := net.DefaultResolver.LookupHost(ctx, arg)
		if err != nil {
			return "ERR", err.Error()
		}
		return "ADDRS", strings.Join(addrs, ",")
	case "tcp":
		c, err := (&net.Dialer{Timeout: 4 * time.Second}).DialContext(ctx, "tcp", arg)
		if err != nil {
			return "ERR", err.Error()
		}
		defer c.Close()
		// A connect the stack accepted but the far end never answers is
		// not a way out: send something and see whether anything returns.
		c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
		b := make([]byte, 64)
		n, err := c.Read(b)
		if n > 0 {
			return "DATA", fmt.Sprintf("%q", b[:n])
		}
		return "CONNECTED", fmt.Sprint(err)
	case "udp":
		c, err := net.Dial("udp", arg)
		if err != nil {
			return "ERR", err.Error()
		}
		defer c.Close()
		// A DNS query for example.com, type A.
		q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1}
		return sendAwait(c, q)
	case "icmp":
		c, err := net.Dial("ip4:icmp", arg)
		if err != nil {
			return "ERR", err.Error()
		}
		defer c.Close()
		msg := []byte{8, 0, 0, 0, 0x42, 0x42, 0, 1, 'v', 'd'}
		sum := uint32(0)
		for i := 0; i+1 < len(msg); i += 2 {
			sum += uint32(msg[i])<<8 | uint32(msg[i+1])
		}
		sum = (sum >> 16) + (sum & 0xffff)
		sum += sum >> 16
		cs := ^uint16(sum)
		msg[2], msg[3] = byte(cs>>8), byte(cs)
		return sendAwait(c, msg)
	case "sni":
		parts := strings.Split(arg, ":")
		if len(parts) != 3 {
			return "ERR", "want sni:NAME:PORT:SNI"
		}
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 4 * time.Second}, Config: &tls.Config{ServerName: parts[2], InsecureSkipVerify: true}}
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(parts[0], parts[1]))
		if err != nil {
			return "ERR", err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", parts[2])
		b, _ := io.ReadAll(io.LimitReader(c, 256))
		return "TLS", fmt.Sprintf("%q", b)
	case "host":
		i := strings.LastIndex(arg, ":")
		u, host := arg[:i], arg[i+1:]
		if _, err := url.Parse(u); err != nil {
			return "ERR", err.Error()
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
		req.Host = host
		resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Do(req)
		if err != nil {
			return "ERR", err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return "HTTP", fmt.Sprintf("%d body=%q", resp.StatusCode, body)
	case "post":
		parts := strings.SplitN(arg, ":", 3)
		if len(parts) != 3 {
			return "ERR", "want post:MODE:FILE:URL"
		}
		return post(ctx, parts[0], parts[1], parts[2])
	}
	return "ERR", "unknown probe " + kind
}

// post sends the content of file to u in the given mode.
func post(ctx context.Context, mode, file, u string) (string, string) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "ERR", err.Error()
	}
	method, ct, enc := "POST", "", ""
	var body []byte
	switch mode {
	case "text":
		body, ct = data, "text/plain"
	case "json", "gzip":
		body, _ = json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": string(data)}}})
		ct = "application/json"
		if mode == "gzip" {
			var b bytes.Buffer
			w := gzip.NewWriter(&b)
			w.Write(body)
			w.Close()
			body, enc = b.Bytes(), "gzip"
		}
	case "b64":
		body, _ = json.Marshal(map[string]string{"blob": base64.StdEncoding.EncodeToString(data)})
		ct = "application/json"
	case "form":
		body, ct = []byte("note="+url.QueryEscape(string(data))), "application/x-www-form-urlencoded"
	case "query":
		method, u = "GET", u+"?d="+url.QueryEscape(string(data))
	case "header":
		method = "GET"
	default:
		return "ERR", "unknown mode " + mode
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return "ERR", err.Error()
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if enc != "" {
		req.Header.Set("Content-Encoding", enc)
	}
	if mode == "header" {
		req.Header.Set("X-Data", strings.ReplaceAll(string(data), "\n", " "))
	}
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Do(req)
	if err != nil {
		return "ERR", err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	return "HTTP", fmt.Sprintf("%d body=%q", resp.StatusCode, b)
}

// sendAwait sends msg on c and reports whether anything answers within
// three seconds.
func sendAwait(c net.Conn, msg []byte) (string, string) {
	if _, err := c.Write(msg); err != nil {
		return "ERR", err.Error()
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 512)
	n, err := c.Read(b)
	if n > 0 {
		return "REPLY", fmt.Sprintf("%d bytes", n)
	}
	return "NOTHING", fmt.Sprint(err)
}
