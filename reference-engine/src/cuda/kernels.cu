// The reference engine's CUDA kernels, compiled at run time with NVRTC.
//
// They compute what the CPU kernels compute (kernels/ops.rs, kernels/gemm.rs), operation
// for operation. The program is compiled with --fmad=false, so no product and sum is ever
// contracted behind our back: every fused multiply-add below is an explicit fmaf, every
// other product or sum is rounded on its own, divisions and square roots are IEEE (prec-div,
// prec-sqrt), denormals are kept (no ftz). A reduction that the CPU takes in a fixed order
// is taken here in the same order; only maxima (which do not depend on order) are taken in
// parallel. No kernel splits a reduction over blocks or uses atomics, so a row's result does
// not depend on the other rows of the batch.
//
// No headers: NVRTC compiles this alone (f16/bf16 conversions are PTX cvt instructions).

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned long long u64;

// ---- element-wise functions, as in kernels/ops.rs -------------------------------------

// e^x from plain f32 operations: ops::exp (Cody-Waite reduction, Cephes polynomial).
__device__ __forceinline__ float sw_exp(float x) {
    // f32::clamp: NaN passes through
    if (x < -87.33654f) x = -87.33654f;
    if (x > 88.0f) x = 88.0f;
    float n = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.6933594f;
    r = r - n * -2.1219444e-4f;
    float z = r * r;
    float p = 1.9875691e-4f;
    p = p * r + 1.3981999e-3f;
    p = p * r + 8.333452e-3f;
    p = p * r + 4.1665796e-2f;
    p = p * r + 1.6666665e-1f;
    p = p * r + 0.5f;
    float y = p * z + r + 1.0f;
    int e = ((int)n + 127) << 23;
    return y * __int_as_float(e);
}

__device__ __forceinline__ float sw_silu(float x) {
    return x * (1.0f / (1.0f + sw_exp(-x)));
}

__device__ __forceinline__ float round_f16(float x) {
    unsigned short h;
    float y;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(h));
    return y;
}

__device__ __forceinline__ float round_bf16(float x) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return __int_as_float(((int)h) << 16);
}

// ---- block reductions ----------------------------------------------------------------

// Σ x[i]² as ops::dot(x, x): element i accumulated in lane i % 16 with fmaf in index order,
// then lanes summed l[i] += l[i + h] for h = 8, 4, 2, 1. Every thread of the block calls it;
// `lanes` is 16 floats of shared memory. Returns the sum to every thread.
__device__ float sum_squares(const float* x, int n, float* lanes) {
    int t = threadIdx.x;
    if (t < 16) {
        float acc = 0.0f;
        for (int i = t; i < n; i += 16) acc = fmaf(x[i], x[i], acc);
        lanes[t] = acc;
    }
    __syncthreads();
    if (t == 0) {
        for (int h = 8; h >= 1; h >>= 1)
            for (int i = 0; i < h; i++) lanes[i] = lanes[i] + lanes[i + h];
    }
    __syncthreads();
    float s = lanes[0];
    __syncthreads();
    return s;
}

// ops::rms_norm: out[i] = w[i] * (x[i] * r), r = 1 / sqrt(ss / n + eps). `out` may be `x`.
__device__ void rms_norm_block(const float* x, const float* w, float eps, int n, float* out,
                               float* lanes) {
    float ss = sum_squares(x, n, lanes);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = w[i] * (x[i] * r);
    __syncthreads();
}

// requant::quantize_activations_q8 on one block of up to 32 values (d = amax / 127,
// q = round(x / d) clamped to ±127, value q * d; all zero when d is 0 or not finite).
// Called by one thread.
__device__ void quantize_q8_block(float* v, int len) {
    float amax = 0.0f;
    for (int i = 0; i < len; i++) amax = fmaxf(amax, fabsf(v[i]));
    float d = amax / 127.0f;
    if (d == 0.0f || !isfinite(d)) {
        for (int i = 0; i < len; i++) v[i] = 0.0f;
        return;
    }
    float id = 1.0f / d;
    for (int i = 0; i < len; i++) {
        float q = roundf(v[i] * id);
        if (q < -127.0f) q = -127.0f;
        if (q > 127.0f) q = 127.0f;
        v[i] = q * d;
    }
}

