/* The character transformer's window step, fused per window (reslm.models.window_kernel).
 *
 * One window (T characters, width D) goes through all L post-LN encoder layers with every
 * intermediate in a per-thread workspace of a few hundred KB, so the attention tile, the (T, F)
 * feed-forward activations and the dropout masks never leave the cache. The forward keeps only each
 * layer's input (B, L, T, D); the backward recomputes a layer from its input, then differentiates it
 * (one extra forward, no large activation stored). Dropout masks are a hash of (the step's seed pair
 * of the site, the element's index in the plain path's tensor of that site), the same function as
 * reslm.models.window_kernel.hashed_drop_mask, so the backward regenerates them instead of storing
 * them, and the plain path can be given the very same masks.
 *
 * Arithmetic per layer (keep = 1/(1-p) in training, 1 in eval; m* are 0/1 masks):
 *   q, k, v = x Wqkv^T + bqkv;  q *= 1/sqrt(D/H)
 *   P = softmax(q k^T) per head;  o = (P * mA * keep) v
 *   x1 = LN1(x + keep * m1 * (o Wo^T + bo))
 *   x' = LN2(x1 + keep * m3 * (keep * m2 * relu(x1 W1^T + b1)) W2^T + b2)
 * The last layer computes queries and everything after them for the last position only.
 *
 * How it is laid out for the CPU's vector units (VL floats: 16 with AVX-512, 8 otherwise):
 * - the linear maps are small matrix products over the window's rows (`mm`), register-blocked so
 *   that a weight row loaded once serves several rows and several independent sums are in flight;
 *   the feed-forward width is padded to a multiple of 16 with zero weights;
 * - attention keeps the D channels in the vector lanes, heads side by side: a score is a lane-wise
 *   product summed within each head's D/H lanes (`seg`), so the softmax, the dropout and the weighted
 *   sum of every head run at once, in vertical operations; keys are packed so that a head's D/H
 *   lanes hold D/H different keys (below, `pack`).
 *
 * D, T, H, F, L are compile-time constants (-D flags). D must be a multiple of VL and D/H a divisor
 * of VL (reslm.models.window_kernel.unsupported says so before building).
 * Parameters of one layer, packed in this order (layer l at params + l * PL):
 *   Wqkv (3D, D), bqkv (3D), Wo (D, D), bo (D), W1 (F, D), b1 (F), W2 (D, F), b2 (D),
 *   g1 (D), be1 (D), g2 (D), be2 (D)
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#pragma GCC diagnostic ignored "-Wpsabi"   /* 64-byte vectors on a CPU without AVX-512: all inlined */

#ifdef __AVX512F__
#define VL 16   /* floats per vector */
#else
#define VL 8    /* AVX2, and CPUs with narrower vectors (the compiler splits them) */
#endif
#if D % VL != 0 || D % H != 0 || VL % (D / H) != 0
#error "the fused window step needs D a multiple of the vector width and D/H a divisor of it"
#endif

#define HD (D / H)
#define D3 (3 * D)
#define V (D / VL)                 /* vectors per row of width D */
#define FP ((F + 15) / 16 * 16)    /* the feed-forward width, padded */
#define NP ((T + HD - 1) / HD)     /* key groups of attention (below) */
#define O_WQKV 0
#define O_BQKV (O_WQKV + D3 * D)
#define O_WO (O_BQKV + D3)
#define O_BO (O_WO + D * D)
#define O_W1 (O_BO + D)
#define O_B1 (O_W1 + F * D)
#define O_W2 (O_B1 + F)
#define O_B2 (O_W2 + D * F)
#define O_G1 (O_B2 + D)
#define O_BE1 (O_G1 + D)
#define O_G2 (O_BE1 + D)
#define O_BE2 (O_G2 + D)
#define PL (O_BE2 + D)
#define LN_EPS 1e-5f
#define INLINE static inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(4 * VL)));
typedef int32_t vi __attribute__((vector_size(4 * VL)));
typedef uint32_t vu __attribute__((vector_size(4 * VL)));
typedef float vfa __attribute__((vector_size(4 * VL), aligned(4)));   /* for unaligned loads and stores */

INLINE vf ld(const float *p) { return *(const vfa *)p; }
INLINE void st(float *p, vf v) { *(vfa *)p = v; }
INLINE vf vmax(vf a, vf b) { vi m = a > b; return (vf)(((vi)a & m) | ((vi)b & ~m)); }
#if VL == 16
static const vu IOTA = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
static const vu IOTA = {0, 1, 2, 3, 4, 5, 6, 7};
#endif

