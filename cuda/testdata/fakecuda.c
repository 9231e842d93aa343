// fakecuda.c: a fake CUDA driver library (libcuda.so.1) for package cuda's
// tests on machines without a GPU. fake_test.go compiles it with gcc into
// shared objects, in variants chosen with -D:
//
//   FAKE_NO_DEVICE     cuInit returns CUDA_ERROR_NO_DEVICE (100)
//   FAKE_NO_PROCADDR   no cuGetProcAddress_v2: the loader falls back to dlsym
//   FAKE_OMIT_MEMALLOC neither cuMemAlloc_v2 nor "cuMemAlloc" through cuGetProcAddress
//   FAKE_NO_MEMOPS     cuStreamWaitValue32 returns CUDA_ERROR_NOT_SUPPORTED
//   FAKE_NO_DMABUF     CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0
//
// It is an ABI harness, not a GPU model: "device memory" is malloc'd host
// memory and kernels run at launch, on the host. What it checks strictly:
// the primary context is current on the calling thread for every call that
// needs one (else CUDA_ERROR_INVALID_CONTEXT), the 64-byte IPC handle
// arrives intact by value, the JIT options, and the kernel parameter block.
// Streams and events report CUDA_ERROR_NOT_READY twice after new work, so
// that callers must poll.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;

enum {
	OK = 0,
	INVALID_VALUE = 1,
	NO_DEVICE = 100,
	INVALID_CONTEXT = 201,
	INVALID_PTX = 218,
	INVALID_HANDLE = 400,
	NOT_FOUND = 500,
	NOT_READY = 600,
	NOT_SUPPORTED = 801,
};

#define NDEV 2
#define CTX_BASE 0x1000

static __thread uintptr_t current;   // the calling thread's current context
static int ctx_refs[NDEV];

// A log of what cuGetProcAddress_v2 was asked, "name@version/flags;" each.
static char proc_log[8192];

static int need_ctx(void) {
	if (current < CTX_BASE || current >= CTX_BASE + NDEV || ctx_refs[current - CTX_BASE] == 0)
		return INVALID_CONTEXT;
	return OK;
}
#define NEED_CTX do { int e_ = need_ctx(); if (e_) return e_; } while (0)

CUresult cuGetErrorName(CUresult e, const char **s) {
	switch (e) {
	case OK: *s = "CUDA_SUCCESS"; return OK;
	case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
	case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
	case NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
	case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
	case INVALID_PTX: *s = "CUDA_ERROR_INVALID_PTX"; return OK;
	case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return OK;
	case NOT_READY: *s = "CUDA_ERROR_NOT_READY"; return OK;
	case NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; return OK;
	}
	*s = NULL;
	return INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult e, const char **s) {
	switch (e) {
	case NO_DEVICE: *s = "no CUDA-capable device is detected (fake)"; return OK;
	case INVALID_VALUE: *s = "invalid argument (fake)"; return OK;
	case INVALID_CONTEXT: *s = "invalid device context (fake)"; return OK;
	case INVALID_PTX: *s = "a PTX JIT compilation failed (fake)"; return OK;
	case NOT_SUPPORTED: *s = "operation not supported (fake)"; return OK;
	}
	*s = NULL;
	return INVALID_VALUE;
}

CUresult cuInit(unsigned flags) {
#ifdef FAKE_NO_DEVICE
	return NO_DEVICE;
#endif
	return flags == 0 ? OK : INVALID_VALUE;
}

CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }

CUresult cuDeviceGetCount(int *n) { *n = NDEV; return OK; }

CUresult cuDeviceGet(int *d, int ordinal) {
	if (ordinal < 0 || ordinal >= NDEV) return 101;
	*d = ordinal;
	return OK;
}

static CUresult device_name(char *name, int len, int dev, const char *how) {
	if (dev < 0 || dev >= NDEV || len < 1) return INVALID_VALUE;
	snprintf(name, len, "Fake GPU %d (%s)", dev, how);
	return OK;
}

