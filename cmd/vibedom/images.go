package main

import (
	"context"
	"fmt"
	"io"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
	"github.com/vibedom/vibedom/vm"
)

// unneededWarn is how many bytes of unneeded images make init say so.
const unneededWarn = 1 << 30

func init() {
	commands = append(commands, &cli.Command{
		Name:  "images",
		Usage: "list the image cache (~/.vibedom/images): each image's kind, size, last use and what still needs it",
		Description: `An image is needed by the current guest image and boot files (what the next
session boots) and by every session that can still use it: running, paused or
detached, crashed and recoverable, or with a patch waiting for review. What
cannot be told is kept, and the listing says why. vibedom images prune removes
the rest.`,
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the listing as JSON"}},
		Action: func(ctx context.Context, c *cli.Command) error {
			h, err := home.Default()
			if err != nil {
				return err
			}
			uses, err := sessionUses(h)
			if err != nil {
				return err
			}
			rep, err := image.ListCache(ctx, h, uses)
			if err != nil {
				return err
			}
			w := c.Root().Writer
			if c.Bool("json") {
				return writeJSON(w, rep)
			}
			printImages(w, rep)
			return nil
		},
		Commands: []*cli.Command{{
			Name:  "prune",
			Usage: "remove every cached image that neither the current images nor a session needs",
			Description: `It holds the image cache's build locks while it decides and removes, so it
waits for an image build in another process to finish. It removes only what the
cache writes (boot image folders and root images), never follows a symlink and
never removes anything outside the cache folder.`,
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "dry-run", Usage: "say what would be removed; remove nothing"},
				&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
			},
			Action: func(ctx context.Context, c *cli.Command) error {
				h, err := home.Default()
				if err != nil {
					return err
				}
				ew := c.Root().ErrWriter
				rep, err := image.PruneCache(ctx, h, image.PruneOptions{
					Sessions: func() ([]image.SessionUse, error) { return sessionUses(h) },
					DryRun:   c.Bool("dry-run"),
					Waiting: func(lock string) {
						fmt.Fprintf(ew, "vibedom: an image build holds the cache lock %s: waiting for it to finish\n", termtext.Inline(lock))
					},
				})
				if rep == nil {
					return err
				}
				w := c.Root().Writer
				if c.Bool("json") {
					if jerr := writeJSON(w, rep); jerr != nil {
						return jerr
					}
					return err
				}
				verb, total := "removed", "freed"
				if rep.DryRun {
					verb, total = "would remove", "would free"
				}
				for _, e := range rep.Removed {
					fmt.Fprintf(w, "%s %s (%s)\n", verb, termtext.Line(e.Name), humanSize(e.Size))
				}
				kept := len(rep.Entries) - len(rep.Removed)
				fmt.Fprintf(w, "%s %s; kept %d (vibedom images says why)\n", total, humanSize(rep.Freed), kept)
				return err
			},
		}},
	})
}

// sessionUses says, for every session that can still use an image, what
// it recorded. A finished session (stopped or failed, no scratch disk
// left, no patch waiting) needs none. A crashed session's recovery boots
// the current image (session/recover.go), but its recorded root image is
// kept while its work can be recovered or reviewed.
func sessionUses(h home.Home) ([]image.SessionUse, error) {
	all, err := session.ListSessions(h)
	if err != nil {
		return nil, err
	}
	var out []image.SessionUse
	for _, s := range all {
		u := image.SessionUse{Name: s.Name, Status: string(s.Live), Arch: vm.Arch(s.Arch), RootImage: s.RootImage}
		switch s.Live {
		case session.StatusDamaged:
			u.Unknown = true
		case session.StatusStarting, session.StatusRunning, session.StatusPaused, session.StatusStopping, session.StatusRecovering:
			u.Running = true
		default:
			switch {
			case s.Recoverable():
				u.Status += ", recoverable"
			case s.PatchPending():
				u.Status += ", patch waiting for review"
			default:
				continue
			}
		}
		out = append(out, u)
	}
	return out, nil
}

func printImages(w io.Writer, rep *image.CacheReport) {
	if len(rep.Entries) == 0 {
		fmt.Fprintf(w, "the image cache %s is empty\n", termtext.Line(rep.Dir))
		return
	}
	fmt.Fprintf(w, "image cache %s\n", termtext.Line(rep.Dir))
	for _, e := range rep.Entries {
		built, used := "-", "unknown"
		if !e.Built.IsZero() {
			built = e.Built.Local().Format("2006-01-02 15:04")
		}
		if !e.LastUsed.IsZero() {
			used = e.LastUsed.Local().Format("2006-01-02 15:04")
		}
		fmt.Fprintf(w, "%-5s %10s  built %s  used %s  %s\n", e.Kind, humanSize(e.Size), built, used, termtext.Line(e.Name))
		if !e.Keep {
			fmt.Fprintln(w, "      unneeded: vibedom images prune removes it")
		}
		for _, why := range e.Why {
			fmt.Fprintf(w, "      kept: %s\n", termtext.Line(why))
		}
	}
	if rep.Unneeded > 0 {
		fmt.Fprintf(w, "%s of images nothing needs: `vibedom images prune` removes them\n", humanSize(rep.Unneeded))
	} else {
		fmt.Fprintln(w, "nothing to prune")
	}
}

// warnUnneededImages prints one line to w when images nothing needs take
// more than unneededWarn bytes. It never removes anything, and says
// nothing when the cache cannot be read.
func warnUnneededImages(ctx context.Context, w io.Writer, h home.Home) {
	uses, err := sessionUses(h)
	if err != nil {
		return
	}
	rep, err := image.ListCache(ctx, h, uses)
	if err != nil || rep.Unneeded <= unneededWarn {
		return
	}
	fmt.Fprintf(w, "vibedom: %s of cached images no session or current image needs: `vibedom images prune` removes them\n", humanSize(rep.Unneeded))
}
