/* One draft token, fused: a distilled draft's whole one-token step on CPU in one call.
 *
 * specasr.backends.cpu.fused builds this file on first use with torch's extension builder
 * (torch.utils.cpp_extension: -O3 -march=native -fopenmp, linked against the OpenMP runtime torch
 * itself loaded) and calls it through ctypes. It is C in a .cpp file, as that builder compiles
 * C++: the exported functions are `extern "C"` so ctypes finds them by their plain names.
 * It replaces, for one row and one new token, the ~40 small torch ops of
 * `specasr.backends.cpu.scripted.int8_layer_step` (per layer) and the int8 head, whose fixed costs
 * made up most of a draft step (docs/benchmarks.md has the timings). The maths is the draft's:
 *
 *   x = embed[token] + positions[pos]
 *   per layer: x += out(self_attn(qkv(ln1(x))));  x += cross_out(cross_attn(cross_q(ln2(x))));
 *              x += fc2(gelu(fc1(ln3(x))))
 *   logits[N] = head(ln(x))
 *
 * Products are int8: weights per output row (scale sw[r]), the input vector quantised per
 * call to int8 (scale sx), summed exactly in int32: y[r] = sx * sw[r] * sum_i xq[i] w[r][i] + b[r].
 * That is lossy like fbgemm's dynamic product the torch path runs (rounding differs), which
 * moves the draft's agreement with the target, never the transcript.
 *
 * The self-attention cache is the torch runner's own ([H, 448, dh] fp32 per layer, B = 1):
 * this step writes the token's keys and values at `pos` and attends over 0 … pos. The cross
 * K/V are the runner's ([H, S, dh], bf16 or fp32).
 *
 * The file also exports `int8_rows`, an int8 target's head product (`fused.Int8Rows`; see there),
 * and `attend_bf16`, an encoder's self-attention in bf16 (`bf16.Bf16Attention`; see there).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX512VNNI__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define MAX_LAYERS 8

/* Bump SPECASR_DRAFT_ABI whenever a signature below, `Dims` or the order of the pointers
 * `draft_model` and `draft_state` read changes, together with `ABI` in fused.py: Python checks
 * it (and sizeof(Dims) against its ctypes mirror) before calling anything, so a library and a
 * Python side that disagree fall back to torch instead of reading each other's memory wrongly. */
#define SPECASR_DRAFT_ABI 4

/* The model's sizes, mirrored field for field by `_Dims` (a ctypes.Structure) in fused.py */
typedef struct {
    int32_t d, heads, ffn, layers, ctx, threads;
    int32_t head_rows;   /* the head's output rows: the draft's vocabulary */
    int32_t embed_rows;  /* rows of embed: the largest token accepted */
    float eps;           /* every layer norm's */
} Dims;

typedef struct {
    const int8_t *w;      /* [out, in] */
    const float *scale;   /* [out] */
    const int32_t *rsum;  /* [out]: sum_i w[r][i], for the +128 shift of the VNNI path */
    const float *bias;    /* [out] or NULL */
    int out, in;
} Lin;

typedef struct {
    const float *ln1w, *ln1b, *ln2w, *ln2b, *ln3w, *ln3b;
    Lin qkv, out, cq, co, fc1, fc2;
} Layer;

typedef struct {
    int d, heads, ffn, layers, ctx, threads, vocab;  /* vocab: rows of embed */
    float eps;
    const float *embed, *pos;  /* [V, d], [ctx, d] */
    const float *lnw, *lnb;
    Layer layer[MAX_LAYERS];
    Lin head;
} Model;

typedef struct {
    float *K[MAX_LAYERS], *V[MAX_LAYERS];    /* [H, ctx, dh] fp32 */
    const void *ck[MAX_LAYERS], *cv[MAX_LAYERS]; /* [H, S, dh] */
    int S, bf16;
} State;

