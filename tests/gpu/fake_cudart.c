/* A stand-in CUDA runtime for dry runs of tests/gpu/run.sh's CLI steps on a machine without a
 * GPU: the entry points ckpt's CUDA engine binds (src/device/cuda_runtime.h), over host memory,
 * every copy synchronous, one device of 64 GiB. Not a GPU: its timings mean nothing.
 *   cc -O2 -shared -fPIC -o build/libfakecudart.so tests/gpu/fake_cudart.c
 *   CKPT_CUDART=$PWD/build/libfakecudart.so build/ckpt load FILE --device cuda:0 --digest */
#include <stdlib.h>
#include <string.h>

static __thread int current, pending;
static const size_t total = (size_t)64 << 30;

int cudaGetDeviceCount(int* n) { *n = 1; return 0; }
int cudaGetDevice(int* d) { *d = current; return 0; }
int cudaSetDevice(int d) { if (d != 0) return pending = 101; current = d; return 0; }
int cudaGetLastError(void) { int e = pending; pending = 0; return e; }
int cudaMalloc(void** p, size_t n) { *p = aligned_alloc(256, (n + 255) / 256 * 256); return *p ? 0 : (pending = 2); }
int cudaFree(void* p) { free(p); return 0; }
int cudaHostAlloc(void** p, size_t n, unsigned f) { (void)f; return cudaMalloc(p, n); }
int cudaFreeHost(void* p) { free(p); return 0; }
int cudaStreamCreateWithFlags(void** s, unsigned f) { (void)f; *s = malloc(1); return 0; }
int cudaStreamDestroy(void* s) { free(s); return 0; }
int cudaStreamSynchronize(void* s) { (void)s; return 0; }
int cudaMemcpy(void* d, const void* s, size_t n, int k) { (void)k; memcpy(d, s, n); return 0; }
int cudaMemcpyAsync(void* d, const void* s, size_t n, int k, void* st) { (void)st; return cudaMemcpy(d, s, n, k); }
int cudaEventCreateWithFlags(void** e, unsigned f) { (void)f; *e = malloc(1); return 0; }
int cudaEventRecord(void* e, void* s) { (void)e; (void)s; return 0; }
int cudaEventSynchronize(void* e) { (void)e; return 0; }
int cudaEventDestroy(void* e) { free(e); return 0; }
int cudaMemGetInfo(size_t* f, size_t* t) { *f = total; *t = total; return 0; }
int cudaRuntimeGetVersion(int* v) { *v = 13000; return 0; }
const char* cudaGetErrorString(int e) { return e == 2 ? "out of memory (fake runtime)" : "error (fake runtime)"; }
