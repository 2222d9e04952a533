/* _kscan_events.h: one Kineto event object -> the fields ranklens keeps (types as the reference decoder checks them).
 * Included once, by _kscan.c (static functions: one translation unit). */
#ifndef KSCAN_EVENTS_H
#define KSCAN_EVENTS_H

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

/* I_PEER is not a key: commit() fills it from `Dst Rank` / `Src Rank` (Ev.dst, Ev.src) */
enum { I_EXT, I_CORR, I_STREAM, I_DEVICE, I_IN, I_OUT, I_GSIZE, I_SEQ, I_BYTES, I_PEER, N_INT };
static const char *INT_NAMES[N_INT] = {"external_id", "correlation", "stream", "device",
                                       "in_nelems", "out_nelems", "group_size", "seq", "bytes",
                                       "peer"};
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
    OptInt dst, src; /* p2p peer: `Dst Rank` (send), `Src Rank` (recv) */
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

/* A key against a literal: the length first, then a fixed-size compare the compiler inlines
 * (a function taking the literal's strlen was called out of line: ~3% of the scan). */
#define key_is(s, n, lit) ((n) == (Py_ssize_t)(sizeof(lit) - 1) && memcmp((s), (lit), sizeof(lit) - 1) == 0)

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

/* A global rank (`Dst Rank` / `Src Rank`): an int or a string of ASCII digits in 0..INT32_MAX.
 * Anything else (escaped, negative, longer, a float) goes to the reference, which judges it. */
static int parse_rank(Parser *ps, OptInt *o) {
    ws(ps);
    if (ps->p < ps->end && *ps->p == '"') {
        const u8 *s;
        Py_ssize_t n;
        int esc;
        if (scan_string(ps, &s, &n, &esc) < 0) return -1;
        if (esc || n < 1 || n > 10) FAIL(ps, "odd rank string");
        int64_t v = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (s[i] < '0' || s[i] > '9') FAIL(ps, "odd rank string");
            v = v * 10 + (s[i] - '0');
        }
        o->v = v;
        o->set = 1;
    } else if (parse_int(ps, o, 0) < 0) {
        return -1;
    }
    if (o->set && (o->v < 0 || o->v > INT32_MAX)) FAIL(ps, "rank beyond int32");
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

/* Object iteration shared by events and args. At '{': 1 if the object is empty (consumed), 0 if
 * a key follows, -1 on error. */
static int obj_begin(Parser *ps, const char *what) {
    if (ps->p >= ps->end || *ps->p != '{') FAIL(ps, what);
    ps->p++;
    ws(ps);
    if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 1; }
    return 0;
}

/* A key (escaped keys are left to the reference decoder) and its ':'. */
static int obj_key(Parser *ps, const u8 **k, Py_ssize_t *kn) {
    int esc;
    ws(ps);
    if (ps->p >= ps->end || *ps->p != '"') FAIL(ps, "expected key");
    if (scan_string(ps, k, kn, &esc) < 0) return -1;
    if (esc) FAIL(ps, "escaped key");
    ws(ps);
    if (ps->p >= ps->end || *ps->p != ':') FAIL(ps, "expected ':'");
    ps->p++;
    return 0;
}

/* After a value: 1 if another key follows, 0 at the object's end, -1 on error. */
static int obj_more(Parser *ps) {
    ws(ps);
    if (ps->p < ps->end && *ps->p == ',') { ps->p++; return 1; }
    if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
    FAIL(ps, "expected ',' or '}'");
}

/* An object's members, each key handed to `member` (which parses its value): 0, or -1 on
 * error. Static callees with a constant `member`: the compiler inlines them. */
typedef int (*Member)(Parser *ps, Ev *ev, const u8 *k, Py_ssize_t kn);

static int parse_object(Parser *ps, Ev *ev, const char *what, Member member) {
    int more = obj_begin(ps, what);
    if (more) return more < 0 ? -1 : 0;
    do {
        const u8 *k;
        Py_ssize_t kn;
        if (obj_key(ps, &k, &kn) < 0 || member(ps, ev, k, kn) < 0) return -1;
    } while ((more = obj_more(ps)) == 1);
    return more;
}

static int args_member(Parser *ps, Ev *ev, const u8 *k, Py_ssize_t kn) {
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
    else if (key_is(k, kn, "Dst Rank")) r = parse_rank(ps, &ev->dst);
    else if (key_is(k, kn, "Src Rank")) r = parse_rank(ps, &ev->src);
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
    return r;
}

static int parse_args(Parser *ps, Ev *ev) {
    ws(ps);
    if (ps->p < ps->end && *ps->p == 'n') return expect_lit(ps, "null", 4);
    return parse_object(ps, ev, "args is not an object", args_member);
}

/* The fields `args` sets, as absent. */
static inline void args_clear(Ev *ev) {
    for (int i = 0; i < N_INT; i++) ev->ints[i].set = 0;
    for (int i = 0; i < N_SPAN; i++) ev->spans[i].set = 0;
    ev->dst.set = ev->src.set = 0;
    ev->grid_set = ev->block_set = 0;
}

static int event_member(Parser *ps, Ev *ev, const u8 *k, Py_ssize_t kn) {
    int r;
    if (key_is(k, kn, "ph")) r = parse_str(ps, &ev->ph, 0);
    else if (key_is(k, kn, "cat")) r = parse_str(ps, &ev->cat, 1);
    else if (key_is(k, kn, "name")) r = parse_str(ps, &ev->name, 0);
    else if (key_is(k, kn, "pid")) r = parse_id(ps, &ev->pid_k, &ev->pid, &ev->pid_s);
    else if (key_is(k, kn, "tid")) r = parse_id(ps, &ev->tid_k, &ev->tid, &ev->tid_s);
    else if (key_is(k, kn, "ts")) r = parse_float(ps, &ev->ts_set, &ev->ts);
    else if (key_is(k, kn, "dur")) r = parse_float(ps, &ev->dur_set, &ev->dur);
    else if (key_is(k, kn, "args")) {
        /* a repeated `args` replaces the earlier one, as in the reference decoder */
        args_clear(ev);
        r = parse_args(ps, ev);
    } else r = skip_value(ps, 1);
    return r;
}

static int parse_event(Parser *ps, Ev *ev) {
    /* only what says a field is present: every value is read behind its flag (a memset of the
     * whole 776-byte Ev per event was ~3% of the scan) */
    static const Span none = {0};
    ev->ph = ev->cat = ev->name = none; /* commit() reads ph's and a metadata name's esc */
    ev->pid_k = ev->tid_k = 0;
    ev->ts_set = ev->dur_set = 0;
    args_clear(ev);
    return parse_object(ps, ev, "event is not an object", event_member);
}

#endif
