/* _kscan: Kineto `traceEvents` pieces -> column buffers, in one pass over the bytes.
 *
 * Why: decoding events into Python objects and then into columns costs ~10x the bytes' size
 * in interpreter work; this scanner writes the columns ranklens stores directly, so a core
 * decodes hundreds of MB/s. It is an accelerator, not a second definition of the format:
 * the typed msgspec decoder in kineto_events.py is the reference, and on anything unusual
 * (a type it would reject, a number beyond int64, an escaped key, invalid UTF-8, a timed event
 * without ts/dur) this scanner raises ValueError and the caller decodes the piece with that
 * reference, which produces the user's error message or the result. Tests check that both
 * decoders give identical columns on every trace they can both read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned char u8;

/* ------------------------------------------------------------------ growable buffers */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *p = (char *)realloc(b->p, (size_t)cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (b->len + n > b->cap && buf_grow(b, n) < 0) return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static PyObject *buf_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", b->len);
}

/* An int64 column with a validity byte per row. */
typedef struct { Buf v, ok; } IntCol;
/* A string column in Arrow layout: int32 offsets (n+1), data, validity byte per row. */
typedef struct { Buf off, data, ok; } StrCol;

static inline int int_push(IntCol *c, int valid, int64_t v) {
    u8 o = (u8)valid;
    if (!valid) v = 0;
    return buf_put(&c->v, &v, 8) | buf_put(&c->ok, &o, 1);
}

static int str_init(StrCol *c) {
    int32_t z = 0;
    return buf_put(&c->off, &z, 4);
}

static inline int str_push(StrCol *c, const void *s, Py_ssize_t n, int valid) {
    u8 o = (u8)valid;
    if (valid && buf_put(&c->data, s, n) < 0) return -1;
    if (c->data.len > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "piece too large for int32 offsets");
        return -1;
    }
    int32_t end = (int32_t)c->data.len;
    return buf_put(&c->off, &end, 4) | buf_put(&c->ok, &o, 1);
}

/* ------------------------------------------------------------------ the parser */

typedef struct {
    const u8 *p, *end;
    const char *err;
} Parser;

#define FAIL(ps, msg) do { (ps)->err = (msg); return -1; } while (0)

static inline void ws(Parser *ps) {
    while (ps->p < ps->end) {
        u8 c = *ps->p;
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') ps->p++;
        else break;
    }
}

static inline int hexval(u8 c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string token: p at '"'. Sets the raw span (between the quotes) and whether it has escapes. */
static int scan_string(Parser *ps, const u8 **s, Py_ssize_t *n, int *esc) {
    const u8 *p = ps->p + 1;
    *esc = 0;
    for (;;) {
        /* fast skip of plain bytes, 8 at a time: stop at a word holding '"', '\\' or < 0x20 */
        while (ps->end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t q = w ^ 0x2222222222222222ULL, b = w ^ 0x5C5C5C5C5C5C5C5CULL;
            uint64_t hit = ((q - 0x0101010101010101ULL) & ~q) | ((b - 0x0101010101010101ULL) & ~b) |
                           ((w - 0x2020202020202020ULL) & ~w);
            hit &= 0x8080808080808080ULL;
            if (hit) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                /* the lowest flagged byte is a real stop (borrows only flag bytes above one) */
                p += __builtin_ctzll(hit) >> 3;
                goto stop;
#else
                break;
#endif
            }
            p += 8;
        }
        while (p < ps->end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
    stop:
        if (p >= ps->end) FAIL(ps, "unterminated string");
        if (*p == '"') break;
        if (*p < 0x20) FAIL(ps, "control character in string");
        *esc = 1; /* backslash */
        if (p + 1 >= ps->end) FAIL(ps, "unterminated string");
        u8 e = p[1];
        if (e == 'u') {
            if (p + 6 > ps->end) FAIL(ps, "bad \\u escape");
            for (int i = 2; i < 6; i++)
                if (hexval(p[i]) < 0) FAIL(ps, "bad \\u escape");
            p += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                   e == 'r' || e == 't') {
            p += 2;
        } else {
            FAIL(ps, "bad escape");
        }
    }
    *s = ps->p + 1;
    *n = p - (ps->p + 1);
    ps->p = p + 1;
    return 0;
}

static int put_utf8(Buf *out, uint32_t cp) {
    u8 b[4];
    int n;
    if (cp < 0x80) { b[0] = (u8)cp; n = 1; }
    else if (cp < 0x800) { b[0] = (u8)(0xC0 | (cp >> 6)); b[1] = (u8)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        b[0] = (u8)(0xE0 | (cp >> 12)); b[1] = (u8)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (u8)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        b[0] = (u8)(0xF0 | (cp >> 18)); b[1] = (u8)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (u8)(0x80 | ((cp >> 6) & 0x3F)); b[3] = (u8)(0x80 | (cp & 0x3F)); n = 4;
    }
    return buf_put(out, b, n);
}

static uint32_t hex4(const u8 *p) {
    return (uint32_t)(hexval(p[0]) << 12 | hexval(p[1]) << 8 | hexval(p[2]) << 4 | hexval(p[3]));
}

/* Decode a scanned string span into UTF-8 bytes (appended to out). Lone surrogates -> error. */
static int unescape(Parser *ps, const u8 *s, Py_ssize_t n, Buf *out) {
    const u8 *p = s, *e = s + n;
    while (p < e) {
        const u8 *q = p;
        while (q < e && *q != '\\') q++;
        if (q > p && buf_put(out, p, q - p) < 0) return -2;
        if (q >= e) break;
        u8 c = q[1];
        uint32_t cp;
        switch (c) {
            case '"': cp = '"'; p = q + 2; break;
            case '\\': cp = '\\'; p = q + 2; break;
            case '/': cp = '/'; p = q + 2; break;
            case 'b': cp = '\b'; p = q + 2; break;
            case 'f': cp = '\f'; p = q + 2; break;
            case 'n': cp = '\n'; p = q + 2; break;
            case 'r': cp = '\r'; p = q + 2; break;
            case 't': cp = '\t'; p = q + 2; break;
            default: /* 'u' (scan_string checked the digits) */
                cp = hex4(q + 2);
                p = q + 6;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (p + 6 > e || p[0] != '\\' || p[1] != 'u') FAIL(ps, "lone surrogate");
                    uint32_t lo = hex4(p + 2);
                    if (lo < 0xDC00 || lo > 0xDFFF) FAIL(ps, "lone surrogate");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    FAIL(ps, "lone surrogate");
                }
        }
        if (put_utf8(out, cp) < 0) return -2;
    }
    return 0;
}