/* ---- building blocks ------------------------------------------------------------------ */
static void layer_norm(const float *x, const float *w, const float *b, float eps, int d, float *y) {
    float mean = 0.f, var = 0.f;
    for (int i = 0; i < d; i++) mean += x[i];
    mean /= d;
    for (int i = 0; i < d; i++) {
        float t = x[i] - mean;
        var += t * t;
    }
    float inv = 1.f / sqrtf(var / d + eps);
    for (int i = 0; i < d; i++) y[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* x [n] -> xq [n] int8 (|xq| <= 127) and its scale; the VNNI path also needs x + 128 as uint8 */
static float quantize(const float *x, int n, int8_t *xq) {
    float m = 0.f;
    for (int i = 0; i < n; i++) { float t = x[i] < 0.f ? -x[i] : x[i]; m = t > m ? t : m; }
    float s = m > 0.f ? m / 127.f : 1.f, inv = 1.f / s;
    for (int i = 0; i < n; i++) xq[i] = (int8_t)lrintf(x[i] * inv);
    return s;
}

static inline int32_t dot_i8(const uint8_t *xu, const int8_t *xq, const int8_t *w, int n, int32_t rsum) {
#ifdef __AVX512VNNI__
    (void)xq;
    __m512i acc = _mm512_setzero_si512();
    int i = 0;
    for (; i + 64 <= n; i += 64)
        acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512((const void *)(xu + i)),
                                  _mm512_loadu_si512((const void *)(w + i)));
    int32_t s = _mm512_reduce_add_epi32(acc);
    for (; i < n; i++) s += (int32_t)xu[i] * w[i];
    return s - 128 * rsum;  /* xu = xq + 128 */
#else
    (void)xu;
    (void)rsum;
    int32_t s = 0;
    for (int i = 0; i < n; i++) s += (int32_t)xq[i] * (int32_t)w[i];
    return s;
#endif
}

/* y [out] = x [in] · Wᵀ (+ b), int8 */
static void linear(const Lin *L, const float *x, float *y, int8_t *xq, uint8_t *xu, int threads) {
    float sx = quantize(x, L->in, xq);
    for (int i = 0; i < L->in; i++) xu[i] = (uint8_t)(xq[i] + 128);
#pragma omp parallel for schedule(static) num_threads(threads) if (L->out >= 1024)
    for (int r = 0; r < L->out; r++) {
        float v = (float)dot_i8(xu, xq, L->w + (size_t)r * L->in, L->in, L->rsum[r]) * sx * L->scale[r];
        y[r] = L->bias ? v + L->bias[r] : v;
    }
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#ifdef __AVX512F__
/* 16 keys' or values' elements at t (bf16 or fp32) as fp32 */
static inline __m512 load16(const void *t, size_t at, int bf16) {
    if (bf16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)t + at));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)t + at);
}
#endif

/* one query q [dh] against n keys/values [n, dh] (fp32 or bf16) -> y [dh]; p: scratch [n] */
static void attend(const float *q, const void *K, const void *V, int n, int dh, int bf16, float *p, float *y) {
    float m = -INFINITY;
#ifdef __AVX512F__
    if (dh % 16 == 0 && dh <= 128) {
        __m512 qv[8], acc[8];
        int c = dh / 16;
        for (int i = 0; i < c; i++) qv[i] = _mm512_loadu_ps(q + 16 * i);
        for (int j = 0; j < n; j++) {
            __m512 s = _mm512_mul_ps(qv[0], load16(K, (size_t)j * dh, bf16));
            for (int i = 1; i < c; i++) s = _mm512_fmadd_ps(qv[i], load16(K, (size_t)j * dh + 16 * i, bf16), s);
            p[j] = _mm512_reduce_add_ps(s);
            m = p[j] > m ? p[j] : m;
        }
        float z = 0.f;
        for (int j = 0; j < n; j++) z += (p[j] = expf(p[j] - m));
        for (int i = 0; i < c; i++) acc[i] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            __m512 w = _mm512_set1_ps(p[j]);
            for (int i = 0; i < c; i++) acc[i] = _mm512_fmadd_ps(w, load16(V, (size_t)j * dh + 16 * i, bf16), acc[i]);
        }
        __m512 inv = _mm512_set1_ps(1.f / z);
        for (int i = 0; i < c; i++) _mm512_storeu_ps(y + 16 * i, _mm512_mul_ps(acc[i], inv));
        return;
    }
