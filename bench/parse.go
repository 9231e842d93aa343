package bench

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// launcherPrefix is what launchers put before each line of a rank's
// output: "[1] " (goccl-run, goccl-perf -np), "[1,0]<stdout>:" (Open
// MPI's mpirun --tag-output), "[0] " (MPICH's -prepend-rank).
var launcherPrefix = regexp.MustCompile(`^\[\d+(,\d+)*\](<std(out|err)>:)? ?`)

// ParseTable reads the result rows of a text table: goccl-perf's and
// nccl-tests' layout (13 fields: size count type redop root, then time
// algbw busbw #wrong out of place and in place), nccl-tests' older one
// without the root column (12 fields, as in many published logs), or the
// baseline tools' in ../shared/baselines (9 fields: size count type redop
// iters time algbw busbw #wrong). Comment lines (#) and other text are
// skipped; a launcher's prefix ("[rank] ", mpirun --tag-output's
// "[1,0]<stdout>:") is removed. It fails when no row is found.
func ParseTable(r io.Reader) ([]Row, error) {
	var rows []Row
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(launcherPrefix.ReplaceAllString(sc.Text(), ""))
		if t == "" || t[0] == '#' {
			continue
		}
		f := strings.Fields(t)
		if len(f) == 12 {
			// The older layout: no root column.
			f = append(f[:4:4], append([]string{"-1"}, f[4:]...)...)
		}
		if len(f) != 13 && len(f) != 9 {
			continue
		}
		size, err1 := strconv.ParseInt(f[0], 10, 64)
		count, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			continue
		}
		row := Row{Bytes: size, Count: count, Type: f[2], RedOp: f[3], Root: -1}
		var err error
		if len(f) == 9 {
			iters, e := strconv.Atoi(f[4])
			if e != nil {
				continue
			}
			row.OutOfPlace, err = parseMeasure(f[5:9])
			row.OutOfPlace.Iters = iters
		} else {
			if row.Root, err = strconv.Atoi(f[4]); err != nil {
				continue
			}
			if row.OutOfPlace, err = parseMeasure(f[5:9]); err == nil && f[9] != "N/A" {
				var m Measure
				if m, err = parseMeasure(f[9:13]); err == nil {
					row.InPlace = &m
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w: %q", line, err, t)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no result rows (want nccl-tests' layout)")
	}
	return rows, nil
}

// parseMeasure parses time, algbw, busbw, #wrong.
func parseMeasure(f []string) (Measure, error) {
	var m Measure
	var err error
	if m.TimeUs, err = strconv.ParseFloat(f[0], 64); err != nil {
		return m, fmt.Errorf("bad time %q", f[0])
	}
	if m.AlgBW, err = strconv.ParseFloat(f[1], 64); err != nil {
		return m, fmt.Errorf("bad algbw %q", f[1])
	}
	if m.BusBW, err = strconv.ParseFloat(f[2], 64); err != nil {
		return m, fmt.Errorf("bad busbw %q", f[2])
	}
	m.Wrong = -1
	if f[3] != "N/A" {
		w, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			return m, fmt.Errorf("bad #wrong %q", f[3])
		}
		m.Wrong = int64(w)
	}
	return m, nil
}
