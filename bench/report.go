package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/goccl/goccl/collective"
)

// Report is a whole run: what was asked, who ran it, and the rows. It is
// what -J writes and what `goccl-perf plot` reads.
type Report struct {
	Tool       string                `json:"tool"` // "goccl-perf", or the peer a table was parsed from
	Label      string                `json:"label,omitempty"`
	Collective Coll                  `json:"collective"`
	NRanks     int                   `json:"nranks"`
	Ranks      []collective.RankInfo `json:"ranks,omitempty"`
	Params     Params                `json:"params"`
	Date       time.Time             `json:"date"`
	Rows       []Row                 `json:"results"`
	Wrong      int64                 `json:"wrong"`
	AvgBusBW   float64               `json:"avgBusbw"`
	Error      string                `json:"error,omitempty"`
}

// Params records the options a run used, in nccl-tests' terms.
type Params struct {
	MinBytes  int64   `json:"minBytes"`
	MaxBytes  int64   `json:"maxBytes"`
	Factor    int64   `json:"stepFactor,omitempty"`
	Step      int64   `json:"stepBytes,omitempty"`
	Iters     int     `json:"iters"`
	Warmup    int     `json:"warmupIters"`
	TargetSec float64 `json:"targetSeconds,omitempty"`
	Check     int     `json:"check"`
	Blocking  bool    `json:"blocking"`
	Agg       string  `json:"aggregation"`
	Transport string  `json:"transport,omitempty"`
	TLS       bool    `json:"tls,omitempty"` // mutual TLS on TCP connections
	Algo      string  `json:"algo,omitempty"`
	Channels  int     `json:"channels,omitempty"`
	Chunk     int64   `json:"chunkBytes,omitempty"`
	Device    string  `json:"device,omitempty"` // "gpu": buffers in device memory
	// Shared: host buffers from collective.MemAlloc (goccl-perf -R 1).
	Shared bool `json:"sharedBuffers,omitempty"`
	// Registered: Go buffers registered with collective.Register (-R 2).
	Registered bool `json:"registeredBuffers,omitempty"`
}

// ParamsOf fills Params from o (the transport and tuning fields are the
// caller's).
func ParamsOf(o Options) Params {
	o.defaults()
	p := Params{MinBytes: o.MinBytes, MaxBytes: o.MaxBytes, Iters: o.Iters, Warmup: o.Warmup, TargetSec: o.Target.Seconds(),
		Check: o.Check, Blocking: o.Blocking, Agg: o.Agg.String(), Shared: o.Shared, Registered: o.Registered}
	if o.Factor > 1 {
		p.Factor = o.Factor
	} else {
		p.Step = o.Step
	}
	return p
}

// Summarise fills Wrong and AvgBusBW from the rows.
func (r *Report) Summarise() {
	r.Wrong, r.AvgBusBW = 0, 0
	n := 0
	for _, row := range r.Rows {
		for _, m := range row.measures() {
			r.Wrong += max(0, m.Wrong)
			r.AvgBusBW += m.BusBW
			n++
		}
	}
	if n > 0 {
		r.AvgBusBW /= float64(n)
	}
}

func (r Row) measures() []Measure {
	if r.InPlace == nil {
		return []Measure{r.OutOfPlace}
	}
	return []Measure{r.OutOfPlace, *r.InPlace}
}

