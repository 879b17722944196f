/*
 * Native fast path of qpart's kernels: pack, unpack, fused quantize+pack, fused
 * unpack+dequantize. The bit layout is documented in kernels/packing.py; this file must produce
 * byte-identical results to the numpy reference there (tests/kernels/test_parity.py).
 *
 * Floating-point parity with numpy: every float op is a single float32 IEEE operation in the same
 * order as the reference; the build passes -ffp-contract=off so that no FMA fuses them.
 * The GIL is released around every loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define COLS 512            /* columns of a full block; a full block holds 8 * COLS codes */
#define BLOCK (8 * COLS)

/* ---- packing of one block of 8*M codes into b*M bytes ------------------------------------ */

static inline __attribute__((always_inline)) void
pack_block_b(const uint8_t *restrict c, uint8_t *restrict out, Py_ssize_t M, const int b)
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

static inline __attribute__((always_inline)) void
unpack_block_b(const uint8_t *restrict in, uint8_t *restrict c, Py_ssize_t M, const int b)
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

static void pack_block(const uint8_t *c, uint8_t *out, Py_ssize_t M, int b)
{
    switch (b) {
    case 1: pack_block_b(c, out, M, 1); break;
    case 2: pack_block_b(c, out, M, 2); break;
    case 3: pack_block_b(c, out, M, 3); break;
    case 4: pack_block_b(c, out, M, 4); break;
    case 5: pack_block_b(c, out, M, 5); break;
    case 6: pack_block_b(c, out, M, 6); break;
    case 7: pack_block_b(c, out, M, 7); break;
    default: memcpy(out, c, (size_t)(8 * M)); break;
    }
}

static void unpack_block(const uint8_t *in, uint8_t *c, Py_ssize_t M, int b)
{
    switch (b) {
    case 1: unpack_block_b(in, c, M, 1); break;
    case 2: unpack_block_b(in, c, M, 2); break;
    case 3: unpack_block_b(in, c, M, 3); break;
    case 4: unpack_block_b(in, c, M, 4); break;
    case 5: unpack_block_b(in, c, M, 5); break;
    case 6: unpack_block_b(in, c, M, 6); break;
    case 7: unpack_block_b(in, c, M, 7); break;
    default: memcpy(c, in, (size_t)(8 * M)); break;
    }
}

static Py_ssize_t packed_size(Py_ssize_t n, int b) { return (Py_ssize_t)b * ((n + 7) / 8); }

/* Walk the blocks of n codes: full blocks of BLOCK codes, then one tail block of ceil(rem/8)
 * columns, zero padded. Returns 0, or 1 if a code does not fit in b bits. */
static int pack_all(const uint8_t *codes, Py_ssize_t n, int b, uint8_t *out)
{
    uint8_t over = 0;
    Py_ssize_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        const uint8_t *c = codes + i;
        for (Py_ssize_t k = 0; k < BLOCK; k++)
            over |= c[k];
        pack_block(c, out, COLS, b);
        out += (Py_ssize_t)b * COLS;
    }
    if (i < n) {
        uint8_t tail[BLOCK];
        const Py_ssize_t rem = n - i, M = (rem + 7) / 8;
        memset(tail, 0, sizeof tail);
        memcpy(tail, codes + i, (size_t)rem);
        for (Py_ssize_t k = 0; k < rem; k++)
            over |= tail[k];
        pack_block(tail, out, M, b);
    }
    return b < 8 && (over >> b) != 0;
}

static void unpack_all(const uint8_t *in, Py_ssize_t n, int b, uint8_t *codes)
{
    Py_ssize_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        unpack_block(in, codes + i, COLS, b);
        in += (Py_ssize_t)b * COLS;
    }
    if (i < n) {
        uint8_t tail[BLOCK];
        const Py_ssize_t rem = n - i, M = (rem + 7) / 8;
        unpack_block(in, tail, M, b);
        memcpy(codes + i, tail, (size_t)rem);
    }
}

/* ---- group parameters and the fused kernels ------------------------------------------------ */

/* min, scale of one group; returns 0 on success, 1 on a non-finite value or range.
 * The SSE2 path keeps min/max exact without -ffast-math (minps/maxps), and finds non-finite
 * values on the exponent bits; other machines take the scalar loop. */
static int group_params(const float *x, Py_ssize_t len, int qmax, float *mn_out, float *scale_out)
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

typedef struct {
    const float *x;
    Py_ssize_t n, group;
    int b;
    float *mins, *scales;
    uint8_t *out;
} qp_args;

/* Number of groups without the signed overflow of n + group - 1 (group may be huge). */
static Py_ssize_t group_count(Py_ssize_t n, Py_ssize_t group)
{
    return n > 0 ? (n - 1) / group + 1 : 0;
}

static int quantize_pack_run(qp_args *a)
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
            if (group_params(a->x + g0, glen, qmax, &a->mins[ready], &a->scales[ready]))
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
            pack_block(codes, out, COLS, a->b);
            out += (Py_ssize_t)a->b * COLS;
        } else {
            const Py_ssize_t M = (cnt + 7) / 8;
            memset(codes + cnt, 0, (size_t)(8 * M - cnt));
            pack_block(codes, out, M, a->b);
        }
    }
    return 0;
}