// Exported: what dlsym finds. cuGetProcAddress_v2 hands out proc_name
// instead, so the test sees which way the symbols were resolved.
CUresult cuDeviceGetName(char *name, int len, int dev) { return device_name(name, len, dev, "dlsym"); }
__attribute__((unused)) static CUresult proc_name(char *name, int len, int dev) { return device_name(name, len, dev, "cuGetProcAddress"); }

CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
	if (dev < 0 || dev >= NDEV) return INVALID_VALUE;
	switch (attr) {
	case 75: *v = 7; return OK;    // compute capability 7.0
	case 76: *v = 0; return OK;
	case 92: *v = 0; return OK;    // v1 stream mem ops off, as on a default driver
#ifndef FAKE_NO_DMABUF
	case 124: *v = 1; return OK;   // dma-buf export supported
#endif
	}
	*v = 0;
	return OK;
}

CUresult cuDeviceTotalMem_v2(size_t *n, int dev) { *n = (size_t)(dev + 1) << 30; return OK; }

CUresult cuDeviceGetPCIBusId(char *s, int len, int dev) {
	snprintf(s, len, "0000:%02X:00.0", 0x19 + dev);
	return OK;
}

CUresult cuDeviceCanAccessPeer(int *can, int dev, int peer) { *can = dev != peer; return OK; }

CUresult cuDevicePrimaryCtxRetain(uintptr_t *ctx, int dev) {
	if (dev < 0 || dev >= NDEV) return INVALID_VALUE;
	ctx_refs[dev]++;
	*ctx = CTX_BASE + dev;
	return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
	if (dev < 0 || dev >= NDEV || ctx_refs[dev] == 0) return INVALID_VALUE;
	ctx_refs[dev]--;
	return OK;
}

// Every 4th call is slow, as a driver call sometimes is: the Go runtime
// then hands the thread's P to another thread, and a goroutine that is not
// locked to its thread may resume on another one, where another context
// (or none) is current. The next call then fails.
static int get_calls;

CUresult cuCtxGetCurrent(uintptr_t *ctx) {
	if (__sync_fetch_and_add(&get_calls, 1) % 4 == 0) usleep(100);
	*ctx = current;
	return OK;
}
CUresult cuCtxSetCurrent(uintptr_t ctx) {
	if (ctx != 0 && (ctx < CTX_BASE || ctx >= CTX_BASE + NDEV)) return INVALID_CONTEXT;
	current = ctx;
	return OK;
}

// Allocations, for cuPointerGetAttribute and cuMemGetAddressRange.
struct alloc { uintptr_t p; size_t n; int type; int dev; };
// The table is shared by all threads: alloc_lock guards it.
static struct alloc allocs[256];
static int alloc_lock;

static void lock(void) { while (__sync_lock_test_and_set(&alloc_lock, 1)) ; }
static void unlock(void) { __sync_lock_release(&alloc_lock); }

static void track(void *p, size_t n, int type) {
	lock();
	for (int i = 0; i < 256; i++)
		if (allocs[i].p == 0) {
			allocs[i] = (struct alloc){(uintptr_t)p, n, type, (int)(current - CTX_BASE)};
			break;
		}
	unlock();
}
static struct alloc *find_locked(uintptr_t p) {
	for (int i = 0; i < 256; i++)
		if (allocs[i].p != 0 && p >= allocs[i].p && p < allocs[i].p + allocs[i].n) return &allocs[i];
	return NULL;
}
// find returns a copy of the allocation containing p (p == 0: none).
static struct alloc find(uintptr_t p) {
	lock();
	struct alloc *a = find_locked(p), r = {0};
	if (a) r = *a;
	unlock();
	return r;
}
static int untrack(uintptr_t p, int type) {
	lock();
	struct alloc *a = find_locked(p);
	int ok = a && a->p == p && a->type == type;
	if (ok) a->p = 0;
	unlock();
	return ok;
}