/* each lane: the sum over the lanes of its head (HD consecutive lanes), the same value in all of them */
INLINE vf seg(vf x) {
#pragma GCC unroll 4
    for (uint32_t h = 1; h < HD; h <<= 1) x += __builtin_shuffle(x, (vi)(IOTA ^ h));
    return x;
}

/* ---- small matrix products ----------------------------------------------------------------------
 * C (M, N) = C0 + A B, A (M, K) with element (i, k) at A[i * ars + k * acs], B (K, N) row-major
 * (row stride ldb), C0 at C0[i * ld0 + n] (ld0 = 0: a bias row; C0 = C, ld0 = ldc: accumulate;
 * NULL: zero). N is a multiple of VL. */
#if VL == 16
#define MR 4    /* rows per block: MR x NR sums in registers (AVX-512 has 32) */
#define NR 4
#define MR1 8   /* rows per block where N is one vector */
#else
#define MR 4    /* AVX2 has 16 registers */
#define NR 2
#define MR1 8
#endif

INLINE void mk(const int mr, const int nr, const int K, const float *A, const int ars, const int acs,
               const float *B, const int ldb, const float *C0, const int ld0, float *C, const int ldc) {
    vf c[MR1 > MR ? MR1 : MR][NR];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nr; v++) c[r][v] = C0 ? ld(C0 + r * ld0 + VL * v) : (vf){0};
    for (int k = 0; k < K; k++) {
        vf b[NR];
#pragma GCC unroll 4
        for (int v = 0; v < nr; v++) b[v] = ld(B + k * ldb + VL * v);
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const float a = A[r * ars + k * acs];
#pragma GCC unroll 4
            for (int v = 0; v < nr; v++) c[r][v] += a * b[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nr; v++) st(C + r * ldc + VL * v, c[r][v]);
}

/* the columns of rows [i, i + mr) */
INLINE void mm_rows(const int mr, const ptrdiff_t i, const int K, const int N, const float *A, const int ars,
                    const int acs, const float *B, const int ldb, const float *C0, const int ld0, float *C,
                    const int ldc) {
    const float *a = A + i * ars;
    int n = 0;
    for (; n + VL * NR <= N; n += VL * NR)
        mk(mr, NR, K, a, ars, acs, B + n, ldb, C0 ? C0 + i * ld0 + n : NULL, ld0, C + i * ldc + n, ldc);
#if NR > 1
    const int left = (N - n) / VL;
    const float *c0 = C0 ? C0 + i * ld0 + n : NULL;
    if (left == 1) mk(mr, 1, K, a, ars, acs, B + n, ldb, c0, ld0, C + i * ldc + n, ldc);
    else if (left == 2) mk(mr, 2, K, a, ars, acs, B + n, ldb, c0, ld0, C + i * ldc + n, ldc);
#if NR > 3
    else if (left == 3) mk(mr, 3, K, a, ars, acs, B + n, ldb, c0, ld0, C + i * ldc + n, ldc);
#endif
#endif
}

INLINE void mm(const int M, const int K, const int N, const float *A, const int ars, const int acs, const float *B,
               const int ldb, const float *C0, const int ld0, float *C, const int ldc) {
    ptrdiff_t i = 0;
    if (N == VL) {
        for (; i + MR1 <= M; i += MR1) mk(MR1, 1, K, A + i * ars, ars, acs, B, ldb, C0 ? C0 + i * ld0 : NULL, ld0,
                                          C + i * ldc, ldc);
        for (; i < M; i++) mk(1, 1, K, A + i * ars, ars, acs, B, ldb, C0 ? C0 + i * ld0 : NULL, ld0, C + i * ldc, ldc);
        return;
    }
    for (; i + MR <= M; i += MR) mm_rows(MR, i, K, N, A, ars, acs, B, ldb, C0, ld0, C, ldc);
    for (; i < M; i++) mm_rows(1, i, K, N, A, ars, acs, B, ldb, C0, ld0, C, ldc);
}

/* ---- dropout masks ------------------------------------------------------------------------------ */
INLINE vu mix32(vu x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 16;
    return x;
}

/* a site's masks: its seed pair, the threshold and the kept elements' factor */
typedef struct { uint32_t s0, s1; int32_t lim; int none, all; vf keep; } Site;   /* s0: made odd */

static Site site(const uint32_t *seed, int64_t thr, float keep, int train) {
    Site s = {seed[0] | 1u, seed[1], 0, 0, 0, (vf){0} + keep};
    const int64_t lim = (int64_t)INT32_MIN + thr;
    s.all = !train || thr <= 0;            /* every element kept */
    s.none = train && lim > INT32_MAX;     /* every element dropped */
    s.lim = s.none || s.all ? 0 : (int32_t)lim;
    return s;
}