// ---- GEMM: y[m][n] = Σ_k x[m][k] · w[n][k] -------------------------------------------
//
// The weights are the CPU's packed panels (gemm.rs): 16 output columns per panel, laid out
// [panel][k][16], as f32 (FMT 0), as 8-bit integers (FMT 1), or as 4-bit values two to a
// byte ([panel][k][8], column c in the low nibble of byte c, c + 8 in the high one; FMT 2),
// with one scale and offset per group of k and column ([panel][k / group][16]); a weight is
// q * scale + offset, multiply then add. A block computes 16 rows x 16 columns (one panel);
// each thread one output, one fmaf chain over k = 0..K in order from zero, the k tiles
// walked in order. Nothing depends on m.

// The weight of panel p, input index kk, column cc of the panel: stored f32, or the integer
// times its group's scale plus its offset (multiply, then add), as gemm.rs dequantizes.
template <int FMT>
__device__ __forceinline__ float weight(long long p, int kk, int cc, int k, int ng,
                                        const float* __restrict__ wf,
                                        const i8* __restrict__ q, const u8* __restrict__ q4,
                                        int lo, const float* __restrict__ scale,
                                        const float* __restrict__ offset, int group) {
    long long at = (p * k + kk) * 16;
    if (FMT == 0) return wf[at + cc];
    int qv;
    if (FMT == 1) {
        qv = q[at + cc];
    } else {
        u8 b = q4[at / 2 + (cc & 7)];
        qv = (cc < 8 ? (b & 15) : (b >> 4)) + lo;
    }
    long long g = (p * ng + kk / group) * 16 + cc;
    return (float)qv * scale[g] + offset[g];
}

#define TK 32

template <int FMT>
__device__ void gemm_body(const float* __restrict__ x, float* __restrict__ y, int m, int n,
                          int k, const float* __restrict__ wf, const i8* __restrict__ q,
                          const u8* __restrict__ q4, int lo, const float* __restrict__ scale,
                          const float* __restrict__ offset, int group) {
    __shared__ float ws[TK][16];
    __shared__ float xs[16][TK + 1];
    int c = threadIdx.x, ry = threadIdx.y;
    int tid = ry * 16 + c;
    long long p = blockIdx.x;
    int row0 = blockIdx.y * 16;
    int ng = group > 0 ? k / group : 0;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TK) {
        int kt = min(TK, k - k0);
        for (int e = tid; e < TK * 16; e += 256) {
            int kk = e >> 4, cc = e & 15;
            ws[kk][cc] = kk < kt ? weight<FMT>(p, k0 + kk, cc, k, ng, wf, q, q4, lo, scale, offset,
                                               group)
                                 : 0.0f;
        }
        for (int e = tid; e < 16 * TK; e += 256) {
            int r = e / TK, kk = e % TK;
            int row = row0 + r;
            xs[r][kk] = (row < m && kk < kt) ? x[(long long)row * k + k0 + kk] : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < kt; kk++) acc = fmaf(xs[ry][kk], ws[kk][c], acc);
        __syncthreads();
    }
    int row = row0 + ry, col = (int)p * 16 + c;
    if (row < m && col < n) y[(long long)row * n + col] = acc;
}

extern "C" __global__ void gemm_f32(const float* x, float* y, int m, int n, int k,
                                   const float* w) {
    gemm_body<0>(x, y, m, n, k, w, 0, 0, 0, 0, 0, 0);
}

extern "C" __global__ void gemm_q8(const float* x, float* y, int m, int n, int k, const i8* q,
                                  const float* scale, const float* offset, int group) {
    gemm_body<1>(x, y, m, n, k, 0, q, 0, 0, scale, offset, group);
}

