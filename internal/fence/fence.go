// Package fence lets a path that almost always runs alone hand state to
// the rare path that meets it without a locked instruction of its own:
// an asymmetric Dekker handshake, where the cold side pays for both.
//
// The hot side publishes with Store (a plain store on amd64: x86 keeps
// stores in order, so everything written before it is visible first) and
// then reads the cold side's flag. Without a fence between the two, that
// read may be answered before the store leaves the core's store buffer,
// and a cold side that sets its flag and then reads the hot side's word
// could miss the store while the hot side misses the flag. The cold side
// closes that window with Heavy after setting its flag: membarrier(2)
// with MEMBARRIER_CMD_PRIVATE_EXPEDITED runs a full barrier on every CPU
// that runs one of this process's threads, so either the hot side's store
// was drained before the barrier (the cold side's next read sees it) or
// the hot side's read of the flag comes after it (and sees the flag).
// This is the pairing sys_membarrier was added to Linux 4.3 for, and the
// one liburcu's membarrier flavour uses for its readers.
//
// Why bother: a locked instruction (a Go atomic store is an XCHG on
// amd64, a sync.Mutex two locked instructions a lock and unlock) waits for
// every store before it to reach the cache, and a store to a line another
// core is polling, such as a shared-memory board's entry, needs that line
// back first: a cross-core round trip that a plain store leaves to the
// store buffer. On the 2-rank 8-byte broadcast over shared memory the
// communicator's two lock pairs and the board's exchange were half of the
// operation's time (docs/performance.md, thirteenth session).
//
// Where the hot side's Store is sequentially consistent anyway (the race
// detector, which must see the handshake's stores as synchronising, and
// architectures without the plain form here), the handshake needs no
// barrier and Heavy does nothing. Where membarrier is missing or refused
// (a kernel before 4.14, a seccomp filter), Ready is false and callers
// keep their locks.
package fence

// Ready reports whether Store and Heavy pair as described: false only
// where the plain store is used and membarrier cannot back it.
func Ready() bool { return ready() }

// Store stores v at *p with release ordering: every load and store before
// it in program order is visible before it is. Read *p with atomic loads.
func Store(p *uint32, v uint32) { store(p, v) }

// Store64 is Store for a uint64.
func Store64(p *uint64, v uint64) { store64(p, v) }

// Heavy makes every Store that some thread of this process made before
// the call visible to the caller's loads after it, and every load that a
// thread makes after the call see the caller's stores before it. It is
// expensive (an interprocessor interrupt to each CPU running one of this
// process's threads): for the cold side only. Call it only when Ready. It
// returns false if the kernel refused it after all (a seccomp filter
// installed since Ready): then it made no such promise, and the caller
// must do without.
func Heavy() bool { return heavy() }

// SharedReady registers this process for SharedHeavy's barriers and
// reports whether Store and SharedHeavy pair across processes: a Store
// this process makes to memory other processes map is backed by their
// SharedHeavy (membarrier's global expedited commands, Linux 4.16). Like
// Ready, false only where the plain store is used and the kernel refuses.
func SharedReady() bool { return sharedReady() }

// SharedHeavy is Heavy across processes: it covers the threads of every
// process for which SharedReady returned true. Call it only when
// SharedReady; false as for Heavy.
func SharedHeavy() bool { return sharedHeavy() }
