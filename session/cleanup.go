package session

import (
	"errors"
	"fmt"
)

// cleanups runs teardown steps registered as resources are acquired, last in
// first out, and joins their errors.
type cleanups struct {
	steps []cleanupStep
}

type cleanupStep struct {
	what string
	fn   func() error
}

func (c *cleanups) add(what string, fn func() error) {
	c.steps = append(c.steps, cleanupStep{what, fn})
}

// run runs every step once, newest first.
func (c *cleanups) run() error {
	var errs []error
	for i := len(c.steps) - 1; i >= 0; i-- {
		if err := c.steps[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.steps[i].what, err))
		}
	}
	c.steps = nil
	return errors.Join(errs...)
}
