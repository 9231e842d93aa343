// Command goccl-run starts a goccl job on this host: N processes of one
// program, one rank each, like `torchrun --standalone` or `mpirun -np` on
// a single machine.
//
// Each rank gets GOCCL_RANK, GOCCL_WORLD_SIZE, GOCCL_LOCAL_RANK,
// GOCCL_LOCAL_SIZE, GOCCL_ROOT (127.0.0.1 and a free port) and a fresh
// GOCCL_SECRET, which collective.InitFromEnv reads. Every line a rank
// writes to stdout or stderr appears on goccl-run's stdout or stderr with
// "[rank] " in front. Ranks read stdin from the null device.
//
// goccl-run waits for every rank. When it receives SIGINT or SIGTERM, or
// when a rank exits non-zero or is killed by a signal, it sends SIGTERM to
// every rank's process group (so processes a rank started get it too) and
// SIGKILL -grace later (default 3s). It never leaves a rank running. With
// -keep-going a failed rank does not stop the others: they can Shrink
// their communicator and run to their end (the exit status is still the
// failed rank's).
//
//	goccl-run -np N [-grace D] [-keep-going] [--] PROGRAM [ARGS...]
//
// Exit status: 0 when every rank exited 0; otherwise, after printing
// "goccl-run: " and what happened to stderr, the exit status of the first
// rank that failed, 1 if that rank was killed by a signal or could not be
// started, 128+n when goccl-run itself was stopped by signal n (130 for
// SIGINT, 143 for SIGTERM), and 2 for bad usage.
//
// Multi-host jobs use the cluster's own launcher (torchrun, mpirun, srun, a
// Kubernetes Job); see docs/launchers.md.
package main