extern "C" __global__ void gemm_q4(const float* x, float* y, int m, int n, int k, const u8* q4,
                                  int lo, const float* scale, const float* offset, int group) {
    gemm_body<2>(x, y, m, n, k, 0, 0, q4, lo, scale, offset, group);
}

// The same GEMM register-tiled, for batches of rows: a block computes 64 rows x 64 columns
// (four panels), each thread 4 x 4 outputs (rows ty + 16 i, columns tx + 16 j of panel j),
// the k tiles of 16 walked in order and, within a tile, k in order: every output is still
// one fmaf chain over k = 0..K from zero, so it has the simple kernel's bits.

#define BK 16

template <int FMT>
__device__ void gemm_tiled_body(const float* __restrict__ x, float* __restrict__ y, int m,
                                int n, int k, const float* __restrict__ wf,
                                const i8* __restrict__ q, const u8* __restrict__ q4, int lo,
                                const float* __restrict__ scale,
                                const float* __restrict__ offset, int group) {
    __shared__ float ws[BK][64];
    __shared__ float xs[BK][64 + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int tid = ty * 16 + tx;
    long long p0 = (long long)blockIdx.x * 4;
    long long panels = (n + 15) / 16;
    int row0 = blockIdx.y * 64;
    int ng = group > 0 ? k / group : 0;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += BK) {
        int kt = min(BK, k - k0);
        for (int e = tid; e < BK * 64; e += 256) {
            int kk = e >> 6, cl = e & 63;
            long long p = p0 + (cl >> 4);
            int cc = cl & 15;
            ws[kk][cl] = kk < kt && p < panels
                             ? weight<FMT>(p, k0 + kk, cc, k, ng, wf, q, q4, lo, scale, offset,
                                           group)
                             : 0.0f;
        }
        for (int e = tid; e < 64 * BK; e += 256) {
            int r = e / BK, kk = e % BK;
            int row = row0 + r;
            xs[kk][r] = (row < m && kk < kt) ? x[(long long)row * k + k0 + kk] : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < kt; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = xs[kk][ty + 16 * i];
            for (int j = 0; j < 4; j++) b[j] = ws[kk][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        int row = row0 + ty + 16 * i;
        if (row >= m) continue;
        for (int j = 0; j < 4; j++) {
            long long col = (p0 + j) * 16 + tx;
            if (col < n) y[(long long)row * n + col] = acc[i][j];
        }
    }
}

extern "C" __global__ void gemm_f32_tiled(const float* x, float* y, int m, int n, int k,
                                         const float* w) {
    gemm_tiled_body<0>(x, y, m, n, k, w, 0, 0, 0, 0, 0, 0);
}

extern "C" __global__ void gemm_q8_tiled(const float* x, float* y, int m, int n, int k,
                                        const i8* q, const float* scale, const float* offset,
                                        int group) {
    gemm_tiled_body<1>(x, y, m, n, k, 0, q, 0, 0, scale, offset, group);
}

extern "C" __global__ void gemm_q4_tiled(const float* x, float* y, int m, int n, int k,
                                        const u8* q4, int lo, const float* scale,
                                        const float* offset, int group) {
    gemm_tiled_body<2>(x, y, m, n, k, 0, 0, q4, lo, scale, offset, group);
}

// The same GEMM for large batches: a block computes 128 rows x 128 columns (eight panels),
// each thread 8 x 8 outputs (rows 4ty..4ty+3 and 64+4ty..64+4ty+3, columns likewise by tx),
// reading its operands from shared memory four at a time. The next k tile's raw values are
// fetched into registers while the current tile is multiplied, and dequantized as they are
// stored. Every output is still one fmaf chain over k = 0..K in order from zero. The host
// uses it only when WK divides k and, for integer weights, the group.

#define WK 8

template <int FMT>
__device__ __forceinline__ void gemm_wide_body(const float* __restrict__ x, float* __restrict__ y,
                                               int m, int n, int k,
                                               const float* __restrict__ wf,
                                               const i8* __restrict__ q,
                                               const u8* __restrict__ q4, int lo,
                                               const float* __restrict__ scale,
                                               const float* __restrict__ offset, int group) {
    __shared__ alignas(16) float ws[WK][132];
    __shared__ alignas(16) float xs[WK][132];
    int tx = threadIdx.x, ty = threadIdx.y;
    int tid = ty * 16 + tx;
    int p0 = blockIdx.x * 8;
    int panels = (n + 15) / 16;
    int row0 = blockIdx.y * 128;
    int ng = group > 0 ? k / group : 0;
    // this thread's four weights of a tile: panel p0 + pw, k offsets kw..kw+3, column cw (so
    // one scale and offset, the group being a multiple of the tile); its four inputs: rows
    // row0 + rx + 32r, k offset kx. Pointers walk k tile by tile.
    int pw = tid >> 5, kw = ((tid >> 4) & 1) * 4, cw = tid & 15;
    int rx = tid >> 3, kx = tid & 7;
    bool wlive = p0 + pw < panels;
    long long wfirst = ((long long)(p0 + pw) * k + kw) * 16;
    const float* wfp = FMT == 0 ? wf + wfirst + cw : 0;
    const i8* wqp = FMT == 1 ? q + wfirst + cw : 0;
    const u8* w4p = FMT == 2 ? q4 + wfirst / 2 + (cw & 7) : 0;
    long long gfirst = (long long)(p0 + pw) * ng * 16 + cw;
    const float* sp = FMT == 0 ? 0 : scale + gfirst;
    const float* op = FMT == 0 ? 0 : offset + gfirst;
    const float* xp = x + (long long)(row0 + rx) * k + kx;
    unsigned xlive = 0;
#pragma unroll
    for (int r = 0; r < 4; r++)
        if (row0 + rx + 32 * r < m) xlive |= 1u << r;
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
    // f32 weights, or the four integers packed a byte each with their scale and offset
    float wa[4], xr[4];
    int wq;
    float wsc, wof;
    // fetch the tile at K0 (where the pointers are), then step them one tile on
#define WIDE_FETCH(K0)                                                                     \
    {                                                                                      \
        if (FMT == 0) {                                                                    \
            _Pragma("unroll") for (int r = 0; r < 4; r++) wa[r] =                          \
                wlive ? wfp[r * 16] : 0.0f;                                                \
            wfp += WK * 16;                                                                \
        } else {                                                                           \
            wq = 0;                                                                        \
            if (wlive) {                                                                   \
                _Pragma("unroll") for (int r = 0; r < 4; r++) {                            \
                    int v_ = FMT == 1 ? (int)(u8)wqp[r * 16]                               \
                                      : (w4p[r * 8] >> ((threadIdx.x & 8) >> 1)) & 15;     \
                    wq |= v_ << (8 * r);                                                   \
                }                                                                          \
            }                                                                              \
            wsc = wlive ? *sp : 0.0f;                                                      \
            wof = wlive ? *op : 0.0f;                                                      \
            if (FMT == 1) wqp += WK * 16;                                                  \
            if (FMT == 2) w4p += WK * 8;                                                   \
            if (((K0) + WK) % group == 0) {                                                \
                sp += 16;                                                                  \
                op += 16;                                                                  \
            }                                                                              \
        }                                                                                  \
        _Pragma("unroll") for (int r = 0; r < 4; r++) xr[r] =                              \
            (xlive >> r) & 1 ? xp[r * 32 * k] : 0.0f;                                      \
        xp += WK;                                                                          \
    }
// the integer of byte r: signed for 8-bit weights, plus `lo` for 4-bit ones
#define WIDE_INT(R)                                                                        \
    (FMT == 1 ? (int)(signed char)(wq >> (8 * (R))) : ((wq >> (8 * (R))) & 15) + lo)
#define WIDE_STORE()                                                                       \
    _Pragma("unroll") for (int r = 0; r < 4; r++) {                                        \
        ws[kw + r][pw * 16 + cw] =                                                         \
            FMT == 0 ? wa[r] : (wlive ? (float)WIDE_INT(r) * wsc + wof : 0.0f);            \
        xs[kx][rx + 32 * r] = xr[r];                                                       \
    }
    WIDE_FETCH(0)
    WIDE_STORE()
    __syncthreads();
    for (int k0 = 0; k0 < k; k0 += WK) {
        bool more = k0 + WK < k;
        if (more) WIDE_FETCH(k0 + WK)
#pragma unroll
        for (int kk = 0; kk < WK; kk++) {
            float4 a0 = *(const float4*)&xs[kk][4 * ty];
            float4 a1 = *(const float4*)&xs[kk][64 + 4 * ty];
            float4 b0 = *(const float4*)&ws[kk][4 * tx];
            float4 b1 = *(const float4*)&ws[kk][64 + 4 * tx];
            float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
        if (more) {
            WIDE_STORE()
        }
        __syncthreads();
    }
#undef WIDE_FETCH
#undef WIDE_INT
#undef WIDE_STORE
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int row = row0 + (i < 4 ? 4 * ty + i : 64 + 4 * ty + i - 4);
        if (row >= m) continue;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            long long col = (long long)p0 * 16 + (j < 4 ? 4 * tx + j : 64 + 4 * tx + j - 4);
            if (col < n) y[(long long)row * n + col] = acc[i][j];
        }
    }
}

// Two entry points per format: `wide` asks for two blocks a multiprocessor (at most 128
// registers a thread), `wide1` for one (no register cap); the GPU check times both.
#define WIDE_ENTRIES(SUFFIX, MINB)                                                         \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                \
        gemm_f32_##SUFFIX(const float* x, float* y, int m, int n, int k, const float* w) {  \
        gemm_wide_body<0>(x, y, m, n, k, w, 0, 0, 0, 0, 0, 0);                             \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                \
        gemm_q8_##SUFFIX(const float* x, float* y, int m, int n, int k, const i8* q,        \
                         const float* scale, const float* offset, int group) {             \
        gemm_wide_body<1>(x, y, m, n, k, 0, q, 0, 0, scale, offset, group);                \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                \
        gemm_q4_##SUFFIX(const float* x, float* y, int m, int n, int k, const u8* q4,       \
                         int lo, const float* scale, const float* offset, int group) {     \
        gemm_wide_body<2>(x, y, m, n, k, 0, 0, q4, lo, scale, offset, group);              \
    }

