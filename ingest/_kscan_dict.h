/* _kscan_dict.h: a string dictionary keyed by raw JSON bytes, so each distinct name is decoded once.
 * Included once, by _kscan.c (static functions: one translation unit). */
#ifndef KSCAN_DICT_H
#define KSCAN_DICT_H

/* ------------------------------------------------------------------ string dictionary */

typedef struct {
    const u8 *s;
    Py_ssize_t n;
    uint64_t h;
    int32_t code;
    int esc;
} Slot;

typedef struct {
    Slot *slots;
    Py_ssize_t cap, count;
    PyObject *values; /* list of str, index = code */
    Buf flags;        /* one byte per code: 1 if the value is "Trace" */
} Dict;

static inline uint64_t hash_bytes(const u8 *s, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, (size_t)n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
}

static int dict_init(Dict *d) {
    d->cap = 1024;
    d->count = 0;
    d->slots = (Slot *)calloc((size_t)d->cap, sizeof(Slot));
    d->values = PyList_New(0);
    d->flags = (Buf){0};
    if (!d->slots || !d->values) { PyErr_NoMemory(); return -1; }
    return 0;
}

static void dict_free(Dict *d) {
    free(d->slots);
    Py_XDECREF(d->values);
    buf_free(&d->flags);
}

static int dict_rehash(Dict *d) {
    Py_ssize_t cap = d->cap * 2;
    Slot *ns = (Slot *)calloc((size_t)cap, sizeof(Slot));
    if (!ns) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < d->cap; i++) {
        Slot *o = &d->slots[i];
        if (!o->s) continue;
        Py_ssize_t j = (Py_ssize_t)(o->h & (uint64_t)(cap - 1));
        while (ns[j].s) j = (j + 1) & (cap - 1);
        ns[j] = *o;
    }
    free(d->slots);
    d->slots = ns;
    d->cap = cap;
    return 0;
}

/* Code of a raw string span (decoded once, on first sight). -1 with ps->err or a Python error. */
static int32_t dict_code(Dict *d, Parser *ps, const u8 *s, Py_ssize_t n, int esc, Buf *tmp) {
    static const u8 empty[1] = {0};
    if (!s) s = empty; /* absent / null -> "" */
    uint64_t h = hash_bytes(s, n);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(d->cap - 1));
    while (d->slots[j].s) {
        Slot *sl = &d->slots[j];
        if (sl->h == h && sl->n == n && memcmp(sl->s, s, (size_t)n) == 0) return sl->code;
        j = (j + 1) & (d->cap - 1);
    }
    const char *txt = (const char *)s;
    Py_ssize_t len = n;
    if (esc) {
        tmp->len = 0;
        int r = unescape(ps, s, n, tmp);
        if (r < 0) return -1;
        txt = tmp->p ? tmp->p : "";
        len = tmp->len;
    }
    PyObject *v = PyUnicode_DecodeUTF8(txt, len, "strict");
    if (!v) return -1;
    int r = PyList_Append(d->values, v);
    Py_DECREF(v);
    if (r < 0) return -1;
    u8 flag = (u8)(len == 5 && memcmp(txt, "Trace", 5) == 0);
    if (buf_put(&d->flags, &flag, 1) < 0) return -1;
    int32_t code = (int32_t)d->count++;
    d->slots[j] = (Slot){s, n, h, code, esc};
    if (d->count * 2 > d->cap && dict_rehash(d) < 0) return -1;
    return code;
}

#endif
