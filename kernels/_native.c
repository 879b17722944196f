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

static Py_ssize_t packed_size(Py_ssize_t n, int b) { return (Py_ssize_t)b * ((n + 7) / 8); }

/* Number of groups without the signed overflow of n + group - 1 (group may be huge). */
static Py_ssize_t group_count(Py_ssize_t n, Py_ssize_t group)
{
    return n > 0 ? (n - 1) / group + 1 : 0;
}

typedef struct {
    const float *x;
    Py_ssize_t n, group;
    int b;
    float *mins, *scales;
    uint8_t *out;
} qp_args;

/* ---- streaming stores for large outputs ------------------------------------------------------ */

#if defined(__SSE2__)
#define STREAMING 1
#define STREAM_MIN ((Py_ssize_t)1 << 21) /* 8 MiB of floats: larger than a core's share of the caches */

/* dst[0:len] = src[0:len], the 16-byte-aligned middle with non-temporal stores (no read of dst). */
static void stream_copy(float *dst, const float *src, Py_ssize_t len)
{
    Py_ssize_t k = 0;
    while (k < len && ((uintptr_t)(dst + k) & 15) != 0) {
        dst[k] = src[k];
        k++;
    }
    for (; k + 16 <= len; k += 16) {
        _mm_stream_ps(dst + k, _mm_loadu_ps(src + k));
        _mm_stream_ps(dst + k + 4, _mm_loadu_ps(src + k + 4));
        _mm_stream_ps(dst + k + 8, _mm_loadu_ps(src + k + 8));
        _mm_stream_ps(dst + k + 12, _mm_loadu_ps(src + k + 12));
    }
    for (; k + 4 <= len; k += 4)
        _mm_stream_ps(dst + k, _mm_loadu_ps(src + k));
    for (; k < len; k++)
        dst[k] = src[k];
}

/* Streaming stores are weakly ordered: fence them before the caller (and any thread) reads. */
static void stream_fence(void) { _mm_sfence(); }
#else
#define STREAMING 0
#define STREAM_MIN PY_SSIZE_T_MAX
static void stream_copy(float *dst, const float *src, Py_ssize_t len)
{
    memcpy(dst, src, (size_t)len * sizeof *dst);
}
static void stream_fence(void) {}
#endif

/* ---- one copy of the loops per instruction-set level, chosen at import ----------------------
 * One portable build (no -march): the loops are compiled for the x86-64 baseline and, on x86-64
 * with GCC 12+ or clang 18+ (which know these levels), again for x86-64-v3 (AVX2, BMI2) and
 * x86-64-v4 (AVX-512); the widest level the CPU supports is chosen when the module loads (isa(),
 * isas(), use_isa()). */

#define QP(name) name##_base
#define QP_TARGET
#include "_native_loops.h"
#undef QP
#undef QP_TARGET

#if defined(__clang__)
#define QP_COMPILER_KNOWS_LEVELS (__clang_major__ >= 18) /* __builtin_cpu_supports of levels */
#elif defined(__GNUC__)
#define QP_COMPILER_KNOWS_LEVELS (__GNUC__ >= 12)
#else
#define QP_COMPILER_KNOWS_LEVELS 0
#endif
#if defined(__x86_64__) && QP_COMPILER_KNOWS_LEVELS
#define QP_LEVELS 1
#define QP(name) name##_v3
#define QP_TARGET __attribute__((target("arch=x86-64-v3")))
#include "_native_loops.h"
#undef QP
#undef QP_TARGET
#define QP(name) name##_v4
#define QP_TARGET __attribute__((target("arch=x86-64-v4")))
#include "_native_loops.h"
#undef QP
#undef QP_TARGET
#else
#define QP_LEVELS 0
#endif

typedef struct {
    const char *name;
    int (*pack_all)(const uint8_t *, Py_ssize_t, int, uint8_t *);
    void (*unpack_all)(const uint8_t *, Py_ssize_t, int, uint8_t *);
    int (*quantize_pack_run)(qp_args *);
    void (*unpack_dequantize_run)(const uint8_t *, Py_ssize_t, int, Py_ssize_t, const float *,
                                  const float *, float *);
} isa_t;

