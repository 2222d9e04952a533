/* _kscan_json.h: JSON tokens for the Kineto scanner: buffers, strings, numbers, skipping, UTF-8.
 * Included once, by _kscan.c (static functions: one translation unit). */
#ifndef KSCAN_JSON_H
#define KSCAN_JSON_H

/* ------------------------------------------------------------------ growable buffers */

/* A growable byte buffer held as a bytes object, resized in place (_PyBytes_Resize, for a
 * bytes object not yet shared), so that the columns are handed to Python without a copy
 * (copying them out of malloc'd buffers at the end was ~5% of the scan, in memmove). */
typedef struct {
    char *p; /* obj's bytes */
    Py_ssize_t len, cap;
    PyObject *obj;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    if (!b->obj) {
        b->obj = PyBytes_FromStringAndSize(NULL, cap);
        if (!b->obj) return -1;
    } else if (_PyBytes_Resize(&b->obj, cap) < 0) { /* b->obj is NULL then */
        b->p = NULL;
        b->len = b->cap = 0;
        return -1;
    }
    b->p = PyBytes_AS_STRING(b->obj);
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (b->len + n > b->cap && buf_grow(b, n) < 0) return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

/* The buffer's bytes as a bytes object, handed over (the buffer is empty after). */
static PyObject *buf_bytes(Buf *b) {
    PyObject *out = b->obj;
    if (!out) return PyBytes_FromStringAndSize("", 0);
    b->obj = NULL;
    b->p = NULL;
    if (_PyBytes_Resize(&out, b->len) < 0) out = NULL;
    b->len = b->cap = 0;
    return out;
}

static void buf_free(Buf *b) {
    Py_CLEAR(b->obj);
    b->p = NULL;
    b->len = b->cap = 0;
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

/* Length of the strict UTF-8 sequence at p (a byte >= 0x80), or 0 if it is not one: as
 * Python's decoder, no overlongs, no surrogates, nothing past U+10FFFF. */
static int utf8_seq(const u8 *p, const u8 *e) {
    u8 c = *p;
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
    return n + 1;
}

/* A string token: p at '"'. Sets the raw span (between the quotes) and whether it has escapes.
 * Its bytes are checked as UTF-8 here: outside strings only ASCII parses, so a piece whose
 * strings are valid is valid (a separate pass over every byte first was ~5% of the scan). */
static int scan_string(Parser *ps, const u8 **s, Py_ssize_t *n, int *esc) {
    const u8 *p = ps->p + 1;
    *esc = 0;
    for (;;) {
        /* fast skip of plain ASCII, 8 bytes at a time: stop at a word holding '"', '\\', a byte
         * < 0x20 or one >= 0x80 */
        while (ps->end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t q = w ^ 0x2222222222222222ULL, b = w ^ 0x5C5C5C5C5C5C5C5CULL;
            uint64_t hit = ((q - 0x0101010101010101ULL) & ~q) | ((b - 0x0101010101010101ULL) & ~b) |
                           ((w - 0x2020202020202020ULL) & ~w) | w;
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
        while (p < ps->end && *p != '"' && *p != '\\' && *p >= 0x20 && *p < 0x80) p++;
    stop:
        if (p >= ps->end) FAIL(ps, "unterminated string");
        if (*p == '"') break;
        if (*p >= 0x80) {
            int len = utf8_seq(p, ps->end);
            if (!len) FAIL(ps, "invalid UTF-8");
            p += len;
            continue;
        }
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

#endif