#endif
    for (int j = 0; j < n; j++) {
        float s = 0.f;
        if (bf16) {
            const uint16_t *k = (const uint16_t *)K + (size_t)j * dh;
            for (int i = 0; i < dh; i++) s += q[i] * bf16_to_f32(k[i]);
        } else {
            const float *k = (const float *)K + (size_t)j * dh;
            for (int i = 0; i < dh; i++) s += q[i] * k[i];
        }
        p[j] = s;
        m = s > m ? s : m;
    }
    float z = 0.f;
    for (int j = 0; j < n; j++) z += (p[j] = expf(p[j] - m));
    for (int i = 0; i < dh; i++) y[i] = 0.f;
    for (int j = 0; j < n; j++) {
        float w = p[j] / z;
        if (bf16) {
            const uint16_t *v = (const uint16_t *)V + (size_t)j * dh;
            for (int i = 0; i < dh; i++) y[i] += w * bf16_to_f32(v[i]);
        } else {
            const float *v = (const float *)V + (size_t)j * dh;
            for (int i = 0; i < dh; i++) y[i] += w * v[i];
        }
    }
}

static inline float gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }

/* ---- an int8 target's head: the per-row product, without fbgemm's packed copy ----------
 *
 * `specasr.backends.cpu.scripted.int8_product(x, packed, None, per_row=True)` computes, through
 * fbgemm, for each row of x [rows, in] and each row of W [out, in] (int8, |w| <= 63, fp32 scale
 * sw): a = max |x_r|; u = round(x_r / a * 127.5) + 128 in 0 … 255 (fbgemm's fixed range [-1, 1]:
 * scale s = 2/255, zero point 128); y[r][o] = float(sum_i u[i] w[o][i] - 128 rsum[o]) * (s * sw[o])
 * * a. This is the same arithmetic, bitwise (tested), from W in a layout of 16-row blocks, each
 * [in/4][16][4] (four consecutive inputs of 16 outputs side by side: one vector), which
 * `fused.Int8Rows` builds with one permutation instead of fbgemm's packing, which for a 51865-row
 * head costs a load more than a recording's worth of its products. Each vector product adds four
 * inputs of one row (broadcast) into 16 outputs: no horizontal sums. A row's result depends on that
 * row alone. */

#define OUT_BLOCK 16
#define ROWS_CHUNK 64 /* rows per task of int8_rows */

#if defined(__AVX512VNNI__)
#define ROWS_MAX 8
/* R rows (R constant at each call) of u against one 16-output block: sums[R][16] */
static inline __attribute__((always_inline)) void block_rows(const uint8_t *u, int in, const int8_t *wb, int R,
                                                             int32_t *sums) {
    __m512i acc[ROWS_MAX];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
    for (int k = 0; k < in / 4; k++) {
        __m512i wv = _mm512_loadu_si512((const void *)(wb + (size_t)k * 64));
        for (int r = 0; r < R; r++) {
            int32_t quad;
            memcpy(&quad, u + (size_t)r * in + 4 * k, 4);
            acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(quad), wv);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_si512((void *)(sums + r * 16), acc[r]);
}
#elif defined(__AVX2__)
#define ROWS_MAX 4
static inline __attribute__((always_inline)) void block_rows(const uint8_t *u, int in, const int8_t *wb, int R,
                                                             int32_t *sums) {
    /* u8 · s8 pairs into int16: |w| <= 63 keeps 2 · 255 · 63 below 32767, so nothing saturates */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i lo[ROWS_MAX], hi[ROWS_MAX];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_si256();
    for (int k = 0; k < in / 4; k++) {
        __m256i wl = _mm256_loadu_si256((const __m256i *)(wb + (size_t)k * 64));
        __m256i wh = _mm256_loadu_si256((const __m256i *)(wb + (size_t)k * 64 + 32));
        for (int r = 0; r < R; r++) {
            int32_t quad;
            memcpy(&quad, u + (size_t)r * in + 4 * k, 4);
            __m256i q = _mm256_set1_epi32(quad);
            lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q, wl), ones));
            hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q, wh), ones));
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_si256((__m256i *)(sums + r * 16), lo[r]);
        _mm256_storeu_si256((__m256i *)(sums + r * 16 + 8), hi[r]);
    }
}
#else
#define ROWS_MAX 4
static inline void block_rows(const uint8_t *u, int in, const int8_t *wb, int R, int32_t *sums) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 16; j++) {
            int32_t t = 0;
            for (int k = 0; k < in / 4; k++)
                for (int e = 0; e < 4; e++) t += (int32_t)u[(size_t)r * in + 4 * k + e] * wb[(size_t)k * 64 + 4 * j + e];
            sums[r * 16 + j] = t;
        }
}
#endif


