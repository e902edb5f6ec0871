package netfilter

import "github.com/vibedom/vibedom/netfilter/egress"
import "github.com/vibedom/vibedom/netfilter/netstack"
import "context"

// ResolveResolver answers that the names in rs exist and asks next
// (SystemResolver when nil) about the rest.
func ResolveResolver(rs []egress.Resolve, next netstack.Resolver) netstack.Resolver {
	if next == nil {
		next = netstack.SystemResolver{}
	}
	names := map[string]bool{}
	for _, r := range rs {
		names[r.Name] = true
	}
	return resolveResolver{names: names, next: next}
}

type resolveResolver struct {
	names map[string]bool
	next  netstack.Resolver
}

func (r resolveResolver) Exists(ctx context.Context, name string) (bool, error) {
	if r.names[name] {
		return true, nil
	}
	return r.next.Exists(ctx, name)
}
