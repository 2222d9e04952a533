/* _sqlscan: integer columns of one SQLite table, decoded from the file's own pages.
 *
 * Why: an Nsight export's kernel table holds millions of rows of ~40 columns; through SQLite
 * (ADBC) every value read costs its virtual machine and the crossing into Arrow, ~1 us a row
 * for the seven values a kernel needs, the largest part of an Nsight ingest. The table's
 * b-tree leaves are plain records (https://www.sqlite.org/fileformat.html), so this module
 * walks them and writes the wanted columns straight into numpy buffers, without the GIL.
 * Pages are read with pread(), runs of leaves at a time, not mapped: a file cut short or an
 * I/O error while it is read is an error (ValueError), where a mapping would raise SIGBUS.
 *
 * It is an accelerator, not a second reader: anything it does not handle (a value that is not
 * an integer, a page that is not a rowid table's, any structure it cannot trust) raises
 * ValueError and the caller reads the table through SQLite, so results never depend on which
 * path ran. Tests compare both on every export they can read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "_sqlscan_pages.h"

static PyObject *as_bytes(U32s *a) {
    return PyBytes_FromStringAndSize((const char *)a->v, a->n * (Py_ssize_t)sizeof(uint32_t));
}

/* leaves(fd, page_size, usable_size, pages, root) -> (leaf pages, cells): the leaf pages of the
 * table whose b-tree starts at root, in rowid order, and the number of rows on each (uint32
 * bytes); `pages`: how many pages the file holds (what may be read). */
static PyObject *sqlscan_leaves(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    unsigned int psize, usable, npages, root;
    if (!PyArg_ParseTuple(args, "iIIII", &fd, &psize, &usable, &npages, &root)) return NULL;
    Db d;
    PyObject *out = NULL;
    U32s leaves = {0}, counts = {0};
    if (open_db(&d, fd, psize, usable, npages) == 0) {
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = walk(&d, root, &leaves, &counts);
        Py_END_ALLOW_THREADS
        if (rc < 0) PyErr_SetString(PyExc_ValueError, d.err);
        else out = Py_BuildValue("(NN)", as_bytes(&leaves), as_bytes(&counts));
    }
    free(leaves.v);
    free(counts.v);
    free(d.win);
    return out;
}

/* ------------------------------------------------------------------ the rows */

typedef struct {
    const int32_t *want; /* record column -> output slot, -1: not read */
    int32_t ncol;        /* columns of the record that matter (the last wanted + 1) */
    int32_t alias;       /* the INTEGER PRIMARY KEY column (stored NULL: the rowid), or -1 */
    Py_ssize_t stride;   /* out[slot * stride + row]: stride > n, for streams a whole number
                          * of pages apart alias in the cache (3x slower at 8 columns) */
    int64_t *out;
    int64_t *keys;       /* each row's rowid */
    u8 *valid;
    Py_ssize_t n;
    u8 *tmp; /* a payload that spills onto overflow pages, gathered */
    size_t tmp_cap;
} Rows;

/* The full payload of a cell whose first `local` bytes are on its page, the rest on the chain
 * of overflow pages starting at `ovfl` (read straight into the payload: the window keeps the
 * leaf). */
static const u8 *gather(Db *d, Rows *r, const u8 *local_p, uint64_t local, uint64_t total,
                        uint32_t ovfl) {
    if (total > (uint64_t)d->npages * d->psize) return fail(d, "a payload larger than the file"), NULL;
    if (r->tmp_cap < total) {
        u8 *t = realloc(r->tmp, (size_t)total);
        if (!t) return fail(d, "out of memory"), NULL;
        r->tmp = t;
        r->tmp_cap = (size_t)total;
    }
    memcpy(r->tmp, local_p, (size_t)local);
    uint64_t have = local;
    uint32_t hops = 0;
    while (have < total) {
        u8 link[4];
        if (ovfl < 1 || ovfl > d->npages || ++hops > d->npages)
            return fail(d, "a broken overflow chain"), NULL;
        uint64_t take = total - have < d->usable - 4 ? total - have : d->usable - 4;
        if (read_full(d, link, 4, page_off(d, ovfl)) < 0 ||
            read_full(d, r->tmp + have, (size_t)take, page_off(d, ovfl) + 4) < 0)
            return NULL;
        have += take;
        ovfl = be32(link);
    }
    return r->tmp;
}

