package preflight

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"slices"
	"sync"

	"github.com/rs/zerolog"
	"github.com/spf13/viper"
	"github.com/zricethezav/gitleaks/v8/config"
	"github.com/zricethezav/gitleaks/v8/logging"
)

// engineVersion is bumped whenever a change in this package would change
// what a scan finds in the same bytes; it is part of the cache key.
const engineVersion = "vibedom-preflight-1"

// maxDecodeDepth is the depth of gitleaks' recursive decoding of base64,
// hex and percent-encoded segments; 5 is the gitleaks CLI default.
const maxDecodeDepth = 5

// ErrConfig is returned (wrapped) when the user's gitleaks.toml cannot be
// used.
var ErrConfig = errors.New("invalid gitleaks configuration")

// rules is a loaded rule set. After loading it is only read, so one value is
// shared by every worker's detector.
type rules struct {
	cfg    config.Config
	digest string // hex sha256 over everything that decides a file's findings
}

var (
	// loadMu serialises config loading: gitleaks' Translate reads package
	// globals (viper's config file, the extend depth).
	loadMu sync.Mutex
	// loaded memoises rule sets by the digest of their inputs, so repeated
	// scans in one process pay the ~40 ms of parsing and compiling once.
	loaded = map[string]*rules{}

	silenceOnce sync.Once
)

// silenceGitleaks turns gitleaks' global zerolog logger off. Its trace
// messages carry secret values, and this package logs only through the
// slog.Logger it is given.
func silenceGitleaks() {
	silenceOnce.Do(func() { logging.Logger = logging.Logger.Level(zerolog.Disabled) })
}

// loadRules returns gitleaks' default rules extended by the TOML file at
// userPath, with the semantics of `[extend] useDefault = true`: rules with a
// new id are added, rules with a default id are merged into the default rule
// (non-empty fields replace, tags/keywords/allowlists append), global
// allowlists append, and `[extend] disabledRules` removes default rules.
// A missing file (or an empty userPath) means the defaults alone.
func loadRules(userPath string) (*rules, error) {
	silenceGitleaks()
	var user []byte
	if userPath != "" {
		b, err := os.ReadFile(userPath)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("read gitleaks config %q: %w", userPath, err)
		default:
			user = b
		}
	}
	digest := configDigest(user)

	loadMu.Lock()
	defer loadMu.Unlock()
	if r, ok := loaded[digest]; ok {
		return r, nil
	}
	cfg, err := buildConfig(user)
	if err != nil {
		return nil, fmt.Errorf("load gitleaks config %q: %w: %w (fix or remove the file)", userPath, ErrConfig, err)
	}
	r := &rules{cfg: cfg, digest: digest}
	loaded[digest] = r
	return r, nil
}

// configDigest names the rule set: the engine version, the gitleaks
// version, the default rules and the user's file.
func configDigest(user []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00", engineVersion, gitleaksVersion(), maxDecodeDepth)
	fmt.Fprintf(h, "%d\x00%s\x00", len(config.DefaultConfig), config.DefaultConfig)
	fmt.Fprintf(h, "%d\x00", len(user))
	h.Write(user)
	return hex.EncodeToString(h.Sum(nil))
}

func gitleaksVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/zricethezav/gitleaks/v8" {
				if m.Replace != nil {
					return m.Replace.Path + "@" + m.Replace.Version
				}
				return m.Version
			}
		}
	}
	return "unknown"
}

// parseViper reads TOML into gitleaks' intermediate form with a private
// viper instance (never the global one).
func parseViper(b []byte) (config.ViperConfig, error) {
	v := viper.New()
	v.SetConfigType("toml")
	var vc config.ViperConfig
	if err := v.ReadConfig(bytes.NewReader(b)); err != nil {
		return vc, err
	}
	if err := v.Unmarshal(&vc); err != nil {
		return vc, err
	}
	return vc, nil
}

// translate runs gitleaks' Translate, turning its panics on bad regular
// expressions into errors.
func translate(vc config.ViperConfig) (cfg config.Config, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	return vc.Translate()
}