/* A JSON number. *is_int: integer grammar (no '.', no exponent) and fits int64. */
typedef struct {
    int is_int, neg;
    int64_t i;
    double d;
} Num;

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int scan_number(Parser *ps, Num *num) {
    const u8 *p = ps->p, *start = p;
    int neg = 0, frac = 0, exp = 0, digits = 0;
    uint64_t mant = 0;
    if (*p == '-') { neg = 1; p++; }
    if (p >= ps->end || *p < '0' || *p > '9') FAIL(ps, "bad number");
    if (*p == '0') p++;
    else {
        while (p < ps->end && *p >= '0' && *p <= '9') {
            mant = mant * 10 + (uint64_t)(*p - '0'); /* wraps past 19 digits: see `digits` */
            digits++; p++;
        }
    }
    int is_int = 1;
    if (p < ps->end && *p == '.') {
        is_int = 0; p++;
        if (p >= ps->end || *p < '0' || *p > '9') FAIL(ps, "bad number");
        while (p < ps->end && *p >= '0' && *p <= '9') {
            mant = mant * 10 + (uint64_t)(*p - '0');
            frac++; digits++; p++;
        }
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        is_int = 0; exp = 1; p++;
        if (p < ps->end && (*p == '+' || *p == '-')) p++;
        if (p >= ps->end || *p < '0' || *p > '9') FAIL(ps, "bad number");
        while (p < ps->end && *p >= '0' && *p <= '9') p++;
    }
    ps->p = p;
    num->neg = neg;
    int overflow = digits > 19; /* 19 digits always fit in uint64 */
    if (is_int) {
        if (overflow || mant > (uint64_t)INT64_MAX + (uint64_t)neg) FAIL(ps, "integer beyond int64");
        num->is_int = 1;
        num->i = neg ? (int64_t)(0 - mant) : (int64_t)mant;
        num->d = (double)num->i;
        return 0;
    }
    num->is_int = 0;
    if (!overflow && !exp && mant < (1ULL << 53) && frac <= 22) {
        /* exact: both operands are exact doubles, so the quotient is correctly rounded */
        double d = (double)mant / POW10[frac];
        num->d = neg ? -d : d;
    } else {
        char tmp[128];
        Py_ssize_t n = p - start;
        if (n >= (Py_ssize_t)sizeof(tmp)) FAIL(ps, "number too long");
        memcpy(tmp, start, (size_t)n);
        tmp[n] = 0;
        num->d = strtod(tmp, NULL);
    }
    return 0;
}