static int value(Db *d, uint64_t type, const u8 *v, int64_t *out) {
    static const int size[7] = {0, 1, 2, 3, 4, 6, 8};
    if (type >= 1 && type <= 6) {
        int64_t x = (int8_t)v[0]; /* sign from the first byte, then big-endian */
        for (int i = 1; i < size[type]; i++) x = (int64_t)(((uint64_t)x << 8) | v[i]);
        *out = x;
        return 0;
    }
    if (type == 8 || type == 9) {
        *out = (int64_t)(type - 8);
        return 0;
    }
    return fail(d, "a value that is not an integer");
}

static uint64_t body_size(uint64_t type) {
    static const uint64_t size[12] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0, 0, 0};
    return type < 12 ? size[type] : (type - 12) / 2;
}

/* One record (payload pl of size P) of row `row`: its wanted columns into r. */
static int record(Db *d, Rows *r, const u8 *pl, uint64_t P, int64_t rowid, Py_ssize_t row) {
    const u8 *end = pl + P;
    uint64_t hsize;
    int k = varint(pl, end, &hsize);
    if (!k || hsize > P || hsize < (uint64_t)k) return fail(d, "a record header past its record");
    const u8 *h = pl + k, *hend = pl + hsize, *body = pl + hsize;
    for (int32_t c = 0; c < r->ncol; c++) {
        uint64_t type = 0;
        int present = h < hend;
        if (present) {
            int m = varint(h, hend, &type);
            if (!m) return fail(d, "a record header past its record");
            h += m;
        }
        uint64_t sz = body_size(type);
        if (sz > (uint64_t)(end - body)) return fail(d, "a value past its record");
        int32_t slot = r->want[c];
        if (slot >= 0) {
            Py_ssize_t at = slot * r->stride + row;
            if (type == 0 || !present) { /* NULL, or a column added after the row was written */
                r->valid[at] = c == r->alias;
                r->out[at] = c == r->alias ? rowid : 0;
            } else {
                if (value(d, type, body, &r->out[at]) < 0) return -1;
                r->valid[at] = 1;
            }
        }
        body += sz;
    }
    return 0;
}

/* The n rows starting at cell `skip` of leaves[first], across as many leaves as they take. */
static int rows(Db *d, Rows *r, const uint32_t *leaves, Py_ssize_t nleaves, Py_ssize_t first,
                uint32_t skip) {
    const uint64_t U = d->usable, X = U - 35, M = ((U - 12) * 32 / 255) - 23;
    Py_ssize_t row = 0;
    for (Py_ssize_t li = first; row < r->n; li++, skip = 0) {
        if (li >= nleaves) return fail(d, "fewer rows than the leaves counted");
        uint32_t pg = leaves[li];
        const u8 *p = page_at(d, pg);
        if (!p) return -1;
        const u8 *h = p + hdr_at(pg), *pend = p + U;
        if (h[0] != 0x0D) return fail(d, "not a rowid table's leaf page");
        uint32_t ncell = be16(h + 3);
        if (hdr_at(pg) + 8 + 2 * ncell > U) return fail(d, "a cell array past its page");
        for (uint32_t i = skip; i < ncell && row < r->n; i++, row++) {
            uint32_t at = be16(h + 8 + 2 * i);
            if (at < hdr_at(pg) + 8 || at >= U) return fail(d, "a cell past its page");
            const u8 *c = p + at;
            uint64_t P, key;
            int a = varint(c, pend, &P);
            int b = a ? varint(c + a, pend, &key) : 0;
            if (!b) return fail(d, "a cell past its page");
            const u8 *pl = c + a + b;
            uint64_t local = P;
            if (P > X) {
                uint64_t K = M + (P - M) % (U - 4);
                local = K <= X ? K : M;
            }
            if (local + (P > X ? 4 : 0) > (uint64_t)(pend - pl)) return fail(d, "a cell past its page");
            if (P > X) {
                pl = gather(d, r, pl, local, P, be32(pl + local));
                if (!pl) return -1;
            }
            r->keys[row] = (int64_t)key;
            if (record(d, r, pl, P, (int64_t)key, row) < 0) return -1;
        }
    }
    return 0;
}

