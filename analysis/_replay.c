/* The dependency graph's longest-path replay, vertex by vertex (graph_replay.replay_loop), and
the topological order of a graph whose timestamps contradict its edges (graph_units._kahn).

Why C: a capture without step marks is one step whose lanes are chains of millions of kernels,
each waiting on another stream's: a braid that numpy cannot take a level at a time. The Python
loop took 4.5-7 s a replay on 5 M kernels, and a report replays the graph about five times.
Kahn's algorithm runs on every real trace whose clocks put a few edges backwards (each bundled
sample has some); its heap loop in Python took ~5 s on 790 k vertices, holding the GIL.

Every index is checked (a bad one raises ValueError, never reads out of bounds); the sums are
checked for int64 overflow, which returns False so that the caller runs the exact Python loop.
The GIL is released while the loop runs: the graph is built on a thread beside the analyses.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer view;
    int held;
} Buf;

/* A 1-d C-contiguous int64 buffer (numpy int64: format "l" or "q"). */
static int get_i64(PyObject *obj, Buf *b, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    b->held = 0;
    if (PyObject_GetBuffer(obj, &b->view, flags) < 0) {
        return -1;
    }
    b->held = 1;
    const char *f = b->view.format ? b->view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') {
        f++;
    }
    int ok = b->view.ndim == 1 && b->view.itemsize == 8 &&
             ((f[0] == 'q' && f[1] == 0) || (f[0] == 'l' && f[1] == 0 && sizeof(long) == 8));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a 1-d contiguous int64 array", what);
        return -1;
    }
    return 0;
}

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++) {
        if (bufs[i].held) {
            PyBuffer_Release(&bufs[i].view);
            bufs[i].held = 0;
        }
    }
}

/* o[0..n) as int64 buffers into b (zeroed by the caller), writable where bit i of `writable` is
   set; on an error, those taken are released. */
static int get_all(PyObject **o, Buf *b, int n, const char *const *names, unsigned writable) {
    for (int i = 0; i < n; i++) {
        if (get_i64(o[i], &b[i], (writable >> i) & 1u, names[i]) < 0) {
            release(b, n);
            return -1;
        }
    }
    return 0;
}

static Py_ssize_t len_of(Buf *b) { return b->view.len / 8; }

enum { OK = 0, BAD_INDEX = 1, OVERFLOW = 2 };

static int run_loop(const int64_t *order, Py_ssize_t n_order, const int64_t *ptr,
                    const int64_t *src, const int64_t *lag, Py_ssize_t m, const int64_t *base,
                    const int64_t *add, Py_ssize_t n, int64_t *val, int64_t *arg) {
    for (Py_ssize_t i = 0; i < n_order; i++) {
        int64_t v = order[i];
        if (v < 0 || v >= n) {
            return BAD_INDEX;
        }
        int64_t lo = ptr[v], hi = ptr[v + 1];
        if (lo < 0 || hi < lo || hi > m) {
            return BAD_INDEX;
        }
        int64_t best = base[v], a = -1;
        for (int64_t k = lo; k < hi; k++) {
            int64_t s = src[k];
            if (s < 0 || s >= n) {
                return BAD_INDEX;
            }
            int64_t r;
            if (__builtin_add_overflow(val[s], lag[k], &r)) {
                return OVERFLOW;
            }
            if (r > best) {
                best = r;
                a = k;
            }
        }
        if (__builtin_add_overflow(best, add[v], &val[v])) {
            return OVERFLOW;
        }
        if (arg) {
            arg[v] = a;
        }
    }
    return OK;
}

PyDoc_STRVAR(loop_doc,
             "loop(order, ptr, src, lag, base, add, val, arg) -> bool\n\n"
             "graph_replay.replay_loop into val (and arg, or None), zeroed by the caller. "
             "False on an int64 overflow (val is then partial: run the Python loop).");