// WriteJSON writes r to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadReport reads a report written by WriteJSON, or parses a text table
// in nccl-tests' layout (goccl-perf's, nccl-tests' or the baseline tools'
// output; see ParseTable).
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if t := strings.TrimSpace(string(b)); strings.HasPrefix(t, "{") {
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if r.Label == "" {
			r.Label = path
		}
		return &r, nil
	}
	rows, err := ParseTable(strings.NewReader(string(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r := &Report{Tool: "table", Label: path, Rows: rows}
	r.Summarise()
	return r, nil
}

// Table writes nccl-tests' text layout. Column heads, units and row
// fields are nccl-tests' (src/util.cu there): size, count, type, redop,
// root, then time, algbw, busbw and #wrong out of place and in place; a
// parser that splits nccl-tests' rows on blanks splits these the same way.
type Table struct{}

// Header writes the preamble: parameters, one line per rank, column heads.
func (Table) Header(w io.Writer, rep *Report) {
	p := rep.Params
	step := fmt.Sprintf("%d(factor)", p.Factor)
	if p.Factor <= 1 {
		step = fmt.Sprintf("%d(bytes)", p.Step)
	}
	fmt.Fprintf(w, "# goccl-perf %s\n", rep.Collective)
	fmt.Fprintf(w, "# nRanks %d minBytes %d maxBytes %d step: %s warmup iters: %d iters: %d agg iters: 1 validation: %d blocking: %d aggregation: %s\n",
		rep.NRanks, p.MinBytes, p.MaxBytes, step, p.Warmup, p.Iters, p.Check, b2i(p.Blocking), p.Agg)
	if p.TargetSec > 0 {
		fmt.Fprintf(w, "# iterations: as many as fill %.3gs per size and placement\n", p.TargetSec)
	}
	if p.Transport != "" || p.Algo != "" || p.Channels > 0 || p.Chunk > 0 {
		fmt.Fprintf(w, "# forced: transport %s algo %s channels %d chunk %d\n", orAuto(p.Transport), orAuto(p.Algo), p.Channels, p.Chunk)
	}
	if p.TLS {
		fmt.Fprintln(w, "# tls: mutual TLS 1.3 on every TCP connection")
	}
	if p.Shared {
		fmt.Fprintln(w, "# buffers: collective.MemAlloc (peers on this host map them; -R 1)")
	}
	if p.Registered {
		fmt.Fprintln(w, "# buffers: Go memory registered with collective.Register (peers on this host map their whole pages; -R 2)")
	}
	fmt.Fprintln(w, "#")
	fmt.Fprintln(w, "# Using ranks")
	for _, ri := range rep.Ranks {
		host, _, _ := strings.Cut(ri.Host, "/")
		dev := ""
		if ri.Device != "" {
			dev = " device " + ri.Device
		}
		if ri.NIC != "" {
			dev += " nic " + ri.NIC
		}
		fmt.Fprintf(w, "#  Rank %2d Pid %6d on %10s transport %s%s\n", ri.Rank, ri.PID, host, ri.Transport, dev)
	}
	fmt.Fprintln(w, "#")
	fmt.Fprintf(w, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "", "", "")
	fmt.Fprintf(w, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
		"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong")
	fmt.Fprintf(w, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n",
		"(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")
}

func orAuto(s string) string {
	if s == "" {
		return "auto"
	}
	return s
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// WriteRow writes one row.
func (Table) WriteRow(w io.Writer, r Row) {
	var b strings.Builder
	fmt.Fprintf(&b, "%12d  %12d  %8s  %6s  %6d", r.Bytes, r.Count, r.Type, r.RedOp, r.Root)
	writeMeasure(&b, &r.OutOfPlace)
	writeMeasure(&b, r.InPlace)
	b.WriteByte('\n')
	io.WriteString(w, b.String())
}

func writeMeasure(b *strings.Builder, m *Measure) {
	if m == nil {
		fmt.Fprintf(b, "  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A")
		return
	}
	wrong := "N/A"
	if m.Wrong >= 0 {
		wrong = fmt.Sprint(m.Wrong)
	}
	fmt.Fprintf(b, "  %7s  %6s  %6s  %6s", fit(m.TimeUs, 7), fit(m.AlgBW, 6), fit(m.BusBW, 6), wrong)
}

// fit formats v in width characters with as many decimals (2, 1, 0) as
// fit, as nccl-tests does, falling back to exponent form.
func fit(v float64, width int) string {
	for _, prec := range []int{2, 1, 0} {
		if s := fmt.Sprintf("%*.*f", width, prec, v); len(s) <= width {
			return s
		}
	}
	return fmt.Sprintf("%*.1e", width, v)
}

// Footer writes nccl-tests' closing lines.
func (Table) Footer(w io.Writer, rep *Report) {
	status := "OK"
	if rep.Wrong > 0 || rep.Error != "" {
		status = "FAILED"
	}
	fmt.Fprintf(w, "# %-20s : %d %s\n", "Out of bounds values", rep.Wrong, status)
	fmt.Fprintf(w, "# %-20s : %g \n", "Avg bus bandwidth", math.Round(rep.AvgBusBW*1e4)/1e4)
	fmt.Fprintln(w, "#")
	if rep.Error != "" {
		fmt.Fprintf(w, "# error: %s\n", rep.Error)
	}
}

// Printer is a Sink that writes each row as it comes.
type Printer struct {
	W io.Writer
	// Progress, if set, gets the progress reports (see Sink).
	OnProgress func(i, total int, label string)
}

func (p Printer) Row(r Row) { Table{}.WriteRow(p.W, r) }

func (p Printer) Progress(i, total int, label string) {
	if p.OnProgress != nil {
		p.OnProgress(i, total, label)
	}
}
