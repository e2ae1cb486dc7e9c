// A probe of the in-kernel all-reduce's latency (patch 0007's decode path) on one GPU. GGML_CUDA_DEVICES gives each
// virtual device its own streams of the one context, so n streams stand for n virtual devices here: one kernel per
// stream per call, the calls back to back, as test-bridge-allreduce --bench times them. Variants:
//   empty   the kernels alone: the floor that n launches per call set
//   meet    the meeting alone: every block fences, writes its flag and polls the others' (no data)
//   gather  patch 0007's in-kernel path: stage the tensor in mapped host memory, meet, read every other's, sum
//   ll      the flags inside the data (NCCL's LL protocol): every 8 bytes carry 4 of data and the call's token, no
//           fence, no flag, the readers poll the data itself; twice the bytes over the link
//   empty-small   empty kernels with one 4-byte argument instead of the 160 bytes above: what the arguments cost
//   gather-ptr    gather with the slot's addresses read from device memory (a 40-byte argument list)
// Sums are left to right here (the order does not change the timing); ll's and gather-ptr's results are checked
// against gather's.
// Build and run (the lent machine has nvcc):  nvcc -O3 -arch=sm_90 -o /tmp/probe allreduce-latency.cu && /tmp/probe
//   [ITERS (400)] [ROUNDS (5)]
// Output: one line per variant, device count and size: per-call wall and host-enqueue medians over the rounds.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                                          \
    do {                                                                                                  \
        cudaError_t err_ = (x);                                                                           \
        if (err_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));                 \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

constexpr int MAXN      = 8;
constexpr int THREADS   = 256;
constexpr int MAXBLOCKS = 8;
constexpr int STRIDE    = 16;              // ints between flags: a 64-byte line each
constexpr size_t SLOT   = (size_t) 256 << 10;  // bytes of data per rank and slot (ll: twice that)

enum mode_t_ { EMPTY, MEET, GATHER, LL, EMPTY_SMALL, GATHER_PTR, N_MODES };
static const char * mode_names[N_MODES] = { "empty", "meet", "gather", "ll", "empty-small", "gather-ptr" };

struct probe_args {
    float * stage[MAXN];
    uint4 * ll[MAXN];
    int *   flags;
};

static __device__ __forceinline__ void meet(int * flags, const int n, const int rank, const int token) {
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        *(volatile int *) (flags + (rank * MAXBLOCKS + blockIdx.x) * STRIDE) = token;
    }
    if ((int) threadIdx.x < n && (int) threadIdx.x != rank) {
        const volatile int * other = flags + ((int) threadIdx.x * MAXBLOCKS + blockIdx.x) * STRIDE;
        while (*other != token) {
            __nanosleep(32);
        }
        __threadfence_system();
    }
    __syncthreads();
}