WIDE_ENTRIES(wide, 2)
WIDE_ENTRIES(wide1, 1)

// The GEMM for a few rows (decode): a block of 64 threads computes R rows x 64 columns (four
// panels), one column per thread. The panels' raw weights (f32, or integers with their
// groups' scales and offsets) and the R input rows are copied to shared memory SK values of
// k at a time with cp.async, the next stage in flight while this one is multiplied, and
// each thread dequantizes its column as it reads it (q * scale + offset, multiply then
// add). Every output is one fmaf chain over k = 0..K in order from zero. The host uses it
// only when SK divides k and the group is 16, 32 or 64.

#define SK 64

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned long long s;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)s), "l"(gmem)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// bytes of one k row of a panel: 16 f32, 16 i8 or 8 nibble bytes
template <int FMT>
struct RowBytes {
    static const int v = FMT == 0 ? 64 : (FMT == 1 ? 16 : 8);
};

// panel stride in shared memory, padded by 64 bytes so that the four panels of f32 weights
// fall in different banks
template <int FMT>
struct PanelStride {
    static const int v = SK * RowBytes<FMT>::v + 64;
};

// stages in flight: five of 2 KiB (4-bit), four of 4 KiB (8-bit), two of 16 KiB (f32)
// weights, within the 48 KiB of static shared memory
template <int FMT>
struct Stages {
    static const int v = FMT == 0 ? 2 : (FMT == 1 ? 4 : 5);
};

