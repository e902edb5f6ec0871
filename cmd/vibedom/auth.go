package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/vibedom/vibedom/childenv"
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "auth",
		Usage: "API keys and subscription logins the host keeps for the agents (the guest only ever gets placeholders)",
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
				Name:      "import",
				Usage:     "take the subscription login (Claude Pro/Max, ChatGPT) the host's own CLI holds; the VM only ever gets placeholders",
				ArgsUsage: "claude|codex",
				Action: func(ctx context.Context, c *cli.Command) error {
					k, err := authLogin(c)
					if err != nil {
						return err
					}
					return importLogin(c, k)
				},
			},
			{
				Name:      "login",
				Usage:     "run the vendor CLI's own sign-in on this host (claude auth login, codex login), then import it",
				ArgsUsage: "claude|codex",
				Action: func(ctx context.Context, c *cli.Command) error {
					k, err := authLogin(c)
					if err != nil {
						return err
					}
					bin, err := exec.LookPath(k.Login[0])
					if err != nil {
						return fmt.Errorf("`%s` is not installed on this host: install it and sign in there (`%s`), then run `vibedom auth import %s`", k.Login[0], strings.Join(k.Login, " "), k.Name)
					}
					cmd := exec.CommandContext(ctx, bin, k.Login[1:]...)
					cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.Root().Writer, c.Root().ErrWriter
					cmd.Env = childenv.Environ()
					if err := cmd.Run(); err != nil {
						return fmt.Errorf("`%s` failed (%v): sign in with it yourself, then run `vibedom auth import %s`", strings.Join(k.Login, " "), err, k.Name)
					}
					return importLogin(c, k)
				},
			},
			{
				Name:  "list",
				Usage: "the API keys and subscription logins the host holds: provider, kind, expiry, a fingerprint (never a token)",
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
						Name        string     `json:"name"`
						Provider    string     `json:"provider"`
						Kind        string     `json:"kind"`
						Source      string     `json:"source"`
						Fingerprint string     `json:"fingerprint"`
						Host        string     `json:"host"`
						Plan        string     `json:"plan,omitempty"`
						Expires     *time.Time `json:"expires,omitempty"`
					}
					rows := []row{}
					for _, k := range ks {
						rows = append(rows, row{Name: k.Provider.Name, Provider: k.Provider.Name, Kind: "api key", Source: k.Source,
							Fingerprint: k.Fingerprint(), Host: k.Provider.Host})
					}
					var damaged []string
					for _, lk := range credentials.LoginKinds {
						l, err := credentials.LoadLogin(string(home), lk)
						if errors.Is(err, credentials.ErrNoLogin) {
							continue
						}
						if err != nil {
							damaged = append(damaged, err.Error())
							continue
						}
						exp := l.Expires.UTC()
						rows = append(rows, row{Name: lk.Name, Provider: lk.Provider, Kind: "subscription", Source: credentials.WhereLogin(string(home), lk),
							Fingerprint: l.Fingerprint(), Host: lk.APIHost, Plan: l.Plan, Expires: &exp})
					}
					w := c.Root().Writer
					for _, d := range damaged {
						fmt.Fprintf(c.Root().ErrWriter, "vibedom: %s\n", d)
					}
					if c.Bool("json") {
						return writeJSON(w, rows)
					}
					if len(rows) == 0 {
						fmt.Fprintf(w, "No API keys or subscription logins: set %s, or run `vibedom auth set PROVIDER` (%s) or `vibedom auth import claude|codex`.\n", envNames(), strings.Join(credentials.Names(), ", "))
						return nil
					}
					for _, r := range rows {
						switch r.Kind {
						case "subscription":
							plan := termtext.Inline(r.Plan) // the CLI's file says it
							if plan == "" {
								plan = "plan unknown"
							}
							fmt.Fprintf(w, "%-10s subscription (%s login, %s)  %s  access token expires %s, the host refreshes it  (swapped in only on requests to %s)\n",
								r.Provider, r.Name, plan, r.Fingerprint, r.Expires.Local().Format("2006-01-02 15:04"), r.Host)
						default:
							fmt.Fprintf(w, "%-10s api key  %s  %s  (swapped in only on requests to %s)\n", r.Provider, r.Fingerprint, r.Source, r.Host)
						}
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
				Usage:     "forget a stored API key (anthropic, openai) or subscription login (claude, codex)",
				ArgsUsage: "PROVIDER|claude|codex",
				Action: func(ctx context.Context, c *cli.Command) error {
					home, err := home.Default()
					if err != nil {
						return err
					}
					if c.Args().Len() == 1 {
						if k, err := credentials.LookupLogin(c.Args().First()); err == nil {
							return credentials.RemoveLogin(string(home), k)
						}
					}
					p, err := authProvider(c)
					if err != nil {
						return fmt.Errorf("%w, or a subscription login: claude, codex", err)
					}
					return credentials.Remove(string(home), p)
				},
			},
		},
	})
}

// authLogin is the subscription login a command names.
func authLogin(c *cli.Command) (credentials.LoginKind, error) {
	if c.Args().Len() != 1 {
		return credentials.LoginKind{}, errors.New("name one subscription login: claude or codex")
	}
	return credentials.LookupLogin(c.Args().First())
}

// importLogin takes the host CLI's login of kind k into vibedom's store.
func importLogin(c *cli.Command, k credentials.LoginKind) error {
	home, err := home.Default()
	if err != nil {
		return err
	}
	hd, err := os.UserHomeDir()
	if err != nil {
		return err
	}
	l, err := credentials.ImportLogin(k, hd, os.Getenv)
	if err != nil {
		return err
	}
	if err := credentials.SaveLogin(string(home), l); err != nil {
		return fmt.Errorf("store the %s login: %w", k.Name, err)
	}
	plan := termtext.Inline(l.Plan) // the CLI's file says it
	if plan == "" {
		plan = "plan unknown"
	}
	fmt.Fprintf(c.Root().Writer, "Imported the %s subscription login (%s, %s) from %s into %s.\n", k.Name, plan, l.Fingerprint(), termtext.Inline(l.Source), credentials.WhereLogin(string(home), k))
	fmt.Fprintf(c.Root().Writer, "The VM gets placeholders; the host refreshes the token itself. A refresh may sign the host's own %s out (single-use refresh tokens): sign in there again if it asks.\n", k.Login[0])
	return nil
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