static __device__ __forceinline__ void st_volatile(uint4 * p, const uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

static __device__ __forceinline__ uint4 ld_volatile(const uint4 * p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

static __global__ void probe_small(const unsigned token) {
    (void) token;
}

template <int mode>
static __device__ __forceinline__ void probe_body(float * data, const probe_args & a, const int n, const int rank,
                                                  const int count, const unsigned token) {
    if (mode == EMPTY) {
        return;
    }
    if (mode == MEET) {
        meet(a.flags, n, rank, (int) token);
        return;
    }
    const int gnt   = gridDim.x * blockDim.x;
    const int first = blockIdx.x * blockDim.x + threadIdx.x;
    const int nvec  = count / 4;
    float4 * d4 = (float4 *) data;
    if (mode == GATHER) {
        float4 * mine = (float4 *) a.stage[rank];
        for (int i = first; i < nvec; i += gnt) {
            mine[i] = d4[i];
        }
        meet(a.flags, n, rank, (int) token);
        for (int i = first; i < nvec; i += gnt) {
            float4 v[MAXN];
#pragma unroll
            for (int k = 0; k < MAXN; ++k) {
                if (k < n) {
                    v[k] = k == rank ? d4[i] : __ldcv((const float4 *) a.stage[k] + i);
                }
            }
            float4 s = v[0];
#pragma unroll
            for (int k = 1; k < MAXN; ++k) {
                if (k < n) {
                    s.x += v[k].x; s.y += v[k].y; s.z += v[k].z; s.w += v[k].w;
                }
            }
            d4[i] = s;
        }
        return;
    }
    // LL: vector i goes as two 16-byte stores {x, token, y, token}, {z, token, w, token}
    uint4 * mine = a.ll[rank];
    for (int i = first; i < nvec; i += gnt) {
        const float4 x = d4[i];
        st_volatile(mine + 2 * i,     make_uint4(__float_as_uint(x.x), token, __float_as_uint(x.y), token));
        st_volatile(mine + 2 * i + 1, make_uint4(__float_as_uint(x.z), token, __float_as_uint(x.w), token));
    }
    for (int i = first; i < nvec; i += gnt) {
        uint4 lo[MAXN], hi[MAXN];
#pragma unroll
        for (int k = 0; k < MAXN; ++k) {
            if (k < n && k != rank) {
                lo[k] = ld_volatile(a.ll[k] + 2 * i);
                hi[k] = ld_volatile(a.ll[k] + 2 * i + 1);
            }
        }
#pragma unroll
        for (int k = 0; k < MAXN; ++k) {
            if (k < n && k != rank) {
                while (lo[k].y != token || lo[k].w != token) {
                    lo[k] = ld_volatile(a.ll[k] + 2 * i);
                }
                while (hi[k].y != token || hi[k].w != token) {
                    hi[k] = ld_volatile(a.ll[k] + 2 * i + 1);
                }
            }
        }
        const float4 own = d4[i];
        float4 s = rank == 0 ? own : make_float4(__uint_as_float(lo[0].x), __uint_as_float(lo[0].z),
                                                 __uint_as_float(hi[0].x), __uint_as_float(hi[0].z));
#pragma unroll
        for (int k = 1; k < MAXN; ++k) {
            if (k < n) {
                const float4 v = k == rank ? own : make_float4(__uint_as_float(lo[k].x), __uint_as_float(lo[k].z),
                                                               __uint_as_float(hi[k].x), __uint_as_float(hi[k].z));
                s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
            }
        }
        d4[i] = s;
    }
}

template <int mode>
static __global__ void probe_kernel(float * data, const probe_args a, const int n, const int rank, const int count,
                                    const unsigned token) {
    probe_body<mode>(data, a, n, rank, count, token);
}

static __global__ void probe_gather_ptr(float * data, const probe_args * __restrict__ a, const int n, const int rank,
                                        const int count, const unsigned token) {
    probe_body<GATHER>(data, *a, n, rank, count, token);
}

struct group {
    int n = 0;
    cudaStream_t stream[MAXN] = {};
    float * data[MAXN] = {};
    unsigned char * host = nullptr;  // mapped: [slot][rank] gather staging, [slot][rank] ll staging, [slot] flags
    unsigned char * dev  = nullptr;
    probe_args args[2] = {};          // per slot
    probe_args * dargs = nullptr;     // the same in device memory
    unsigned token = 0;
    unsigned long long calls = 0;
};

static size_t host_bytes(const int n) {
    return 2 * ((size_t) n * SLOT + (size_t) n * 2 * SLOT + (size_t) n * MAXBLOCKS * STRIDE * sizeof(int));
}

static void call(group & g, const int mode, const int count) {
    const int slot = (int) (g.calls++ % 2);
    g.token = g.token + 1 == 0 ? 1 : g.token + 1;
    const probe_args & a = g.args[slot];
    const int blocks = std::max(1, std::min(MAXBLOCKS, (count / 4 + THREADS - 1) / THREADS));
    for (int r = 0; r < g.n; ++r) {
        switch (mode) {
            case EMPTY:  probe_kernel<EMPTY><<<blocks, THREADS, 0, g.stream[r]>>>(g.data[r], a, g.n, r, count, g.token); break;
            case MEET:   probe_kernel<MEET><<<blocks, THREADS, 0, g.stream[r]>>>(g.data[r], a, g.n, r, count, g.token); break;
            case GATHER: probe_kernel<GATHER><<<blocks, THREADS, 0, g.stream[r]>>>(g.data[r], a, g.n, r, count, g.token); break;
            case LL:     probe_kernel<LL><<<blocks, THREADS, 0, g.stream[r]>>>(g.data[r], a, g.n, r, count, g.token); break;
            case EMPTY_SMALL: probe_small<<<blocks, THREADS, 0, g.stream[r]>>>(g.token); break;
            default:     probe_gather_ptr<<<blocks, THREADS, 0, g.stream[r]>>>(g.data[r], g.dargs + slot, g.n, r, count, g.token); break;
        }
    }
    CHECK(cudaGetLastError());
}

static void sync(group & g) {
    for (int r = 0; r < g.n; ++r) {
        CHECK(cudaStreamSynchronize(g.stream[r]));
    }
}

static void fill(group & g, const int count) {
    std::vector<float> v(count);
    for (int r = 0; r < g.n; ++r) {
        for (int i = 0; i < count; ++i) {
            v[i] = (float) ((i * 7 + r * 13) % 97) * 0.25f;  // exact in F32: every order gives the same sum
        }
        CHECK(cudaMemcpy(g.data[r], v.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    }
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int main(int argc, char ** argv) {
    const int iters  = argc > 1 ? atoi(argv[1]) : 400;
    const int rounds = argc > 2 ? atoi(argv[2]) : 5;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, iters=%d rounds=%d, arguments %zu bytes, CUDA_DEVICE_MAX_CONNECTIONS=%s\n", prop.name, iters, rounds,
           sizeof(float *) + sizeof(probe_args) + 4 * sizeof(int),
           getenv("CUDA_DEVICE_MAX_CONNECTIONS") ? getenv("CUDA_DEVICE_MAX_CONNECTIONS") : "(default)");
    const int counts[] = { 2048, 8192 };
    for (int n = 2; n <= 6; ++n) {
        group g;
        g.n = n;
        for (int r = 0; r < n; ++r) {
            CHECK(cudaStreamCreateWithFlags(&g.stream[r], cudaStreamNonBlocking));
            CHECK(cudaMalloc(&g.data[r], SLOT));
        }
        CHECK(cudaHostAlloc((void **) &g.host, host_bytes(n), cudaHostAllocPortable | cudaHostAllocMapped));
        memset(g.host, 0, host_bytes(n));
        CHECK(cudaHostGetDevicePointer((void **) &g.dev, g.host, 0));
        for (int slot = 0; slot < 2; ++slot) {
            unsigned char * base = g.dev + slot * (host_bytes(n) / 2);
            for (int k = 0; k < n; ++k) {
                g.args[slot].stage[k] = (float *) (base + (size_t) k * SLOT);
                g.args[slot].ll[k]    = (uint4 *) (base + (size_t) n * SLOT + (size_t) k * 2 * SLOT);
            }
            g.args[slot].flags = (int *) (base + (size_t) n * 3 * SLOT);
        }
        CHECK(cudaMalloc(&g.dargs, sizeof(g.args)));
        CHECK(cudaMemcpy(g.dargs, g.args, sizeof(g.args), cudaMemcpyHostToDevice));
        for (const int count : counts) {
            // ll and gather-ptr against gather: the same sums (exact inputs)
            std::vector<float> want(count), got(count);
            fill(g, count); call(g, GATHER, count); sync(g);
            CHECK(cudaMemcpy(want.data(), g.data[n - 1], count * sizeof(float), cudaMemcpyDeviceToHost));
            bool same[N_MODES] = {};
            for (const int m : { LL, GATHER_PTR }) {
                fill(g, count); call(g, m, count); sync(g);
                CHECK(cudaMemcpy(got.data(), g.data[n - 1], count * sizeof(float), cudaMemcpyDeviceToHost));
                same[m] = memcmp(want.data(), got.data(), count * sizeof(float)) == 0;
            }
            std::vector<double> wall[N_MODES], host[N_MODES];
            for (int round = 0; round < rounds; ++round) {
                for (int m = 0; m < N_MODES; ++m) {
                    fill(g, count);  // values stay small: the probe times, the check above compares
                    for (int i = 0; i < 20; ++i) {
                        call(g, m, count);
                    }
                    sync(g);
                    const auto t0 = std::chrono::steady_clock::now();
                    for (int i = 0; i < iters; ++i) {
                        call(g, m, count);
                    }
                    const auto t1 = std::chrono::steady_clock::now();
                    sync(g);
                    const auto t2 = std::chrono::steady_clock::now();
                    wall[m].push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / iters);
                    host[m].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
                }
            }
            for (int m = 0; m < N_MODES; ++m) {
                printf("probe: devices=%d bytes=%d mode=%s us_median=%.2f us_min=%.2f host_us_median=%.2f%s\n", n,
                       count * 4, mode_names[m], median(wall[m]), *std::min_element(wall[m].begin(), wall[m].end()),
                       median(host[m]), m == LL || m == GATHER_PTR ? (same[m] ? " check=same" : " check=DIFFERENT") : "");
            }
            fflush(stdout);
        }
        for (int r = 0; r < n; ++r) {
            CHECK(cudaStreamDestroy(g.stream[r]));
            CHECK(cudaFree(g.data[r]));
        }
        CHECK(cudaFreeHost(g.host));
        CHECK(cudaFree(g.dargs));
    }
    return 0;
}