static int skip_value(Parser *ps, int depth);

static int expect_lit(Parser *ps, const char *lit, Py_ssize_t n) {
    if (ps->end - ps->p < n || memcmp(ps->p, lit, (size_t)n) != 0) FAIL(ps, "bad literal");
    ps->p += n;
    return 0;
}

static int skip_value(Parser *ps, int depth) {
    if (depth > 64) FAIL(ps, "nesting too deep");
    ws(ps);
    if (ps->p >= ps->end) FAIL(ps, "truncated");
    u8 c = *ps->p;
    const u8 *s;
    Py_ssize_t n;
    int esc;
    Num num;
    switch (c) {
        case '"': return scan_string(ps, &s, &n, &esc);
        case '{':
            ps->p++; ws(ps);
            if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
            for (;;) {
                ws(ps);
                if (ps->p >= ps->end || *ps->p != '"') FAIL(ps, "expected key");
                if (scan_string(ps, &s, &n, &esc) < 0) return -1;
                ws(ps);
                if (ps->p >= ps->end || *ps->p != ':') FAIL(ps, "expected ':'");
                ps->p++;
                if (skip_value(ps, depth + 1) < 0) return -1;
                ws(ps);
                if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
                if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
                FAIL(ps, "expected ',' or '}'");
            }
        case '[':
            ps->p++; ws(ps);
            if (ps->p < ps->end && *ps->p == ']') { ps->p++; return 0; }
            for (;;) {
                if (skip_value(ps, depth + 1) < 0) return -1;
                ws(ps);
                if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
                if (ps->p < ps->end && *ps->p == ']') { ps->p++; return 0; }
                FAIL(ps, "expected ',' or ']'");
            }
        case 't': return expect_lit(ps, "true", 4);
        case 'f': return expect_lit(ps, "false", 5);
        case 'n': return expect_lit(ps, "null", 4);
        default:
            if (c == '-' || (c >= '0' && c <= '9')) {
                /* numbers beyond int64 are fine where the value is skipped */
                const u8 *save = ps->p;
                if (scan_number(ps, &num) < 0) {
                    if (ps->err && strcmp(ps->err, "integer beyond int64") == 0) {
                        ps->err = NULL;
                        ps->p = save;
                        if (*ps->p == '-') ps->p++;
                        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
                        return 0;
                    }
                    return -1;
                }
                return 0;
            }
            FAIL(ps, "unexpected character");
    }
}

/* ------------------------------------------------------------------ UTF-8 validation */

/* Strict UTF-8 (as Python's decoder: no overlongs, no surrogates, <= U+10FFFF). */
static int valid_utf8(const u8 *p, const u8 *e) {
    while (p < e) {
        /* ASCII fast path, 8 bytes at a time */
        while (e - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (w & 0x8080808080808080ULL) break;
            p += 8;
        }
        if (p >= e) break;
        u8 c = *p;
        if (c < 0x80) { p++; continue; }
        int n;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (e - p <= n) return 0;
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        p += n + 1;
    }
    return 1;
}

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
    free(d->flags.p);
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

/* ------------------------------------------------------------------ events */

typedef struct {
    const u8 *s;
    Py_ssize_t n;
    int esc;
    int set; /* 0 absent, 1 string (or raw value), 2 null */
} Span;

typedef struct {
    int set;
    int64_t v;
} OptInt;

enum { I_EXT, I_CORR, I_STREAM, I_DEVICE, I_IN, I_OUT, I_GSIZE, I_SEQ, I_BYTES, N_INT };
static const char *INT_NAMES[N_INT] = {"external_id", "correlation", "stream", "device",
                                       "in_nelems", "out_nelems", "group_size", "seq", "bytes"};
enum { S_COLL, S_DTYPE, S_PGNAME, S_PGDESC, S_PGRANKS, S_DIMS, S_ITYPES, S_CONCRETE, S_ANAME,
       N_SPAN };
/* string columns: the spans above except the metadata name, plus the launch text */
#define N_STR (S_ANAME + 1)
#define S_LAUNCH S_ANAME
static const char *STR_NAMES[N_STR] = {"coll",  "dtype",  "pg_name",  "pg_desc", "pg_ranks",
                                       "shapes", "itypes", "concrete", "launch"};

typedef struct {
    Span ph, cat, name;
    int pid_k, tid_k; /* 0 null/absent, 1 int, 2 string */
    int64_t pid, tid;
    Span pid_s, tid_s;
    int ts_set, dur_set;
    double ts, dur;
    OptInt ints[N_INT];
    Span spans[N_SPAN];
    char grid[96], block[96];
    int grid_set, block_set;
} Ev;