/* ---- an encoder's self-attention in bf16 (attend_bf16) -------------------------------------
 * softmax(Q Kᵀ) V per window and head over all S frames (no mask), Q already scaled, dh = 64:
 * both products are AVX512_BF16 dot products of bf16 pairs summed in fp32 (vdpbf16ps), the
 * softmax is fp32 and its weights are rounded to bf16 for the second product, as a bf16
 * attention does. Per (window, head) K is packed as [dh / 2][S'][2] (16 keys per vector, S'
 * = S rounded up to 16, zeros past S) and V as [S' / 2][dh][2]; a task is 8 queries of one
 * head: their S' scores stay in the thread's cache, where a [S, S] score matrix per head did
 * not (torch's fp32 flash attention ran at about a third of this speed: docs/benchmarks.md).
 * Every task reads only its own window and head, so a window's output does not depend on the
 * others in the batch, nor on the thread count. */
#ifdef __AVX512BF16__
#define ATT_DH 64
#define ATT_ROWS 8

static inline __m512 exp_ps(__m512 x) {
    /* e^x = 2^n · 2^f, n = round(x log2 e), |f| <= 1/2; 2^f by its degree-6 Taylor polynomial
     * (relative error about 1e-7); below -87 (weights under 1e-38) the input is clamped */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.540353039338161e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.333355814642844e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402265069591007f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471805599453f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static void attend_pack(const uint16_t *k, const uint16_t *v, int S, int Sp, int d, uint32_t *kp, uint16_t *vp) {
    for (int j = 0; j < Sp; j++) {  /* kp[i][j]: key j's dims 2i, 2i+1 */
        const uint32_t *row = (const uint32_t *)(k + (size_t)j * d);
        for (int i = 0; i < ATT_DH / 2; i++) kp[(size_t)i * Sp + j] = j < S ? row[i] : 0u;
    }
    for (int j2 = 0; j2 < Sp / 2; j2++)  /* vp[j2][c]: dim c of keys 2·j2, 2·j2 + 1 */
        for (int c = 0; c < ATT_DH; c++) {
            const int j = 2 * j2;
            vp[((size_t)j2 * ATT_DH + c) * 2] = j < S ? v[(size_t)j * d + c] : 0;
            vp[((size_t)j2 * ATT_DH + c) * 2 + 1] = j + 1 < S ? v[(size_t)(j + 1) * d + c] : 0;
        }
}

/* 8 queries (rows of them past S are zeros, never written) of one head: out rows, fp32 */
static void attend_rows(const uint32_t *qp, int rows, const uint32_t *kp, const uint16_t *vp, int S, int Sp,
                        float *sc, uint16_t *pb, float *out, int d) {
    for (int j0 = 0; j0 < Sp; j0 += 16) {  /* scores [8][Sp] */
        __m512 acc[ATT_ROWS];
        for (int r = 0; r < ATT_ROWS; r++) acc[r] = _mm512_setzero_ps();
        for (int i = 0; i < ATT_DH / 2; i++) {
            const __m512bh kv = (__m512bh)_mm512_load_si512(kp + (size_t)i * Sp + j0);
            for (int r = 0; r < ATT_ROWS; r++)
                acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32((int)qp[r * ATT_DH / 2 + i]), kv);
        }
        for (int r = 0; r < ATT_ROWS; r++) _mm512_store_ps(sc + (size_t)r * Sp + j0, acc[r]);
    }
    float inv[ATT_ROWS];
    for (int r = 0; r < ATT_ROWS; r++) {  /* softmax in fp32; the weights leave as bf16 pairs */
        float *s = sc + (size_t)r * Sp;
        for (int j = S; j < Sp; j++) s[j] = -INFINITY;
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < Sp; j += 16) m = _mm512_max_ps(m, _mm512_load_ps(s + j));
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < Sp; j += 32) {
            const bool two = j + 16 < Sp;
            const __m512 e0 = exp_ps(_mm512_sub_ps(_mm512_load_ps(s + j), mx));
            const __m512 e1 = two ? exp_ps(_mm512_sub_ps(_mm512_load_ps(s + j + 16), mx)) : _mm512_setzero_ps();
            sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
            const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);  /* e0 low, e1 high */
            if (two) _mm512_storeu_si512(pb + (size_t)r * Sp + j, both);
            else _mm256_storeu_si256((__m256i *)(pb + (size_t)r * Sp + j), _mm512_castsi512_si256(both));
        }
        inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
    }
    for (int r0 = 0; r0 < ATT_ROWS && r0 < rows; r0 += 4) {  /* out = P V / sum, 4 rows × 64 dims */
        __m512 acc[4][4];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
        for (int j2 = 0; j2 < Sp / 2; j2++) {
            const __m512i *vrow = (const __m512i *)(vp + (size_t)j2 * ATT_DH * 2);
            const __m512bh v0 = (__m512bh)_mm512_load_si512(vrow), v1 = (__m512bh)_mm512_load_si512(vrow + 1);
            const __m512bh v2 = (__m512bh)_mm512_load_si512(vrow + 2), v3 = (__m512bh)_mm512_load_si512(vrow + 3);
            for (int r = 0; r < 4; r++) {
                const uint32_t pair = ((const uint32_t *)(pb + (size_t)(r0 + r) * Sp))[j2];
                const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pair);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], p, v0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], p, v1);
                acc[r][2] = _mm512_dpbf16_ps(acc[r][2], p, v2);
                acc[r][3] = _mm512_dpbf16_ps(acc[r][3], p, v3);
            }
        }
        for (int r = 0; r < 4 && r0 + r < rows; r++) {
            float *o = out + (size_t)(r0 + r) * d;
            const __m512 scale = _mm512_set1_ps(inv[r0 + r]);
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[r][c], scale));
        }
    }
}
#endif