template <int FMT, int R>
__device__ void gemm_skinny_body(const float* __restrict__ x, float* __restrict__ y, int m,
                                 int n, int k, const u8* __restrict__ wraw, int lo,
                                 const float* __restrict__ scale,
                                 const float* __restrict__ offset, int group) {
    const int RB = RowBytes<FMT>::v;
    const int PS = PanelStride<FMT>::v;
    const int NS = Stages<FMT>::v;
    __shared__ alignas(16) u8 sw[NS][4 * PanelStride<FMT>::v];
    __shared__ alignas(16) float ss[NS][FMT == 0 ? 4 : 4 * 16 * (SK / 16)];
    __shared__ alignas(16) float so[NS][FMT == 0 ? 4 : 4 * 16 * (SK / 16)];
    __shared__ alignas(16) float xs[NS][R][SK];
    int t = threadIdx.x;
    long long p0 = (long long)blockIdx.x * 4;
    long long panels = (n + 15) / 16;
    int row0 = blockIdx.y * R;
    int rows = min(R, m - row0);
    int ng = group > 0 ? k / group : 0;
    int gs = group > 0 ? SK / group : 0;            // groups per stage
    int gshift = group > 0 ? __ffs(group) - 1 : 0;  // group is a power of two
    int np = (int)min(4LL, panels - p0);            // live panels of this block
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    int stages = k / SK;
    // issue the copies of stage S into buffer S % NS (a group is committed either way, so
    // that waiting for all but the newest NS - 2 groups always means stage s is in)
#define SKINNY_ISSUE(S)                                                                    \
    if ((S) < stages) {                                                                    \
        int b_ = (S) % NS;                                                                 \
        long long k0_ = (long long)(S) * SK;                                               \
        for (int c = t; c < np * (SK * RB / 16); c += 64) {                                \
            int pl = c / (SK * RB / 16), o = c % (SK * RB / 16);                           \
            cp_async16(&sw[b_][pl * PS + o * 16],                                          \
                       wraw + ((p0 + pl) * k + k0_) * RB + o * 16);                        \
        }                                                                                  \
        if (FMT != 0) {                                                                    \
            for (int c = t; c < np * gs * 4; c += 64) {                                    \
                int pl = c / (gs * 4), o = c % (gs * 4);                                   \
                long long g = ((p0 + pl) * ng + k0_ / group) * 16 + o * 4;                 \
                cp_async16(&ss[b_][pl * gs * 16 + o * 4], scale + g);                      \
                cp_async16(&so[b_][pl * gs * 16 + o * 4], offset + g);                     \
            }                                                                              \
        }                                                                                  \
        for (int c = t; c < rows * (SK / 4); c += 64) {                                    \
            int r = c / (SK / 4), o = c % (SK / 4);                                        \
            cp_async16(&xs[b_][r][o * 4], x + (long long)(row0 + r) * k + k0_ + o * 4);    \
        }                                                                                  \
    }                                                                                      \
    cp_async_commit();
    for (int s = 0; s < NS - 1; s++) {
        SKINNY_ISSUE(s)
    }
    int pl = t >> 4, cc = t & 15;
    for (int s = 0; s < stages; s++) {
        cp_async_wait<NS - 2>();
        // stage s is in for every thread, and every thread is done with stage s - 1,
        // whose buffer the next issue refills
        __syncthreads();
        SKINNY_ISSUE(s + NS - 1)
        int b = s % NS;
        if (pl < np) {
            const u8* wp = &sw[b][pl * PS];
            const float* sc = &ss[b][pl * gs * 16 + cc];
            const float* of = &so[b][pl * gs * 16 + cc];
#pragma unroll 8
            for (int kk = 0; kk < SK; kk++) {
                float w;
                if (FMT == 0) {
                    w = ((const float*)wp)[kk * 16 + cc];
                } else {
                    int qv;
                    if (FMT == 1) {
                        qv = (int)(i8)wp[kk * 16 + cc];
                    } else {
                        u8 byte = wp[kk * 8 + (cc & 7)];
                        qv = (cc < 8 ? (byte & 15) : (byte >> 4)) + lo;
                    }
                    int g = (kk >> gshift) * 16;
                    w = (float)qv * sc[g] + of[g];
                }
#pragma unroll
                for (int r = 0; r < R; r++) acc[r] = fmaf(xs[b][r][kk], w, acc[r]);
            }
        }
    }
    cp_async_wait<0>();
#undef SKINNY_ISSUE
    long long col = p0 * 16 + t;
    if (pl < np && col < n) {
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < rows) y[(long long)(row0 + r) * n + col] = acc[r];
    }
}