typedef struct {
    Parser ps;
    Dict cats, names;
    Buf cat_codes, name_codes, pid, tid, ts_ns, dur_ns;
    IntCol ints[N_INT];
    StrCol strs[N_STR];
    PyObject *id_strings; /* [(row, 0 pid | 1 tid, str)] */
    PyObject *threads;    /* [(pid, tid, name)] from process_name / thread_name metadata */
    Buf tmp;
    Py_ssize_t rows;
} Scan;

static inline int key_is(const u8 *s, Py_ssize_t n, const char *k) {
    size_t kn = strlen(k);
    return (size_t)n == kn && memcmp(s, k, kn) == 0;
}

static int parse_str(Parser *ps, Span *sp, int nullable) {
    ws(ps);
    if (ps->p < ps->end && *ps->p == '"') {
        if (scan_string(ps, &sp->s, &sp->n, &sp->esc) < 0) return -1;
        sp->set = 1;
        return 0;
    }
    if (nullable && ps->p < ps->end && *ps->p == 'n') {
        sp->set = 2;
        sp->s = NULL;
        sp->n = 0;
        return expect_lit(ps, "null", 4);
    }
    FAIL(ps, "expected a string");
}

static int parse_raw(Parser *ps, Span *sp) {
    ws(ps);
    const u8 *s = ps->p;
    if (skip_value(ps, 1) < 0) return -1;
    sp->s = s;
    sp->n = ps->p - s;
    sp->set = 1;
    return 0;
}

