/*
 * The loops of kernels/_native.c, included once per instruction-set level: before each inclusion
 * QP(name) names this level's copy and QP_TARGET is the level's target attribute (empty for the
 * baseline). Every copy runs the same IEEE float32 operations in the same order (the build passes
 * -ffp-contract=off, which holds for every target), so every level gives bit-identical results.
 * No include guard: it is meant to be included several times.
 */
#define QP_INLINE QP_TARGET static inline __attribute__((always_inline))

/* ---- packing of one block of 8*M codes into b*M bytes ------------------------------------ */

QP_INLINE void
QP(pack_block_b)(const uint8_t *restrict c, uint8_t *restrict out, Py_ssize_t M, const int b)
{
#pragma GCC unroll 8
    for (int t = 0; t < b; t++) {
        uint8_t *restrict o = out + (Py_ssize_t)t * M;
        for (Py_ssize_t m = 0; m < M; m++) {
            uint8_t acc = 0;
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                const int lo = r * b - 8 * t;
                if (lo >= 8 || lo + b <= 0)
                    continue;
                const uint8_t v = c[(Py_ssize_t)r * M + m];
                acc |= (lo >= 0) ? (uint8_t)(v << lo) : (uint8_t)(v >> (-lo));
            }
            o[m] = acc;
        }
    }
}

QP_INLINE void
QP(unpack_block_b)(const uint8_t *restrict in, uint8_t *restrict c, Py_ssize_t M, const int b)
{
    const uint8_t mask = (uint8_t)((1u << b) - 1u);
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
        const int start = r * b;
        const int t0 = start >> 3, o = start & 7;
        const uint8_t *restrict lo = in + (Py_ssize_t)t0 * M;
        uint8_t *restrict dst = c + (Py_ssize_t)r * M;
        if (o + b > 8) {
            const uint8_t *restrict hi = lo + M;
            for (Py_ssize_t m = 0; m < M; m++)
                dst[m] = (uint8_t)(((lo[m] >> o) | (uint8_t)(hi[m] << (8 - o))) & mask);
        } else {
            for (Py_ssize_t m = 0; m < M; m++)
                dst[m] = (uint8_t)((lo[m] >> o) & mask);
        }
    }
}

QP_INLINE void
QP(pack_block)(const uint8_t *c, uint8_t *out, Py_ssize_t M, int b)
{
    switch (b) {
    case 1: QP(pack_block_b)(c, out, M, 1); break;
    case 2: QP(pack_block_b)(c, out, M, 2); break;
    case 3: QP(pack_block_b)(c, out, M, 3); break;
    case 4: QP(pack_block_b)(c, out, M, 4); break;
    case 5: QP(pack_block_b)(c, out, M, 5); break;
    case 6: QP(pack_block_b)(c, out, M, 6); break;
    case 7: QP(pack_block_b)(c, out, M, 7); break;
    default: memcpy(out, c, (size_t)(8 * M)); break;
    }
}

QP_INLINE void
QP(unpack_block)(const uint8_t *in, uint8_t *c, Py_ssize_t M, int b)
{
    switch (b) {
    case 1: QP(unpack_block_b)(in, c, M, 1); break;
    case 2: QP(unpack_block_b)(in, c, M, 2); break;
    case 3: QP(unpack_block_b)(in, c, M, 3); break;
    case 4: QP(unpack_block_b)(in, c, M, 4); break;
    case 5: QP(unpack_block_b)(in, c, M, 5); break;
    case 6: QP(unpack_block_b)(in, c, M, 6); break;
    case 7: QP(unpack_block_b)(in, c, M, 7); break;
    default: memcpy(c, in, (size_t)(8 * M)); break;
    }
}


/* Walk the blocks of n codes: full blocks of BLOCK codes, then one tail block of ceil(rem/8)
 * columns, zero padded. Returns 0, or 1 if a code does not fit in b bits. */