/* keep (1/(1-p)) where the elements with flat indices idx are kept, 0 where dropped */
INLINE vf drop(const Site *s, vu idx) {
    if (s->all) return s->keep;
    if (s->none) return (vf){0};
    vu h = mix32((idx ^ s->s1) * s->s0);
    return (vf)((vi)s->keep & ((vi)h >= s->lim));
}

/* ---- layer norm over one row --------------------------------------------------------------------- */
static void layernorm(const float *r, const float *g, const float *be, float *xh, float *rs, float *y) {
    float mean = 0.f, var = 0.f;
    for (int c = 0; c < D; c++) mean += r[c];
    mean /= D;
    for (int c = 0; c < D; c++) { float z = r[c] - mean; var += z * z; }
    float s = 1.0f / sqrtf(var / D + LN_EPS);
    *rs = s;
    for (int c = 0; c < D; c++) { xh[c] = (r[c] - mean) * s; y[c] = xh[c] * g[c] + be[c]; }
}

/* one row: y = LN(res + m * a), m the dropout factors of the row's D elements from flat index idx on */
static void residual_ln(const float *res, const float *a, const Site *s, uint32_t idx, float *m, const float *g,
                        const float *be, float *xh, float *rs, float *y) {
    float r[D];
    for (int u = 0; u < V; u++) {
        const vf mu = drop(s, IOTA + (idx + (uint32_t)(VL * u)));
        st(m + VL * u, mu);
        st(r + VL * u, ld(res + VL * u) + mu * ld(a + VL * u));
    }
    layernorm(r, g, be, xh, rs, y);
}

/* d(LN)/d(input) for one row; accumulates the scale and shift gradients */
static void layernorm_back(const float *dy, const float *xh, float rs, const float *g, float *dg, float *dbe, float *dr) {
    float dxh[D], m1 = 0.f, m2 = 0.f;
    for (int c = 0; c < D; c++) {
        dxh[c] = dy[c] * g[c];
        dg[c] += dy[c] * xh[c];
        dbe[c] += dy[c];
        m1 += dxh[c];
        m2 += dxh[c] * xh[c];
    }
    m1 /= D; m2 /= D;
    for (int c = 0; c < D; c++) dr[c] = rs * (dxh[c] - m1 - xh[c] * m2);
}

/* one layer's matrices, transposed and padded as the products read them, built once per call */
typedef struct {
    float wqkvT[D * D3];   /* (D, 3D) */
    float woT[D * D];      /* (D, D) */
    float w1T[D * FP];     /* (D, FP) */
    float b1[FP];
    float w2T[FP * D];     /* (FP, D) */
    float w1[FP * D];      /* (FP, D): W1 with zero rows */
    float w2[D * FP];      /* (D, FP): W2 with zero columns */
} Trans;

/* one window's intermediates of one layer (rows: T for a full layer, 1 for the last one) */
typedef struct {
    float qkv[T * D3];                /* (T, 3D): scaled queries, keys, values */
    float P[T * NP * D], inv[T * D];  /* (R, NP, D): unnormalised attention weights, packed; 1/sums */
    float M[T * NP * D];              /* their dropout factors */
    float o[T * D], a[T * D], m1[T * D];
    float xh1[T * D], rs1[T], x1[T * D];
    float f[T * FP], g[T * FP];
    float f2[T * D], m3[T * D];
    float xh2[T * D], rs2[T];
} Work;

/* one window's backward scratch of one layer */
typedef struct {
    float dqkv[T * D3], dO[T * D], da[T * D], dx1[T * D], df2[T * D], dg[T * FP], dP[T * NP * D];
} Back;

/* e^x for x <= 0, to about one unit in the last place (Cephes' expf: x = n ln2 + r, a degree-5
 * polynomial for e^r, times 2^n); x below -87 gives about 1e-38 instead of a subnormal */
INLINE vf vexp(vf x) {
    x = vmax(x, (vf){0} - 87.0f);
    const vi ni = (vi)(x * 1.44269504088896341f + 12582912.0f) - 0x4B400000;   /* round(x / ln2) */
    const vf n = __builtin_convertvector(ni, vf);
    const vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (vf)((ni + 127) << 23);
}

/* Attention keeps heads side by side in the lanes, and packs keys: lane l of group n holds key
 * n * HD + l % HD of head l / HD, so that a head's HD lanes hold HD different keys and the softmax,
 * exp and dropout hash run on T/HD vectors per row and lane set, not T. */