#define SKINNY_ENTRIES(R)                                                                  \
    extern "C" __global__ void __launch_bounds__(64)                                       \
        gemm_f32_skinny##R(const float* x, float* y, int m, int n, int k, const float* w) { \
        gemm_skinny_body<0, R>(x, y, m, n, k, (const u8*)w, 0, 0, 0, 0);                   \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(64)                                       \
        gemm_q8_skinny##R(const float* x, float* y, int m, int n, int k, const i8* q,       \
                          const float* scale, const float* offset, int group) {            \
        gemm_skinny_body<1, R>(x, y, m, n, k, (const u8*)q, 0, scale, offset, group);      \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(64)                                       \
        gemm_q4_skinny##R(const float* x, float* y, int m, int n, int k, const u8* q4,      \
                          int lo, const float* scale, const float* offset, int group) {    \
        gemm_skinny_body<2, R>(x, y, m, n, k, q4, lo, scale, offset, group);               \
    }

SKINNY_ENTRIES(1)
SKINNY_ENTRIES(4)
SKINNY_ENTRIES(16)

// ---- row-wise kernels ----------------------------------------------------------------

// out[r] = rms_norm(x[r]) for each row r (one block per row).
extern "C" __global__ void rms_norm_rows(const float* x, const float* w, float* out, int n,
                                        float eps) {
    __shared__ float lanes[16];
    long long r = blockIdx.x;
    rms_norm_block(x + r * n, w, eps, n, out + r * n, lanes);
}