QP_TARGET static int QP(pack_all)(const uint8_t *codes, Py_ssize_t n, int b, uint8_t *out)
{
    uint8_t over = 0;
    Py_ssize_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        const uint8_t *c = codes + i;
        for (Py_ssize_t k = 0; k < BLOCK; k++)
            over |= c[k];
        QP(pack_block)(c, out, COLS, b);
        out += (Py_ssize_t)b * COLS;
    }
    if (i < n) {
        uint8_t tail[BLOCK];
        const Py_ssize_t rem = n - i, M = (rem + 7) / 8;
        memset(tail, 0, sizeof tail);
        memcpy(tail, codes + i, (size_t)rem);
        for (Py_ssize_t k = 0; k < rem; k++)
            over |= tail[k];
        QP(pack_block)(tail, out, M, b);
    }
    return b < 8 && (over >> b) != 0;
}

QP_TARGET static void QP(unpack_all)(const uint8_t *in, Py_ssize_t n, int b, uint8_t *codes)
{
    Py_ssize_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        QP(unpack_block)(in, codes + i, COLS, b);
        in += (Py_ssize_t)b * COLS;
    }
    if (i < n) {
        uint8_t tail[BLOCK];
        const Py_ssize_t rem = n - i, M = (rem + 7) / 8;
        QP(unpack_block)(in, tail, M, b);
        memcpy(codes + i, tail, (size_t)rem);
    }
}

/* ---- group parameters and the fused kernels ------------------------------------------------ */

/* min, scale of one group; returns 0 on success, 1 on a non-finite value or range.
 * The SSE2 path keeps min/max exact without -ffast-math (minps/maxps), and finds non-finite
 * values on the exponent bits; other machines take the scalar loop. */
QP_INLINE int
QP(group_params)(const float *x, Py_ssize_t len, int qmax, float *mn_out, float *scale_out)
{
    float mn = x[0], mx = x[0];
    int any_bad = 0;
    Py_ssize_t k = 0;
#if defined(__SSE2__)
    if (len >= 8) {
        const __m128i expo = _mm_set1_epi32(0x7f800000);
        __m128 mn0 = _mm_set1_ps(x[0]), mn1 = mn0, mx0 = mn0, mx1 = mn0;
        __m128i bad = _mm_setzero_si128();
        for (; k + 8 <= len; k += 8) {
            const __m128 a = _mm_loadu_ps(x + k), b = _mm_loadu_ps(x + k + 4);
            mn0 = _mm_min_ps(mn0, a);
            mn1 = _mm_min_ps(mn1, b);
            mx0 = _mm_max_ps(mx0, a);
            mx1 = _mm_max_ps(mx1, b);
            const __m128i ea = _mm_and_si128(_mm_castps_si128(a), expo);
            const __m128i eb = _mm_and_si128(_mm_castps_si128(b), expo);
            bad = _mm_or_si128(bad, _mm_or_si128(_mm_cmpeq_epi32(ea, expo), _mm_cmpeq_epi32(eb, expo)));
        }
        float lanes[4];
        _mm_storeu_ps(lanes, _mm_min_ps(mn0, mn1));
        for (int j = 0; j < 4; j++)
            mn = lanes[j] < mn ? lanes[j] : mn;
        _mm_storeu_ps(lanes, _mm_max_ps(mx0, mx1));
        for (int j = 0; j < 4; j++)
            mx = lanes[j] > mx ? lanes[j] : mx;
        any_bad = _mm_movemask_epi8(bad) != 0;
    }
#endif
    for (; k < len; k++) {
        const float v = x[k];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
        any_bad |= !isfinite(v);
    }
    mn = mn + 0.0f; /* -0.0 -> +0.0, as the numpy reference does */
    const float range = mx - mn;
    if (any_bad || !isfinite(range))
        return 1;
    float scale = range / (float)qmax;
    if (!(scale >= FLT_MIN))
        scale = FLT_MIN;
    *mn_out = mn;
    *scale_out = scale;
    return 0;
}



