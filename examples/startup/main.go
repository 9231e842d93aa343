// Command startup is the smallest goccl job: join the job the launcher
// describes, broadcast 8 bytes, leave. It is the start-up benchmark of
// docs/performance.md (launch to exit, compared with Gloo's):
//
//	go build -o /tmp/startup ./examples/startup
//	go build -o /tmp/goccl-run ./cmd/goccl-run
//	hyperfine -N '/tmp/goccl-run -np 2 /tmp/startup'
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/goccl/goccl/collective"
)

func main() {
	ctx := context.Background()
	c, err := collective.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "startup:", err)
		os.Exit(1)
	}
	buf := make([]float32, 2)
	if c.Rank() == 0 {
		buf[0], buf[1] = 1, 2
	}
	err = collective.Broadcast(ctx, c, buf, buf, 0)
	c.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "startup:", err)
		os.Exit(1)
	}
	if buf[0] != 1 || buf[1] != 2 {
		fmt.Fprintln(os.Stderr, "startup: wrong data", buf)
		os.Exit(1)
	}
}