/* ---- the step ------------------------------------------------------------------------- */
extern "C" {

int specasr_draft_abi(void) { return SPECASR_DRAFT_ABI; }

size_t specasr_draft_dims_size(void) { return sizeof(Dims); }

/* how many pointers draft_model reads for a draft of `layers` layers */
int specasr_draft_pointers(int layers) { return 4 + 4 + layers * (6 + 6 * 4); }

void *draft_model(const Dims *dims, void *const *ptrs) {
    /* ptrs: embed, pos, lnw, lnb, head (w, scale, rsum, bias), then per layer the 3 norms'
     * 6 tensors and 6 products (w, scale, rsum, bias each). Shapes come from d, ffn and
     * head_rows. NULL: more layers than MAX_LAYERS, or no memory. */
    if (dims->layers < 0 || dims->layers > MAX_LAYERS) return NULL;
    Model *m = (Model *)calloc(1, sizeof(Model));
    if (!m) return NULL;
    m->d = dims->d, m->heads = dims->heads, m->ffn = dims->ffn, m->layers = dims->layers;
    m->ctx = dims->ctx, m->threads = dims->threads, m->vocab = dims->embed_rows, m->eps = dims->eps;
    int k = 0, d = m->d;
#define F32(p) ((const float *)(p))
    m->embed = F32(ptrs[k++]), m->pos = F32(ptrs[k++]), m->lnw = F32(ptrs[k++]), m->lnb = F32(ptrs[k++]);
#define LIN(L, o, i)                                                                   \
    do {                                                                               \
        (L).w = (const int8_t *)ptrs[k++], (L).scale = F32(ptrs[k++]);                 \
        (L).rsum = (const int32_t *)ptrs[k++], (L).bias = F32(ptrs[k++]);              \
        (L).out = (o), (L).in = (i);                                                   \
    } while (0)
    LIN(m->head, dims->head_rows, d);
    for (int l = 0; l < m->layers; l++) {
        Layer *y = &m->layer[l];
        y->ln1w = F32(ptrs[k++]), y->ln1b = F32(ptrs[k++]), y->ln2w = F32(ptrs[k++]);
        y->ln2b = F32(ptrs[k++]), y->ln3w = F32(ptrs[k++]), y->ln3b = F32(ptrs[k++]);
        LIN(y->qkv, 3 * d, d);
        LIN(y->out, d, d);
        LIN(y->cq, d, d);
        LIN(y->co, d, d);
        LIN(y->fc1, m->ffn, d);
        LIN(y->fc2, d, m->ffn);
    }
#undef LIN
#undef F32
    return m;
}

void draft_free(void *p) { free(p); }

void *draft_state(const void *model, int S, int bf16, void *const *ptrs) {
    /* ptrs: per layer K, V (self cache), cross K, cross V */
    const Model *m = (const Model *)model;
    State *s = (State *)calloc(1, sizeof(State));
    if (!s) return NULL;
    s->S = S, s->bf16 = bf16;
    for (int l = 0, k = 0; l < m->layers; l++) {
        s->K[l] = (float *)ptrs[k++], s->V[l] = (float *)ptrs[k++];
        s->ck[l] = ptrs[k++], s->cv[l] = ptrs[k++];
    }
    return s;
}

/* token at position pos (pos < ctx) -> logits [head.out] (unless logits is NULL); 0 on success,
 * 1: pos out of range, 2: no memory, 3: token out of range */
int draft_step(const void *model, const void *state, int token, int pos, float *logits) {
    const Model *m = (const Model *)model;
    const State *st = (const State *)state;
    int d = m->d, H = m->heads, dh = d / H, F = m->ffn, ctx = m->ctx;
    /* the model's threads, or fewer where the calling thread's OpenMP count is lower (a decoding
     * loop kept to one thread: `specasr.backends.process.decoding_threads`) */
    int cap = omp_get_max_threads(), threads = cap < m->threads ? cap : m->threads;
    if (pos < 0 || pos >= ctx) return 1;
    if (token < 0 || token >= m->vocab) return 3;
    int big = F > 3 * d ? F : 3 * d;
    int n_att = H * st->S > ctx ? H * st->S : ctx; /* scores: every head's over S frames, or the cache */
    float *buf = (float *)malloc(sizeof(float) * (size_t)(3 * d + 2 * big + n_att));
    int8_t *xq = (int8_t *)malloc((size_t)big);
    uint8_t *xu = (uint8_t *)malloc((size_t)big);
    if (!buf || !xq || !xu) {
        free(buf), free(xq), free(xu);
        return 2;
    }
    float *x = buf, *h = x + d, *a = h + d, *y = a + d, *z = y + big, *p = z + big;
    const float *e = m->embed + (size_t)token * d, *ps = m->pos + (size_t)pos * d;
    for (int i = 0; i < d; i++) x[i] = e[i] + ps[i];
    float scale = 1.f / sqrtf((float)dh);
    for (int l = 0; l < m->layers; l++) {
        const Layer *L = &m->layer[l];
        /* self-attention: q, k, v = qkv(ln1(x)); write k, v at pos; attend over 0 … pos */
        layer_norm(x, L->ln1w, L->ln1b, m->eps, d, h);
        linear(&L->qkv, h, y, xq, xu, threads);
        for (int hd = 0; hd < H; hd++) {
            float *K = st->K[l] + ((size_t)hd * ctx + pos) * dh, *V = st->V[l] + ((size_t)hd * ctx + pos) * dh;
            memcpy(K, y + d + hd * dh, sizeof(float) * dh);
            memcpy(V, y + 2 * d + hd * dh, sizeof(float) * dh);
        }
        for (int i = 0; i < d; i++) y[i] *= scale;
        for (int hd = 0; hd < H; hd++)
            attend(y + hd * dh, st->K[l] + (size_t)hd * ctx * dh, st->V[l] + (size_t)hd * ctx * dh, pos + 1, dh, 0,
                   p, a + hd * dh);
        linear(&L->out, a, h, xq, xu, threads);
        for (int i = 0; i < d; i++) x[i] += h[i];
        /* cross-attention over the S pooled frames */
        layer_norm(x, L->ln2w, L->ln2b, m->eps, d, h);
        linear(&L->cq, h, y, xq, xu, threads);
        for (int i = 0; i < d; i++) y[i] *= scale;
        size_t es = st->bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int hd = 0; hd < H; hd++)  /* head hd's scores in p[hd·S …] */
            attend(y + hd * dh, (const char *)st->ck[l] + (size_t)hd * st->S * dh * es,
                   (const char *)st->cv[l] + (size_t)hd * st->S * dh * es, st->S, dh, st->bf16,
                   p + (size_t)hd * st->S, a + hd * dh);
        linear(&L->co, a, h, xq, xu, threads);
        for (int i = 0; i < d; i++) x[i] += h[i];
        /* MLP */
        layer_norm(x, L->ln3w, L->ln3b, m->eps, d, h);
        linear(&L->fc1, h, z, xq, xu, threads);
        for (int i = 0; i < F; i++) z[i] = gelu(z[i]);
        linear(&L->fc2, z, h, xq, xu, threads);
        for (int i = 0; i < d; i++) x[i] += h[i];
    }
    if (logits) {  /* NULL: a token whose keys and values alone are wanted (not the last fed) */
        layer_norm(x, m->lnw, m->lnb, m->eps, d, h);
        linear(&m->head, h, logits, xq, xu, threads);
    }
    free(buf), free(xq), free(xu);
    return 0;
}