/* the lanes that hold key n * HD + r of their group (all ones there) */
INLINE vi lane(const int r) { return (vi)(IOTA % HD == (uint32_t)r); }
/* the shuffle that copies key r of each head's group into all the head's lanes */
INLINE vi dup(const int r) { return (vi)(IOTA - IOTA % HD + (uint32_t)r); }
/* the lanes of the last group that hold a key (< T) */
INLINE vi valid(void) { return (vi)((NP - 1) * HD + IOTA % HD < (uint32_t)T); }

/* the head sums (seg) of HD keys' products, packed into one group's vector */
INLINE vf pack(const float *a, const float *rows, const int ldr, const int j0) {
    vi out = (vi){0};
#pragma GCC unroll 16
    for (int r = 0; r < HD; r++)
        if (j0 + r < T) out |= (vi)seg(ld(a) * ld(rows + (j0 + r) * ldr)) & lane(r);
    return (vf)out;
}

/* each lane: the max over its head's lanes */
INLINE vf segmax(vf x) {
#pragma GCC unroll 4
    for (uint32_t h = 1; h < HD; h <<= 1) x = vmax(x, __builtin_shuffle(x, (vi)(IOTA ^ h)));
    return x;
}

/* attention of the R query rows over the T keys: w->o (R, D); for the backward, the unnormalised
 * weights E (R, NP, D), each row's 1/sums (R, D) and the dropout factors M (R, NP, D) */
static void attention_fwd(Work *w, const int R, const int q0, int64_t b, const Site *s) {
    vu off[V];   /* a packed lane's index in the (H, R, T) mask, less the row's and group's */
    for (int u = 0; u < V; u++) off[u] = ((IOTA + (uint32_t)VL * u) / HD) * (uint32_t)(R * T) + IOTA % HD;
    const uint32_t base = (uint32_t)(b * H * R * T);
    for (int i = 0; i < R; i++) {
        float *E = w->P + i * NP * D, *M = w->M + i * NP * D;
        const float *q = w->qkv + (q0 + i) * D3;
        for (int u = 0; u < V; u++) {
            vf mx = (vf){0} - INFINITY, sum = (vf){0}, acc = (vf){0};
            for (int n = 0; n < NP; n++) {
                vf sc = pack(q + VL * u, w->qkv + D + VL * u, D3, n * HD);
                if (T % HD && n == NP - 1) sc = (vf)(((vi)sc & valid()) | ((vi)((vf){0} - INFINITY) & ~valid()));
                st(E + n * D + VL * u, sc);
                mx = vmax(mx, sc);
            }
            mx = segmax(mx);
            for (int n = 0; n < NP; n++) {
                vf e = vexp(ld(E + n * D + VL * u) - mx);
                if (T % HD && n == NP - 1) e = (vf)((vi)e & valid());
                const vf m = drop(s, off[u] + (base + (uint32_t)(i * T + n * HD)));
                st(E + n * D + VL * u, e);
                st(M + n * D + VL * u, m);
                sum += e;
                const vf pd = e * m;
#pragma GCC unroll 16
                for (int r = 0; r < HD; r++)
                    if (n * HD + r < T) acc += __builtin_shuffle(pd, dup(r)) * ld(w->qkv + (n * HD + r) * D3 + 2 * D + VL * u);
            }
            const vf inv = 1.0f / seg(sum);
            st(w->inv + i * D + VL * u, inv);
            st(w->o + i * D + VL * u, acc * inv);
        }
    }
}

/* One layer's forward for window b: x (T, D) -> y (R, D), R = 1 (last) or T; intermediates in w.
 * sites: the layer's four (attention weights, attention out, ff hidden, ff out). */
static void layer_fwd(const float *p, const Trans *t, const float *x, float *y, Work *w, int last, int64_t b,
                      const Site *sites) {
    const int R = last ? 1 : T, q0 = last ? T - 1 : 0;
    const float scale = 1.0f / sqrtf((float)HD);
    mm(T, D, D3, x, D, 1, t->wqkvT, D3, p + O_BQKV, 0, w->qkv, D3);
    for (int i = q0; i < T; i++)
        for (int u = 0; u < V; u++) st(w->qkv + i * D3 + VL * u, ld(w->qkv + i * D3 + VL * u) * scale);
    attention_fwd(w, R, q0, b, sites);
    /* out-projection, residual, LN1 */
    mm(R, D, D, w->o, D, 1, t->woT, D, p + O_BO, 0, w->a, D);
    for (int i = 0; i < R; i++)
        residual_ln(x + (q0 + i) * D, w->a + i * D, sites + 1, (uint32_t)(b * R * D + i * D), w->m1 + i * D, p + O_G1,
                    p + O_BE1, w->xh1 + i * D, w->rs1 + i, w->x1 + i * D);
    /* feed-forward, residual, LN2 */
    mm(R, D, FP, w->x1, D, 1, t->w1T, FP, t->b1, 0, w->f, FP);
    for (int i = 0; i < R; i++)
        for (int n = 0; n < FP; n += VL) {
            const vf f = ld(w->f + i * FP + n);
            const vf m = drop(sites + 2, IOTA + (uint32_t)(b * R * F + i * F + n));
            st(w->g + i * FP + n, (vf)((vi)(f * m) & (f > 0)));
        }
    mm(R, FP, D, w->g, FP, 1, t->w2T, D, p + O_B2, 0, w->f2, D);
    for (int i = 0; i < R; i++)
        residual_ln(w->x1 + i * D, w->f2 + i * D, sites + 3, (uint32_t)(b * R * D + i * D), w->m3 + i * D, p + O_G2,
                    p + O_BE2, w->xh2 + i * D, w->rs2 + i, y + i * D);
}

