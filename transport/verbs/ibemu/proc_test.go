//go:build linux

package ibemu

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// TestMain runs the peer process of TestAcrossProcesses when the test
// binary is started as one.
func TestMain(m *testing.M) {
	if dir := os.Getenv("IBEMU_PEER_DIR"); dir != "" {
		os.Exit(peerMain(dir))
	}
	os.Exit(m.Run())
}

// peerMain is the other process: it makes an end, says where it is on
// stdout, connects to the QP named on stdin, and checks what arrives.
func peerMain(dir string) int {
	t := &testing.T{}
	b := newEnd(t, New(Options{Dir: dir, Adversarial: true, Seed: 11}), endOpts{})
	g, _, _ := b.ctx.QueryGID(1, 2)
	fmt.Printf("%x %d %d %d\n", g[:], b.qp.Num(), b.mr.RKey(), b.mr.Addr())
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return 2
	}
	var gb []byte
	var qpn uint32
	fmt.Sscanf(in.Text(), "%x %d", &gb, &qpn)
	var gid ibv.GID
	copy(gid[:], gb)
	connectTo(t, b, gid, qpn, nil)
	if _, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 1}}); err != nil {
		return 3
	}
	fmt.Println("ready")
	wc := make([]ibv.WC, 1)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		n, err := b.cq.Poll(wc)
		if err != nil {
			return 4
		}
		if n == 1 {
			for i, v := range b.mem.B[:wc[0].ByteLen] {
				if v != byte(i*13) {
					fmt.Printf("byte %d is %d\n", i, v)
					return 5
				}
			}
			fmt.Printf("ok %d bytes imm %#x\n", wc[0].ByteLen, wc[0].Imm)
			time.Sleep(time.Hour) // until killed
		}
	}
	return 6
}

// TestAcrossProcesses writes into another process's region, then kills
// the process: the next write fails with RETRY_EXC_ERR once the
// (scaled) transport timeout has passed from the death.
func TestAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	a := newEnd(t, New(Options{Dir: dir, TimeScale: 0.001}), endOpts{})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "IBEMU_PEER_DIR="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l := <-lines:
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("the peer process said nothing")
		}
		return ""
	}
	f := strings.Fields(next())
	require.Len(t, f, 4)
	var gb []byte
	fmt.Sscanf(f[0], "%x", &gb)
	var gid ibv.GID
	copy(gid[:], gb)
	qpn, _ := strconv.Atoi(f[1])
	rkey, _ := strconv.Atoi(f[2])
	raddr, _ := strconv.ParseUint(f[3], 10, 64)
	connectTo(t, a, gid, uint32(qpn), nil)
	g, _, _ := a.ctx.QueryGID(1, 2)
	fmt.Fprintf(stdin, "%x %d\n", g[:], a.qp.Num())
	require.Equal(t, "ready", next())
	const size = 200_000
	for i := range a.mem.B[:size] {
		a.mem.B[i] = byte(i * 13)
	}
	w := ibv.SendWR{ID: 1, Op: ibv.OpWriteImm, Flags: ibv.SendSignaled, Imm: 0xabc,
		SGE: ibv.SGE{Addr: a.mr.Addr(), Len: size, LKey: a.mr.LKey()}, Remote: raddr, RKey: uint32(rkey)}
	_, err = a.qp.PostSend([]ibv.SendWR{w})
	require.NoError(t, err)
	require.Equal(t, ibv.Status(ibv.Success), poll(t, a.cq, 1, 5*time.Second)[0].Status)
	require.Equal(t, "ok 200000 bytes imm 0xabc", next())

	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	killed := time.Now()
	w.Flags, w.Op = ibv.SendSignaled, ibv.OpWrite
	for time.Since(killed) < 2*time.Second {
		_, err = a.qp.PostSend([]ibv.SendWR{w})
		require.NoError(t, err)
		wc := poll(t, a.cq, 1, 5*time.Second)[0]
		if wc.Status == ibv.Success {
			continue // written before the death was noticed: the memory is still there
		}
		require.Equal(t, ibv.RetryExcErr, wc.Status)
		took := time.Since(killed)
		t.Logf("RETRY_EXC_ERR %v after the kill", took)
		// 4.096 µs × 2^20 × 8 × 0.001 ≈ 34 ms after the death is seen.
		require.Greater(t, took, 25*time.Millisecond)
		require.Less(t, took, time.Second)
		return
	}
	t.Fatal("writes to a dead process kept succeeding")
}
