/* _sqlscan_pages.h: the file side of the page scanner (_sqlscan.c): pages read with pread
 * through a window of runs of pages, SQLite's varints, and the walk of a table b-tree down to
 * its leaves. Every offset is checked against its page and every page number against the
 * file: a malformed file gives an error (Db.err), never a read outside a buffer. */

typedef unsigned char u8;

enum { WINDOW = 32 }; /* pages read by one pread(): leaves mostly lie in runs */

typedef struct {
    int fd;
    uint32_t psize, usable, npages;
    u8 *win; /* pages w0 .. w0 + wn - 1 of the file */
    uint32_t w0, wn;
    const char *err;
} Db;

static uint32_t be16(const u8 *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static uint32_t be32(const u8 *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int fail(Db *d, const char *why) {
    if (!d->err) d->err = why;
    return -1;
}

static int read_full(Db *d, u8 *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(d->fd, buf + got, n - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return fail(d, "the file could not be read");
        if (k == 0) return fail(d, "the file is shorter than when it was opened");
        got += (size_t)k;
    }
    return 0;
}

static uint64_t page_off(Db *d, uint32_t pgno) { return (uint64_t)(pgno - 1) * d->psize; }

/* A page's bytes, through the window of pages last read (valid until the next call); NULL
 * when pgno is outside the file or it cannot be read. */
static const u8 *page_at(Db *d, uint32_t pgno) {
    if (pgno < 1 || pgno > d->npages) return fail(d, "a page number outside the file"), NULL;
    if (d->wn && pgno >= d->w0 && pgno - d->w0 < d->wn)
        return d->win + (size_t)(pgno - d->w0) * d->psize;
    if (!d->win && !(d->win = malloc((size_t)WINDOW * d->psize)))
        return fail(d, "out of memory"), NULL;
    uint32_t n = d->npages - pgno + 1 < WINDOW ? d->npages - pgno + 1 : WINDOW;
    d->wn = 0;
    if (read_full(d, d->win, (size_t)n * d->psize, page_off(d, pgno)) < 0) return NULL;
    d->w0 = pgno;
    d->wn = n;
    return d->win;
}
static uint32_t hdr_at(uint32_t pgno) { return pgno == 1 ? 100 : 0; }

/* SQLite's varint (1-9 bytes, big-endian, 7 bits a byte, 8 in the ninth); 0 when it runs past
 * end. */
static int varint_long(const u8 *p, const u8 *end, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        if (p + i >= end) return 0;
        v = (v << 7) | (p[i] & 0x7f);
        if (!(p[i] & 0x80)) {
            *out = v;
            return i + 1;
        }
    }
    if (p + 8 >= end) return 0;
    *out = (v << 8) | p[8];
    return 9;
}

/* Most varints of a record are one byte (serial types, small sizes): those without a call. */
static inline int varint(const u8 *p, const u8 *end, uint64_t *out) {
    if (p < end && p[0] < 0x80) {
        *out = p[0];
        return 1;
    }
    return varint_long(p, end, out);
}

/* ------------------------------------------------------------------ the tree's leaves */

typedef struct {
    uint32_t *v;
    Py_ssize_t n, cap;
} U32s;

static int push(U32s *a, uint32_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 1024;
        uint32_t *v = realloc(a->v, (size_t)cap * sizeof(uint32_t));
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* The leaf pages of the table b-tree at root, in key order, and their cell counts. An interior
 * page's children are copied out as it is first read (the window moves on). */
static int walk(Db *d, uint32_t root, U32s *leaves, U32s *counts) {
    enum { DEPTH = 64 };
    U32s kids[DEPTH];
    Py_ssize_t next[DEPTH];
    memset(kids, 0, sizeof(kids));
    int top = -1, rc = 0;
    uint64_t visits = 0;
    uint32_t pg = root;
    for (;;) {
        if (++visits > d->npages) {
            rc = fail(d, "a page reached twice");
            break;
        }
        const u8 *p = page_at(d, pg);
        if (!p) {
            rc = -1;
            break;
        }
        const u8 *h = p + hdr_at(pg);
        uint32_t ncell = be16(h + 3);
        if (h[0] == 0x0D) { /* leaf of a rowid table */
            if (push(leaves, pg) < 0 || push(counts, ncell) < 0) {
                rc = fail(d, "out of memory");
                break;
            }
        } else if (h[0] != 0x05) {
            rc = fail(d, "not a rowid table's b-tree page");
            break;
        } else if (hdr_at(pg) + 12 + 2 * ncell > d->usable) {
            rc = fail(d, "a cell array past its page");
            break;
        } else if (top + 1 >= DEPTH) {
            rc = fail(d, "a b-tree deeper than SQLite writes");
            break;
        } else { /* interior: its children, left to right, then the right-most */
            U32s *k = &kids[++top];
            k->n = next[top] = 0;
            for (uint32_t i = 0; i < ncell && rc == 0; i++) {
                uint32_t at = be16(h + 12 + 2 * i);
                if (at < hdr_at(pg) + 12 || at + 4 > d->usable) rc = fail(d, "a cell past its page");
                else if (push(k, be32(p + at)) < 0) rc = fail(d, "out of memory");
            }
            if (rc == 0 && push(k, be32(h + 8)) < 0) rc = fail(d, "out of memory");
            if (rc < 0) break;
        }
        while (top >= 0 && next[top] >= kids[top].n) top--;
        if (top < 0) break;
        pg = kids[top].v[next[top]++];
    }
    for (int i = 0; i < DEPTH; i++) free(kids[i].v);
    return rc;
}

static int open_db(Db *d, int fd, uint32_t psize, uint32_t usable, uint32_t npages) {
    memset(d, 0, sizeof(*d));
    d->fd = fd;
    d->psize = psize;
    d->usable = usable;
    d->npages = npages;
    if (psize < 512 || psize > 65536 || (psize & (psize - 1)) || usable < 480 || usable > psize) {
        PyErr_SetString(PyExc_ValueError, "page size out of range");
        return -1;
    }
    return 0;
}