#ifndef FAKE_OMIT_MEMALLOC
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX;
	if (n == 0) return INVALID_VALUE;
	void *m = NULL;
	// Page-aligned, as cuMemAlloc's allocations are (at least 256 bytes;
	// in practice 2 MiB granules), so that dma-buf export can be tested.
	if (posix_memalign(&m, 4096, n)) return 2;
	track(m, n, 2);
	*p = (CUdeviceptr)(uintptr_t)m;
	return OK;
}
#endif

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX;
	if (!untrack(p, 2)) return INVALID_VALUE;
	free((void *)(uintptr_t)p);
	return OK;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *n, CUdeviceptr p) {
	NEED_CTX;
	struct alloc a = find(p);
	if (!a.p) return NOT_FOUND;
	if (base) *base = a.p;
	if (n) *n = a.n;
	return OK;
}

CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
	NEED_CTX;
	if (flags != 3) return INVALID_VALUE; // PORTABLE|DEVICEMAP, what goccl asks
	*p = malloc(n);
	track(*p, n, 1);
	return OK;
}

CUresult cuMemFreeHost(void *p) {
	NEED_CTX;
	if (!untrack((uintptr_t)p, 1)) return INVALID_VALUE;
	free(p);
	return OK;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
	NEED_CTX;
	struct alloc a = find((uintptr_t)p);
	if (!a.p || a.type != 1 || flags != 0) return INVALID_VALUE;
	*d = (CUdeviceptr)(uintptr_t)p; // unified addressing
	return OK;
}

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
	NEED_CTX;
	if (flags != 3 || find((uintptr_t)p).p) return INVALID_VALUE;
	track(p, n, 1);
	return OK;
}

CUresult cuMemHostUnregister(void *p) {
	NEED_CTX;
	return untrack((uintptr_t)p, 1) ? OK : INVALID_VALUE;
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
	NEED_CTX;
	struct alloc a = find(p);
	if (!a.p) return INVALID_VALUE;
	switch (attr) {
	case 2: *(unsigned *)data = a.type; return OK;
	case 9: *(int *)data = a.dev; return OK;
	}
	return INVALID_VALUE;
}

// IPC: bytes 0-7 of a handle hold the pointer, bytes 8-63 the pattern
// (i*37+11) & 0xff, which cuIpcOpenMemHandle_v2 checks in its by-value copy.
typedef struct { unsigned char reserved[64]; } CUipcMemHandle;

// cuMemGetHandleForAddressRange: a dma-buf of whole pages inside one
// device allocation; the fake's descriptor is a memfd whose first 16
// bytes say what was exported (address, length), for the test to check.
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t n, int type, unsigned long long flags) {
	NEED_CTX;
	struct alloc a = find(p);
	if (type != 1 || flags != 0 || !a.p || a.type != 2 || p % 4096 || n % 4096 || n == 0 || p + n > a.p + a.n)
		return INVALID_VALUE;
	int fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
	if (fd < 0) return 2;
	uint64_t what[2] = {p, n};
	if (write(fd, what, sizeof what) != sizeof what) { close(fd); return 2; }
	*(int *)handle = fd;
	return OK;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	NEED_CTX;
	struct alloc a = find(p);
	if (!a.p || a.type != 2 || a.p != p) return INVALID_VALUE;
	memcpy(h->reserved, &p, 8);
	for (int i = 8; i < 64; i++) h->reserved[i] = (unsigned char)(i * 37 + 11);
	return OK;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
	NEED_CTX;
	if (flags != 1) return INVALID_VALUE; // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
	for (int i = 8; i < 64; i++)
		if (h.reserved[i] != (unsigned char)(i * 37 + 11)) return INVALID_HANDLE;
	memcpy(p, h.reserved, 8);
	return OK;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) { NEED_CTX; return find(p).p ? OK : INVALID_VALUE; }