// Each matmul input row quantized in 32-value blocks (the 8-bit activations knob).
// Grid (rows, blocks of 32 per row), one thread.
extern "C" __global__ void quantize_q8_rows(float* x, int k) {
    int b = blockIdx.y;
    int len = min(32, k - b * 32);
    quantize_q8_block(x + (long long)blockIdx.x * k + b * 32, len);
}

// After the fused q/k/v projection, one block per (row, head) of the nh + 2 nkv heads:
// the bias (qwen2), then for q and k heads the per-head RMSNorm (qwen3) and rotate-half
// RoPE with the row's tables, then for k and v heads the KV-cache rounding (kv: 0 f32,
// 1 f16, 2 bf16, 3 q8), in forward.rs's order.
extern "C" __global__ void qkv_post(float* qkv, int qkvd, const float* bias, const float* qn,
                                   const float* kn, const float* cos_t, const float* sin_t,
                                   int nh, int nkv, int hd, float eps, int kv) {
    __shared__ float lanes[16];
    extern __shared__ float v[];  // hd
    long long r = blockIdx.x;
    int head = blockIdx.y;
    int half = hd / 2;
    float* row = qkv + r * qkvd + head * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float x = row[i];
        if (bias) x = x + bias[head * hd + i];
        v[i] = x;
    }
    __syncthreads();
    if (head < nh + nkv) {
        const float* nw = head < nh ? qn : kn;
        if (nw) rms_norm_block(v, nw, eps, hd, v, lanes);
        const float* cs = cos_t + r * half;
        const float* sn = sin_t + r * half;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * cs[i] - x1 * sn[i];
            v[i + half] = x1 * cs[i] + x0 * sn[i];
        }
        __syncthreads();
    }
    if (head >= nh && kv != 0) {
        if (kv == 3) {
            for (int b = threadIdx.x; b * 32 < hd; b += blockDim.x)
                quantize_q8_block(v + b * 32, min(32, hd - b * 32));
        } else {
            for (int i = threadIdx.x; i < hd; i += blockDim.x)
                v[i] = kv == 1 ? round_f16(v[i]) : round_bf16(v[i]);
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < hd; i += blockDim.x) row[i] = v[i];
}

