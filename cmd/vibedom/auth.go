package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/session"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "auth",
		Usage: "API keys the host keeps for the agents (the guest only ever gets a placeholder)",
		Commands: []*cli.Command{
			{
				Name:      "set",
				Usage:     "store a provider's API key (read from stdin; not echoed on a terminal)",
				ArgsUsage: "PROVIDER",
				Action: func(ctx context.Context, c *cli.Command) error {
					p, err := authProvider(c)
					if err != nil {
						return err
					}
					home, err := home.Default()
					if err != nil {
						return err
					}
					key, err := readKey(c, p)
					if err != nil {
						return err
					}
					if err := credentials.Store(string(home), p, key); err != nil {
						return fmt.Errorf("%s key: %w", p.Name, err)
					}
					fmt.Fprintf(c.Root().Writer, "Stored the %s key in %s (only you can read it). $%s, when set, wins over it.\n", p.Name, credentials.Dir(string(home)), p.Env)
					return nil
				},
			},
			{
				Name:  "list",
				Usage: "the keys the host holds: provider, where from, a fingerprint (never the key)",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"}},
				Action: func(ctx context.Context, c *cli.Command) error {
					home, err := home.Default()
					if err != nil {
						return err
					}
					ks, err := credentials.Load(string(home), os.Getenv)
					if err != nil {
						return err
					}
					type row struct {
						Provider    string `json:"provider"`
						Source      string `json:"source"`
						Fingerprint string `json:"fingerprint"`
						Host        string `json:"host"`
					}
					rows := []row{}
					for _, k := range ks {
						rows = append(rows, row{k.Provider.Name, k.Source, k.Fingerprint(), k.Provider.Host})
					}
					w := c.Root().Writer
					if c.Bool("json") {
						return writeJSON(w, rows)
					}
					if len(rows) == 0 {
						fmt.Fprintf(w, "No API keys: set %s, or run `vibedom auth set PROVIDER` (%s).\n", envNames(), strings.Join(credentials.Names(), ", "))
						return nil
					}
					for _, r := range rows {
						fmt.Fprintf(w, "%-10s %s  %s  (swapped in only on requests to %s)\n", r.Provider, r.Fingerprint, r.Source, r.Host)
					}
					return nil
				},
			},
			{
				Name:  "ssh-key",
				Usage: "print the deploy key's public half, to add as a deploy key on your git host (made on first use; used in the VM only through run --ssh-agent)",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"}},
				Action: func(ctx context.Context, c *cli.Command) error {
					home, err := home.Default()
					if err != nil {
						return err
					}
					k, err := session.DeployKey(home)
					if err != nil {
						return err
					}
					w := c.Root().Writer
					if c.Bool("json") {
						return writeJSON(w, k)
					}
					if k.Created {
						fmt.Fprintf(c.Root().ErrWriter, "Made a deploy key in %s.\n", k.Path)
					}
					fmt.Fprintln(w, k.PublicKey)
					return nil
				},
			},
			{
				Name:      "rm",
				Usage:     "delete a stored key",
				ArgsUsage: "PROVIDER",
				Action: func(ctx context.Context, c *cli.Command) error {
					p, err := authProvider(c)
					if err != nil {
						return err
					}
					home, err := home.Default()
					if err != nil {
						return err
					}
					return credentials.Remove(string(home), p)
				},
			},
		},
	})
}

func envNames() string {
	var n []string
	for _, p := range credentials.Providers {
		n = append(n, "$"+p.Env)
	}
	return strings.Join(n, " or ")
}

func authProvider(c *cli.Command) (credentials.Provider, error) {
	if c.Args().Len() != 1 {
		return credentials.Provider{}, fmt.Errorf("name one provider: %s", strings.Join(credentials.Names(), ", "))
	}
	return credentials.Lookup(c.Args().First())
}

// readKey reads the key from stdin: without echo on a terminal.
func readKey(c *cli.Command, p credentials.Provider) (string, error) {
	if term.IsTerminal(int(os.Stdin.Fd())) {
		fmt.Fprintf(c.Root().ErrWriter, "%s API key (not shown): ", p.Name)
		b, err := term.ReadPassword(int(os.Stdin.Fd()))
		fmt.Fprintln(c.Root().ErrWriter)
		return strings.TrimSpace(string(b)), err
	}
	line, err := bufio.NewReader(io.LimitReader(os.Stdin, 8192)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	return strings.TrimSpace(line), nil
}