static int writable(Py_buffer *b, Py_ssize_t need, const char *what) {
    if (b->readonly || b->len < need) {
        PyErr_Format(PyExc_ValueError, "%s: a writable buffer of %zd bytes is needed", what, need);
        return -1;
    }
    return 0;
}

/* rows(fd, page_size, usable_size, pages, leaves, first, skip, n, want, alias, stride, out,
 * valid, keys): n rows from cell `skip` of leaf number `first` (leaves: uint32 bytes); want: int32
 * bytes, a record column's output slot or -1; out: int64, slot s of row i at s * stride + i;
 * valid: uint8 likewise; keys: the n rowids (int64); pages as for leaves(). */
static PyObject *sqlscan_rows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer lv, wv, ov, vv, kv;
    int fd;
    unsigned int npages;
    unsigned int psize, usable, skip;
    Py_ssize_t first, n, stride;
    int alias;
    if (!PyArg_ParseTuple(args, "iIIIy*nIny*inw*w*w*", &fd, &psize, &usable, &npages, &lv,
                          &first, &skip, &n, &wv, &alias, &stride, &ov, &vv, &kv))
        return NULL;
    Db d;
    PyObject *out = NULL;
    Rows r;
    memset(&r, 0, sizeof(r));
    r.want = (const int32_t *)wv.buf;
    r.ncol = (int32_t)(wv.len / (Py_ssize_t)sizeof(int32_t));
    r.alias = alias;
    r.out = (int64_t *)ov.buf;
    r.valid = (u8 *)vv.buf;
    r.keys = (int64_t *)kv.buf;
    r.n = n;
    r.stride = stride;
    int32_t slots = 0;
    for (int32_t c = 0; c < r.ncol; c++) slots = r.want[c] + 1 > slots ? r.want[c] + 1 : slots;
    Py_ssize_t nleaves = lv.len / (Py_ssize_t)sizeof(uint32_t);
    if (open_db(&d, fd, psize, usable, npages) < 0) {
    } else if (n < 0 || first < 0 || first > nleaves || stride < n) {
        PyErr_SetString(PyExc_ValueError, "rows outside the leaves or the buffers");
    } else if (writable(&ov, slots * stride * (Py_ssize_t)sizeof(int64_t), "out") == 0 &&
               writable(&vv, slots * stride, "valid") == 0 &&
               writable(&kv, n * (Py_ssize_t)sizeof(int64_t), "keys") == 0) {
        int rc;
        Py_BEGIN_ALLOW_THREADS rc = rows(&d, &r, (const uint32_t *)lv.buf, nleaves, first, skip);
        Py_END_ALLOW_THREADS
        if (rc < 0) PyErr_SetString(PyExc_ValueError, d.err);
        else out = Py_NewRef(Py_None);
    }
    free(r.tmp);
    free(d.win);
    PyBuffer_Release(&lv);
    PyBuffer_Release(&wv);
    PyBuffer_Release(&ov);
    PyBuffer_Release(&vv);
    PyBuffer_Release(&kv);
    return out;
}

static PyMethodDef METHODS[] = {
    {"leaves", sqlscan_leaves, METH_VARARGS,
     "leaves(fd, page_size, usable_size, pages, root) -> (leaf pages, their row counts)"},
    {"rows", sqlscan_rows, METH_VARARGS,
     "rows(fd, page_size, usable_size, pages, leaves, first, skip, n, want, alias, stride, "
     "out, valid, keys)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_sqlscan",
    .m_doc = "SQLite table pages -> integer columns (see sqlite_pages.py).",
    .m_size = -1,
    .m_methods = METHODS,
};

PyMODINIT_FUNC PyInit__sqlscan(void) { return PyModule_Create(&MODULE); }
