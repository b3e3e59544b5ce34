/* A stand-in for libcuda.so.1 that runs on a machine without a GPU, for plugrad-cuda's tests (test_cuda_standin.py).
 *
 * Compiled against the real cuda.h (the nvidia-cuda-runtime wheel's): every entry point is defined with the name and
 * prototype the header declares, so the C compiler rejects a definition whose parameter count or types differ from
 * the header's, and the exported symbols are the ones the header maps the names to (cuMemAlloc -> cuMemAlloc_v2).
 * At run time each entry point checks the kinds of its arguments' values: a handle must be a live handle of the kind
 * the parameter names (a stream where a CUstream goes, an event where a CUevent goes), a device pointer must lie in a
 * live allocation, flags must be the ones plugrad passes. Device memory is host memory (mmap'd, reserved lazily, so a
 * 5 GiB allocation costs nothing until touched); streams run synchronously; events hold a host timestamp.
 *
 * Kernels: cuModuleLoadData takes any cubin (ELF) or PTX image, and a launch runs one of the stand-in's own kernels,
 * found by the function's name (pg_add, pg_add_n below); launching any other kernel is
 * CUDA_ERROR_NOT_SUPPORTED. Graph nodes copy their argument values when added or set, as the driver does.
 *
 * Every call is appended to a log (standin_log) as "name value value ...", so tests can assert on the sequence. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum kind { K_FREE, K_CTX, K_STREAM, K_EVENT, K_MODULE, K_FUNC, K_GRAPH, K_NODE, K_EXEC };
enum kernel_id { KERNEL_NONE, KERNEL_ADD, KERNEL_ADD_N };
#define MAX_ARGS 4
#define MAX_NODES 256

typedef struct { unsigned g[3], b[3], shared; enum kernel_id kernel; uint64_t args[MAX_ARGS]; } launch_t;
typedef struct handle {
  enum kind kind;
  double stamp; int recorded;                      /* events */
  char name[128]; enum kernel_id kernel; int max_shared;  /* functions */
  struct handle *graph; launch_t node;             /* graph nodes (graph: the graph that owns the node) */
  struct handle *nodes[MAX_NODES]; launch_t launches[MAX_NODES]; int nnodes;  /* graphs and graph execs */
} handle_t;

#define MAX_HANDLES 4096
static handle_t *handles[MAX_HANDLES];
typedef struct { uintptr_t base; size_t size; int host; } alloc_t;
#define MAX_ALLOCS 4096
static alloc_t allocs[MAX_ALLOCS];
static int initialized;

static char *log_buf; static size_t log_len, log_cap;
static void logf_(const char *fmt, ...) {
  char line[512];
  va_list ap; va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof line) n = sizeof line - 1;
  if (log_len + n + 2 > log_cap) { log_cap = (log_cap + n + 2) * 2; log_buf = realloc(log_buf, log_cap); }
  memcpy(log_buf + log_len, line, n); log_len += n; log_buf[log_len++] = '\n'; log_buf[log_len] = 0;
}
const char *standin_log(void) { return log_buf ? log_buf : ""; }
void standin_log_clear(void) { log_len = 0; if (log_buf) log_buf[0] = 0; }
/* the size the last cuMemAlloc was asked for (what a 32-bit path would have truncated) */
static size_t last_alloc_size;
size_t standin_last_alloc_size(void) { return last_alloc_size; }

