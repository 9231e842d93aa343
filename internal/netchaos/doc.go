// Package netchaos joins two network namespaces with an impaired link: it
// loses, delays and reorders the IP packets that cross it, as the kernel's
// netem qdisc would, but in userspace.
//
// Why: goccl's chaos test (collective.TestChaosNamespaces) wants TCP
// between two "hosts" to meet real loss and reordering, and the usual tool,
// `tc qdisc add ... netem`, needs sch_netem. The kernels of our
// development machines and CI are built without it (CONFIG_NET_SCH_NETEM
// is not set, and there are no modules to load), but they have TUN
// devices. So New opens a TUN device in each namespace, gives the two
// ends addresses that route to each other through them, and forwards every
// packet one end sends to the other end with netem's impairments applied
// on the way. The packets are whole IP packets, so the TCP stacks in the
// namespaces see real loss, delay and reordering and must repair it with
// their own retransmissions and reassembly; nothing above IP is touched.
//
// Impairments follow tc-netem(8), applied to each direction on its own,
// as netem on both ends of a veth would be:
//
//   - loss PERCENT: each packet is dropped with probability Loss.
//   - delay TIME JITTER: each packet that is kept waits Delay plus a
//     uniform draw from [-Jitter, +Jitter] (netem's default distribution),
//     clipped at zero. Jitter alone reorders packets, as netem's time-sorted
//     queue does.
//   - reorder PERCENT [CORRELATION]: in tc-netem(8)'s words for
//     "reorder 25% 50%", "25% of packets are sent immediately (with
//     correlation of 50%) while the others are delayed": a packet sent
//     immediately jumps ahead of the delayed ones. As in netem, reordering
//     needs a delay, and the correlation blends each uniform draw with the
//     previous one (sch_netem.c, get_crandom), which is not a true
//     correlation: with a high correlation fewer than PERCENT of the
//     packets are reordered. netem's "gap" is not implemented (tc's
//     default gap of 1 is what New does).
//
// Randomness comes from a PCG source seeded with Impairment.Seed (one
// stream per direction), so a given sequence of packets meets the same fate
// on every run.
//
// Contract:
//
//  1. The namespaces must exist (made by `ip netns add`, or given as a
//     path such as /proc/PID/ns/net); New needs CAP_NET_ADMIN in them and
//     /dev/net/tun. It configures the devices itself (ioctls, no `ip`
//     command): IPv4 only, MTU 1500, a point-to-point address per end, IPv6
//     off on the TUN devices (so the kernel's own router solicitations and
//     MLD reports do not cross the link), loopback up.
//  2. New starts two goroutines per direction (a reader and, when there is
//     a delay, a releaser of delayed packets); Close stops them, closes the
//     TUN devices (which deletes them, their addresses and routes) and
//     returns only when they have stopped. Close is idempotent. Packets
//     still delayed when Close is called are discarded.
//  3. Stats is safe for concurrent use, during and after the link's life.
//
// The delay queue is unbounded (netem's limit defaults to 1000 packets):
// TCP's windows bound what is in flight in the tests this is for. The
// kernel queues up to 500 packets (the TUN device's txqueuelen) for the
// reader; a burst beyond that while the reader lags is dropped there, and
// the link's counters do not see it.
package netchaos
