package collective

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/engine"
	"github.com/goccl/goccl/transport/tcp"
)

// LevelTrace is below slog's Debug: one line per operation.
const LevelTrace = slog.LevelDebug - 4

// Logging subsystems, for GOCCL_DEBUG_SUBSYS (as NCCL_DEBUG_SUBSYS).
const (
	SubsysInit = "INIT" // communicator creation: peers, transports, plans
	SubsysColl = "COLL" // each operation (at TRACE)
	SubsysNet  = "NET"  // transports
)

// parseLevel reads GOCCL_DEBUG: WARN (the default), INFO, DEBUG, TRACE,
// or NONE.
func parseLevel(v string) (slog.Level, bool, error) {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "", "WARN":
		return slog.LevelWarn, true, nil
	case "INFO":
		return slog.LevelInfo, true, nil
	case "DEBUG":
		return slog.LevelDebug, true, nil
	case "TRACE":
		return LevelTrace, true, nil
	case "NONE", "OFF":
		return slog.LevelError + 4, false, nil
	}
	return 0, false, fmt.Errorf("want WARN, INFO, DEBUG, TRACE or NONE")
}

// parseSubsys reads GOCCL_DEBUG_SUBSYS: a comma-separated list of INIT,
// COLL, NET or ALL; a leading ^ excludes the listed ones instead.
func parseSubsys(v string) (map[string]bool, error) {
	v = strings.ToUpper(strings.TrimSpace(v))
	all := []string{SubsysInit, SubsysColl, SubsysNet}
	out := map[string]bool{}
	if v == "" || v == "ALL" {
		for _, s := range all {
			out[s] = true
		}
		return out, nil
	}
	exclude := strings.HasPrefix(v, "^")
	if exclude {
		for _, s := range all {
			out[s] = true
		}
		v = v[1:]
	}
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		known := f == "ALL"
		for _, s := range all {
			known = known || f == s
		}
		if !known {
			return nil, fmt.Errorf("unknown subsystem %q (want INIT, COLL, NET or ALL)", f)
		}
		if f == "ALL" {
			for _, s := range all {
				out[s] = !exclude
			}
			continue
		}
		out[f] = !exclude
	}
	return out, nil
}

// logger is a communicator's logger for one subsystem: text on stderr at
// Config.DebugLevel, or a logger that drops everything when the subsystem
// is off.
func (c *Comm) logger(subsys string) *slog.Logger {
	if !c.cfg.debugSubsys[subsys] {
		return slog.New(discardHandler{})
	}
	h := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: c.cfg.DebugLevel, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.LevelKey && a.Value.Any() == LevelTrace {
			a.Value = slog.StringValue("TRACE")
		}
		return a
	}})
	return slog.New(h).With("subsys", subsys, "rank", c.rank)
}

type discardHandler struct{}

func (discardHandler) Enabled(context.Context, slog.Level) bool  { return false }
func (discardHandler) Handle(context.Context, slog.Record) error { return nil }
func (d discardHandler) WithAttrs([]slog.Attr) slog.Handler      { return d }
func (d discardHandler) WithGroup(string) slog.Handler           { return d }

// logReady writes the INFO summary of a new communicator: ranks, hosts,
// transports to the peers, the algorithms the tuner picks for a small
// and a large all-reduce, and whether some machine runs more ranks than
// it has CPUs.
func (c *Comm) logReady() {
	log := c.logger(SubsysInit)
	if !log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	hosts := map[string]bool{}
	for _, p := range c.peers {
		hosts[p.HostID] = true
	}
	counts := map[string]int{}
	for r, t := range c.routes {
		if r != c.rank {
			counts[t]++
		}
	}
	if c.routes == nil && c.size > 1 {
		counts[c.transport] = c.size - 1
	}
	var tr []string
	for t, n := range counts {
		tr = append(tr, fmt.Sprintf("%s:%d", t, n))
	}
	sort.Strings(tr)
	pick := func(coll algorithms.Collective, bytes int) string {
		// Choose takes the count of the smaller buffer (a reduce-scatter's
		// output, an all-gather's input): bytes is the larger's.
		count := bytes / 4 / coll.Majors(c.size)
		ch, err := c.Choose(coll, Float32, count)
		if err != nil {
			return "?"
		}
		return ch.String()
	}
	attrs := []any{"nranks", c.size, "hosts", max(1, len(hosts)), "transports", strings.Join(tr, ","),
		"allreduce_8B", pick(algorithms.CollAllReduce, 8), "allreduce_64MiB", pick(algorithms.CollAllReduce, 64<<20),
		"timeout", c.cfg.Timeout, "tls", c.cfg.TLSCert != ""}
	if labels := hostLabels(c.peers); labels != nil {
		// Across hosts reduce-scatter and all-gather have a choice too
		// (the ring or the hierarchy).
		attrs = append(attrs, "ring", ringString(algorithms.HostRing(labels), labels),
			"reducescatter_64MiB", pick(algorithms.CollReduceScatter, 64<<20), "allgather_64MiB", pick(algorithms.CollAllGather, 64<<20))
	}
	if len(c.nics) > 0 {
		attrs = append(attrs, "nics", strings.Join(c.nics, ","))
		if cc := tcp.Congestion(c.cfg.TCPCongestion); cc != "" {
			// What the data sockets' congestion control is (Reno where
			// the system's would pace: transport/tcp/congestion.go).
			attrs = append(attrs, "tcp_cc", cc)
		}
	}
	if c.ibPort != "" {
		attrs = append(attrs, "ib_port", c.ibPort)
	}
	if c.cfg.oversubscribed {
		// Some machine runs more ranks than it has CPUs (whatever hosts
		// they count as): its waiting ranks yield at every poll, and the
		// engine cuts some collectives' slices by the slot.
		attrs = append(attrs, "oversubscribed", true)
	}
	if c.dev != nil {
		// Device operations between ranks of this process move device to
		// device (slots in the receiver's device memory); between
		// processes they wait for the transports' device slots.
		attrs = append(attrs, "device", describeDevice(c.dev.dev), "device_path", c.devicePath())
		if c.cfg.topology != nil {
			// The ring the tuner plans device operations by, or why
			// there is none (devlink.go).
			attrs = append(attrs, "device_link", c.cfg.deviceLinkWhy)
		}
	}
	log.Info("goccl: communicator ready", attrs...)
}

// ringString writes a ring order host by host: "0 2 | 1 3" is ranks 0 and
// 2 on one host, then 1 and 3 on the next, and back to 0.
func ringString(ring, hosts []int) string {
	var b strings.Builder
	for i, r := range ring {
		switch {
		case i > 0 && hosts[r] != hosts[ring[i-1]]:
			b.WriteString(" | ")
		case i > 0:
			b.WriteString(" ")
		}
		fmt.Fprint(&b, r)
	}
	return b.String()
}

// logOp writes one TRACE line per operation (COLL).
func (c *Comm) logOp(r *Request, pl *engine.Plan, err error) {
	if c.opLog == nil {
		return
	}
	c.opLog.Log(context.Background(), LevelTrace, "goccl: op", "op", r.name, "seq", r.cseq, "count", r.op.Count,
		"algo", pl.AlgoName(), "channels", pl.Channels, "err", err)
}