static void unpack_dequantize_run(const uint8_t *in, Py_ssize_t n, int b, Py_ssize_t group,
                                  const float *scales, const float *mins, float *outx)
{
    uint8_t codes[BLOCK];
    for (Py_ssize_t s = 0; s < n; s += BLOCK) {
        const Py_ssize_t e = s + BLOCK < n ? s + BLOCK : n;
        const Py_ssize_t cnt = e - s;
        if (cnt == BLOCK) {
            unpack_block(in, codes, COLS, b);
            in += (Py_ssize_t)b * COLS;
        } else {
            unpack_block(in, codes, (cnt + 7) / 8, b);
        }
        for (Py_ssize_t i = s; i < e;) {
            const Py_ssize_t g = i / group;
            const Py_ssize_t ge = (g + 1) * group < e ? (g + 1) * group : e;
            const float sc = scales[g], mn = mins[g];
            const uint8_t *restrict cs = codes + (i - s);
            float *restrict o = outx + i;
            const Py_ssize_t len = ge - i;
            for (Py_ssize_t k = 0; k < len; k++)
                o[k] = (float)cs[k] * sc + mn;
            i = ge;
        }
    }
}

/* ---- Python bindings ------------------------------------------------------------------------ */

static int check_bits(int b)
{
    if (b < 1 || b > 8) {
        PyErr_Format(PyExc_ValueError, "bits must be in 1..8, got %d", b);
        return 0;
    }
    return 1;
}

static int check_len(const char *what, Py_ssize_t have, Py_ssize_t want)
{
    if (have != want) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, expected %zd", what, have, want);
        return 0;
    }
    return 1;
}

static PyObject *py_pack(PyObject *self, PyObject *args)
{
    Py_buffer codes, out;
    int b, bad = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iw*", &codes, &b, &out))
        return NULL;
    PyObject *ret = NULL;
    if (check_bits(b) && check_len("output", out.len, packed_size(codes.len, b))) {
        Py_BEGIN_ALLOW_THREADS
        bad = pack_all((const uint8_t *)codes.buf, codes.len, b, (uint8_t *)out.buf);
        Py_END_ALLOW_THREADS
        if (bad)
            PyErr_Format(PyExc_ValueError, "a code does not fit in %d bits", b);
        else
            ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&codes);
    PyBuffer_Release(&out);
    return ret;
}

static PyObject *py_unpack(PyObject *self, PyObject *args)
{
    Py_buffer in, out;
    int b;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iw*", &in, &b, &out))
        return NULL;
    PyObject *ret = NULL;
    if (check_bits(b) && check_len("packed input", in.len, packed_size(out.len, b))) {
        Py_BEGIN_ALLOW_THREADS
        unpack_all((const uint8_t *)in.buf, out.len, b, (uint8_t *)out.buf);
        Py_END_ALLOW_THREADS
        ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return ret;
}

static PyObject *py_quantize_pack(PyObject *self, PyObject *args)
{
    Py_buffer x, out, scales, mins;
    int b, bad = 0;
    Py_ssize_t group;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*inw*w*w*", &x, &b, &group, &out, &scales, &mins))
        return NULL;
    PyObject *ret = NULL;
    const Py_ssize_t n = x.len / (Py_ssize_t)sizeof(float);
    if (group > n)
        group = n; /* one group either way; keeps every group product below n */
    const Py_ssize_t ng = group > 0 ? group_count(n, group) : 0;
    if (!check_bits(b)) {
    } else if (group <= 0 || n == 0 || x.len % (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "need a non-empty float32 input and a positive group");
    } else if (check_len("output", out.len, packed_size(n, b)) &&
               check_len("scales", scales.len, ng * (Py_ssize_t)sizeof(float)) &&
               check_len("mins", mins.len, ng * (Py_ssize_t)sizeof(float))) {
        qp_args a = {(const float *)x.buf, n, group, b, (float *)mins.buf, (float *)scales.buf,
                     (uint8_t *)out.buf};
        Py_BEGIN_ALLOW_THREADS
        bad = quantize_pack_run(&a);
        Py_END_ALLOW_THREADS
        if (bad)
            PyErr_SetString(PyExc_ValueError,
                            "input holds NaN or infinity, or a group's range overflows float32");
        else
            ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&mins);
    return ret;
}

static PyObject *py_unpack_dequantize(PyObject *self, PyObject *args)
{
    Py_buffer in, scales, mins, out;
    int b;
    Py_ssize_t group;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iny*y*w*", &in, &b, &group, &scales, &mins, &out))
        return NULL;
    PyObject *ret = NULL;
    const Py_ssize_t n = out.len / (Py_ssize_t)sizeof(float);
    if (group > n && n > 0)
        group = n;
    const Py_ssize_t ng = group > 0 ? group_count(n, group) : 0;
    if (!check_bits(b)) {
    } else if (group <= 0 || out.len % (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "need a float32 output and a positive group");
    } else if (check_len("packed input", in.len, packed_size(n, b)) &&
               check_len("scales", scales.len, ng * (Py_ssize_t)sizeof(float)) &&
               check_len("mins", mins.len, ng * (Py_ssize_t)sizeof(float))) {
        Py_BEGIN_ALLOW_THREADS
        unpack_dequantize_run((const uint8_t *)in.buf, n, b, group, (const float *)scales.buf,
                              (const float *)mins.buf, (float *)out.buf);
        Py_END_ALLOW_THREADS
        ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&in);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&mins);
    PyBuffer_Release(&out);
    return ret;
}

static PyMethodDef methods[] = {
    {"pack", py_pack, METH_VARARGS, "pack(codes, bits, out): pack uint8 codes into out."},
    {"unpack", py_unpack, METH_VARARGS, "unpack(packed, bits, out): unpack into uint8 out."},
    {"quantize_pack", py_quantize_pack, METH_VARARGS,
     "quantize_pack(x, bits, group, out, scales, mins): fused group quantize + pack."},
    {"unpack_dequantize", py_unpack_dequantize, METH_VARARGS,
     "unpack_dequantize(packed, bits, group, scales, mins, out): fused unpack + dequantize."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kernels._native", "Native fast path of qpart kernels.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "BLOCK_COLUMNS", COLS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