/* the attention's backward: k->dO (R, D) -> k->dqkv (T, 3D) (queries scaled back) */
static void attention_bwd(const Work *w, Back *k, const int R, const int q0, const float scale) {
    memset(k->dqkv, 0, sizeof(k->dqkv));
    for (int i = 0; i < R; i++) {
        const float *E = w->P + i * NP * D, *M = w->M + i * NP * D, *q = w->qkv + (q0 + i) * D3;
        for (int u = 0; u < V; u++) {
            const vf inv = ld(w->inv + i * D + VL * u), g = ld(k->dO + i * D + VL * u), qu = ld(q + VL * u);
            vf dot = (vf){0}, dq = (vf){0};
            for (int n = 0; n < NP; n++) {
                const vf pj = ld(E + n * D + VL * u) * inv, mj = ld(M + n * D + VL * u);
                const vf dpd = pack(k->dO + i * D + VL * u, w->qkv + 2 * D + VL * u, D3, n * HD) * mj;
                st(k->dP + n * D + VL * u, dpd);
                dot += dpd * pj;
                const vf pd = pj * mj;
#pragma GCC unroll 16
                for (int r = 0; r < HD; r++)
                    if (n * HD + r < T) {
                        float *dv = k->dqkv + (n * HD + r) * D3 + 2 * D + VL * u;
                        st(dv, ld(dv) + __builtin_shuffle(pd, dup(r)) * g);
                    }
            }
            dot = seg(dot);
            for (int n = 0; n < NP; n++) {
                const vf ds = ld(E + n * D + VL * u) * inv * (ld(k->dP + n * D + VL * u) - dot);
#pragma GCC unroll 16
                for (int r = 0; r < HD; r++)
                    if (n * HD + r < T) {
                        const vf d = __builtin_shuffle(ds, dup(r));
                        dq += d * ld(w->qkv + (n * HD + r) * D3 + D + VL * u);
                        float *dk = k->dqkv + (n * HD + r) * D3 + D + VL * u;
                        st(dk, ld(dk) + d * qu);
                    }
            }
            st(k->dqkv + (q0 + i) * D3 + VL * u, dq * scale);
        }
    }
}

/* One layer's backward for window b, after layer_fwd on the same x: dy (R, D) -> dx (T, D) (written),
 * parameter gradients accumulated into gp (same packing as p) and gw2T (F, D): W2's, transposed. */