/* y [rows, out] = the per-row int8 product of x [rows, in] (see above) with W in 16-row blocks
 * w4 [ceil(out / 16)][in / 4][16][4], sw and rsum [ceil(out / 16) · 16]; u [rows, in] and a [rows]
 * are the caller's scratch. in must be a multiple of 4 (else returns 1, computing nothing).
 * Output blocks split over `threads`. */
int int8_rows(const float *x, int rows, int in, const int8_t *w4, const float *sw, const int32_t *rsum,
              int out, float *y, uint8_t *u, float *a, int threads) {
    if (in % 4) return 1;
    const float s = (float)(2.0 / 255.0), inv = 1.f / s;
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= 64)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * in;
        float m = 0.f;
        for (int i = 0; i < in; i++) { float t = fabsf(xr[i]); m = t > m ? t : m; }
        m = m < 1e-30f ? 1e-30f : m;
        a[r] = m;
        uint8_t *ur = u + (size_t)r * in;
        for (int i = 0; i < in; i++) {
            /* the zero point added inside one fused multiply-add, then rounded: fbgemm's order,
             * which differs from rounding first where the sum drops a tie's last bit */
            float t = nearbyintf(fmaf(xr[i] / m, inv, 128.f));
            ur[i] = (uint8_t)(t < 0.f ? 0.f : (t > 255.f ? 255.f : t));
        }
    }
    /* Tasks are (16 outputs, up to ROWS_CHUNK rows): a head's few rows split over its
     * thousands of blocks, an encoder's 1500 frames over their chunks as well (a [1500, 512]
     * product has only 32 blocks). Sums are integers, so the split never changes a result. */
    const int blocks = (out + OUT_BLOCK - 1) / OUT_BLOCK;
    const int chunks = (rows + ROWS_CHUNK - 1) / ROWS_CHUNK;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (blocks * chunks >= 64)
    for (int b = 0; b < blocks; b++) {
        for (int c = 0; c < chunks; c++) {
            const int8_t *wb = w4 + (size_t)b * in * OUT_BLOCK;
            const int end = (c + 1) * ROWS_CHUNK < rows ? (c + 1) * ROWS_CHUNK : rows;
            int32_t sums[ROWS_MAX * OUT_BLOCK];
            for (int r0 = c * ROWS_CHUNK; r0 < end;) {
                int R = end - r0 >= ROWS_MAX ? ROWS_MAX : end - r0;
                const uint8_t *ur = u + (size_t)r0 * in;
                switch (R) {  /* each count its own unrolled copy: the accumulators stay in registers */
#if ROWS_MAX == 8
                case 8: block_rows(ur, in, wb, 8, sums); break;
                case 7: block_rows(ur, in, wb, 7, sums); break;
                case 6: block_rows(ur, in, wb, 6, sums); break;
                case 5: block_rows(ur, in, wb, 5, sums); break;
#endif
                case 4: block_rows(ur, in, wb, 4, sums); break;
                case 3: block_rows(ur, in, wb, 3, sums); break;
                case 2: block_rows(ur, in, wb, 2, sums); break;
                default: block_rows(ur, in, wb, 1, sums); break;
                }
                for (int r = 0; r < R; r++)
                    for (int j = 0; j < OUT_BLOCK && b * OUT_BLOCK + j < out; j++) {
                        const int o = b * OUT_BLOCK + j;
                        y[(size_t)(r0 + r) * out + o] =
                            (float)(sums[r * OUT_BLOCK + j] - 128 * rsum[o]) * (s * sw[o]) * a[r0 + r];
                    }
                r0 += R;
            }
        }
    }
    return 0;
}

