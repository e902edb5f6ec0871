// Command loginprobe runs in the guest as the agent: it sends the
// placeholder refresh token of Claude Code's credentials file to Claude's
// token endpoint, as Claude Code's own refresh does, and prints the
// answer (which vibedom's proxy gives; nothing reaches the vendor). Its
// arguments are fragments of the host's real tokens, base64 of the
// fragment reversed (so they sit in no command line as they are): it
// reports every readable file, environment and command line of the guest
// that holds one.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// find lists where the guest holds any of frags.
func find(frags []string) []string {
	var hits []string
	check := func(name string, b []byte) {
		for _, f := range frags {
			if strings.Contains(string(b), f) {
				hits = append(hits, name)
				return
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		for _, f := range []string{"environ", "cmdline"} {
			if b, err := os.ReadFile(filepath.Join(p, f)); err == nil {
				check(filepath.Join(p, f), b)
			}
		}
	}
	for _, root := range []string{"/home", "/root", "/tmp", "/run", "/etc", "/work", "/var"} {
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if fi, err := d.Info(); err != nil || fi.Size() > 64<<20 {
				return nil
			}
			if b, err := os.ReadFile(path); err == nil {
				check(path, b)
			}
			return nil
		})
	}
	return hits
}

func main() {
	home, _ := os.UserHomeDir()
	b, err := os.ReadFile(filepath.Join(home, ".claude", ".credentials.json"))
	if err != nil {
		fmt.Println(`{"probe_error":"no credentials file"}`)
		os.Exit(1)
	}
	var f struct {
		OAuth struct {
			RefreshToken string   `json:"refreshToken"`
			Scopes       []string `json:"scopes"`
		} `json:"claudeAiOauth"`
	}
	json.Unmarshal(b, &f)
	body, _ := json.Marshal(map[string]string{"grant_type": "refresh_token", "refresh_token": f.OAuth.RefreshToken,
		"client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e"})
	ans := map[string]any{}
	resp, err := http.Post("https://platform.claude.com/v1/oauth/token", "application/json", bytes.NewReader(body))
	if err != nil {
		ans["probe_error"] = err.Error()
	} else {
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		json.Unmarshal(out, &ans)
		if ans == nil {
			ans = map[string]any{}
		}
		ans["probe_status"] = resp.StatusCode
	}
	var frags []string
	for _, a := range os.Args[1:] {
		b, _ := base64.StdEncoding.DecodeString(a)
		r := []byte(string(b))
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		frags = append(frags, string(r))
	}
	ans["probe_found"] = find(frags)
	ans["probe_searched"] = len(frags)
	ans["probe_sent"] = f.OAuth.RefreshToken
	json.NewEncoder(os.Stdout).Encode(ans)
}
