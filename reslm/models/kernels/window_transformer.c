/* The character transformer's window step, fused per window (reslm.models.window_kernel).
 *
 * One window (T characters, width D) goes through all L post-LN encoder layers with every
 * intermediate in a per-thread workspace of a few tens of KB, so the (H, T, T) attention tile, the
 * (T, F) feed-forward activations and the dropout masks never leave the cache. The forward keeps
 * only each layer's input (B, L, T, D); the backward recomputes a layer from its input, then
 * differentiates it (one extra forward, no large activation stored). Dropout masks are a hash of
 * (the step's seed pair of the site, the element's index in the plain path's tensor of that site),
 * the same function as reslm.models.window_kernel.hashed_drop_mask, so the backward regenerates
 * them instead of storing them, and the plain path can be given the very same masks.
 *
 * Arithmetic per layer (keep = 1/(1-p) in training, 1 in eval; m* are 0/1 masks):
 *   q, k, v = x Wqkv^T + bqkv;  q *= 1/sqrt(D/H)
 *   P = softmax(q k^T) per head;  o = (P * mA * keep) v
 *   x1 = LN1(x + keep * m1 * (o Wo^T + bo))
 *   x' = LN2(x1 + keep * m3 * (keep * m2 * relu(x1 W1^T + b1)) W2^T + b2)
 * The last layer computes queries and everything after them for the last position only.
 *
 * D, T, H, F, L are compile-time constants (-D flags) so that the inner loops vectorise fully.
 * Parameters of one layer, packed in this order (layer l at params + l * PL):
 *   Wqkv (3D, D), bqkv (3D), Wo (D, D), bo (D), W1 (F, D), b1 (F), W2 (D, F), b2 (D),
 *   g1 (D), be1 (D), g2 (D), be2 (D)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#define HD (D / H)
#define D3 (3 * D)
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

/* transposed copies of one layer's matrices, built once per call */
typedef struct {
    float wqkvT[D * D3];   /* (D, 3D) */
    float woT[D * D];      /* (D, D) */
    float w1T[D * F];      /* (D, F) */
    float w2T[F * D];      /* (F, D) */
} Trans;

/* one window's intermediates of one layer (rows: T for a full layer, 1 for the last one) */
typedef struct {
    float q[T * D], k[T * D], v[T * D];
    float kT[D * T], vT[D * T];
    float P[H * T * T];
    uint8_t mA[H * T * T];
    float o[T * D], a[T * D];
    uint8_t m1[T * D];
    float xh1[T * D], rs1[T], x1[T * D];
    float f[T * F], g[T * F];
    uint8_t m2[T * F];
    float f2[T * D];
    uint8_t m3[T * D];
    float xh2[T * D], rs2[T];
    /* backward scratch */
    float dq[T * D], dkT[D * T], dvT[D * T], dS[T], dPd[T];
    float do_[T * D], dr1[T * D], dx1[T * D], dg[T * F];
} Work;

static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 16;
    return x;
}

/* 1 where the element with flat index i of a site with seed pair (s0, s1) is KEPT */
static inline uint8_t kept(uint32_t i, uint32_t s0, uint32_t s1, int64_t thr) {
    uint32_t h = mix32((i ^ s1) * (s0 | 1u));
    return (int64_t)(int32_t)h >= (int64_t)INT32_MIN + thr;
}

static void masks(uint8_t *m, int n, int64_t base, const uint32_t *seed, int64_t thr, int train) {
    if (!train) { memset(m, 1, (size_t)n); return; }
    for (int e = 0; e < n; e++) m[e] = kept((uint32_t)(base + e), seed[0], seed[1], thr);
}

