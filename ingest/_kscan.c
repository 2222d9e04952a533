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

#include "_kscan_json.h"
#include "_kscan_dict.h"
#include "_kscan_events.h"

/* ------------------------------------------------------------------ rows */

static int to_ns(Parser *ps, double x, int64_t *out) {
    /* as kineto_events._us_to_ns: exact integer-µs part plus the rounded sub-µs part; beyond
     * its US_LIMIT (2^62 ns) the reference decoder names the event as out of range */
    double w = floor(x);
    if (!(fabs(w) < 4611686018427387.0)) FAIL(ps, "timestamp out of range");
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
    ev->ints[I_PEER] = ev->dst.set ? ev->dst : ev->src; /* as kineto_events._peers */
    for (int i = 0; i < N_INT; i++)
        if (int_push(&sc->ints[i], ev->ints[i].set, ev->ints[i].set ? ev->ints[i].v : 0) < 0)
            return -1;
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
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) buf_free(bufs[i]);
    for (int i = 0; i < N_INT; i++) { buf_free(&sc->ints[i].v); buf_free(&sc->ints[i].ok); }
    for (int i = 0; i < N_STR; i++) {
        buf_free(&sc->strs[i].off); buf_free(&sc->strs[i].data); buf_free(&sc->strs[i].ok);
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

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_kscan",
    .m_doc = "Kineto event scanner (see kineto_fast.py).",
    .m_size = -1,
    .m_methods = METHODS,
};

PyMODINIT_FUNC PyInit__kscan(void) { return PyModule_Create(&MODULE); }