func buildConfig(user []byte) (config.Config, error) {
	dvc, err := parseViper([]byte(config.DefaultConfig))
	if err != nil {
		return config.Config{}, fmt.Errorf("parse default rules: %w", err)
	}
	base, err := translate(dvc)
	if err != nil {
		return config.Config{}, fmt.Errorf("compile default rules: %w", err)
	}
	if len(bytes.TrimSpace(user)) > 0 {
		if err := extendConfig(&base, dvc, user); err != nil {
			return config.Config{}, err
		}
	}
	base.Path = "" // no file is skipped as "the config file"
	for id, r := range base.Rules {
		if err := r.Validate(); err != nil {
			return config.Config{}, err
		}
		base.Rules[id] = r
	}
	return base, nil
}

// extendConfig merges the user's TOML into base (the default rules).
// gitleaks' own extension goes through package globals that make a second
// load in one process silently drop the defaults, so it is done here.
func extendConfig(base *config.Config, dvc config.ViperConfig, user []byte) error {
	uvc, err := parseViper(user)
	if err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	if uvc.Extend.Path != "" || uvc.Extend.URL != "" {
		return errors.New("[extend] path and url are not supported: the file always extends the default rules; copy the rules you need into it")
	}
	disabled := uvc.Extend.DisabledRules
	uvc.Extend = config.Extend{}

	// A rule that overrides a default rule may leave regex and path empty;
	// gitleaks validates after merging, so lend it the default's patterns.
	defaults := map[string]int{}
	for i, r := range dvc.Rules {
		defaults[r.ID] = i
	}
	for i := range uvc.Rules {
		r := &uvc.Rules[i]
		if j, ok := defaults[r.ID]; ok && r.Regex == "" && r.Path == "" {
			r.Regex, r.Path = dvc.Rules[j].Regex, dvc.Rules[j].Path
		}
	}

	// Allowlists that target rules may name default rules, which Translate
	// cannot see here: compile each alone, attach after merging.
	type targeted struct {
		ids []string
		al  *config.Allowlist
	}
	var targets []targeted
	kept := uvc.Allowlists[:0]
	for _, a := range uvc.Allowlists {
		if a == nil || len(a.TargetRules) == 0 {
			kept = append(kept, a)
			continue
		}
		ids := a.TargetRules
		a.TargetRules = nil
		one, err := translate(config.ViperConfig{Allowlists: append(uvc.Allowlists[:0:0], a)})
		if err != nil {
			return fmt.Errorf("allowlist for %v: %w", ids, err)
		}
		targets = append(targets, targeted{ids: ids, al: one.Allowlists[0]})
	}
	uvc.Allowlists = kept

	ucfg, err := translate(uvc)
	if err != nil {
		return err
	}

	for _, id := range disabled {
		if _, ok := base.Rules[id]; !ok {
			return fmt.Errorf("[extend] disabledRules names %q, which is not a default rule", id)
		}
		delete(base.Rules, id)
		base.OrderedRules = slices.DeleteFunc(base.OrderedRules, func(s string) bool { return s == id })
	}
	for _, id := range ucfg.OrderedRules {
		ur := ucfg.Rules[id]
		br, ok := base.Rules[id]
		if !ok {
			base.Rules[id] = ur
			base.OrderedRules = append(base.OrderedRules, id)
			continue
		}
		if ur.Description != "" {
			br.Description = ur.Description
		}
		if ur.Entropy != 0 {
			br.Entropy = ur.Entropy
		}
		if ur.SecretGroup != 0 {
			br.SecretGroup = ur.SecretGroup
		}
		if ur.Regex != nil {
			br.Regex = ur.Regex
		}
		if ur.Path != nil {
			br.Path = ur.Path
		}
		br.Tags = append(slices.Clip(br.Tags), ur.Tags...)
		br.Keywords = append(slices.Clip(br.Keywords), ur.Keywords...)
		br.Allowlists = append(slices.Clip(br.Allowlists), ur.Allowlists...)
		base.Rules[id] = br
	}
	for _, t := range targets {
		for _, id := range t.ids {
			r, ok := base.Rules[id]
			if !ok {
				return fmt.Errorf("[[allowlists]] targetRules names %q, which is not a rule", id)
			}
			r.Allowlists = append(slices.Clip(r.Allowlists), t.al)
			base.Rules[id] = r
		}
	}
	base.Allowlists = append(slices.Clip(base.Allowlists), ucfg.Allowlists...)

	// Keywords are the prefilter: rebuild from the final rules.
	base.Keywords = map[string]struct{}{}
	for _, r := range base.Rules {
		for _, k := range r.Keywords {
			base.Keywords[k] = struct{}{}
		}
	}
	slices.Sort(base.OrderedRules)
	return nil
}