// Streams and events: "pending" counts the NOT_READY answers left.
struct stream { int pending; };
struct event { unsigned flags; int recorded, pending; };

static void touch(uintptr_t s) { if (s) ((struct stream *)s)->pending = 2; }

CUresult cuStreamCreate(uintptr_t *s, unsigned flags) {
	NEED_CTX;
	if (flags != 1) return INVALID_VALUE; // NON_BLOCKING
	*s = (uintptr_t)calloc(1, sizeof(struct stream));
	return OK;
}
CUresult cuStreamDestroy_v2(uintptr_t s) { NEED_CTX; free((void *)s); return OK; }
CUresult cuStreamQuery(uintptr_t s) {
	NEED_CTX;
	struct stream *st = (struct stream *)s;
	if (st && st->pending > 0) { st->pending--; return NOT_READY; }
	return OK;
}
CUresult cuStreamSynchronize(uintptr_t s) { NEED_CTX; if (s) ((struct stream *)s)->pending = 0; return OK; }
CUresult cuStreamWaitEvent(uintptr_t s, uintptr_t e, unsigned flags) {
	NEED_CTX;
	return e && flags == 0 ? OK : INVALID_HANDLE;
}

static uint64_t last_wait[4]; // stream, addr, value, flags

CUresult cuStreamWaitValue32_v2(uintptr_t s, CUdeviceptr addr, uint32_t v, unsigned flags) {
	NEED_CTX;
#ifdef FAKE_NO_MEMOPS
	return NOT_SUPPORTED;
#endif
	last_wait[0] = s, last_wait[1] = addr, last_wait[2] = v, last_wait[3] = flags;
	touch(s);
	return OK;
}

CUresult cuEventCreate(uintptr_t *e, unsigned flags) {
	NEED_CTX;
	struct event *ev = calloc(1, sizeof *ev);
	ev->flags = flags;
	*e = (uintptr_t)ev;
	return OK;
}
CUresult cuEventRecord(uintptr_t e, uintptr_t s) {
	NEED_CTX;
	struct event *ev = (struct event *)e;
	ev->recorded = 1;
	ev->pending = 2;
	(void)s;
	return OK;
}
CUresult cuEventQuery(uintptr_t e) {
	NEED_CTX;
	struct event *ev = (struct event *)e;
	if (ev->pending > 0) { ev->pending--; return NOT_READY; }
	return OK;
}
CUresult cuEventSynchronize(uintptr_t e) { NEED_CTX; ((struct event *)e)->pending = 0; return OK; }
CUresult cuEventElapsedTime(float *ms, uintptr_t a, uintptr_t b) {
	NEED_CTX;
	struct event *x = (struct event *)a, *y = (struct event *)b;
	if ((x->flags & 2) || (y->flags & 2) || !x->recorded || !y->recorded) return INVALID_HANDLE;
	if (x->pending || y->pending) return NOT_READY;
	*ms = 1.5f;
	return OK;
}
CUresult cuEventDestroy_v2(uintptr_t e) { NEED_CTX; free((void *)e); return OK; }

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, uintptr_t s) {
	NEED_CTX;
	memcpy((void *)(uintptr_t)d, h, n);
	touch(s);
	return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, uintptr_t s) {
	NEED_CTX;
	memcpy(h, (void *)(uintptr_t)d, n);
	touch(s);
	return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, uintptr_t s) {
	NEED_CTX;
	memmove((void *)(uintptr_t)d, (void *)(uintptr_t)src, n);
	touch(s);
	return OK;
}

// Modules: any NUL-terminated image loads, unless it contains
// FAKE_JIT_FAIL; the JIT options must be the error log's.
static size_t last_image_len;