static int parse_int(Parser *ps, OptInt *o, int allow_float) {
    ws(ps);
    if (ps->p < ps->end && *ps->p == 'n') { o->set = 0; return expect_lit(ps, "null", 4); }
    Num num;
    if (ps->p >= ps->end || !(*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')))
        FAIL(ps, "expected an integer");
    if (scan_number(ps, &num) < 0) return -1;
    if (num.is_int) { o->v = num.i; o->set = 1; return 0; }
    if (!allow_float || !(fabs(num.d) < 9.2e18)) FAIL(ps, "expected an integer");
    o->v = (int64_t)num.d; /* Python int(float): truncation */
    o->set = 1;
    return 0;
}

static int parse_float(Parser *ps, int *set, double *d) {
    ws(ps);
    if (ps->p < ps->end && *ps->p == 'n') { *set = 0; return expect_lit(ps, "null", 4); }
    Num num;
    if (ps->p >= ps->end || !(*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')))
        FAIL(ps, "expected a number");
    if (scan_number(ps, &num) < 0) return -1;
    *set = 1;
    *d = num.d;
    return 0;
}

static int parse_id(Parser *ps, int *kind, int64_t *v, Span *sp) {
    ws(ps);
    if (ps->p < ps->end && *ps->p == '"') { *kind = 2; return parse_str(ps, sp, 0); }
    if (ps->p < ps->end && *ps->p == 'n') { *kind = 0; return expect_lit(ps, "null", 4); }
    OptInt o;
    if (parse_int(ps, &o, 0) < 0) return -1;
    *kind = 1;
    *v = o.v;
    return 0;
}

/* list[int] | None, formatted as Python's repr of the list (out == NULL: only checked). */
/* Decimal text of v at out (no NUL); returns its length. */
static int fmt_i64(char *out, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    int len = 0;
    if (v < 0) out[len++] = '-';
    while (n) out[len++] = tmp[--n];
    return len;
}

static int parse_dims3(Parser *ps, char *out, int *set) {
    ws(ps);
    if (out && ps->p < ps->end && *ps->p == 'n') { *set = 0; return expect_lit(ps, "null", 4); }
    if (ps->p >= ps->end || *ps->p != '[') FAIL(ps, "expected a list of integers");
    ps->p++;
    int len = 0;
    if (out) out[len++] = '[';
    ws(ps);
    if (ps->p < ps->end && *ps->p == ']') ps->p++;
    else {
        for (int i = 0;; i++) {
            OptInt o;
            ws(ps);
            if (ps->p < ps->end && *ps->p == 'n') FAIL(ps, "expected an integer");
            if (parse_int(ps, &o, 0) < 0) return -1;
            if (!out) goto next;
            if (len > 60) FAIL(ps, "list too long");
            if (i) { out[len++] = ','; out[len++] = ' '; }
            len += fmt_i64(out + len, o.v);
        next:
            ws(ps);
            if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
            if (ps->p < ps->end && *ps->p == ']') { ps->p++; break; }
            FAIL(ps, "expected ',' or ']'");
        }
    }
    if (!out) return 0;
    out[len++] = ']';
    out[len] = 0;
    *set = 1;
    return 0;
}

static int parse_args(Parser *ps, Ev *ev) {
    ws(ps);
    if (ps->p < ps->end && *ps->p == 'n') return expect_lit(ps, "null", 4);
    if (ps->p >= ps->end || *ps->p != '{') FAIL(ps, "args is not an object");
    ps->p++;
    ws(ps);
    if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
    for (;;) {
        const u8 *k;
        Py_ssize_t kn;
        int esc;
        ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') FAIL(ps, "expected key");
        if (scan_string(ps, &k, &kn, &esc) < 0) return -1;
        if (esc) FAIL(ps, "escaped key");
        ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') FAIL(ps, "expected ':'");
        ps->p++;
        int r;
        if (key_is(k, kn, "External id")) r = parse_int(ps, &ev->ints[I_EXT], 0);
        else if (key_is(k, kn, "correlation")) r = parse_int(ps, &ev->ints[I_CORR], 0);
        else if (key_is(k, kn, "stream")) r = parse_int(ps, &ev->ints[I_STREAM], 0);
        else if (key_is(k, kn, "device")) r = parse_int(ps, &ev->ints[I_DEVICE], 0);
        else if (key_is(k, kn, "In msg nelems")) r = parse_int(ps, &ev->ints[I_IN], 0);
        else if (key_is(k, kn, "Out msg nelems")) r = parse_int(ps, &ev->ints[I_OUT], 0);
        else if (key_is(k, kn, "Group size")) r = parse_int(ps, &ev->ints[I_GSIZE], 0);
        else if (key_is(k, kn, "Seq")) r = parse_int(ps, &ev->ints[I_SEQ], 0);
        else if (key_is(k, kn, "bytes")) r = parse_int(ps, &ev->ints[I_BYTES], 1);
        else if (key_is(k, kn, "Collective name")) r = parse_str(ps, &ev->spans[S_COLL], 1);
        else if (key_is(k, kn, "dtype")) r = parse_str(ps, &ev->spans[S_DTYPE], 1);
        else if (key_is(k, kn, "Process Group Name")) r = parse_str(ps, &ev->spans[S_PGNAME], 1);
        else if (key_is(k, kn, "Process Group Description"))
            r = parse_str(ps, &ev->spans[S_PGDESC], 1);
        else if (key_is(k, kn, "name")) r = parse_str(ps, &ev->spans[S_ANAME], 1);
        else if (key_is(k, kn, "Process Group Ranks")) {
            Span *sp = &ev->spans[S_PGRANKS];
            ws(ps);
            u8 c = ps->p < ps->end ? *ps->p : 0;
            if (c == 'n') { sp->set = 0; r = expect_lit(ps, "null", 4); }
            else if (c == '"' || c == '[') {
                /* str | list[int]: the reference decoder checks the list's items */
                r = parse_raw(ps, sp);
                if (r == 0 && c == '[') {
                    Parser sub = {sp->s, sp->s + sp->n, NULL};
                    if (parse_dims3(&sub, NULL, NULL) < 0) FAIL(ps, sub.err);
                }
            } else FAIL(ps, "bad Process Group Ranks");
        }
        else if (key_is(k, kn, "grid")) r = parse_dims3(ps, ev->grid, &ev->grid_set);
        else if (key_is(k, kn, "block")) r = parse_dims3(ps, ev->block, &ev->block_set);
        else if (key_is(k, kn, "Input Dims")) r = parse_raw(ps, &ev->spans[S_DIMS]);
        else if (key_is(k, kn, "Input type")) r = parse_raw(ps, &ev->spans[S_ITYPES]);
        else if (key_is(k, kn, "Concrete Inputs")) r = parse_raw(ps, &ev->spans[S_CONCRETE]);
        else r = skip_value(ps, 2);
        if (r < 0) return -1;
        ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
        FAIL(ps, "expected ',' or '}'");
    }
}

static int parse_event(Parser *ps, Ev *ev) {
    memset(ev, 0, sizeof(*ev));
    if (ps->p >= ps->end || *ps->p != '{') FAIL(ps, "event is not an object");
    ps->p++;
    ws(ps);
    if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
    for (;;) {
        const u8 *k;
        Py_ssize_t kn;
        int esc, r;
        ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') FAIL(ps, "expected key");
        if (scan_string(ps, &k, &kn, &esc) < 0) return -1;
        if (esc) FAIL(ps, "escaped key");
        ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') FAIL(ps, "expected ':'");
        ps->p++;
        if (key_is(k, kn, "ph")) r = parse_str(ps, &ev->ph, 0);
        else if (key_is(k, kn, "cat")) r = parse_str(ps, &ev->cat, 1);
        else if (key_is(k, kn, "name")) r = parse_str(ps, &ev->name, 0);
        else if (key_is(k, kn, "pid")) r = parse_id(ps, &ev->pid_k, &ev->pid, &ev->pid_s);
        else if (key_is(k, kn, "tid")) r = parse_id(ps, &ev->tid_k, &ev->tid, &ev->tid_s);
        else if (key_is(k, kn, "ts")) r = parse_float(ps, &ev->ts_set, &ev->ts);
        else if (key_is(k, kn, "dur")) r = parse_float(ps, &ev->dur_set, &ev->dur);
        else if (key_is(k, kn, "args")) {
            /* a repeated `args` replaces the earlier one, as in the reference decoder */
            memset(ev->ints, 0, sizeof(ev->ints));
            memset(ev->spans, 0, sizeof(ev->spans));
            ev->grid_set = ev->block_set = 0;
            r = parse_args(ps, ev);
        } else r = skip_value(ps, 1);
        if (r < 0) return -1;
        ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
        FAIL(ps, "expected ',' or '}'");
    }
}

/* ------------------------------------------------------------------ rows */

static int to_ns(Parser *ps, double x, int64_t *out) {
    /* as kineto_events._us_to_ns: exact integer-µs part plus the rounded sub-µs part */
    double w = floor(x);
    if (!(fabs(w) < 9.0e15)) FAIL(ps, "timestamp out of range");
    *out = (int64_t)w * 1000 + (int64_t)rint((x - w) * 1000.0);
    return 0;
}

static PyObject *span_str(Scan *sc, Span *sp) {
    if (!sp->esc) return PyUnicode_DecodeUTF8((const char *)sp->s, sp->n, "strict");
    sc->tmp.len = 0;
    if (unescape(&sc->ps, sp->s, sp->n, &sc->tmp) < 0) return NULL;
    return PyUnicode_DecodeUTF8(sc->tmp.p ? sc->tmp.p : "", sc->tmp.len, "strict");
}

static int push_span(Scan *sc, StrCol *c, Span *sp, int raw) {
    if (sp->set != 1) return str_push(c, NULL, 0, 0);
    if (raw || !sp->esc) return str_push(c, sp->s, sp->n, 1);
    sc->tmp.len = 0;
    if (unescape(&sc->ps, sp->s, sp->n, &sc->tmp) < 0) return -1;
    return str_push(c, sc->tmp.p, sc->tmp.len, 1);
}

static PyObject *id_obj(Scan *sc, int kind, int64_t v, Span *sp) {
    if (kind == 1) return PyLong_FromLongLong(v);
    if (kind == 2) return span_str(sc, sp);
    Py_RETURN_NONE;
}

static int add_thread(Scan *sc, Ev *ev, int process) {
    PyObject *pid = id_obj(sc, ev->pid_k, ev->pid, &ev->pid_s);
    PyObject *tid = process ? PyLong_FromLong(-1) : id_obj(sc, ev->tid_k, ev->tid, &ev->tid_s);
    PyObject *nm = span_str(sc, &ev->spans[S_ANAME]);
    PyObject *t = (pid && tid && nm) ? PyTuple_Pack(4, pid, tid, nm, process ? Py_True : Py_False)
                                     : NULL;
    Py_XDECREF(pid);
    Py_XDECREF(tid);
    Py_XDECREF(nm);
    if (!t) return -1;
    int r = PyList_Append(sc->threads, t);
    Py_DECREF(t);
    return r;
}

static int add_id_string(Scan *sc, int which, Span *sp) {
    PyObject *s = span_str(sc, sp);
    if (!s) return -1;
    PyObject *t = Py_BuildValue("(niN)", sc->rows, which, s);
    if (!t) return -1;
    int r = PyList_Append(sc->id_strings, t);
    Py_DECREF(t);
    return r;
}

static int commit(Scan *sc, Ev *ev) {
    Parser *ps = &sc->ps;
    if (ev->ph.esc) FAIL(ps, "escaped ph");
    int one = ev->ph.set == 1 && ev->ph.n == 1;
    if (one && ev->ph.s[0] == 'M') {
        if (ev->spans[S_ANAME].set != 1) return 0;
        if (ev->name.esc) FAIL(ps, "escaped metadata name");
        if (key_is(ev->name.s, ev->name.n, "process_name")) return add_thread(sc, ev, 1);
        if (key_is(ev->name.s, ev->name.n, "thread_name")) return add_thread(sc, ev, 0);
        return 0;
    }
    if (!(one && ev->ph.s[0] == 'X')) return 0;
    Span *c = &ev->cat;
    int32_t cat = dict_code(&sc->cats, ps, c->set == 1 ? c->s : NULL, c->set == 1 ? c->n : 0,
                            c->set == 1 && c->esc, &sc->tmp);
    if (cat < 0) return -1;
    if (sc->cats.flags.p[cat]) return 0; /* cat "Trace": the profiler's own span */
    if (!ev->ts_set || !ev->dur_set || ev->dur < 0) FAIL(ps, "timed event without ts/dur");
    Span *n = &ev->name;
    int32_t name = dict_code(&sc->names, ps, n->set == 1 ? n->s : NULL, n->set == 1 ? n->n : 0,
                             n->set == 1 && n->esc, &sc->tmp);
    if (name < 0) return -1;
    int64_t ts, dur, pid = ev->pid_k == 1 ? ev->pid : 0, tid = ev->tid_k == 1 ? ev->tid : 0;
    if (to_ns(ps, ev->ts, &ts) < 0 || to_ns(ps, ev->dur, &dur) < 0) return -1;
    if (ev->pid_k == 2 && add_id_string(sc, 0, &ev->pid_s) < 0) return -1;
    if (ev->tid_k == 2 && add_id_string(sc, 1, &ev->tid_s) < 0) return -1;
    if (buf_put(&sc->cat_codes, &cat, 4) | buf_put(&sc->name_codes, &name, 4) |
        buf_put(&sc->pid, &pid, 8) | buf_put(&sc->tid, &tid, 8) | buf_put(&sc->ts_ns, &ts, 8) |
        buf_put(&sc->dur_ns, &dur, 8))
        return -1;
    for (int i = 0; i < N_INT; i++)
        if (int_push(&sc->ints[i], ev->ints[i].set, ev->ints[i].v) < 0) return -1;
    static const int raw[S_ANAME] = {0, 0, 0, 0, 1, 1, 1, 1};
    for (int i = 0; i < S_ANAME; i++)
        if (push_span(sc, &sc->strs[i], &ev->spans[i], raw[i]) < 0) return -1;
    if (ev->grid_set || ev->block_set) {
        char txt[256];
        const char *g = ev->grid_set ? ev->grid : "None", *b = ev->block_set ? ev->block : "None";
        size_t gn = strlen(g), bn = strlen(b);
        memcpy(txt, "grid=", 5);
        memcpy(txt + 5, g, gn);
        memcpy(txt + 5 + gn, " block=", 7);
        memcpy(txt + 12 + gn, b, bn);
        if (str_push(&sc->strs[S_LAUNCH], txt, (Py_ssize_t)(12 + gn + bn), 1) < 0) return -1;
    } else if (str_push(&sc->strs[S_LAUNCH], NULL, 0, 0) < 0) {
        return -1;
    }
    sc->rows++;
    return 0;
}

/* ------------------------------------------------------------------ module */

static void scan_free(Scan *sc) {
    dict_free(&sc->cats);
    dict_free(&sc->names);
    Buf *bufs[] = {&sc->cat_codes, &sc->name_codes, &sc->pid, &sc->tid, &sc->ts_ns, &sc->dur_ns,
                   &sc->tmp};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]->p);
    for (int i = 0; i < N_INT; i++) { free(sc->ints[i].v.p); free(sc->ints[i].ok.p); }
    for (int i = 0; i < N_STR; i++) {
        free(sc->strs[i].off.p); free(sc->strs[i].data.p); free(sc->strs[i].ok.p);
    }
    Py_XDECREF(sc->id_strings);
    Py_XDECREF(sc->threads);
}

static int set_item(PyObject *d, const char *k, PyObject *v) {
    if (!v) return -1;
    int r = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return r;
}

static PyObject *result(Scan *sc) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    int bad = set_item(d, "rows", PyLong_FromSsize_t(sc->rows)) |
              set_item(d, "cat_codes", buf_bytes(&sc->cat_codes)) |
              set_item(d, "name_codes", buf_bytes(&sc->name_codes)) |
              set_item(d, "pid", buf_bytes(&sc->pid)) | set_item(d, "tid", buf_bytes(&sc->tid)) |
              set_item(d, "ts_ns", buf_bytes(&sc->ts_ns)) |
              set_item(d, "dur_ns", buf_bytes(&sc->dur_ns));
    Py_INCREF(sc->cats.values);
    Py_INCREF(sc->names.values);
    Py_INCREF(sc->id_strings);
    Py_INCREF(sc->threads);
    bad |= set_item(d, "cats", sc->cats.values) | set_item(d, "names", sc->names.values) |
           set_item(d, "id_strings", sc->id_strings) | set_item(d, "threads", sc->threads);
    for (int i = 0; i < N_INT && !bad; i++)
        bad |= set_item(d, INT_NAMES[i],
                        Py_BuildValue("(NN)", buf_bytes(&sc->ints[i].v), buf_bytes(&sc->ints[i].ok)));
    for (int i = 0; i < N_STR && !bad; i++)
        bad |= set_item(d, STR_NAMES[i],
                        Py_BuildValue("(NNN)", buf_bytes(&sc->strs[i].off),
                                      buf_bytes(&sc->strs[i].data), buf_bytes(&sc->strs[i].ok)));
    if (bad) { Py_DECREF(d); return NULL; }
    return d;
}

static PyObject *run(Scan *sc) {
    Parser *ps = &sc->ps;
    if (!valid_utf8(ps->p, ps->end)) { ps->err = "invalid UTF-8"; return NULL; }
    ws(ps);
    if (ps->p >= ps->end) return result(sc);
    Ev ev;
    for (;;) {
        ws(ps);
        if (parse_event(ps, &ev) < 0 || commit(sc, &ev) < 0) return NULL;
        ws(ps);
        if (ps->p >= ps->end) return result(sc);
        if (*ps->p != ',') { ps->err = "expected ',' between events"; return NULL; }
        ps->p++;
    }
}

static PyObject *kscan_scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &lo, &hi)) return NULL;
    if (lo < 0 || hi > view.len || lo > hi) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "range outside the buffer");
        return NULL;
    }
    Scan sc;
    memset(&sc, 0, sizeof(sc));
    sc.ps.p = (const u8 *)view.buf + lo;
    sc.ps.end = (const u8 *)view.buf + hi;
    PyObject *out = NULL;
    int ok = dict_init(&sc.cats) == 0 && dict_init(&sc.names) == 0;
    sc.id_strings = PyList_New(0);
    sc.threads = PyList_New(0);
    for (int i = 0; ok && i < N_STR; i++) ok = str_init(&sc.strs[i]) == 0;
    if (ok && sc.id_strings && sc.threads) out = run(&sc);
    if (!out && !PyErr_Occurred()) {
        Py_ssize_t at = sc.ps.p - (const u8 *)view.buf;
        PyErr_Format(PyExc_ValueError, "%s at byte %zd", sc.ps.err ? sc.ps.err : "error", at);
    }
    scan_free(&sc);
    PyBuffer_Release(&view);
    return out;
}

