// Command liveprobe runs inside a vibedom guest for the live egress tests.
// It makes one request and prints one line; it never decides what is right.
//
//	get URL       GET through the transparent path (no proxy variables)
//	pget URL      GET through $HTTPS_PROXY / $HTTP_PROXY
//	stream URL    GET (transparent) and read the body until it ends
//	pstream URL   the same through the proxy
//	pinned CAFILE URL  GET (transparent) trusting only the CA in CAFILE
//	retry SECS URL  GET (transparent) again and again until an answer or SECS,
//	                as package managers do: a temporary DNS failure is retried,
//	                "no such host" (NXDOMAIN) is final
//
// Output: "HTTP <status> refused=<X-Vibedom-Refused> body=<quoted body>",
// "STREAM <bytes> <error>", or "ERR <error>".
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Println("ERR usage: liveprobe MODE [SECS] URL")
		os.Exit(2)
	}
	mode, url := os.Args[1], os.Args[len(os.Args)-1]
	tr := &http.Transport{Proxy: nil}
	if strings.HasPrefix(mode, "p") {
		tr.Proxy = http.ProxyFromEnvironment
	}
	client := &http.Client{Transport: tr}
	accept := os.Getenv("PROBE_ACCEPT")
	get := func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		return client.Do(req)
	}
	switch mode {
	case "get", "pget":
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		resp, err := get(ctx)
		if err != nil {
			fmt.Println("ERR", oneLine(err.Error()))
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		fmt.Printf("HTTP %d refused=%q ctype=%q body=%q\n", resp.StatusCode, resp.Header.Get("X-Vibedom-Refused"), resp.Header.Get("Content-Type"), body)
	case "pinned":
		pem, err := os.ReadFile(os.Args[2])
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		resp, err := get(ctx)
		if err != nil {
			fmt.Println("ERR", oneLine(err.Error()))
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		fmt.Printf("HTTP %d body=%q\n", resp.StatusCode, body)
	case "stream", "pstream":
		resp, err := get(context.Background())
		if err != nil {
			fmt.Println("ERR", oneLine(err.Error()))
			return
		}
		fmt.Println("STARTED", resp.StatusCode)
		n, err := io.Copy(io.Discard, resp.Body)
		fmt.Println("STREAM", n, err)
	case "retry":
		secs, _ := strconv.Atoi(os.Args[2])
		end := time.Now().Add(time.Duration(secs) * time.Second)
		tries := 0
		for {
			tries++
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			resp, err := get(ctx)
			if err == nil {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				cancel()
				fmt.Printf("HTTP %d tries=%d refused=%q body=%q\n", resp.StatusCode, tries, resp.Header.Get("X-Vibedom-Refused"), body)
				return
			}
			cancel()
			var dnsErr *net.DNSError
			if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
				fmt.Println("ERR", "tries="+strconv.Itoa(tries), "final:", oneLine(err.Error()))
				return
			}
			if time.Now().After(end) {
				fmt.Println("ERR", "tries="+strconv.Itoa(tries), oneLine(err.Error()))
				return
			}
			fmt.Println("RETRY", tries, oneLine(err.Error()))
			time.Sleep(200 * time.Millisecond)
		}
	default:
		fmt.Println("ERR unknown mode", mode)
	}
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