CUresult cuModuleLoadDataEx(uintptr_t *m, const void *image, unsigned n, int *opts, void **vals) {
	NEED_CTX;
	char *log = NULL;
	size_t *logn = NULL;
	for (unsigned i = 0; i < n; i++) {
		if (opts[i] == 5) log = vals[i];
		if (opts[i] == 6) logn = (size_t *)&vals[i];
	}
	if (!log || !logn || *logn == 0) return INVALID_VALUE;
	last_image_len = strlen(image);
	if (strstr(image, "FAKE_JIT_FAIL")) {
		*logn = snprintf(log, *logn, "ptxas fatal   : fake: FAKE_JIT_FAIL in line 1") + 1;
		return INVALID_PTX;
	}
	*m = (uintptr_t)malloc(1);
	return OK;
}
CUresult cuModuleUnload(uintptr_t m) { NEED_CTX; free((void *)m); return OK; }

// A function handle is a copy of its name.
CUresult cuModuleGetFunction(uintptr_t *f, uintptr_t m, const char *name) {
	NEED_CTX;
	if (!m) return INVALID_HANDLE;
	*f = (uintptr_t)strdup(name);
	return OK;
}

// The last launch: grid and block dimensions, shared memory, stream, and
// the first six parameter values read as 8 bytes (4 for div).
static uint64_t launch_info[16];
static char launch_name[128];
static int launches;

#define P(i, T) (*(T *)params[i])

static float fop(const char *op, float a, float b) {
	if (!strcmp(op, "prod")) return a * b;
	if (!strcmp(op, "min")) return a < b ? a : b;
	if (!strcmp(op, "max")) return a > b ? a : b;
	return a + b; // sum
}

CUresult cuLaunchKernel(const char *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shm, uintptr_t s, void **params, void **extra) {
	NEED_CTX;
	if (!f || !params || extra) return INVALID_VALUE;
	launches++;
	snprintf(launch_name, sizeof launch_name, "%s", f);
	uint64_t info[16] = {gx, gy, gz, bx, by, bz, shm, s};
	const char *red = "goccl_reduce_", *post = "goccl_post_";
	if (!strcmp(f, "goccl_copy")) {
		unsigned char *dst = P(0, unsigned char *), *dst2 = P(1, unsigned char *), *src = P(2, unsigned char *);
		uint64_t n = P(3, uint64_t);
		info[8] = (uintptr_t)dst, info[9] = (uintptr_t)dst2, info[10] = (uintptr_t)src, info[11] = n;
		memcpy(dst, src, n);
		if (dst2) memcpy(dst2, src, n);
	} else if (!strncmp(f, red, strlen(red))) {
		float *dst = P(0, float *), *dst2 = P(1, float *), *a = P(2, float *), *b = P(3, float *);
		uint64_t n = P(4, uint64_t);
		uint32_t div = P(5, uint32_t);
		info[8] = (uintptr_t)dst, info[9] = (uintptr_t)dst2, info[10] = (uintptr_t)a, info[11] = (uintptr_t)b;
		info[12] = n, info[13] = div;
		const char *t = f + strlen(red);
		if (!strncmp(t, "f32_", 4)) {
			for (uint64_t i = 0; i < n; i++) {
				float r = fop(t + 4, a[i], b[i]);
				if (div > 1) r /= (float)div;
				dst[i] = r;
				if (dst2) dst2[i] = r;
			}
		}
	} else if (!strncmp(f, post, strlen(post))) {
		float *dst = P(0, float *), *src = P(1, float *);
		uint64_t n = P(2, uint64_t);
		uint32_t div = P(3, uint32_t);
		info[8] = (uintptr_t)dst, info[9] = (uintptr_t)src, info[10] = n, info[11] = div;
		if (!strcmp(f + strlen(post), "f32"))
			for (uint64_t i = 0; i < n; i++) dst[i] = div > 1 ? src[i] / (float)div : src[i];
	}
	memcpy(launch_info, info, sizeof info);
	touch(s);
	return OK;
}

