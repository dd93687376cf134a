// Package testhook holds the hooks through which this module's tests reach
// into a process they run as a real rank, to play an attacker where no
// outsider can reach without the group secret. The program never sets
// them; being internal, no code outside this module can.
package testhook

import "github.com/weightcast/weightcast/transport"

// Exchange, when set, wraps the exchange through which a rank's transports
// find each other, after the rendezvous checked (with a secret, verified)
// the records: the relay test of cmd/demo points rank 1's tcp transport at
// its relay this way. Set it before the rank opens, and only then.
var Exchange func(transport.Exchange) transport.Exchange