static void layernorm(const float *r, const float *g, const float *be, float *xh, float *rs, float *y) {
    float mean = 0.f, var = 0.f;
    for (int c = 0; c < D; c++) mean += r[c];
    mean /= D;
    for (int c = 0; c < D; c++) { float z = r[c] - mean; var += z * z; }
    float s = 1.0f / sqrtf(var / D + LN_EPS);
    *rs = s;
    for (int c = 0; c < D; c++) { xh[c] = (r[c] - mean) * s; y[c] = xh[c] * g[c] + be[c]; }
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

/* One layer's forward for window b: x (T, D) -> y (R, D), R = 1 (last) or T; intermediates in w. */
static void layer_fwd(const float *p, const Trans *t, const float *x, float *y, Work *w, int last, int64_t b,
                      const uint32_t *seeds, int64_t thr, float keep, int train) {
    const int R = last ? 1 : T, q0 = last ? T - 1 : 0;
    const float scale = 1.0f / sqrtf((float)HD);
    /* keys and values of every position; queries of the R rows */
    for (int j = 0; j < T; j++) {
        float acc[D3];
        for (int o = 0; o < D3; o++) acc[o] = p[O_BQKV + o];
        for (int c = 0; c < D; c++) {
            const float xc = x[j * D + c];
            const float *wr = t->wqkvT + c * D3;
            for (int o = 0; o < D3; o++) acc[o] += xc * wr[o];
        }
        for (int o = 0; o < D; o++) {
            w->k[j * D + o] = acc[D + o];
            w->v[j * D + o] = acc[2 * D + o];
            w->kT[o * T + j] = acc[D + o];
            w->vT[o * T + j] = acc[2 * D + o];
        }
        if (j >= q0)
            for (int o = 0; o < D; o++) w->q[(j - q0) * D + o] = acc[o] * scale;
    }
    /* attention, per head and query row */
    masks(w->mA, H * R * T, b * (int64_t)(H * R * T), seeds, thr, train);
    for (int hh = 0; hh < H; hh++) {
        for (int i = 0; i < R; i++) {
            float s[T], mx = -INFINITY, sum = 0.f;
            for (int j = 0; j < T; j++) s[j] = 0.f;
            for (int c = hh * HD; c < (hh + 1) * HD; c++) {
                const float qc = w->q[i * D + c];
                for (int j = 0; j < T; j++) s[j] += qc * w->kT[c * T + j];
            }
            for (int j = 0; j < T; j++) mx = s[j] > mx ? s[j] : mx;
            for (int j = 0; j < T; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
            const float inv = 1.0f / sum;
            float *P = w->P + (hh * R + i) * T;
            const uint8_t *m = w->mA + (hh * R + i) * T;
            float pd[T];
            for (int j = 0; j < T; j++) { P[j] = s[j] * inv; pd[j] = m[j] ? P[j] * keep : 0.f; }
            for (int c = hh * HD; c < (hh + 1) * HD; c++) {
                float acc = 0.f;
                for (int j = 0; j < T; j++) acc += pd[j] * w->vT[c * T + j];
                w->o[i * D + c] = acc;
            }
        }
    }
    /* out-projection, residual, LN1 */
    masks(w->m1, R * D, b * (int64_t)(R * D), seeds + 2, thr, train);
    for (int i = 0; i < R; i++) {
        float r[D];
        for (int o = 0; o < D; o++) w->a[i * D + o] = p[O_BO + o];
        for (int c = 0; c < D; c++) {
            const float oc = w->o[i * D + c];
            for (int o = 0; o < D; o++) w->a[i * D + o] += oc * t->woT[c * D + o];
        }
        for (int o = 0; o < D; o++)
            r[o] = x[(q0 + i) * D + o] + (w->m1[i * D + o] ? keep * w->a[i * D + o] : 0.f);
        layernorm(r, p + O_G1, p + O_BE1, w->xh1 + i * D, w->rs1 + i, w->x1 + i * D);
    }
    /* feed-forward, residual, LN2 */
    masks(w->m2, R * F, b * (int64_t)(R * F), seeds + 4, thr, train);
    masks(w->m3, R * D, b * (int64_t)(R * D), seeds + 6, thr, train);
    for (int i = 0; i < R; i++) {
        float *f = w->f + i * F, *g = w->g + i * F;
        for (int k = 0; k < F; k++) f[k] = p[O_B1 + k];
        for (int c = 0; c < D; c++) {
            const float xc = w->x1[i * D + c];
            const float *wr = t->w1T + c * F;
            for (int k = 0; k < F; k++) f[k] += xc * wr[k];
        }
        const uint8_t *m2 = w->m2 + i * F;
        for (int k = 0; k < F; k++) g[k] = (m2[k] && f[k] > 0.f) ? f[k] * keep : 0.f;
        float acc[D], r[D];
        for (int o = 0; o < D; o++) acc[o] = p[O_B2 + o];
        for (int k = 0; k < F; k++) {
            const float gk = g[k];
            const float *wr = t->w2T + k * D;
            for (int o = 0; o < D; o++) acc[o] += gk * wr[o];
        }
        for (int o = 0; o < D; o++) {
            w->f2[i * D + o] = acc[o];
            r[o] = w->x1[i * D + o] + (w->m3[i * D + o] ? keep * acc[o] : 0.f);
        }
        layernorm(r, p + O_G2, p + O_BE2, w->xh2 + i * D, w->rs2 + i, y + i * D);
    }
}

/* One layer's backward for window b, after layer_fwd on the same x: dy (R, D) -> dx (T, D) (written),
 * parameter gradients accumulated into gp (same packing as p). */
static void layer_bwd(const float *p, const float *x, const float *dy, float *dx, float *gp, Work *w, int last,
                      float keep) {
    const int R = last ? 1 : T, q0 = last ? T - 1 : 0;
    const float scale = 1.0f / sqrtf((float)HD);
    memset(dx, 0, sizeof(float) * T * D);
    /* LN2, feed-forward */
    for (int i = 0; i < R; i++) {
        float dr2[D], df2[D];
        float *dx1 = w->dx1 + i * D;
        layernorm_back(dy + i * D, w->xh2 + i * D, w->rs2[i], p + O_G2, gp + O_G2, gp + O_BE2, dr2);
        for (int o = 0; o < D; o++) {
            df2[o] = w->m3[i * D + o] ? keep * dr2[o] : 0.f;
            gp[O_B2 + o] += df2[o];
            dx1[o] = dr2[o];
        }
        const float *g = w->g + i * F, *f = w->f + i * F;
        const uint8_t *m2 = w->m2 + i * F;
        float *dg = w->dg + i * F;
        for (int k = 0; k < F; k++) dg[k] = 0.f;
        for (int o = 0; o < D; o++) {
            const float d = df2[o];
            float *gw = gp + O_W2 + o * F;
            const float *wr = p + O_W2 + o * F;
            for (int k = 0; k < F; k++) { gw[k] += d * g[k]; dg[k] += d * wr[k]; }
        }
        for (int k = 0; k < F; k++) {
            const float df = (m2[k] && f[k] > 0.f) ? dg[k] * keep : 0.f;
            if (df == 0.f) continue;
            gp[O_B1 + k] += df;
            float *gw = gp + O_W1 + k * D;
            const float *wr = p + O_W1 + k * D;
            const float *x1 = w->x1 + i * D;
            for (int c = 0; c < D; c++) { gw[c] += df * x1[c]; dx1[c] += df * wr[c]; }
        }
    }
    /* LN1, out-projection */
    for (int i = 0; i < R; i++) {
        float *dr1 = w->dr1 + i * D, *dO = w->do_ + i * D;
        layernorm_back(w->dx1 + i * D, w->xh1 + i * D, w->rs1[i], p + O_G1, gp + O_G1, gp + O_BE1, dr1);
        for (int c = 0; c < D; c++) { dx[(q0 + i) * D + c] += dr1[c]; dO[c] = 0.f; }
        for (int o = 0; o < D; o++) {
            const float da = w->m1[i * D + o] ? keep * dr1[o] : 0.f;
            gp[O_BO + o] += da;
            float *gw = gp + O_WO + o * D;
            const float *wr = p + O_WO + o * D;
            const float *oi = w->o + i * D;
            for (int c = 0; c < D; c++) { gw[c] += da * oi[c]; dO[c] += da * wr[c]; }
        }
    }
    /* attention */
    memset(w->dkT, 0, sizeof(float) * D * T);
    memset(w->dvT, 0, sizeof(float) * D * T);
    for (int hh = 0; hh < H; hh++) {
        for (int i = 0; i < R; i++) {
            const float *P = w->P + (hh * R + i) * T;
            const uint8_t *m = w->mA + (hh * R + i) * T;
            float dPd[T], dS[T], dot = 0.f;
            for (int j = 0; j < T; j++) dPd[j] = 0.f;
            for (int c = hh * HD; c < (hh + 1) * HD; c++) {
                const float g = w->do_[i * D + c];
                const float *vr = w->vT + c * T;
                float *dv = w->dvT + c * T;
                for (int j = 0; j < T; j++) {
                    dPd[j] += g * vr[j];
                    dv[j] += (m[j] ? P[j] * keep : 0.f) * g;
                }
            }
            for (int j = 0; j < T; j++) { dPd[j] = m[j] ? dPd[j] * keep : 0.f; dot += dPd[j] * P[j]; }
            for (int j = 0; j < T; j++) dS[j] = P[j] * (dPd[j] - dot);
            for (int c = hh * HD; c < (hh + 1) * HD; c++) {
                const float qc = w->q[i * D + c];
                const float *kr = w->kT + c * T;
                float *dk = w->dkT + c * T, acc = 0.f;
                for (int j = 0; j < T; j++) { acc += dS[j] * kr[j]; dk[j] += dS[j] * qc; }
                w->dq[i * D + c] = acc * scale;
            }
        }
    }
    /* in-projection: queries of the R rows, keys and values of every position */
    for (int i = 0; i < R; i++) {
        const float *xr = x + (q0 + i) * D;
        float *dxr = dx + (q0 + i) * D;
        for (int o = 0; o < D; o++) {
            const float d = w->dq[i * D + o];
            gp[O_BQKV + o] += d;
            float *gw = gp + O_WQKV + o * D;
            const float *wr = p + O_WQKV + o * D;
            for (int c = 0; c < D; c++) { gw[c] += d * xr[c]; dxr[c] += d * wr[c]; }
        }
    }
    for (int j = 0; j < T; j++) {
        const float *xr = x + j * D;
        float *dxr = dx + j * D;
        for (int o = 0; o < 2 * D; o++) {
            const float d = o < D ? w->dkT[o * T + j] : w->dvT[(o - D) * T + j];
            gp[O_BQKV + D + o] += d;
            float *gw = gp + O_WQKV + (D + o) * D;
            const float *wr = p + O_WQKV + (D + o) * D;
            for (int c = 0; c < D; c++) { gw[c] += d * xr[c]; dxr[c] += d * wr[c]; }
        }
    }
}

static Trans *transpose_all(const float *params) {
    Trans *tr = (Trans *)malloc(sizeof(Trans) * L);
    if (!tr) return NULL;
    for (int l = 0; l < L; l++) {
        const float *p = params + (int64_t)l * PL;
        Trans *t = tr + l;
        for (int o = 0; o < D3; o++) for (int c = 0; c < D; c++) t->wqkvT[c * D3 + o] = p[O_WQKV + o * D + c];
        for (int o = 0; o < D; o++) for (int c = 0; c < D; c++) t->woT[c * D + o] = p[O_WO + o * D + c];
        for (int k = 0; k < F; k++) for (int c = 0; c < D; c++) t->w1T[c * F + k] = p[O_W1 + k * D + c];
        for (int o = 0; o < D; o++) for (int k = 0; k < F; k++) t->w2T[k * D + o] = p[O_W2 + o * F + k];
    }
    return tr;
}

static int64_t threshold(double p) { return (int64_t)llround(p * 4294967296.0); }

int reslm_params_per_layer(void) { return PL; }

/* One window forward: x0 (T, D) -> y (D), each layer's input into saved (L, T, D) when saved is not NULL. */
static void forward_window(const float *params, const Trans *tr, const uint32_t *seeds, int64_t thr, float keep,
                           int train, Work *w, float *buf, int64_t b, const float *x0, float *saved, float *y) {
    float *cur = buf, *nxt = buf + T * D;
    memcpy(cur, x0, sizeof(float) * T * D);
    for (int l = 0; l < L; l++) {
        if (saved) memcpy(saved + (int64_t)l * T * D, cur, sizeof(float) * T * D);
        const int last = l == L - 1;
        layer_fwd(params + (int64_t)l * PL, tr + l, cur, last ? y : nxt, w, last, b, seeds + l * 8, thr, keep, train);
        float *t = cur; cur = nxt; nxt = t;
    }
}

/* One window backward from its saved layer inputs (L, T, D): dy (D) -> dx0 (T, D), gradients into gp. */
static void backward_window(const float *params, const Trans *tr, const uint32_t *seeds, int64_t thr, float keep,
                            int train, Work *w, float *buf, int64_t b, const float *saved, const float *dy,
                            float *dx0, float *gp) {
    float *g = buf, *dxl = buf + T * D, *yl = buf + 2 * T * D;
    memcpy(g, dy, sizeof(float) * D);
    for (int l = L - 1; l >= 0; l--) {
        const int last = l == L - 1;
        const float *xl = saved + (int64_t)l * T * D;
        const float *pl = params + (int64_t)l * PL;
        layer_fwd(pl, tr + l, xl, yl, w, last, b, seeds + l * 8, thr, keep, train);
        layer_bwd(pl, xl, g, l == 0 ? dx0 : dxl, gp + (int64_t)l * PL, w, last, keep);
        if (l > 0) memcpy(g, dxl, sizeof(float) * T * D);
    }
}

/* B windows in parallel, each thread with its own workspace: the forward (dy NULL) or the backward.
 * Returns 0, or 1 when memory could not be allocated. */
static int windows(int64_t B, const float *params, const uint32_t *seeds, double p, int train, int threads,
                   const float *x0, float *saved, float *y, const float *dy, float *dx0, float *grads) {
    Trans *tr = transpose_all(params);
    if (!tr) return 1;
    const int64_t thr = threshold(p);
    const float keep = train ? (float)(1.0 / (1.0 - p)) : 1.0f;
    int fail = 0;
#pragma omp parallel num_threads(threads)
    {
        Work *w = (Work *)malloc(sizeof(Work));
        float *buf = (float *)malloc(sizeof(float) * 3 * T * D);
        if (!w || !buf) {
#pragma omp atomic write
            fail = 1;
        } else if (dy == NULL) {
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++)
                forward_window(params, tr, seeds, thr, keep, train, w, buf, b, x0 + b * T * D,
                               saved ? saved + b * L * T * D : NULL, y + b * D);
        } else {
            float *gp = grads + (int64_t)omp_get_thread_num() * L * PL;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < B; b++)
                backward_window(params, tr, seeds, thr, keep, train, w, buf, b, saved + b * L * T * D, dy + b * D,
                                dx0 + b * T * D, gp);
        }
        free(w);
        free(buf);
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