// cuGetProcAddress_v2: base names to this library's versioned entries.
#ifndef FAKE_NO_PROCADDR
struct entry { const char *name; void *fn; };
#define E(base, fn) {base, (void *)fn}
static const struct entry table[] = {
	E("cuDeviceGetCount", cuDeviceGetCount), E("cuDeviceGet", cuDeviceGet),
	E("cuDeviceGetName", proc_name), E("cuDeviceGetAttribute", cuDeviceGetAttribute),
	E("cuDeviceTotalMem", cuDeviceTotalMem_v2), E("cuDeviceGetPCIBusId", cuDeviceGetPCIBusId),
	E("cuDeviceCanAccessPeer", cuDeviceCanAccessPeer),
	E("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain), E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2),
	E("cuCtxGetCurrent", cuCtxGetCurrent), E("cuCtxSetCurrent", cuCtxSetCurrent),
#ifndef FAKE_OMIT_MEMALLOC
	E("cuMemAlloc", cuMemAlloc_v2),
#endif
	E("cuMemFree", cuMemFree_v2), E("cuMemGetAddressRange", cuMemGetAddressRange_v2),
	E("cuMemHostAlloc", cuMemHostAlloc), E("cuMemFreeHost", cuMemFreeHost),
	E("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2),
	E("cuMemHostRegister", cuMemHostRegister_v2), E("cuMemHostUnregister", cuMemHostUnregister),
	E("cuPointerGetAttribute", cuPointerGetAttribute),
	E("cuMemGetHandleForAddressRange", cuMemGetHandleForAddressRange),
	E("cuIpcGetMemHandle", cuIpcGetMemHandle), E("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2),
	E("cuIpcCloseMemHandle", cuIpcCloseMemHandle),
	E("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2), E("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2),
	E("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2),
	E("cuStreamCreate", cuStreamCreate), E("cuStreamDestroy", cuStreamDestroy_v2),
	E("cuStreamQuery", cuStreamQuery), E("cuStreamSynchronize", cuStreamSynchronize),
	E("cuStreamWaitEvent", cuStreamWaitEvent), E("cuStreamWaitValue32", cuStreamWaitValue32_v2),
	E("cuEventCreate", cuEventCreate), E("cuEventRecord", cuEventRecord), E("cuEventQuery", cuEventQuery),
	E("cuEventSynchronize", cuEventSynchronize), E("cuEventElapsedTime", cuEventElapsedTime),
	E("cuEventDestroy", cuEventDestroy_v2),
	E("cuModuleLoadDataEx", cuModuleLoadDataEx), E("cuModuleGetFunction", cuModuleGetFunction),
	E("cuModuleUnload", cuModuleUnload), E("cuLaunchKernel", cuLaunchKernel),
	{NULL, NULL},
};

CUresult cuGetProcAddress_v2(const char *name, void **fn, int version, uint64_t flags, int *status) {
	size_t l = strlen(proc_log);
	snprintf(proc_log + l, sizeof proc_log - l, "%s@%d/%llu;", name, version, (unsigned long long)flags);
	for (const struct entry *e = table; e->name; e++)
		if (!strcmp(e->name, name)) {
			*fn = e->fn;
			if (status) *status = 0;
			return OK;
		}
	*fn = NULL;
	if (status) *status = 1; // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
	return NOT_FOUND;
}
#endif

// For the tests.
void fake_proc_log(char *buf, int n) { snprintf(buf, n, "%s", proc_log); }
void fake_last_launch(uint64_t *info, char *name, int n) {
	memcpy(info, launch_info, sizeof launch_info);
	snprintf(name, n, "%s", launch_name);
}
void fake_last_wait(uint64_t *w) { memcpy(w, last_wait, sizeof last_wait); }
uint64_t fake_last_image_len(void) { return last_image_len; }
int fake_ctx_refs(int dev) { return ctx_refs[dev]; }
