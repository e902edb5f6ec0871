// Command agentrelay is the guest's half of an outsider's relayed SSH login,
// built for the guest by TestSSHAgentRelayedLoginVM: it fetches the data an
// SSH client outside the VM must sign from $RELAY_URL/req (an allowed HTTP
// name), asks the agent in $SSH_AUTH_SOCK to sign it with its key, and posts
// the signature to $RELAY_URL/sig, or the agent's error to $RELAY_URL/err.
package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

func main() {
	if err := run(); err != nil {
		fmt.Println("agentrelay:", err)
		os.Exit(1)
	}
}

func run() error {
	base := os.Getenv("RELAY_URL")
	resp, err := http.Get(base + "/req")
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch the login to sign: %s %v", resp.Status, err)
	}
	ac, err := net.Dial("unix", os.Getenv("SSH_AUTH_SOCK"))
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer ac.Close()
	ag := agent.NewClient(ac)
	keys, err := ag.List()
	if err != nil || len(keys) == 0 {
		return fmt.Errorf("agent keys: %v %v", keys, err)
	}
	path, body := "/sig", []byte(nil)
	sig, err := ag.Sign(keys[0], data)
	if err != nil {
		path, body = "/err", []byte(err.Error())
		fmt.Println("agent refused:", err)
	} else {
		body = ssh.Marshal(sig)
		fmt.Println("agent signed")
	}
	resp, err = http.Post(base+path, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