static void layer_bwd(const float *p, const Trans *t, const float *x, const float *dy, float *dx, float *gp,
                      float *gw2T, const Work *w, Back *k, int last, const Site *sites) {
    const int R = last ? 1 : T, q0 = last ? T - 1 : 0;
    const vf keep = sites[2].keep;
    const float scale = 1.0f / sqrtf((float)HD);
    memset(dx, 0, sizeof(float) * T * D);
    /* LN2, feed-forward */
    for (int i = 0; i < R; i++) {
        float *dx1 = k->dx1 + i * D, *df2 = k->df2 + i * D;
        layernorm_back(dy + i * D, w->xh2 + i * D, w->rs2[i], p + O_G2, gp + O_G2, gp + O_BE2, dx1);
        for (int u = 0; u < V; u++) {
            const vf d = ld(w->m3 + i * D + VL * u) * ld(dx1 + VL * u);
            st(df2 + VL * u, d);
            st(gp + O_B2 + VL * u, ld(gp + O_B2 + VL * u) + d);
        }
    }
    mm(R, D, FP, k->df2, D, 1, t->w2, FP, NULL, 0, k->dg, FP);               /* dg = df2 W2 */
    mm(F, R, D, w->g, 1, FP, k->df2, D, gw2T, D, gw2T, D);                   /* gW2^T += g^T df2 */
    {
        vf gb[FP / VL];
        for (int n = 0; n < FP / VL; n++) gb[n] = (vf){0};
        for (int i = 0; i < R; i++)
            for (int n = 0; n < FP; n += VL) {
                const vf gz = ld(w->g + i * FP + n), df = ld(k->dg + i * FP + n);
                const vf d = (vf)((vi)(df * keep) & (gz > 0));   /* where the unit was kept and active */
                st(k->dg + i * FP + n, d);
                gb[n / VL] += d;
            }
        float gbs[FP];
        for (int n = 0; n < FP; n += VL) st(gbs + n, gb[n / VL]);
        for (int c = 0; c < F; c++) gp[O_B1 + c] += gbs[c];
    }
    mm(F, R, D, k->dg, 1, FP, w->x1, D, gp + O_W1, D, gp + O_W1, D);        /* gW1 += df^T x1 */
    mm(R, FP, D, k->dg, FP, 1, t->w1, D, k->dx1, D, k->dx1, D);              /* dx1 += df W1 */
    /* LN1, out-projection */
    for (int i = 0; i < R; i++) {
        float dr1[D];
        layernorm_back(k->dx1 + i * D, w->xh1 + i * D, w->rs1[i], p + O_G1, gp + O_G1, gp + O_BE1, dr1);
        for (int u = 0; u < V; u++) {
            st(dx + (q0 + i) * D + VL * u, ld(dr1 + VL * u));
            const vf d = ld(w->m1 + i * D + VL * u) * ld(dr1 + VL * u);
            st(k->da + i * D + VL * u, d);
            st(gp + O_BO + VL * u, ld(gp + O_BO + VL * u) + d);
        }
    }
    mm(R, D, D, k->da, D, 1, p + O_WO, D, NULL, 0, k->dO, D);                /* dO = da Wo */
    mm(D, R, D, k->da, 1, D, w->o, D, gp + O_WO, D, gp + O_WO, D);          /* gWo += da^T o */
    attention_bwd(w, k, R, q0, scale);
    /* in-projection: queries of the R rows, keys and values of every position */
    for (int j = 0; j < T; j++)
        for (int o = 0; o < D3; o += VL) st(gp + O_BQKV + o, ld(gp + O_BQKV + o) + ld(k->dqkv + j * D3 + o));
    mm(D3, T, D, k->dqkv, 1, D3, x, D, gp + O_WQKV, D, gp + O_WQKV, D);     /* gWqkv += dqkv^T x */
    mm(T, D3, D, k->dqkv, D3, 1, p + O_WQKV, D, dx, D, dx, D);              /* dx += dqkv Wqkv */
}

static Trans *transpose_all(const float *params) {
    Trans *tr = (Trans *)calloc(L, sizeof(Trans));
    if (!tr) return NULL;
    for (int l = 0; l < L; l++) {
        const float *p = params + (int64_t)l * PL;
        Trans *t = tr + l;
        for (int o = 0; o < D3; o++) for (int c = 0; c < D; c++) t->wqkvT[c * D3 + o] = p[O_WQKV + o * D + c];
        for (int o = 0; o < D; o++) for (int c = 0; c < D; c++) t->woT[c * D + o] = p[O_WO + o * D + c];
        for (int k = 0; k < F; k++) {
            t->b1[k] = p[O_B1 + k];
            for (int c = 0; c < D; c++) {
                t->w1T[c * FP + k] = t->w1[k * D + c] = p[O_W1 + k * D + c];
                t->w2T[k * D + c] = t->w2[c * FP + k] = p[O_W2 + c * F + k];
            }
        }
    }
    return tr;
}

static int64_t threshold(double p) { return (int64_t)llround(p * 4294967296.0); }

int reslm_params_per_layer(void) { return PL; }

static void sites_of(Site *s, const uint32_t *seeds, int64_t thr, float keep, int train) {
    for (int e = 0; e < 4 * L; e++) s[e] = site(seeds + 2 * e, thr, keep, train);
}

/* One window forward: x0 (T, D) -> y (D), each layer's input into saved (L, T, D) when saved is not NULL. */
static void forward_window(const float *params, const Trans *tr, const Site *sites, Work *w, float *buf, int64_t b,
                           const float *x0, float *saved, float *y) {
    float *cur = buf, *nxt = buf + T * D;
    memcpy(cur, x0, sizeof(float) * T * D);
    for (int l = 0; l < L; l++) {
        if (saved) memcpy(saved + (int64_t)l * T * D, cur, sizeof(float) * T * D);
        const int last = l == L - 1;
        layer_fwd(params + (int64_t)l * PL, tr + l, cur, last ? y : nxt, w, last, b, sites + 4 * l);
        float *t = cur; cur = nxt; nxt = t;
    }
}

