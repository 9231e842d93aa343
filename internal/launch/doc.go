// Package launch is goccl's side of process launchers: FromEnv reads what a
// launcher told this process (rank, world size, local rank and size, the
// rendezvous root and the job's secret), and Run is a launcher itself,
// starting N ranks of a program on this host the way goccl-run does.
//
// # Reading the environment
//
// FromEnv takes rank and size from the first of these sets whose rank or
// size variable is set:
//
//  1. goccl: GOCCL_RANK, GOCCL_WORLD_SIZE, GOCCL_LOCAL_RANK, GOCCL_LOCAL_SIZE
//  2. torchrun, Kubeflow: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//  3. Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//     OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//  4. MPICH, Hydra, Intel MPI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
//     MPI_LOCALNRANKS
//  5. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the local size from
//     SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE (indexed by
//     SLURM_NODEID), else SLURM_NTASKS_PER_NODE
//
// Rank and size are required together; a set with one but not the other is
// an error, not a reason to try the next set. Local rank and size are
// optional (-1 when unknown). The rendezvous root is GOCCL_ROOT=host:port,
// else MASTER_ADDR and MASTER_PORT; GOCCL_ID, the string form of a unique
// ID, carries the root and the secret itself and makes them optional.
// GOCCL_ROOT=":port" takes the host from MASTER_ADDR (torchrun's agent
// listens on MASTER_PORT itself). GOCCL_SECRET, when set, is 32 hex digits
// shared by every rank.
//
// Contract:
//
//  1. A variable that is set is used or rejected, never skipped: an empty
//     or malformed value is an error naming the variable, its value and what
//     was expected. (Slurm's per-node task lists are the exception: if they
//     do not parse, the local size is -1.)
//  2. Errors name the variables found, with their values, and the ones
//     missing. They never contain the value of GOCCL_SECRET or GOCCL_ID.
//  3. FromEnv reads the environment only through its lookup argument.
//
// # Launching
//
// Run starts the ranks with GOCCL_RANK, GOCCL_WORLD_SIZE, GOCCL_LOCAL_RANK,
// GOCCL_LOCAL_SIZE, GOCCL_ROOT (127.0.0.1 and a free port) and a fresh
// GOCCL_SECRET, prefixes each line of their output with "[rank] ", and
// waits. It owns its processes:
//
//  1. Each rank leads its own process group; stopping a rank signals the
//     group, so what the rank started is stopped too.
//  2. When ctx is done or a rank fails, every group gets SIGTERM, then
//     SIGKILL after Options.Grace. Run returns only after every rank has
//     been waited for and every group has been sent SIGKILL: no rank, and
//     nothing left in a rank's group, outlives Run.
//  3. Run starts no goroutine that outlives it.
//
// Forwarding the launcher's own SIGINT and SIGTERM is the caller's job:
// cancel ctx when they arrive (cmd/goccl-run does).
package launch
