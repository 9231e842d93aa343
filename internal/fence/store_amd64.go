//go:build amd64 && !race

package fence

// plainStore: Store is a plain MOV, which Heavy must back.
const plainStore = true

//go:noescape
func store(p *uint32, v uint32)

//go:noescape
func store64(p *uint64, v uint64)