QP_TARGET static int QP(quantize_pack_run)(qp_args *a)
{
    const int qmax = (1 << a->b) - 1;
    const float fqmax = (float)qmax;
    uint8_t codes[BLOCK];
    Py_ssize_t ready = 0; /* groups whose parameters are computed */
    const Py_ssize_t ngroups = group_count(a->n, a->group);
    uint8_t *out = a->out;
    for (Py_ssize_t s = 0; s < a->n; s += BLOCK) {
        const Py_ssize_t e = s + BLOCK < a->n ? s + BLOCK : a->n;
        while (ready < ngroups && ready * a->group < e) {
            const Py_ssize_t g0 = ready * a->group;
            const Py_ssize_t glen = g0 + a->group <= a->n ? a->group : a->n - g0;
            if (QP(group_params)(a->x + g0, glen, qmax, &a->mins[ready], &a->scales[ready]))
                return 1;
            ready++;
        }
        for (Py_ssize_t i = s; i < e;) {
            const Py_ssize_t g = i / a->group;
            const Py_ssize_t ge = (g + 1) * a->group < e ? (g + 1) * a->group : e;
            const float mn = a->mins[g], inv = 1.0f / a->scales[g];
            const float *restrict xs = a->x + i;
            uint8_t *restrict cs = codes + (i - s);
            const Py_ssize_t len = ge - i;
            for (Py_ssize_t k = 0; k < len; k++) {
                float t = (xs[k] - mn) * inv + 0.5f;
                t = t < fqmax + 0.5f ? t : fqmax;
                cs[k] = (uint8_t)(int32_t)t;
            }
            i = ge;
        }
        const Py_ssize_t cnt = e - s;
        if (cnt == BLOCK) {
            QP(pack_block)(codes, out, COLS, a->b);
            out += (Py_ssize_t)a->b * COLS;
        } else {
            const Py_ssize_t M = (cnt + 7) / 8;
            memset(codes + cnt, 0, (size_t)(8 * M - cnt));
            QP(pack_block)(codes, out, M, a->b);
        }
    }
    return 0;
}

QP_TARGET static void QP(unpack_dequantize_run)(const uint8_t *in, Py_ssize_t n, int b, Py_ssize_t group,
                                  const float *scales, const float *mins, float *outx)
{
    uint8_t codes[BLOCK];
    float vals[BLOCK];
    /* A large output goes through a block in L1 and on to memory with streaming stores: written
     * in place, each cache line of it would be read first (write-allocate), as much memory traffic
     * as a memcpy; the values are the same either way. */
    const int stream = STREAMING && n >= STREAM_MIN && ((uintptr_t)outx & 3) == 0;
    for (Py_ssize_t s = 0; s < n; s += BLOCK) {
        const Py_ssize_t e = s + BLOCK < n ? s + BLOCK : n;
        const Py_ssize_t cnt = e - s;
        if (cnt == BLOCK) {
            QP(unpack_block)(in, codes, COLS, b);
            in += (Py_ssize_t)b * COLS;
        } else {
            QP(unpack_block)(in, codes, (cnt + 7) / 8, b);
        }
        for (Py_ssize_t i = s; i < e;) {
            const Py_ssize_t g = i / group;
            const Py_ssize_t ge = (g + 1) * group < e ? (g + 1) * group : e;
            const float sc = scales[g], mn = mins[g];
            const uint8_t *restrict cs = codes + (i - s);
            float *restrict o = stream ? vals + (i - s) : outx + i;
            const Py_ssize_t len = ge - i;
            for (Py_ssize_t k = 0; k < len; k++)
                o[k] = (float)cs[k] * sc + mn;
            i = ge;
        }
        if (stream)
            stream_copy(outx + s, vals, cnt);
    }
    if (stream)
        stream_fence();
}

#undef QP_INLINE