/* 1 where this build has attend_bf16's kernel (the CPU computes AVX512_BF16 dot products) */
int attend_bf16_built(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

/* out [B, S, H·64] fp32 = each head's softmax(Q Kᵀ) V for q, k, v [B, S, H·64] bf16 (contiguous,
 * q scaled), see above. Returns 1 for other head sizes, 2 where the kernel is not built, 3 when
 * memory runs out (nothing written then), else 0. Tasks split over `threads` (at most the
 * caller's OpenMP count). */
int attend_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, float *out, int B, int S, int H, int dh,
                int threads) {
    if (dh != 64 || B < 1 || S < 1 || H < 1) return 1;
#ifdef __AVX512BF16__
    const int d = H * ATT_DH, Sp = (S + 15) & ~15, blocks = (S + ATT_ROWS - 1) / ATT_ROWS;
    const size_t kp_n = (size_t)(ATT_DH / 2) * Sp, vp_n = (size_t)Sp * ATT_DH;  /* uint32s, uint16s */
    const size_t per_head = kp_n * 4 + vp_n * 2;                                    /* bytes, a multiple of 64 */
    char *packs = (char *)aligned_alloc(64, (size_t)B * H * per_head);
    if (!packs) return 3;
    const int cap = omp_get_max_threads(), team = threads < cap ? threads : cap;
    int failed = 0;
#pragma omp parallel num_threads(team > 0 ? team : 1)
    {
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H;
            char *pk = packs + (size_t)bh * per_head;
            attend_pack(k + (size_t)b * S * d + h * ATT_DH, v + (size_t)b * S * d + h * ATT_DH, S, Sp, d,
                        (uint32_t *)pk, (uint16_t *)(pk + kp_n * 4));
        }
        float *sc = (float *)aligned_alloc(64, (size_t)ATT_ROWS * Sp * 4);
        uint16_t *pb = (uint16_t *)aligned_alloc(64, (size_t)ATT_ROWS * Sp * 2);
        if (!sc || !pb) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
#pragma omp for schedule(static)
            for (long task = 0; task < (long)B * H * blocks; task++) {
                const int bh = (int)(task / blocks), q0 = (int)(task % blocks) * ATT_ROWS;
                const int b = bh / H, h = bh % H, rows = S - q0 < ATT_ROWS ? S - q0 : ATT_ROWS;
                const char *pk = packs + (size_t)bh * per_head;
                uint32_t qp[ATT_ROWS * ATT_DH / 2];
                for (int r = 0; r < ATT_ROWS; r++) {
                    const uint32_t *row = (const uint32_t *)(q + ((size_t)b * S + q0 + r) * d + h * ATT_DH);
                    for (int i = 0; i < ATT_DH / 2; i++) qp[r * ATT_DH / 2 + i] = r < rows ? row[i] : 0u;
                }
                attend_rows(qp, rows, (const uint32_t *)pk, (const uint16_t *)(pk + kp_n * 4), S, Sp, sc, pb,
                            out + ((size_t)b * S + q0) * d + h * ATT_DH, d);
            }
        }
        free(sc);
        free(pb);
    }
    free(packs);
    return failed ? 3 : 0;
#else
    (void)q; (void)k; (void)v; (void)out; (void)threads;
    return 2;
#endif
}

}  /* extern "C" */
