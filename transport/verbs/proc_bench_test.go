package verbs

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/goccl/goccl/transport/verbs/ibemu"
)

// TestMain runs the other rank of BenchmarkBoardAcrossProcesses when the
// test binary is started as it.
func TestMain(m *testing.M) {
	if n := os.Getenv("VERBS_BOARD_PEER"); n != "" {
		os.Exit(boardPeer(n))
	}
	os.Exit(m.Run())
}

// boardPeer is rank 1: its listener is descriptor 3, the two ranks'
// addresses and the fabric are in the environment.
func boardPeer(n string) int {
	iters, _ := strconv.Atoi(n)
	ln, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	e, err := New(Options{Rank: 1, NRanks: 2, Peers: strings.Split(os.Getenv("VERBS_BOARD_PEERS"), ","), Secret: secret, Listener: ln,
		Provider: ibemu.New(ibemu.Options{Dir: os.Getenv("VERBS_BOARD_DIR")}), GIDIndex: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer e.Close(nil)
	if err := boardLoop(e, 1, iters); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func boardLoop(e *Endpoint, r, iters int) error {
	ctx := context.Background()
	if err := e.JoinBoard(ctx); err != nil {
		return err
	}
	brd := e.Board()
	data := make([]byte, 8)
	for seq := range uint64(iters) {
		if err := brd.Post(ctx, seq, 1, data); err != nil {
			return err
		}
		if _, _, _, err := brd.Read(ctx, 1-r, seq); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkBoardAcrossProcesses is BenchmarkBoard with the other rank in
// a process of its own, as in a job (the time includes the connection
// setup, amortised over b.N).
func BenchmarkBoardAcrossProcesses(b *testing.B) {
	dir := b.TempDir()
	lns := make([]net.Listener, 2)
	peers := make([]string, 2)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lns[i], peers[i] = ln, ln.Addr().String()
	}
	f, err := lns[1].(*net.TCPListener).File()
	if err != nil {
		b.Fatal(err)
	}
	lns[1].Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VERBS_BOARD_PEER="+strconv.Itoa(b.N), "VERBS_BOARD_PEERS="+strings.Join(peers, ","), "VERBS_BOARD_DIR="+dir)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	e, err := New(Options{Rank: 0, NRanks: 2, Peers: peers, Secret: secret, Listener: lns[0], Provider: ibemu.New(ibemu.Options{Dir: dir}), GIDIndex: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(nil)
	b.ResetTimer()
	if err := boardLoop(e, 0, b.N); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatal(err)
	}
}
