// Package mitm is the Go MITM engine, the default engine of vibedom's
// egress proxy (GoEngine), and the contract between an engine and the
// request filters it calls (Destination, RequestFilter and its optional
// capabilities), which both engines honour.
//
// The engine terminates the guest's TLS with leaf certificates from the
// vibedom CA, checks that SNI, Host and :authority name the destination the
// connection was admitted for, passes every request through the
// RequestFilter and sends it upstream, over TLS verified against the
// system roots, through the egress policy's dial guard. It serves the
// explicit proxy too, and bounds what a guest can make it hold (the memory
// budget, upstream connection slots).
//
// It does not decide the policy (netfilter/egress), admit connections
// (netfilter/netstack), scan for secrets or swap credentials (the filters
// are built in netfilter), or write the logs (it reports Events to a sink).
package mitm
