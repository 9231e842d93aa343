// Package bench is the harness behind goccl-perf: it sweeps a collective
// over message sizes, element types, reduction operators and roots on a
// communicator, times it the way nccl-tests does, checks every result,
// and writes nccl-tests' table, JSON and plots.
//
// Every rank of the communicator calls Run with the same Options; rank 0
// passes a Sink that gets each row as it is measured. For each size the
// out-of-place form is timed and checked, then the in-place form (NCCL's
// aliasing conventions; alltoall and sendrecv have none and print N/A).
//
// Timing: Warmup untimed operations, then Iters timed back to back (or as
// many as fill Target, agreed across ranks), blocking calls or, with
// Blocking off, asynchronous ones waited for at the end; each rank's time
// per operation is combined across ranks as nccl-tests' -a says (average
// by default). algbw is size/time; busbw multiplies it by BusFactor,
// nccl-tests' factor (doc/PERFORMANCE.md there). Sizes and counts follow
// nccl-tests: the size column is the full vector for all-reduce,
// broadcast, reduce and sendrecv, the send buffer of reduce-scatter and
// the receive buffer of all-gather and alltoall; count is per rank (per
// block for those three).
//
// Checking (see verify.go) uses inputs whose results are exact in every
// type whatever the order of reduction, poisons the outputs first and
// compares bit for bit; #wrong is the number of wrong elements summed over
// the ranks.
//
// ParseTable and ReadReport read tables back (goccl-perf's, nccl-tests'
// and the baseline tools'), and Plot overlays reports, which is what
// `goccl-perf plot` and bench/compare use.
package bench
