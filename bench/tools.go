package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// The helpers the programs under bench (compare, fit) share.

// SizeName prints a byte count as the tables do: "256 MiB", "64 KiB",
// "8 B" (whole units only).
func SizeName(b int64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", b>>30)
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}

// SplitList splits a comma-separated flag value, dropping blanks.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// ModuleRoot is the goccl checkout the calling program was built from.
func ModuleRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "."
	}
	return filepath.Dir(filepath.Dir(file))
}

// ErrTimedOut is wrapped by RunLimited's error for a run it killed at
// its limit.
var ErrTimedOut = errors.New("killed")

// RunLimited runs argv with env added to this process's environment and
// returns its output (stdout and stderr together), which it also writes
// to log under a "### command" line. A run past limit is killed as a
// process group: a launcher's ranks are its children (MPICH's 4 ranks
// over TCP on 2 cores hung, blocked, for minutes), and they go with it.
func RunLimited(ctx context.Context, argv, env []string, limit time.Duration, log io.Writer) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	fmt.Fprintf(log, "### %s\n%s\n", strings.Join(argv, " "), out.Bytes())
	if ctx.Err() == context.DeadlineExceeded {
		return out.Bytes(), fmt.Errorf("%w after -run-timeout %v", ErrTimedOut, limit)
	}
	return out.Bytes(), err
}