static handle_t *new_handle(enum kind k) {
  for (int i = 0; i < MAX_HANDLES; i++) if (!handles[i]) {
    handle_t *h = calloc(1, sizeof *h);
    h->kind = k; handles[i] = h; return h;
  }
  return NULL;
}
/* the handle `p` when it is a live one of kind `k`, else NULL (never dereferences an unknown pointer) */
static handle_t *as(const void *p, enum kind k) {
  if (!p) return NULL;
  for (int i = 0; i < MAX_HANDLES; i++) if (handles[i] == p) return handles[i]->kind == k ? handles[i] : NULL;
  return NULL;
}
static void drop(handle_t *h) {
  for (int i = 0; i < MAX_HANDLES; i++) if (handles[i] == h) { handles[i] = NULL; free(h); return; }
}
/* the allocation [p, p + n) lies in (device: host == 0), or NULL */
static alloc_t *inside(uintptr_t p, size_t n, int host) {
  for (int i = 0; i < MAX_ALLOCS; i++) {
    alloc_t *a = &allocs[i];
    if (a->size && a->host == host && p >= a->base && p + n <= a->base + a->size && p + n >= p) return a;
  }
  return NULL;
}
static CUresult map_alloc(uintptr_t *out, size_t size, int host) {
  for (int i = 0; i < MAX_ALLOCS; i++) if (!allocs[i].size) {
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    allocs[i] = (alloc_t){(uintptr_t)m, size, host};
    *out = (uintptr_t)m;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int stream_ok(CUstream s) { return s == NULL || as(s, K_STREAM) != NULL; }
#define NEED_INIT() do { if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

/* ---- errors, init, devices, contexts, streams */

static const char *names[][2] = {
  {"CUDA_SUCCESS", "no error"}, {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"}, {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
};
CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: case CUDA_ERROR_INVALID_VALUE: case CUDA_ERROR_OUT_OF_MEMORY: case CUDA_ERROR_NOT_INITIALIZED:
      *pStr = names[error][0]; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *pStr = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_IMAGE: *pStr = "CUDA_ERROR_INVALID_IMAGE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_HANDLE: *pStr = "CUDA_ERROR_INVALID_HANDLE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *pStr = "CUDA_ERROR_NOT_FOUND"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_SUPPORTED: *pStr = "CUDA_ERROR_NOT_SUPPORTED"; return CUDA_SUCCESS;
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  *pStr = error <= CUDA_ERROR_NOT_INITIALIZED ? names[error][1] : "stand-in error";
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuInit(unsigned int Flags) {
  logf_("cuInit %u", Flags);
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;  /* the header: Flags must be 0 */
  initialized = 1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
  if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = CUDA_VERSION;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetCount(int *count) { NEED_INIT(); if (!count) return CUDA_ERROR_INVALID_VALUE; *count = 1; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  NEED_INIT();
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
  NEED_INIT();
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "plugrad CUDA stand-in (no GPU)");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  NEED_INIT();
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (attrib == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) *pi = 9;
  else if (attrib == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) *pi = 0;
  else return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
static handle_t *primary;
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!primary) primary = new_handle(K_CTX);
  *pctx = (CUcontext)primary;
  logf_("cuDevicePrimaryCtxRetain %d", dev);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) { NEED_INIT(); return ctx && !as(ctx, K_CTX) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS; }
CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  NEED_INIT();
  if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  *phStream = (CUstream)new_handle(K_STREAM);
  logf_("cuStreamCreate %u", Flags);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) { NEED_INIT(); return stream_ok(hStream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

/* ---- memory */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  NEED_INIT();
  logf_("cuMemAlloc_v2 %zu", bytesize);
  if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  last_alloc_size = bytesize;
  uintptr_t p;
  CUresult r = map_alloc(&p, bytesize, 0);
  if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)p;
  return r;
}
CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
  NEED_INIT();
  logf_("cuMemFree_v2 %llu", (unsigned long long)dptr);
  for (int i = 0; i < MAX_ALLOCS; i++) if (allocs[i].size && !allocs[i].host && allocs[i].base == dptr) {
    munmap((void *)allocs[i].base, allocs[i].size);
    allocs[i].size = 0;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;  /* not the start of a live allocation */
}
CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  NEED_INIT();
  logf_("cuMemHostAlloc %zu %u", bytesize, Flags);
  if (!pp || bytesize == 0 || Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
    return CUDA_ERROR_INVALID_VALUE;
  uintptr_t p;
  CUresult r = map_alloc(&p, bytesize, 1);
  if (r == CUDA_SUCCESS) *pp = (void *)p;
  return r;
}
CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) {
  NEED_INIT();
  logf_("cuMemcpyHtoDAsync_v2 %llu %zu", (unsigned long long)dstDevice, ByteCount);
  if (!stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  if (!srcHost || !inside(dstDevice, ByteCount, 0)) return CUDA_ERROR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  NEED_INIT();
  logf_("cuMemcpyDtoHAsync_v2 %llu %zu", (unsigned long long)srcDevice, ByteCount);
  if (!stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  if (!dstHost || !inside(srcDevice, ByteCount, 0)) return CUDA_ERROR_INVALID_VALUE;
  memcpy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                                   size_t ByteCount, CUstream hStream) {
  NEED_INIT();
  logf_("cuMemcpyPeerAsync %llu %llu %zu", (unsigned long long)dstDevice, (unsigned long long)srcDevice, ByteCount);
  if (!as(dstContext, K_CTX) || !as(srcContext, K_CTX)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  if (!inside(dstDevice, ByteCount, 0) || !inside(srcDevice, ByteCount, 0)) return CUDA_ERROR_INVALID_VALUE;
  memmove((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
  return CUDA_SUCCESS;
}

/* ---- events */

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  NEED_INIT();
  if (!phEvent || Flags != CU_EVENT_DEFAULT) return CUDA_ERROR_INVALID_VALUE;  /* plugrad times with default events */
  *phEvent = (CUevent)new_handle(K_EVENT);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  NEED_INIT();
  logf_("cuEventRecord");
  handle_t *e = as(hEvent, K_EVENT);
  if (!e || !stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  e->stamp = now(); e->recorded = 1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  NEED_INIT();
  logf_("cuEventSynchronize");
  return as(hEvent, K_EVENT) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
  NEED_INIT();
  logf_("cuEventElapsedTime_v2");
  handle_t *s = as(hStart, K_EVENT), *e = as(hEnd, K_EVENT);
  if (!pMilliseconds) return CUDA_ERROR_INVALID_VALUE;
  if (!s || !e || !s->recorded || !e->recorded) return CUDA_ERROR_INVALID_HANDLE;
  *pMilliseconds = (float)((e->stamp - s->stamp) * 1e3);
  return CUDA_SUCCESS;
}

/* ---- modules, functions, launches */

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
  NEED_INIT();
  if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
  const char *img = image;
  if (memcmp(img, "\x7f" "ELF", 4) != 0 && !strstr(img, ".entry")) return CUDA_ERROR_INVALID_IMAGE;  /* a cubin or PTX */
  *module = (CUmodule)new_handle(K_MODULE);
  logf_("cuModuleLoadData");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  NEED_INIT();
  if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
  if (!as(hmod, K_MODULE)) return CUDA_ERROR_INVALID_HANDLE;
  handle_t *f = new_handle(K_FUNC);
  snprintf(f->name, sizeof f->name, "%s", name);
  f->kernel = !strcmp(name, "pg_add") ? KERNEL_ADD : !strcmp(name, "pg_add_n") ? KERNEL_ADD_N : KERNEL_NONE;
  f->max_shared = 48 << 10;
  *hfunc = (CUfunction)f;
  logf_("cuModuleGetFunction %s", name);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  NEED_INIT();
  logf_("cuFuncSetAttribute %d %d", (int)attrib, value);
  handle_t *f = as(hfunc, K_FUNC);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES || value < 0 || value > 227 << 10) return CUDA_ERROR_INVALID_VALUE;
  f->max_shared = value;
  return CUDA_SUCCESS;
}

static int nargs_of(enum kernel_id k) { return k == KERNEL_ADD ? 3 : k == KERNEL_ADD_N ? 4 : 0; }
/* a launch's description with its argument values copied out of kernelParams (each parameter's size: the kernel's) */
static CUresult describe(launch_t *out, handle_t *f, const unsigned g[3], const unsigned b[3], unsigned shared, void **params) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (f->kernel == KERNEL_NONE) return CUDA_ERROR_NOT_SUPPORTED;  /* the stand-in cannot run real device code */
  for (int i = 0; i < 3; i++) if (!g[i] || !b[i]) return CUDA_ERROR_INVALID_VALUE;
  if ((unsigned long)b[0] * b[1] * b[2] > 1024 || shared > (unsigned)f->max_shared) return CUDA_ERROR_INVALID_VALUE;
  if (!params) return CUDA_ERROR_INVALID_VALUE;
  *out = (launch_t){{g[0], g[1], g[2]}, {b[0], b[1], b[2]}, shared, f->kernel, {0}};
  for (int i = 0; i < nargs_of(f->kernel); i++) {
    if (!params[i]) return CUDA_ERROR_INVALID_VALUE;
    if (f->kernel == KERNEL_ADD_N && i == 3) out->args[i] = (uint64_t)(int64_t)*(int32_t *)params[i];
    else out->args[i] = *(uint64_t *)params[i];
  }
  return CUDA_SUCCESS;
}
static CUresult run(const launch_t *l) {
  size_t threads = (size_t)l->g[0] * l->g[1] * l->g[2] * l->b[0] * l->b[1] * l->b[2];
  size_t n = l->kernel == KERNEL_ADD_N && (int64_t)l->args[3] < (int64_t)threads ? (size_t)(int64_t)l->args[3] : threads;
  for (int i = 0; i < 3; i++) if (!inside(l->args[i], n * sizeof(float), 0)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  float *out = (float *)(uintptr_t)l->args[0];
  const float *a = (const float *)(uintptr_t)l->args[1], *b = (const float *)(uintptr_t)l->args[2];
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
  NEED_INIT();
  handle_t *fn = as(f, K_FUNC);
  logf_("cuLaunchKernel %s %u %u %u %u %u %u %u", fn ? fn->name : "?", gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
        sharedMemBytes);
  if (!stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  if (extra) return CUDA_ERROR_INVALID_VALUE;  /* plugrad passes its arguments by kernelParams only */
  unsigned g[3] = {gridDimX, gridDimY, gridDimZ}, b[3] = {blockDimX, blockDimY, blockDimZ};
  launch_t l;
  CUresult r = describe(&l, fn, g, b, sharedMemBytes, kernelParams);
  return r != CUDA_SUCCESS ? r : run(&l);
}

/* ---- graphs */

CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
  NEED_INIT();
  if (!phGraph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *phGraph = (CUgraph)new_handle(K_GRAPH);
  logf_("cuGraphCreate");
  return CUDA_SUCCESS;
}
static CUresult node_launch(launch_t *out, const CUDA_KERNEL_NODE_PARAMS *p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (p->extra || p->kern || p->ctx) return CUDA_ERROR_INVALID_VALUE;  /* plugrad sets func and kernelParams only */
  unsigned g[3] = {p->gridDimX, p->gridDimY, p->gridDimZ}, b[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  return describe(out, as(p->func, K_FUNC), g, b, p->sharedMemBytes, p->kernelParams);
}
CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies,
                                      const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
  NEED_INIT();
  logf_("cuGraphAddKernelNode_v2 %zu", numDependencies);
  handle_t *g = as(hGraph, K_GRAPH);
  if (!g) return CUDA_ERROR_INVALID_HANDLE;
  if (!phGraphNode || (numDependencies && !dependencies) || g->nnodes == MAX_NODES) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < numDependencies; i++) {
    handle_t *d = as(dependencies[i], K_NODE);
    if (!d || d->graph != g) return CUDA_ERROR_INVALID_VALUE;  /* a dependency must be a node of this graph */
  }
  launch_t l;
  CUresult r = node_launch(&l, nodeParams);
  if (r != CUDA_SUCCESS) return r;
  handle_t *n = new_handle(K_NODE);
  n->graph = g; n->node = l;
  g->nodes[g->nnodes++] = n;  /* dependencies exist before a node, so creation order is a topological order */
  *phGraphNode = (CUgraphNode)n;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
  NEED_INIT();
  logf_("cuGraphInstantiateWithFlags %llu", flags);
  handle_t *g = as(hGraph, K_GRAPH);
  if (!g) return CUDA_ERROR_INVALID_HANDLE;
  if (!phGraphExec || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  handle_t *x = new_handle(K_EXEC);
  x->nnodes = g->nnodes;
  for (int i = 0; i < g->nnodes; i++) { x->nodes[i] = g->nodes[i]; x->launches[i] = g->nodes[i]->node; }
  *phGraphExec = (CUgraphExec)x;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
  NEED_INIT();
  logf_("cuGraphExecKernelNodeSetParams_v2");
  handle_t *x = as(hGraphExec, K_EXEC), *n = as(hNode, K_NODE);
  if (!x || !n) return CUDA_ERROR_INVALID_HANDLE;
  for (int i = 0; i < x->nnodes; i++) if (x->nodes[i] == n) return node_launch(&x->launches[i], nodeParams);
  return CUDA_ERROR_INVALID_VALUE;  /* not a node of the graph this exec was instantiated from */
}
CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  NEED_INIT();
  handle_t *x = as(hGraphExec, K_EXEC);
  logf_("cuGraphLaunch %d", x ? x->nnodes : -1);
  if (!x || !stream_ok(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  for (int i = 0; i < x->nnodes; i++) { CUresult r = run(&x->launches[i]); if (r != CUDA_SUCCESS) return r; }
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  handle_t *x = as(hGraphExec, K_EXEC);
  logf_("cuGraphExecDestroy");
  if (!x) return CUDA_ERROR_INVALID_HANDLE;
  drop(x);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  handle_t *g = as(hGraph, K_GRAPH);
  logf_("cuGraphDestroy");
  if (!g) return CUDA_ERROR_INVALID_HANDLE;
  for (int i = 0; i < g->nnodes; i++) drop(g->nodes[i]);
  drop(g);
  return CUDA_SUCCESS;
}