static PyObject *loop(PyObject *self, PyObject *args) {
    PyObject *o[8];
    if (!PyArg_UnpackTuple(args, "loop", 8, 8, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                           &o[7])) {
        return NULL;
    }
    static const char *names[8] = {"order", "ptr", "src", "lag", "base", "add", "val", "arg"};
    Buf b[8];
    memset(b, 0, sizeof b);
    int tracked = o[7] != Py_None;
    if (get_all(o, b, tracked ? 8 : 7, names, 0xC0u) < 0) { /* val, arg written */
        return NULL;
    }
    Py_ssize_t n = len_of(&b[4]), m = len_of(&b[2]);
    if (len_of(&b[1]) != n + 1 || len_of(&b[3]) != m || len_of(&b[5]) != n ||
        len_of(&b[6]) != n || (tracked && len_of(&b[7]) != n)) {
        release(b, 8);
        PyErr_SetString(PyExc_ValueError,
                        "loop: expected len(ptr) = len(base) + 1, len(lag) = len(src) and "
                        "add, val, arg as long as base");
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_loop((const int64_t *)b[0].view.buf, len_of(&b[0]), (const int64_t *)b[1].view.buf,
                  (const int64_t *)b[2].view.buf, (const int64_t *)b[3].view.buf, m,
                  (const int64_t *)b[4].view.buf, (const int64_t *)b[5].view.buf, n,
                  (int64_t *)b[6].view.buf, tracked ? (int64_t *)b[7].view.buf : NULL);
    Py_END_ALLOW_THREADS
    release(b, 8);
    if (rc == BAD_INDEX) {
        PyErr_SetString(PyExc_ValueError, "loop: a vertex or edge index is out of range");
        return NULL;
    }
    return PyBool_FromLong(rc == OK);
}

PyDoc_STRVAR(chain_doc,
             "chain(v, arg, src, out) -> int\n\n"
             "Follow the binding in-edges back from vertex v (arg: edge per vertex, -1 at a "
             "start; src: each edge's source), writing the vertices into out; their count.");

static PyObject *chain(PyObject *self, PyObject *args) {
    long long v0;
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "LOOO:chain", &v0, &o[0], &o[1], &o[2])) {
        return NULL;
    }
    Buf b[3];
    memset(b, 0, sizeof b);
    static const char *names[3] = {"arg", "src", "out"};
    if (get_all(o, b, 3, names, 0x4u) < 0) { /* out written */
        return NULL;
    }
    const int64_t *arg = (const int64_t *)b[0].view.buf, *src = (const int64_t *)b[1].view.buf;
    int64_t *out = (int64_t *)b[2].view.buf;
    Py_ssize_t n = len_of(&b[0]), m = len_of(&b[1]), cap = len_of(&b[2]), got = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t v = v0;
    while (v >= 0) {
        if (v >= n || got >= cap) { /* out of range, or longer than the graph: a cycle */
            bad = 1;
            break;
        }
        out[got++] = v;
        int64_t k = arg[v];
        if (k >= m) {
            bad = 1;
            break;
        }
        v = k >= 0 ? src[k] : -1;
    }
    Py_END_ALLOW_THREADS
    release(b, 3);
    if (bad) {
        PyErr_SetString(PyExc_ValueError,
                        "chain: an index is out of range or the binding edges loop");
        return NULL;
    }
    return PyLong_FromSsize_t(got);
}

/* A binary min-heap of vertex positions (unique: pos is a permutation). */
static void heap_push(int64_t *heap, Py_ssize_t *len, int64_t p) {
    Py_ssize_t i = (*len)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (heap[up] <= p) {
            break;
        }
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = p;
}

static int64_t heap_pop(int64_t *heap, Py_ssize_t *len) {
    int64_t top = heap[0], last = heap[--(*len)];
    Py_ssize_t i = 0, n = *len;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) {
            break;
        }
        if (c + 1 < n && heap[c + 1] < heap[c]) {
            c++;
        }
        if (heap[c] >= last) {
            break;
        }
        heap[i] = heap[c];
        i = c;
    }
    if (n > 0) {
        heap[i] = last;
    }
    return top;
}

