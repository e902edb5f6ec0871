// Command loginprobe runs in the guest as the agent: it sends the
// placeholder refresh token of Claude Code's credentials file to Claude's
// token endpoint, as Claude Code's own refresh does, and prints the
// answer (which vibedom's proxy gives; nothing reaches the vendor).
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
)

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
	resp, err := http.Post("https://platform.claude.com/v1/oauth/token", "application/json", bytes.NewReader(body))
	if err != nil {
		fmt.Printf("{\"probe_error\":%q}\n", err.Error())
		os.Exit(1)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	var ans map[string]any
	json.Unmarshal(out, &ans)
	if ans == nil {
		ans = map[string]any{}
	}
	ans["probe_status"] = resp.StatusCode
	ans["probe_sent"] = f.OAuth.RefreshToken
	json.NewEncoder(os.Stdout).Encode(ans)
}