/* One window backward from its saved layer inputs (L, T, D): dy (D) -> dx0 (T, D), gradients into gp
 * and gw2T (L, F, D); each layer recomputed from its input first. */
static void backward_window(const float *params, const Trans *tr, const Site *sites, Work *w, Back *k, float *buf,
                            int64_t b, const float *saved, const float *dy, float *dx0, float *gp, float *gw2T) {
    float *g = buf, *dxl = buf + T * D, *yl = buf + 2 * T * D;
    memcpy(g, dy, sizeof(float) * D);
    for (int l = L - 1; l >= 0; l--) {
        const int last = l == L - 1;
        const float *xl = saved + (int64_t)l * T * D;
        const float *pl = params + (int64_t)l * PL;
        layer_fwd(pl, tr + l, xl, yl, w, last, b, sites + 4 * l);
        layer_bwd(pl, tr + l, xl, g, l == 0 ? dx0 : dxl, gp + (int64_t)l * PL, gw2T + (int64_t)l * F * D, w, k, last,
                  sites + 4 * l);
        if (l > 0) memcpy(g, dxl, sizeof(float) * T * D);
    }
}

/* One window's training pass: forward through every layer (each layer's intermediates kept in w[l]),
 * the head (logits = hw y + hb, hw (V, D)) and the cross-entropy against `target` times `scale`
 * (1/B: the batch mean), then the backward from it, no layer recomputed. Returns the window's loss;
 * its logits into logits (V); gradients into dx0 (T, D), gp, gw2T (L, F, D) and gh (hw's (V, D), then
 * hb's (V)). */
static float train_window(const float *params, const Trans *tr, const Site *sites, Work *w, Back *k, float *xs,
                          float *lg, int64_t b, const float *x0, const float *hw, const float *hb, int nv,
                          int64_t target, float scale, float *logits, float *dx0, float *gp, float *gw2T, float *gh) {
    float y[D], g[D], *dxl = xs + (int64_t)L * T * D;
    for (int l = 0; l < L; l++)
        layer_fwd(params + (int64_t)l * PL, tr + l, l ? xs + (int64_t)l * T * D : x0,
                  l == L - 1 ? y : xs + (int64_t)(l + 1) * T * D, w + l, l == L - 1, b, sites + 4 * l);
    float mx = -INFINITY, sum = 0.f;
    for (int v = 0; v < nv; v++) {
        float z = hb[v];
        for (int c = 0; c < D; c++) z += hw[(int64_t)v * D + c] * y[c];
        lg[v] = z;
        mx = z > mx ? z : mx;
    }
    for (int v = 0; v < nv; v++) sum += expf(lg[v] - mx);
    memcpy(logits, lg, sizeof(float) * (size_t)nv);
    const float loss = mx + logf(sum) - lg[target];
    for (int c = 0; c < D; c++) g[c] = 0.f;
    for (int v = 0; v < nv; v++) {
        const float d = scale * (expf(lg[v] - mx) / sum - (v == target ? 1.0f : 0.0f));
        float *ghw = gh + (int64_t)v * D;
        for (int c = 0; c < D; c++) { ghw[c] += d * y[c]; g[c] += d * hw[(int64_t)v * D + c]; }
        gh[(int64_t)nv * D + v] += d;
    }
    for (int l = L - 1; l >= 0; l--) {
        const float *xl = l ? xs + (int64_t)l * T * D : x0;
        float *dx = l ? dxl : dx0;
        layer_bwd(params + (int64_t)l * PL, tr + l, xl, l == L - 1 ? g : xs + (int64_t)(l + 1) * T * D, dx,
                  gp + (int64_t)l * PL, gw2T + (int64_t)l * F * D, w + l, k, l == L - 1, sites + 4 * l);
        if (l) memcpy(xs + (int64_t)l * T * D, dx, sizeof(float) * T * D);   /* layer l's input, now its gradient */
    }
    return loss;
}

/* W2's gradients, summed transposed (L, F, D), into the packed ones */
static void add_w2(float *gp, const float *gw2T) {
    for (int l = 0; l < L; l++)
        for (int f = 0; f < F; f++)
            for (int c = 0; c < D; c++) gp[(int64_t)l * PL + O_W2 + c * F + f] += gw2T[((int64_t)l * F + f) * D + c];
}

/* B windows in parallel, each thread with its own workspace: the forward (dy NULL) or the backward.
 * Returns 0, or 1 when memory could not be allocated. */