/* skip_events(buffer, pos) -> index just past the ']' that closes the events array, scanning
 * from pos (the start of an event, or the ']' itself) over events separated by commas. */
static PyObject *kscan_skip_events(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "y*n", &view, &pos)) return NULL;
    if (pos < 0 || pos > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position outside the buffer");
        return NULL;
    }
    Parser ps = {(const u8 *)view.buf + pos, (const u8 *)view.buf + view.len, NULL};
    Py_ssize_t end = -1;
    ws(&ps);
    if (ps.p < ps.end && *ps.p == ']') end = ps.p + 1 - (const u8 *)view.buf;
    while (end < 0) {
        if (skip_value(&ps, 1) < 0) break;
        ws(&ps);
        if (ps.p < ps.end && *ps.p == ',') { ps.p++; continue; }
        if (ps.p < ps.end && *ps.p == ']') end = ps.p + 1 - (const u8 *)view.buf;
        else { ps.err = "expected ',' or ']' after an event"; break; }
    }
    Py_ssize_t at = ps.p - (const u8 *)view.buf;
    PyBuffer_Release(&view);
    if (end < 0) return PyErr_Format(PyExc_ValueError, "%s at byte %zd", ps.err ? ps.err : "error", at);
    return PyLong_FromSsize_t(end);
}

static PyMethodDef METHODS[] = {
    {"skip_events", kscan_skip_events, METH_VARARGS,
     "skip_events(buffer, pos) -> index past the ']' closing the events array"},
    {"scan", kscan_scan, METH_VARARGS,
     "scan(buffer, lo, hi) -> dict of column buffers for the events in buffer[lo:hi]"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_kscan",
                                    "Kineto event scanner (see kineto_fast.py).", -1, METHODS};

PyMODINIT_FUNC PyInit__kscan(void) { return PyModule_Create(&MODULE); }
