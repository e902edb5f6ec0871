package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// vibedomHome is ~/.vibedom, or $VIBEDOM_HOME when set. It is not created.
func vibedomHome() (string, error) {
	if h := os.Getenv("VIBEDOM_HOME"); h != "" {
		return filepath.Abs(h)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find home directory (set VIBEDOM_HOME): %w", err)
	}
	return filepath.Join(home, ".vibedom"), nil
}
