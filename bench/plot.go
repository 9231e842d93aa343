package bench

import (
	"fmt"
	"math"
	"os"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot draws bus bandwidth and time per operation against size (log axes)
// for every report, side by side in one PNG at path. Each report gives
// one line per type/operator/root it has (out of place), and, when
// inPlace is set, a dashed line for its in-place results.
func Plot(path, title string, reports []*Report, inPlace bool) error {
	var all []series
	for _, rep := range reports {
		groups := map[string][]Row{}
		var keys []string
		for _, r := range rep.Rows {
			k := fmt.Sprintf("%s %s", r.Type, r.RedOp)
			if r.Root >= 0 {
				k += fmt.Sprintf(" root %d", r.Root)
			}
			if _, ok := groups[k]; !ok {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], r)
		}
		label := rep.Label
		if label == "" {
			label = rep.Tool
		}
		for _, k := range keys {
			name := label
			if len(keys) > 1 {
				name += " " + k
			}
			rows := groups[k]
			sort.Slice(rows, func(i, j int) bool { return rows[i].Bytes < rows[j].Bytes })
			s := series{label: name}
			var ip series
			ip.label, ip.dashed = name+" in-place", true
			for _, r := range rows {
				s.add(r.Bytes, r.OutOfPlace)
				if inPlace && r.InPlace != nil {
					ip.add(r.Bytes, *r.InPlace)
				}
			}
			all = append(all, s)
			if len(ip.xs) > 0 {
				all = append(all, ip)
			}
		}
	}
	if len(all) == 0 {
		return fmt.Errorf("plot: nothing to draw")
	}
	bw, tm := plot.New(), plot.New()
	bw.Title.Text, tm.Title.Text = title+": bus bandwidth", title+": time per operation"
	bw.Y.Label.Text, tm.Y.Label.Text = "busbw (GB/s)", "time (µs)"
	for _, p := range []*plot.Plot{bw, tm} {
		p.X.Label.Text = "size (bytes)"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = byteTicks{}
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
	}
	tm.Y.Scale = plot.LogScale{}
	tm.Y.Tick.Marker = decadeTicks{}
	bw.Y.Min = 0
	for i, s := range all {
		c := plotutil.Color(i)
		if s.dashed {
			c = plotutil.Color(i - 1)
		}
		for _, pp := range []struct {
			p  *plot.Plot
			ys []float64
		}{{bw, s.bw}, {tm, s.tu}} {
			xy := make(plotter.XYs, 0, len(s.xs))
			for j, x := range s.xs {
				if pp.ys[j] > 0 {
					xy = append(xy, plotter.XY{X: x, Y: pp.ys[j]})
				}
			}
			if len(xy) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xy)
			if err != nil {
				return err
			}
			l.Color, pts.Color = c, c
			if s.dashed {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			}
			pts.Shape = draw.CircleGlyph{}
			pts.Radius = vg.Points(2)
			pp.p.Add(l, pts)
			pp.p.Legend.Add(s.label, l, pts)
		}
	}
	img := vgimg.New(vg.Points(1100), vg.Points(420))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(12), PadY: vg.Points(8), PadTop: vg.Points(4), PadBottom: vg.Points(4),
		PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	cs := plot.Align([][]*plot.Plot{{bw, tm}}, tiles, dc)
	bw.Draw(cs[0][0])
	tm.Draw(cs[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// series is one line in each panel.
type series struct {
	label  string
	xs     []float64
	bw, tu []float64
	dashed bool
}

func (s *series) add(bytes int64, m Measure) {
	s.xs = append(s.xs, float64(bytes))
	s.bw = append(s.bw, m.BusBW)
	s.tu = append(s.tu, m.TimeUs)
}

// byteTicks marks powers of two with byte units: 8, 1K, 1M, 1G.
type byteTicks struct{}

func (byteTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log2(max(lo, 1))); math.Pow(2, e) <= hi*1.0001; e++ {
		v := math.Pow(2, e)
		if v < lo*0.9999 {
			continue
		}
		t := plot.Tick{Value: v}
		// Label every power of two on a short axis, every other on a long one.
		if int(e)%2 == 0 || hi/lo <= 1<<12 {
			t.Label = byteLabel(v)
		}
		ts = append(ts, t)
	}
	return ts
}

// decadeTicks marks 1, 2 and 5 times the powers of ten on a log axis, all
// labelled, so that even an axis that spans less than a decade has some.
type decadeTicks struct{}

func (decadeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: fmt.Sprintf("%g", v)})
			}
		}
	}
	if len(ts) < 2 {
		ts = append(ts, plot.Tick{Value: lo, Label: fmt.Sprintf("%.3g", lo)}, plot.Tick{Value: hi, Label: fmt.Sprintf("%.3g", hi)})
	}
	return ts
}

func byteLabel(v float64) string {
	switch {
	case v >= 1<<30:
		return fmt.Sprintf("%gG", v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%gM", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%gK", v/(1<<10))
	}
	return fmt.Sprintf("%g", v)
}