/* Kahn's algorithm: the vertex of lowest position among those whose kept in-edges are all
   placed goes next. optr/succ: each vertex's kept out-edges (CSR); indeg: kept in-degrees
   (consumed); at: workspace, the vertex at each position; heap: workspace. */
static Py_ssize_t run_kahn(Py_ssize_t n, const int64_t *optr, const int64_t *succ, Py_ssize_t m,
                           int64_t *indeg, const int64_t *pos, int64_t *at, int64_t *heap,
                           int64_t *out, int *bad) {
    Py_ssize_t len = 0, got = 0;
    *bad = 0;
    if (optr[0] != 0 || optr[n] != m) {
        *bad = 1;
        return 0;
    }
    for (Py_ssize_t v = 0; v < n; v++) {
        at[v] = -1;
    }
    for (Py_ssize_t v = 0; v < n; v++) {
        int64_t p = pos[v];
        if (p < 0 || p >= n || at[p] != -1 || optr[v + 1] < optr[v]) {
            *bad = 1; /* pos is not a permutation, or the edges are not CSR */
            return 0;
        }
        at[p] = v;
    }
    for (Py_ssize_t v = 0; v < n; v++) {
        if (indeg[v] == 0) {
            heap_push(heap, &len, pos[v]);
        }
    }
    while (len > 0) {
        int64_t v = at[heap_pop(heap, &len)];
        out[got++] = v;
        for (int64_t k = optr[v]; k < optr[v + 1]; k++) {
            int64_t w = succ[k];
            if (w < 0 || w >= n) {
                *bad = 1;
                return 0;
            }
            if (--indeg[w] == 0) {
                heap_push(heap, &len, pos[w]);
            }
        }
    }
    return got;
}

PyDoc_STRVAR(kahn_doc,
             "kahn(optr, succ, indeg, pos, at, heap, out) -> int\n\n"
             "graph_units._kahn: the vertices Kahn's algorithm can place, lowest position "
             "(pos, a permutation) first, written into out; their count. indeg is consumed; "
             "at and heap are workspaces as long as pos.");

static PyObject *kahn(PyObject *self, PyObject *args) {
    PyObject *o[7];
    if (!PyArg_UnpackTuple(args, "kahn", 7, 7, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                           &o[6])) {
        return NULL;
    }
    static const char *names[7] = {"optr", "succ", "indeg", "pos", "at", "heap", "out"};
    Buf b[7];
    memset(b, 0, sizeof b);
    if (get_all(o, b, 7, names, 0x74u) < 0) { /* indeg, at, heap, out written */
        return NULL;
    }
    Py_ssize_t n = len_of(&b[3]), m = len_of(&b[1]);
    if (len_of(&b[0]) != n + 1 || len_of(&b[2]) != n || len_of(&b[4]) != n ||
        len_of(&b[5]) != n || len_of(&b[6]) != n) {
        release(b, 7);
        PyErr_SetString(PyExc_ValueError,
                        "kahn: expected len(optr) = len(pos) + 1 and indeg, at, heap, out as "
                        "long as pos");
        return NULL;
    }
    int bad;
    Py_ssize_t got;
    Py_BEGIN_ALLOW_THREADS
    got = run_kahn(n, (const int64_t *)b[0].view.buf, (const int64_t *)b[1].view.buf, m,
                   (int64_t *)b[2].view.buf, (const int64_t *)b[3].view.buf,
                   (int64_t *)b[4].view.buf, (int64_t *)b[5].view.buf, (int64_t *)b[6].view.buf,
                   &bad);
    Py_END_ALLOW_THREADS
    release(b, 7);
    if (bad) {
        PyErr_SetString(PyExc_ValueError,
                        "kahn: pos is not a permutation, or an edge index is out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(got);
}

static PyMethodDef methods[] = {
    {"loop", loop, METH_VARARGS, loop_doc},
    {"chain", chain, METH_VARARGS, chain_doc},
    {"kahn", kahn, METH_VARARGS, kahn_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay", "The replay's vertex loop in C (graph_replay).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module); }