static int windows(int64_t B, const float *params, const uint32_t *seeds, double p, int train, int threads,
                   const float *x0, float *saved, float *y, const float *dy, float *dx0, float *grads) {
    Trans *tr = transpose_all(params);
    if (!tr) return 1;
    Site sites[4 * L];
    sites_of(sites, seeds, threshold(p), train ? (float)(1.0 / (1.0 - p)) : 1.0f, train);
    int fail = 0;
#pragma omp parallel num_threads(threads)
    {
        Work *w = (Work *)malloc(sizeof(Work));
        Back *k = dy ? (Back *)malloc(sizeof(Back)) : NULL;
        float *buf = (float *)malloc(sizeof(float) * 3 * T * D);
        float *gw2T = dy ? (float *)calloc((size_t)L * F * D, sizeof(float)) : NULL;
        if (!w || !buf || (dy && (!gw2T || !k))) {
#pragma omp atomic write
            fail = 1;
        } else if (dy == NULL) {
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++)
                forward_window(params, tr, sites, w, buf, b, x0 + b * T * D, saved ? saved + b * L * T * D : NULL,
                               y + b * D);
        } else {
            float *gp = grads + (int64_t)omp_get_thread_num() * L * PL;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++)
                backward_window(params, tr, sites, w, k, buf, b, saved + b * L * T * D, dy + b * D, dx0 + b * T * D,
                                gp, gw2T);
            add_w2(gp, gw2T);
        }
        free(w);
        free(k);
        free(buf);
        free(gw2T);
    }
    free(tr);
    return fail;
}

/* Forward of B windows. x0 (B, T, D); saved (B, L, T, D): each layer's input (NULL: not kept); y (B, D): the
 * last layer's output at the last position. seeds: (L, 4, 2) uint32 (attention, out, ff hidden, ff out).
 * Returns 0, or 1 when memory could not be allocated. */
int reslm_window_forward(int64_t B, const float *x0, const float *params, const uint32_t *seeds, double p,
                         int train, int threads, float *saved, float *y) {
    return windows(B, params, seeds, p, train, threads, x0, saved, y, NULL, NULL, NULL);
}

/* Backward of B windows after reslm_window_forward (train or eval, the same seeds and p): dy (B, D)
 * -> dx0 (B, T, D); grads (threads, L * PL) zeroed by the caller, one row per thread (summed by the
 * caller). Returns 0, or 1 when memory could not be allocated. */
int reslm_window_backward(int64_t B, const float *saved, const float *dy, const float *params,
                          const uint32_t *seeds, double p, int train, int threads, float *dx0, float *grads) {
    return windows(B, params, seeds, p, train, threads, NULL, (float *)saved, NULL, dy, dx0, grads);
}

/* The loss of B windows and its gradients in one pass (no layer computed twice): x0 (B, T, D), the
 * head hw (V, D) and hb (V), targets (B); logits (B, V) and losses (B): each window's logits and
 * cross-entropy; the gradients of their mean: dx0 (B, T, D), grads (threads, L * PL) and ghead
 * (threads, V * D + V), zeroed by the caller, one row per thread. Returns 0, or 1 when memory could
 * not be allocated. */
int reslm_window_train(int64_t B, const float *x0, const float *params, const float *hw, const float *hb, int nv,
                       const int64_t *targets, const uint32_t *seeds, double p, int train, int threads, float *logits,
                       float *losses, float *dx0, float *grads, float *ghead) {
    Trans *tr = transpose_all(params);
    if (!tr) return 1;
    Site sites[4 * L];
    sites_of(sites, seeds, threshold(p), train ? (float)(1.0 / (1.0 - p)) : 1.0f, train);
    const float scale = 1.0f / (float)B;
    int fail = 0;
#pragma omp parallel num_threads(threads)
    {
        Work *w = (Work *)malloc(sizeof(Work) * L);
        Back *k = (Back *)malloc(sizeof(Back));
        float *xs = (float *)malloc(sizeof(float) * (L + 1) * T * D);
        float *lg = (float *)malloc(sizeof(float) * (size_t)nv);
        float *gw2T = (float *)calloc((size_t)L * F * D, sizeof(float));
        if (!w || !k || !xs || !lg || !gw2T) {
#pragma omp atomic write
            fail = 1;
        } else {
            const int th = omp_get_thread_num();
            float *gp = grads + (int64_t)th * L * PL, *gh = ghead + (int64_t)th * (nv * D + nv);
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++)
                losses[b] = train_window(params, tr, sites, w, k, xs, lg, b, x0 + b * T * D, hw, hb, nv, targets[b],
                                         scale, logits + b * nv, dx0 + b * T * D, gp, gw2T, gh);
            add_w2(gp, gw2T);
        }
        free(w);
        free(k);
        free(xs);
        free(lg);
        free(gw2T);
    }
    free(tr);
    return fail;
}
