// Command loadprobe runs in a test guest and puts load through the
// session's proxy: it downloads a URL n times and uploads MB megabytes of
// text to it, then prints what it moved. Usage: loadprobe URL N MB.
package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) != 4 {
		fail(fmt.Errorf("usage: loadprobe URL N MB"))
	}
	url := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	mb, _ := strconv.Atoi(os.Args[3])
	var down int64
	for i := 0; i < n; i++ {
		resp, err := http.Get(url)
		if err != nil {
			fail(err)
		}
		k, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			fail(fmt.Errorf("download %d: status %d, %v", i, resp.StatusCode, err))
		}
		down += k
	}
	line := bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog 0123456789\n"), 1<<20/55+1)[:1<<20]
	body := bytes.Repeat(line, mb)
	resp, err := http.Post(url, "text/plain", bytes.NewReader(body))
	if err != nil {
		fail(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		fail(fmt.Errorf("upload: status %d", resp.StatusCode))
	}
	fmt.Printf("down=%d up=%d\n", down, len(body))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadprobe:", err)
	os.Exit(1)
}
