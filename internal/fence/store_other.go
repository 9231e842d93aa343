//go:build !amd64 || race

package fence

import "sync/atomic"

// plainStore: Store is sequentially consistent (and, under the race
// detector, seen as synchronising), so the handshake needs no barrier.
const plainStore = false

func store(p *uint32, v uint32) { atomic.StoreUint32(p, v) }

func store64(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