// Appends each row's key and value to its sequence's cache at the row's position: keys and
// values are rows [pos][kvd]; kp[r] / vp[r] are that sequence's buffers for this layer.
extern "C" __global__ void kv_store(const float* qkv, int qkvd, int qd, int kvd, const u64* kp,
                                   const u64* vp, const int* pos) {
    long long r = blockIdx.x;
    float* kc = (float*)kp[r] + (long long)pos[r] * kvd;
    float* vc = (float*)vp[r] + (long long)pos[r] * kvd;
    const float* src = qkv + r * qkvd + qd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        kc[i] = src[i];
        vc[i] = src[kvd + i];
    }
}

// Causal attention for one (row, head), as ops::attend: score j = (Σ_d q[d] k_j[d]) one
// fmaf chain over d; scaled; softmax with exp(s - max) and the sum taken in order; output
// element d one fmaf chain over j in order. Keys of positions 0..=pos[r] of the row's
// sequence. `scores` is scratch [rows * nh][ld].
extern "C" __global__ void attention(const float* qkv, int qkvd, float* att, int qd,
                                    const u64* kp, const u64* vp, const int* pos, int nh,
                                    int group, int hd, int kvd, float scale, float* scores,
                                    long long ld) {
    extern __shared__ float qs[];  // hd
    __shared__ float red[256];
    long long r = blockIdx.x;
    int head = blockIdx.y;
    int t = threadIdx.x;
    int n_keys = pos[r] + 1;
    int off = (head / group) * hd;
    const float* kc = (const float*)kp[r];
    const float* vc = (const float*)vp[r];
    float* sc = scores + (r * nh + head) * ld;
    for (int d = t; d < hd; d += blockDim.x) qs[d] = qkv[r * qkvd + head * hd + d];
    __syncthreads();
    for (int j = t; j < n_keys; j += blockDim.x) {
        const float* kj = kc + (long long)j * kvd + off;
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc = fmaf(qs[d], kj[d], acc);
        sc[j] = acc * scale;
    }
    // the maximum (order-free; NaN ignored as f32::max ignores it)
    float mx = __int_as_float(0xff800000);  // -inf
    for (int j = t; j < n_keys; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    red[t] = mx;
    __syncthreads();
    for (int h = blockDim.x / 2; h >= 1; h >>= 1) {
        if (t < h) red[t] = fmaxf(red[t], red[t + h]);
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    for (int j = t; j < n_keys; j += blockDim.x) sc[j] = sw_exp(sc[j] - mx);
    __syncthreads();
    if (t == 0) {
        float sum = 0.0f;
        for (int j = 0; j < n_keys; j++) sum = sum + sc[j];
        red[0] = sum;
    }
    __syncthreads();
    float sum = red[0];
    for (int j = t; j < n_keys; j += blockDim.x) sc[j] = sc[j] / sum;
    __syncthreads();
    for (int d = t; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n_keys; j++) acc = fmaf(sc[j], vc[(long long)j * kvd + off + d], acc);
        att[r * qd + head * hd + d] = acc;
    }
}

// act[r][i] = silu(gu[r][i]) * gu[r][f + i].
extern "C" __global__ void silu_mul(const float* gu, float* act, int f, long long total) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    long long r = idx / f, i = idx % f;
    act[idx] = sw_silu(gu[r * 2 * f + i]) * gu[r * 2 * f + f + i];
}

// x[i] += o[i].
extern "C" __global__ void add_in_place(float* x, const float* o, long long total) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total) x[idx] = x[idx] + o[idx];
}

// dst[j] = src[rows[j]] (rows of length e).
extern "C" __global__ void gather_rows(const float* src, float* dst, const int* rows, int e) {
    long long j = blockIdx.x;
    const float* s = src + (long long)rows[j] * e;
    for (int i = threadIdx.x; i < e; i += blockDim.x) dst[j * e + i] = s[i];
}