static const isa_t ISAS[] = {
#if QP_LEVELS
    {"x86-64-v4", pack_all_v4, unpack_all_v4, quantize_pack_run_v4, unpack_dequantize_run_v4},
    {"x86-64-v3", pack_all_v3, unpack_all_v3, quantize_pack_run_v3, unpack_dequantize_run_v3},
#endif
    {"baseline", pack_all_base, unpack_all_base, quantize_pack_run_base, unpack_dequantize_run_base},
};
#define NISAS ((int)(sizeof ISAS / sizeof ISAS[0]))

static const isa_t *ACTIVE = &ISAS[NISAS - 1];

/* Whether this CPU runs level i (the baseline always). */
static int isa_supported(int i)
{
#if QP_LEVELS
    __builtin_cpu_init();
    if (strcmp(ISAS[i].name, "x86-64-v4") == 0)
        return __builtin_cpu_supports("x86-64-v4");
    if (strcmp(ISAS[i].name, "x86-64-v3") == 0)
        return __builtin_cpu_supports("x86-64-v3");
#endif
    (void)i;
    return 1;
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
        const isa_t *isa = ACTIVE; /* read under the GIL: use_isa writes it under the GIL */
        Py_BEGIN_ALLOW_THREADS
        bad = isa->pack_all((const uint8_t *)codes.buf, codes.len, b, (uint8_t *)out.buf);
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
        const isa_t *isa = ACTIVE;
        Py_BEGIN_ALLOW_THREADS
        isa->unpack_all((const uint8_t *)in.buf, out.len, b, (uint8_t *)out.buf);
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
        const isa_t *isa = ACTIVE;
        Py_BEGIN_ALLOW_THREADS
        bad = isa->quantize_pack_run(&a);
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
        const isa_t *isa = ACTIVE;
        Py_BEGIN_ALLOW_THREADS
        isa->unpack_dequantize_run((const uint8_t *)in.buf, n, b, group, (const float *)scales.buf,
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

static PyObject *py_isa(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(ACTIVE->name);
}

static PyObject *py_isas(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *out = PyList_New(0);
    for (int i = 0; out != NULL && i < NISAS; i++) {
        if (!isa_supported(i))
            continue;
        PyObject *name = PyUnicode_FromString(ISAS[i].name);
        if (name == NULL || PyList_Append(out, name) < 0) {
            Py_XDECREF(name);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(name);
    }
    return out;
}

static PyObject *py_use_isa(PyObject *self, PyObject *args)
{
    const char *name;
    (void)self;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    for (int i = 0; i < NISAS; i++) {
        if (strcmp(ISAS[i].name, name) != 0)
            continue;
        if (!isa_supported(i)) {
            PyErr_Format(PyExc_ValueError, "this CPU does not run the %s kernels", name);
            return NULL;
        }
        ACTIVE = &ISAS[i];
        return Py_NewRef(Py_None);
    }
    PyErr_Format(PyExc_ValueError, "no %s kernels in this build", name);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack", py_pack, METH_VARARGS, "pack(codes, bits, out): pack uint8 codes into out."},
    {"unpack", py_unpack, METH_VARARGS, "unpack(packed, bits, out): unpack into uint8 out."},
    {"quantize_pack", py_quantize_pack, METH_VARARGS,
     "quantize_pack(x, bits, group, out, scales, mins): fused group quantize + pack."},
    {"unpack_dequantize", py_unpack_dequantize, METH_VARARGS,
     "unpack_dequantize(packed, bits, group, scales, mins, out): fused unpack + dequantize."},
    {"isa", py_isa, METH_NOARGS, "isa(): the instruction-set level the kernels run at."},
    {"isas", py_isas, METH_NOARGS, "isas(): the levels this build has and this CPU runs, widest first."},
    {"use_isa", py_use_isa, METH_VARARGS, "use_isa(name): run the kernels at that level."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kernels._native", "Native fast path of qpart kernels.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    for (int i = 0; i < NISAS; i++) { /* the widest level this CPU runs */
        if (isa_supported(i)) {
            ACTIVE = &ISAS[i];
            break;
        }
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "BLOCK_COLUMNS", COLS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
