/* pydory._cproducer: a librdkafka producer driven from C (issue 25, lever 3).
 *
 * Rule: a message handed to librdkafka from here carries a msg_state of its own, freed
 * (or kept on the producer's free list for a next message) here alone, when its delivery
 * report is served (poll) -- never before, never twice.
 *
 * Why: confluent-kafka's Producer builds, per message, a callback state holding a Python
 * callable, and per delivery report a Message object and a Python call; on the daemon's
 * stream path that was ~45 % of its CPU. Here a message's state is a small C struct, and
 * the delivery reports come through librdkafka's event API a batch at a time: the
 * acknowledged ones are summed per (token, topic) in C and handed to Python as a few
 * tuples per poll; failures (rare) come back one tuple each, with everything a resend
 * needs (their headers read back from the report).
 *
 * One copy of librdkafka in the process: this module is not linked against librdkafka.
 * bind(path) resolves the functions it uses (dlsym) from the library confluent-kafka
 * already loaded (pydory/daemon/delivery/compiled_producer.py finds its path); the
 * declarations come from librdkafka's header (Debian's librdkafka-dev), whose ABI the
 * newer library keeps. Untrusted bytes never reach this file: it copies what the intake
 * already judged, and reads back what librdkafka reports.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "_cburst.h"

/* ---- the librdkafka functions used, resolved by bind() ---------------------------- */

#define RDK_FUNCTIONS(X)                                                                   \
    X(rd_kafka_version)                                                                    \
    X(rd_kafka_version_str)                                                                \
    X(rd_kafka_conf_new)                                                                   \
    X(rd_kafka_conf_set)                                                                   \
    X(rd_kafka_conf_destroy)                                                               \
    X(rd_kafka_conf_set_events)                                                            \
    X(rd_kafka_new)                                                                        \
    X(rd_kafka_destroy)                                                                    \
    X(rd_kafka_name)                                                                       \
    X(rd_kafka_producev)                                                                   \
    X(rd_kafka_queue_get_main)                                                             \
    X(rd_kafka_queue_destroy)                                                              \
    X(rd_kafka_queue_poll)                                                                 \
    X(rd_kafka_set_log_queue)                                                              \
    X(rd_kafka_event_type)                                                                 \
    X(rd_kafka_event_destroy)                                                              \
    X(rd_kafka_event_message_count)                                                        \
    X(rd_kafka_event_message_array)                                                        \
    X(rd_kafka_event_stats)                                                                \
    X(rd_kafka_event_error)                                                                \
    X(rd_kafka_event_error_string)                                                         \
    X(rd_kafka_event_error_is_fatal)                                                       \
    X(rd_kafka_event_log)                                                                  \
    X(rd_kafka_outq_len)                                                                   \
    X(rd_kafka_purge)                                                                      \
    X(rd_kafka_fatal_error)                                                                \
    X(rd_kafka_topic_name)                                                                 \
    X(rd_kafka_topic_new)                                                                  \
    X(rd_kafka_topic_destroy)                                                              \
    X(rd_kafka_headers_new)                                                                \
    X(rd_kafka_headers_destroy)                                                            \
    X(rd_kafka_header_add)                                                                 \
    X(rd_kafka_header_get_all)                                                             \
    X(rd_kafka_message_headers)                                                            \
    X(rd_kafka_message_status)

#define DECLARE_POINTER(name) static __typeof__(name) *p_##name = NULL;
RDK_FUNCTIONS(DECLARE_POINTER)
#undef DECLARE_POINTER

static void *library = NULL;
static char library_path[4096];

/* The librdkafka the extension module at ``module_path`` (confluent-kafka's cimpl)
 * actually loaded: dlsym on that module's handle searches its own dependencies, so the
 * symbol found is in the copy it links, and dladdr names that copy. RTLD_NOLOAD only:
 * nothing is ever mapped here, so the process never holds a second librdkafka. Returns
 * that library's handle (the caller closes it), its rd_kafka_version() in *version and
 * its path in *info; NULL with an ImportError set if there is none. */
static void *
find_library(const char *module_path, int *version, Dl_info *info)
{
    void *owner = dlopen(module_path, RTLD_NOW | RTLD_NOLOAD);
    if (owner == NULL) {
        PyErr_Format(PyExc_ImportError, "%s is not loaded: %s", module_path, dlerror());
        return NULL;
    }
    void *symbol = dlsym(owner, "rd_kafka_version");
    void *handle = NULL;
    if (symbol != NULL && dladdr(symbol, info) != 0 && info->dli_fname != NULL)
        handle = dlopen(info->dli_fname, RTLD_NOW | RTLD_NOLOAD);
    dlclose(owner);
    if (handle == NULL) {
        PyErr_Format(PyExc_ImportError, "%s links no loaded librdkafka", module_path);
        return NULL;
    }
    *version = ((int (*)(void))symbol)();
    return handle;
}

/* library_version(module_path) -> (version, library_path): the rd_kafka_version() and
 * path of the librdkafka that module loaded, binding nothing: the start decides from it
 * (compiled_producer.check_librdkafka) before bind(). */
static PyObject *
library_version(PyObject *Py_UNUSED(module), PyObject *arg)
{
    const char *module_path = PyUnicode_AsUTF8(arg);
    if (module_path == NULL)
        return NULL;
    int version;
    Dl_info info;
    void *handle = find_library(module_path, &version, &info);
    if (handle == NULL)
        return NULL;
    PyObject *result = Py_BuildValue("(is)", version, info.dli_fname);
    dlclose(handle);
    return result;
}

/* bind(module_path) -> (version, library_path): resolve the functions this module uses
 * from the librdkafka find_library names. The library must be at least the version of
 * the header this file was compiled against (HEADER_VERSION; its ABI only grows): the
 * start checks that first, in Python, with the words a user needs
 * (compiled_producer.check_librdkafka); this guard keeps the module itself from binding
 * an older one when called otherwise. */
static PyObject *
bind_library(PyObject *Py_UNUSED(module), PyObject *arg)
{
    const char *module_path = PyUnicode_AsUTF8(arg);
    if (module_path == NULL)
        return NULL;
    if (library != NULL)
        return Py_BuildValue("(ss)", p_rd_kafka_version_str(), library_path);
    int version;
    Dl_info info;
    void *handle = find_library(module_path, &version, &info);
    if (handle == NULL)
        return NULL;
    if (version < RD_KAFKA_VERSION) {
        PyErr_Format(PyExc_ImportError,
                     "librdkafka %s (0x%08x) is older than the header pydory._cproducer "
                     "was built against (0x%08x)",
                     info.dli_fname, version, RD_KAFKA_VERSION);
        dlclose(handle);
        return NULL;
    }
#define RESOLVE(name)                                                                      \
    p_##name = (__typeof__(name) *)dlsym(handle, #name);                                   \
    if (p_##name == NULL) {                                                                \
        PyErr_Format(PyExc_ImportError, "librdkafka %s has no %s", info.dli_fname, #name); \
        dlclose(handle);                                                                   \
        return NULL;                                                                       \
    }
    RDK_FUNCTIONS(RESOLVE)
#undef RESOLVE
    snprintf(library_path, sizeof library_path, "%s", info.dli_fname);
    library = handle;
    return Py_BuildValue("(ss)", p_rd_kafka_version_str(), library_path);
}

/* ---- the records a poll hands back: named, built here once per type --------------- */

static PyStructSequence_Field ack_sum_fields[] = {
    {"token", "the caller's token"},
    {"topic", NULL},
    {"messages", "how many were acknowledged"},
    {"data_bytes", "their keys' and values' bytes"},
    {NULL, NULL},
};
static PyStructSequence_Field ack_fields[] = {
    {"topic", NULL},         {"partition", NULL}, {"key", NULL}, {"value", NULL},
    {"timestamp_ms", NULL},  {"token", NULL},     {NULL, NULL},
};
static PyStructSequence_Field failure_fields[] = {
    {"code", "librdkafka's error code"},
    {"topic", NULL},
    {"partition", NULL},
    {"key", NULL},
    {"value", NULL},
    {"timestamp_ms", "the client's timestamp it was sent with"},
    {"headers", "its record headers, read back from the report"},
    {"token", NULL},
    {"partition_key", "its PartitionKey, or None for AnyPartition"},
    {"attempt", "how many times it was sent"},
    {"maybe_in_kafka", "an earlier attempt may have reached the log"},
    {"status", "rd_kafka_message_status(): 0 not, 1 possibly, 2 persisted"},
    {NULL, NULL},
};
static PyStructSequence_Field statistics_fields[] = {{"json", NULL}, {NULL, NULL}};
static PyStructSequence_Field error_fields[] = {
    {"code", NULL}, {"text", NULL}, {"fatal", NULL}, {NULL, NULL}};
static PyStructSequence_Field log_fields[] = {
    {"level", "syslog level"}, {"facility", NULL}, {"name", NULL}, {"text", NULL}, {NULL, NULL}};
static PyStructSequence_Field polled_fields[] = {
    {"ack_sums", "[AckSum]: acknowledgements summed per (token, topic)"},
    {"acks", "[Ack] one by one, or None (summed)"},
    {"failures", "[Failure]"},
    {"events", "[Statistics | Error | Log], in the order librdkafka queued them"},
    {"stopped_by", "the exception type that stopped this poll (the rest stays held), or None"},
    {NULL, NULL},
};

#define RECORD_TYPE(var, type_name, fields)                                                 \
    static PyTypeObject var;                                                                \
    static PyStructSequence_Desc var##_desc = {"pydory._cproducer." type_name, NULL,       \
                                               fields, sizeof fields / sizeof *fields - 1};
RECORD_TYPE(AckSumType, "AckSum", ack_sum_fields)
RECORD_TYPE(AckType, "Ack", ack_fields)
RECORD_TYPE(FailureType, "Failure", failure_fields)
RECORD_TYPE(StatisticsType, "Statistics", statistics_fields)
RECORD_TYPE(ErrorType, "Error", error_fields)
RECORD_TYPE(LogType, "Log", log_fields)
RECORD_TYPE(PolledType, "Polled", polled_fields)
#undef RECORD_TYPE

/* A record of ``type`` from Py_BuildValue's ``format`` (a tuple: "(...)"), or NULL. */
static PyObject *
record(PyTypeObject *type, const char *format, ...)
{
    va_list va;
    va_start(va, format);
    PyObject *values = Py_VaBuildValue(format, va);
    va_end(va);
    if (values == NULL)
        return NULL;
    PyObject *item = PyStructSequence_New(type);
    if (item != NULL)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); i++)
            PyStructSequence_SET_ITEM(item, i, Py_NewRef(PyTuple_GET_ITEM(values, i)));
    Py_DECREF(values);
    return item;
}

/* librdkafka's text (log lines, error strings, statistics, names): it may carry any bytes
 * a broker sent, so decoded with replacement, never refused. */
static PyObject *
text_of(const char *text)
{
    if (text == NULL)
        text = "";
    return PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
}

/* ---- faults for the tests: inert unless armed (_inject_faults) -------------------- */

static long fail_report_countdown = 0; /* the n-th report converted from now fails */
static long garble_texts = 0; /* the next n log lines and error strings carry bytes not UTF-8 */

/* ``text``, or (armed) the same prefixed with bytes that are not UTF-8, in ``buffer``. */
static const char *
maybe_garbled(const char *text, char *buffer, size_t size)
{
    if (garble_texts <= 0 || text == NULL)
        return text;
    garble_texts--;
    snprintf(buffer, size, "\xff\xfe %s", text);
    return buffer;
}

static int
report_fault(void)
{
    if (fail_report_countdown > 0 && --fail_report_countdown == 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *
inject_faults(PyObject *Py_UNUSED(module), PyObject *args)
{
    if (!PyArg_ParseTuple(args, "ll", &fail_report_countdown, &garble_texts))
        return NULL;
    Py_RETURN_NONE;
}

/* ---- one message's state: what its delivery report must give back ----------------- */

typedef struct msg_state {
    struct msg_state *next_free; /* in the producer's free states (see state_new) */
    long long token;        /* the caller's opaque int (the commit point's epoch) */
    long long timestamp_ms; /* the client's timestamp it was sent with */
    long long partition_key;
    int attempt;
    unsigned char has_partition_key; /* PartitionKey; else AnyPartition */
    unsigned char maybe_in_kafka;    /* an earlier attempt may have reached the log */
} msg_state;

/* ---- the Producer type ---------------------------------------------------------- */

/* Acknowledged messages of one (token, topic), summed until a poll hands them over. */
#define TOPIC_NAME_MAX 256 /* Kafka's longest topic name is 249 bytes */
typedef struct {
    long long token;
    long long count;
    long long data_bytes; /* keys and values */
    char topic[TOPIC_NAME_MAX];
} ack_sum;

/* One event taken off the main queue, held until it is served; a delivery report event's
 * messages are taken out once (librdkafka's iterator walks an event only once; the
 * messages live until the event is destroyed). */
typedef struct {
    rd_kafka_event_t *event;
    const rd_kafka_message_t **messages; /* NULL: not taken out yet, or not a report */
    size_t count;
    size_t reported; /* messages[:reported] are reported and their states freed */
} held_event;

#define MAX_SUMS 32
#define MAX_EVENTS_PER_POLL 256
/* At most this many states kept for reuse (64 KiB); more are given back to malloc. */
#define MAX_FREE_STATES 1024
/* Topic handles held per producer; a producer sending to more topics sends the others by
 * name (librdkafka's lookup), as before. */
#define MAX_TOPIC_HANDLES 16

typedef struct {
    PyObject *name; /* the str it was first asked for (held: compared by identity) */
    rd_kafka_topic_t *rkt;
} topic_handle;

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue; /* the main queue: delivery reports, stats, errors, logs */
    /* A poll is running (maybe waiting without the GIL): close() and a second poll are
     * refused until it returns. */
    int polling;
    /* Events taken off the queue and not yet served: held[first:n_held]. A poll that
     * stops (a report it could not convert) leaves the rest here for the next one, as
     * if still queued. */
    held_event held[MAX_EVENTS_PER_POLL];
    int first, n_held;
    /* Acknowledgements summed, not yet handed over. */
    ack_sum sums[MAX_SUMS];
    int n_sums;
    /* The topic handle of the last acknowledgement summed and its sum's index, valid only
     * while one report event is served (its handles live as long as it does; a pointer
     * from an earlier event may name another topic since): the messages of an event share
     * one topic, so all but its first skip the name lookup and comparison (issue 30). */
    const rd_kafka_topic_t *last_rkt;
    int last_sum;
    /* States of messages reported, kept for the next messages (a free list: no malloc
     * and free per message; touched with the GIL held only). */
    msg_state *free_states;
    int n_free_states;
    /* librdkafka's topic handles of the topics sent to, held until close: producev by
     * handle, not by name (a lookup under librdkafka's write lock per message). */
    topic_handle topics[MAX_TOPIC_HANDLES];
    int n_topics;
} Producer;

/* A message's state: a free one of the producer's, or a new one (NULL: out of memory). */
static msg_state *
state_new(Producer *self)
{
    msg_state *state = self->free_states;
    if (state == NULL)
        return malloc(sizeof *state);
    self->free_states = state->next_free;
    self->n_free_states--;
    return state;
}

/* A message's state is done with (its report served, or the message refused). */
static void
state_free(Producer *self, msg_state *state)
{
    if (state == NULL)
        return;
    if (self->n_free_states >= MAX_FREE_STATES) {
        free(state);
        return;
    }
    state->next_free = self->free_states;
    self->free_states = state;
    self->n_free_states++;
}

/* The handle of ``topic`` (``text``, its name), held from its first message to close(), or
 * NULL: send by name (every handle slot is taken, or librdkafka refused the name: the
 * produce by name then says why). */
static rd_kafka_topic_t *
topic_handle_of(Producer *self, PyObject *topic, const char *text)
{
    for (int i = 0; i < self->n_topics; i++)
        if (self->topics[i].name == topic)
            return self->topics[i].rkt;
    for (int i = 0; i < self->n_topics; i++) /* the same name in another str object */
        if (strcmp(p_rd_kafka_topic_name(self->topics[i].rkt), text) == 0)
            return self->topics[i].rkt;
    if (self->n_topics == MAX_TOPIC_HANDLES || self->rk == NULL)
        return NULL;
    rd_kafka_topic_t *rkt = p_rd_kafka_topic_new(self->rk, text, NULL);
    if (rkt == NULL)
        return NULL;
    self->topics[self->n_topics].name = Py_NewRef(topic);
    self->topics[self->n_topics].rkt = rkt;
    self->n_topics++;
    return rkt;
}

static int
Producer_init(Producer *self, PyObject *args, PyObject *kwargs)
{
    PyObject *properties;
    static char *keywords[] = {"properties", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!", keywords, &PyDict_Type, &properties))
        return -1;
    if (library == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pydory._cproducer.bind() was not called");
        return -1;
    }
    if (self->rk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Producer already initialised");
        return -1;
    }
    char errstr[512];
    rd_kafka_conf_t *conf = p_rd_kafka_conf_new();
    PyObject *name, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(properties, &position, &name, &value)) {
        const char *name_text = PyUnicode_AsUTF8(name);
        const char *value_text = name_text ? PyUnicode_AsUTF8(value) : NULL;
        if (value_text == NULL) {
            p_rd_kafka_conf_destroy(conf);
            return -1; /* not str: the caller converts every value first */
        }
        if (p_rd_kafka_conf_set(conf, name_text, value_text, errstr, sizeof errstr) !=
            RD_KAFKA_CONF_OK) {
            p_rd_kafka_conf_destroy(conf);
            PyErr_SetString(PyExc_ValueError, errstr);
            return -1;
        }
    }
    if (p_rd_kafka_conf_set(conf, "log.queue", "true", errstr, sizeof errstr) !=
        RD_KAFKA_CONF_OK) {
        p_rd_kafka_conf_destroy(conf);
        PyErr_SetString(PyExc_ValueError, errstr);
        return -1;
    }
    p_rd_kafka_conf_set_events(conf, RD_KAFKA_EVENT_DR | RD_KAFKA_EVENT_STATS |
                                         RD_KAFKA_EVENT_ERROR | RD_KAFKA_EVENT_LOG);
    rd_kafka_t *rk;
    Py_BEGIN_ALLOW_THREADS
    rk = p_rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    Py_END_ALLOW_THREADS
    if (rk == NULL) { /* rd_kafka_new destroys conf only when it succeeds */
        p_rd_kafka_conf_destroy(conf);
        PyErr_SetString(PyExc_ValueError, errstr);
        return -1;
    }
    self->rk = rk;
    self->queue = p_rd_kafka_queue_get_main(rk);
    p_rd_kafka_set_log_queue(rk, NULL); /* NULL: the main queue */
    return 0;
}

static void release_event(Producer *self, held_event *held);

static void
Producer_close0(Producer *self)
{
    /* Events still held: their unreported messages' states go with them (the instance
     * goes too: nothing can report them any more). */
    for (; self->first < self->n_held; self->first++)
        release_event(self, &self->held[self->first]);
    self->first = self->n_held = self->n_sums = 0;
    self->last_rkt = NULL;
    while (self->free_states != NULL) {
        msg_state *state = self->free_states;
        self->free_states = state->next_free;
        free(state);
    }
    self->n_free_states = 0;
    for (; self->n_topics > 0; self->n_topics--) { /* before the instance, as librdkafka asks */
        topic_handle *handle = &self->topics[self->n_topics - 1];
        p_rd_kafka_topic_destroy(handle->rkt);
        Py_CLEAR(handle->name);
    }
    rd_kafka_t *rk = self->rk;
    rd_kafka_queue_t *queue = self->queue;
    self->rk = NULL;
    self->queue = NULL;
    if (rk == NULL)
        return;
    Py_BEGIN_ALLOW_THREADS
    p_rd_kafka_queue_destroy(queue);
    p_rd_kafka_destroy(rk);
    Py_END_ALLOW_THREADS
}

static void
Producer_dealloc(Producer *self)
{
    Producer_close0(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
require_open(Producer *self)
{
    if (self->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the producer is closed");
        return -1;
    }
    return 0;
}

/* The headers of a message: a list of (name, bytes | str | None), as confluent-kafka
 * takes them. NULL with an exception set if one is not that. */
static rd_kafka_headers_t *
headers_from(PyObject *list)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    rd_kafka_headers_t *headers = p_rd_kafka_headers_new((size_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "a header is a (name, value) tuple");
            goto fail;
        }
        Py_ssize_t name_size, value_size = 0;
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(item, 0), &name_size);
        if (name == NULL)
            goto fail;
        PyObject *value = PyTuple_GET_ITEM(item, 1);
        const char *data = NULL;
        if (PyBytes_Check(value)) {
            data = PyBytes_AS_STRING(value);
            value_size = PyBytes_GET_SIZE(value);
        } else if (PyUnicode_Check(value)) {
            data = PyUnicode_AsUTF8AndSize(value, &value_size);
            if (data == NULL)
                goto fail;
        } else if (value != Py_None) {
            PyErr_SetString(PyExc_TypeError, "a header's value is bytes, str or None");
            goto fail;
        }
        p_rd_kafka_header_add(headers, name, name_size, data, value_size);
    }
    return headers;
fail:
    p_rd_kafka_headers_destroy(headers);
    return NULL;
}

/* PyLong_AsLongLong without its slow path: Python 3.11's converts an int of more than one
 * 30-bit digit (every timestamp in ms) through _PyLong_AsByteArray, ~1 % of the daemon's
 * samples (perf). The same value, or -1 with OverflowError set. */
static long long
as_long_long(PyObject *number)
{
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "int too big to convert");
        return -1;
    }
    return value;
}

static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* A burst's fresh identities (daemon/spool/identity.py's IdentityRun.compiled, ``(name,
 * prefix, first)``): message ``index`` of the burst has the one header ``name: prefix +
 * decimal(first + index)``, formatted here, with no Python object per message. */
#define IDENTITY_PREFIX_MAX 200
typedef struct {
    const char *name;
    Py_ssize_t name_size;
    char value[IDENTITY_PREFIX_MAX + 24];
    Py_ssize_t prefix_size;
    long long first;
} identity_run;

static int
identity_run_from(PyObject *tuple, identity_run *run)
{
    if (PyTuple_GET_SIZE(tuple) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(tuple, 1)) ||
        PyBytes_GET_SIZE(PyTuple_GET_ITEM(tuple, 1)) > IDENTITY_PREFIX_MAX) {
        PyErr_SetString(PyExc_TypeError, "an identity run is (name, prefix: bytes, first)");
        return -1;
    }
    run->name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(tuple, 0), &run->name_size);
    run->first = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, 2));
    if (run->name == NULL || (run->first == -1 && PyErr_Occurred()))
        return -1;
    if (run->first < 0) {
        PyErr_SetString(PyExc_ValueError, "an identity run starts at a sequence >= 0");
        return -1;
    }
    run->prefix_size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(tuple, 1));
    memcpy(run->value, PyBytes_AS_STRING(PyTuple_GET_ITEM(tuple, 1)), (size_t)run->prefix_size);
    return 0;
}

static rd_kafka_headers_t *
identity_header(identity_run *run, Py_ssize_t index)
{
    char digits[24];
    int n = 0;
    unsigned long long sequence = (unsigned long long)run->first + (unsigned long long)index;
    do {
        digits[n++] = (char)('0' + sequence % 10);
        sequence /= 10;
    } while (sequence);
    char *at = run->value + run->prefix_size;
    for (int i = 0; i < n; i++)
        at[i] = digits[n - 1 - i];
    rd_kafka_headers_t *headers = p_rd_kafka_headers_new(1);
    p_rd_kafka_header_add(headers, run->name, run->name_size, run->value, run->prefix_size + n);
    return headers;
}

/* One message to librdkafka, copied, to ``rkt`` (a handle of topic_handle_of's) or, if
 * NULL, to ``topic`` by name; its state kept as the message's opaque; ``headers``
 * (or NULL) handed over. 0, or librdkafka's error code (then it holds nothing: neither
 * the state nor the headers, which are destroyed). -1 with a Python exception set. */
static long
produce_one(Producer *self, rd_kafka_topic_t *rkt, const char *topic, int32_t partition,
            const char *value_data,
            size_t value_size, const char *key_data, size_t key_size, long long timestamp_ms,
            rd_kafka_headers_t *headers, long long token, PyObject *partition_key, int attempt,
            int maybe_in_kafka)
{
    if (self->rk == NULL) { /* closed: refused like any message librdkafka cannot take */
        if (headers != NULL)
            p_rd_kafka_headers_destroy(headers);
        return (long)RD_KAFKA_RESP_ERR__DESTROY;
    }
    long long key_number = 0;
    if (partition_key != Py_None) {
        key_number = PyLong_AsLongLong(partition_key);
        if (key_number == -1 && PyErr_Occurred()) {
            if (headers != NULL)
                p_rd_kafka_headers_destroy(headers);
            return -1;
        }
    }
    msg_state *state = state_new(self);
    if (state == NULL) {
        if (headers != NULL)
            p_rd_kafka_headers_destroy(headers);
        PyErr_NoMemory();
        return -1;
    }
    state->token = token;
    state->timestamp_ms = timestamp_ms;
    state->partition_key = key_number;
    state->has_partition_key = partition_key != Py_None;
    state->attempt = attempt;
    state->maybe_in_kafka = (unsigned char)maybe_in_kafka;
    /* Copied (F_COPY), never written: librdkafka's signature only lacks the const. */
    void *value = (void *)(uintptr_t)value_data;
    const void *key = key_data;
    rd_kafka_resp_err_t err;
#define FIELDS                                                                             \
    RD_KAFKA_V_PARTITION(partition), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),             \
        RD_KAFKA_V_VALUE(value, value_size), RD_KAFKA_V_KEY(key, key_size),                \
        RD_KAFKA_V_TIMESTAMP(timestamp_ms), RD_KAFKA_V_OPAQUE(state)
#define PRODUCE(TOPIC)                                                                     \
    (headers == NULL ? p_rd_kafka_producev(self->rk, TOPIC, FIELDS, RD_KAFKA_V_END)          \
                     : p_rd_kafka_producev(self->rk, TOPIC, FIELDS, RD_KAFKA_V_HEADERS(headers), \
                                           RD_KAFKA_V_END))
    err = rkt != NULL ? PRODUCE(RD_KAFKA_V_RKT(rkt)) : PRODUCE(RD_KAFKA_V_TOPIC(topic));
#undef PRODUCE
#undef FIELDS
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        state_free(self, state);
        if (headers != NULL)
            p_rd_kafka_headers_destroy(headers);
    }
    return (long)err;
}

/* produce(topic, partition, value, key, timestamp_ms, partition_key, attempt, token,
 *         maybe_in_kafka, headers) -> 0, or librdkafka's error code (the message was
 * refused and is not held: the caller decides what that means). Dispatcher.send's
 * fields, in its order. */
static PyObject *
Producer_produce(Producer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "produce() takes 10 arguments");
        return NULL;
    }
    const char *topic = PyUnicode_AsUTF8(args[0]);
    if (topic == NULL)
        return NULL;
    long partition = PyLong_AsLong(args[1]);
    if (partition == -1 && PyErr_Occurred())
        return NULL;
    if (!PyBytes_Check(args[2]) || !(args[3] == Py_None || PyBytes_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError, "value is bytes, key bytes or None");
        return NULL;
    }
    long long timestamp_ms = as_long_long(args[4]);
    PyObject *partition_key = args[5];
    long attempt = PyLong_AsLong(args[6]);
    long long token = PyLong_AsLongLong(args[7]);
    int maybe_in_kafka = PyObject_IsTrue(args[8]);
    if (PyErr_Occurred())
        return NULL;
    rd_kafka_headers_t *headers = NULL;
    if (args[9] != Py_None) {
        if (!PyList_Check(args[9])) {
            PyErr_SetString(PyExc_TypeError, "headers is a list or None");
            return NULL;
        }
        if ((headers = headers_from(args[9])) == NULL)
            return NULL;
    }
    PyObject *key = args[3];
    long err = produce_one(self, topic_handle_of(self, args[0], topic), topic,
                           (int32_t)partition, PyBytes_AS_STRING(args[2]),
                           (size_t)PyBytes_GET_SIZE(args[2]),
                           key == Py_None ? NULL : PyBytes_AS_STRING(key),
                           key == Py_None ? 0 : (size_t)PyBytes_GET_SIZE(key), timestamp_ms,
                           headers, token, partition_key, (int)attempt, maybe_in_kafka);
    return err == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(err);
}

/* pydory._cwire's ParsedBurst (_cburst.h), found through its capsule at import; NULL if
 * that module is not built: then a parsed burst is a list only. */
static const parsed_burst_api *parsed_burst = NULL;

static void
find_parsed_burst(void)
{
    /* PyCapsule_Import imports the package only, then reads attributes: the module first. */
    PyObject *cwire = PyImport_ImportModule("pydory._cwire");
    const parsed_burst_api *api = NULL;
    if (cwire != NULL)
        api = PyCapsule_Import(PARSED_BURST_CAPSULE, 0);
    Py_XDECREF(cwire);
    if (api == NULL) {
        PyErr_Clear(); /* not built here: lists only */
        return;
    }
    /* Built from another _cburst.h than this file: not trusted. */
    if (api->object_size == sizeof(ParsedBurstObject) && api->entry_size == sizeof(burst_entry))
        parsed_burst = api;
}

static int
is_parsed_burst(PyObject *parsed)
{
    return parsed_burst != NULL && Py_TYPE(parsed) == parsed_burst->type;
}

/* A parsed burst (a ParsedBurst, or parse_any_partition_burst's list): its length, or -1
 * with a TypeError if it is neither. */
static Py_ssize_t
parsed_length(PyObject *parsed)
{
    if (is_parsed_burst(parsed))
        return ((ParsedBurstObject *)parsed)->length;
    if (PyList_Check(parsed))
        return PyList_GET_SIZE(parsed);
    PyErr_SetString(PyExc_TypeError, "a parsed burst is a ParsedBurst or a list");
    return -1;
}

/* Message ``i`` of a parsed burst, into ``fields``, if it is a well-formed AnyPartition
 * message of ``topic`` (any topic if NULL) whose key and value fit ``max_data``: 1; 0 if
 * not; -1 with an exception (a list's timestamp not an int64). The pointers are into the
 * burst's frames (a ParsedBurst) or its bytes (a list: (topic, key, value, timestamp_ms)
 * tuples, or None), valid while the caller holds ``parsed`` and calls no Python. */
static int
short_path_fields(PyObject *parsed, Py_ssize_t i, PyObject *topic, long long max_data,
                  burst_entry *fields)
{
    if (is_parsed_burst(parsed)) {
        const burst_entry *entry = &((ParsedBurstObject *)parsed)->entries[i];
        if (entry->topic == NULL ||
            (topic != NULL && entry->topic != topic &&
             PyUnicode_Compare(entry->topic, topic) != 0) ||
            entry->key_size + entry->value_size > max_data)
            return 0;
        *fields = *entry;
        return 1;
    }
    PyObject *item = PyList_GET_ITEM(parsed, i);
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4)
        return 0;
    PyObject *its_topic = PyTuple_GET_ITEM(item, 0);
    if (topic != NULL && its_topic != topic &&
        !(PyUnicode_Check(its_topic) && PyUnicode_Compare(its_topic, topic) == 0))
        return 0;
    PyObject *key = PyTuple_GET_ITEM(item, 1), *value = PyTuple_GET_ITEM(item, 2);
    if (!PyBytes_Check(key) || !PyBytes_Check(value))
        return 0;
    if (PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(value) > max_data)
        return 0;
    fields->timestamp_ms = as_long_long(PyTuple_GET_ITEM(item, 3));
    if (fields->timestamp_ms == -1 && PyErr_Occurred())
        return -1;
    fields->topic = its_topic;
    fields->key = PyBytes_AS_STRING(key);
    fields->key_size = PyBytes_GET_SIZE(key);
    fields->value = PyBytes_AS_STRING(value);
    fields->value_size = PyBytes_GET_SIZE(value);
    return 1;
}

/* produce_burst(parsed, headers, topic, max_data, runs, token) -> [(index, code)]: every
 * message of ``parsed`` (a ParsedBurst, read in place, or parse_any_partition_burst's
 * list) of ``topic`` whose key and
 * value fit ``max_data``, in order, to the partitions ``runs`` names ([(partition,
 * count)], the router's AnyPartition runs, exactly as many as there are such messages),
 * each with its headers (``headers[index]``; an identity run's, see identity_run, if
 * headers is the tuple ``(name, prefix, first)``; none if headers is None), under
 * ``token``: a first attempt of an AnyPartition message, as produce() would send it (an
 * empty key as none, a timestamp <= 0 as "now"). The ones librdkafka refused, with its
 * error codes. */
static PyObject *
Producer_produce_burst(Producer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "produce_burst() takes 6 arguments");
        return NULL;
    }
    PyObject *parsed = args[0], *headers = args[1], *topic = args[2], *runs = args[4];
    Py_ssize_t n = parsed_length(parsed);
    if (n < 0)
        return NULL;
    if (!(headers == Py_None || PyList_Check(headers) || PyTuple_Check(headers)) ||
        !PyList_Check(runs) || !PyUnicode_Check(topic)) {
        PyErr_SetString(PyExc_TypeError, "produce_burst(ParsedBurst | list, list | tuple | "
                                         "None, str, int, list, int)");
        return NULL;
    }
    if (PyList_Check(headers) && PyList_GET_SIZE(headers) < n) {
        PyErr_SetString(PyExc_ValueError, "fewer headers than messages");
        return NULL;
    }
    identity_run identities;
    if (PyTuple_Check(headers) && identity_run_from(headers, &identities) < 0)
        return NULL;
    const char *topic_name = PyUnicode_AsUTF8(topic);
    long long max_data = PyLong_AsLongLong(args[3]);
    long long token = PyLong_AsLongLong(args[5]);
    if (topic_name == NULL || PyErr_Occurred())
        return NULL;
    PyObject *refused = PyList_New(0);
    if (refused == NULL)
        return NULL;
    rd_kafka_topic_t *rkt = topic_handle_of(self, topic, topic_name);
    Py_ssize_t run = -1;
    long long left_in_run = 0;
    int32_t partition = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        burst_entry fields;
        int taken = short_path_fields(parsed, i, topic, max_data, &fields);
        if (taken < 0)
            goto fail;
        if (!taken)
            continue;
        while (left_in_run == 0) {
            if (++run >= PyList_GET_SIZE(runs)) {
                PyErr_SetString(PyExc_ValueError, "the runs name fewer partitions than messages");
                goto fail;
            }
            PyObject *pair = PyList_GET_ITEM(runs, run);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                PyErr_SetString(PyExc_TypeError, "a run is (partition, count)");
                goto fail;
            }
            partition = (int32_t)PyLong_AsLong(PyTuple_GET_ITEM(pair, 0));
            left_in_run = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
            if (PyErr_Occurred())
                goto fail;
        }
        left_in_run--;
        rd_kafka_headers_t *message_headers = NULL;
        if (PyTuple_Check(headers))
            message_headers = identity_header(&identities, i);
        else if (headers != Py_None) {
            PyObject *header_list = PyList_GET_ITEM(headers, i);
            if (!PyList_Check(header_list) && header_list != Py_None) {
                PyErr_SetString(PyExc_TypeError, "a message's headers are a list or None");
                goto fail;
            }
            if (header_list != Py_None && (message_headers = headers_from(header_list)) == NULL)
                goto fail;
        }
        long long timestamp_ms = fields.timestamp_ms;
        long err = produce_one(self, rkt, topic_name, partition, fields.value,
                               (size_t)fields.value_size, fields.key_size ? fields.key : NULL,
                               (size_t)fields.key_size, timestamp_ms > 0 ? timestamp_ms : 0,
                               message_headers, token, Py_None, 1, 0);
        if (err == -1 && PyErr_Occurred())
            goto fail;
        if (err != 0 && append_new(refused, Py_BuildValue("(nl)", i, err)) < 0)
            goto fail;
    }
    return refused;
fail:
    Py_DECREF(refused);
    return NULL;
}

#define MAX_BURST_TOPICS 16

/* burst_topics(parsed, max_data) -> {topic: (count, data_bytes)} of the messages whose
 * key and value fit max_data, or None if the burst has more than MAX_BURST_TOPICS topics
 * (the caller then takes the per-message path). */
static PyObject *
burst_topics(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "burst_topics(parsed, max_data: int)");
        return NULL;
    }
    PyObject *parsed = args[0];
    Py_ssize_t n = parsed_length(parsed);
    if (n < 0)
        return NULL;
    long long max_data = PyLong_AsLongLong(args[1]);
    if (max_data == -1 && PyErr_Occurred())
        return NULL;
    PyObject *topics[MAX_BURST_TOPICS];
    long long counts[MAX_BURST_TOPICS], data_bytes[MAX_BURST_TOPICS];
    int n_topics = 0, last = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        burst_entry fields;
        int taken = short_path_fields(parsed, i, NULL, max_data, &fields);
        if (taken < 0)
            return NULL;
        if (!taken)
            continue;
        PyObject *topic = fields.topic;
        int found = -1;
        if (n_topics && topics[last] == topic)
            found = last;
        for (int t = 0; found < 0 && t < n_topics; t++)
            if (topics[t] == topic ||
                (PyUnicode_Check(topic) && PyUnicode_Compare(topics[t], topic) == 0))
                found = t;
        if (found < 0) {
            if (!PyUnicode_Check(topic))
                continue;
            if (n_topics == MAX_BURST_TOPICS)
                Py_RETURN_NONE;
            found = n_topics++;
            topics[found] = topic;
            counts[found] = data_bytes[found] = 0;
        }
        last = found;
        counts[found]++;
        data_bytes[found] += fields.key_size + fields.value_size;
    }
    PyObject *result = PyDict_New();
    for (int t = 0; result != NULL && t < n_topics; t++) {
        PyObject *entry = Py_BuildValue("(LL)", counts[t], data_bytes[t]);
        if (entry == NULL || PyDict_SetItem(result, topics[t], entry) < 0)
            Py_CLEAR(result);
        Py_XDECREF(entry);
    }
    return result;
}

/* ---- serving the main queue -------------------------------------------------------- */

/* What one poll hands back (the Polled record's lists). */
typedef struct {
    PyObject *ack_sums; /* [AckSum] */
    PyObject *acks;     /* [Ack], or None: summed */
    PyObject *failures; /* [Failure] */
    PyObject *events;   /* [Statistics | Error | Log] */
} poll_result;

static PyObject *
bytes_or_none(const void *data, size_t size)
{
    if (data == NULL)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
}

/* Hand the sums over, each removed once it is in the list (a failure keeps the rest). */
static int
flush_sums(Producer *self, poll_result *result)
{
    self->last_rkt = NULL; /* the sums it names go */
    while (self->n_sums > 0) {
        ack_sum *sum = &self->sums[self->n_sums - 1];
        PyObject *item = record(&AckSumType, "(LNLL)", sum->token, text_of(sum->topic),
                                sum->count, sum->data_bytes);
        if (append_new(result->ack_sums, item) < 0)
            return -1;
        self->n_sums--;
    }
    return 0;
}

static int
add_to_sums(Producer *self, poll_result *result, const rd_kafka_message_t *message,
            long long token)
{
    long long data_bytes = (long long)(message->len + message->key_len);
    if (message->rkt == self->last_rkt) { /* this event's topic: its sum, if the token's */
        ack_sum *sum = &self->sums[self->last_sum];
        if (sum->token == token) {
            sum->count++;
            sum->data_bytes += data_bytes;
            return 0;
        }
    }
    const char *topic = p_rd_kafka_topic_name(message->rkt);
    for (int i = self->n_sums - 1; i >= 0; i--) {
        ack_sum *sum = &self->sums[i];
        if (sum->token == token && strcmp(sum->topic, topic) == 0) {
            sum->count++;
            sum->data_bytes += data_bytes;
            self->last_rkt = message->rkt;
            self->last_sum = i;
            return 0;
        }
    }
    if (self->n_sums == MAX_SUMS && flush_sums(self, result) < 0)
        return -1;
    ack_sum *sum = &self->sums[self->n_sums];
    sum->token = token;
    sum->count = 1;
    sum->data_bytes = data_bytes;
    snprintf(sum->topic, sizeof sum->topic, "%s", topic);
    self->last_rkt = message->rkt;
    self->last_sum = self->n_sums++;
    return 0;
}

static PyObject *
headers_of(const rd_kafka_message_t *message)
{
    rd_kafka_headers_t *headers;
    if (p_rd_kafka_message_headers(message, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR)
        Py_RETURN_NONE;
    PyObject *list = PyList_New(0);
    const char *name;
    const void *value;
    size_t size;
    for (size_t i = 0; list != NULL &&
                       p_rd_kafka_header_get_all(headers, i, &name, &value, &size) ==
                           RD_KAFKA_RESP_ERR_NO_ERROR;
         i++) {
        PyObject *item = Py_BuildValue("(NN)", text_of(name), bytes_or_none(value, size));
        if (append_new(list, item) < 0)
            Py_CLEAR(list);
    }
    return list;
}

static int
report_failure(poll_result *result, const rd_kafka_message_t *message, msg_state *state)
{
    PyObject *partition_key =
        state->has_partition_key ? PyLong_FromLongLong(state->partition_key) : Py_NewRef(Py_None);
    PyObject *item = record(
        &FailureType, "(iNiNNLNLNiOi)", (int)message->err,
        text_of(p_rd_kafka_topic_name(message->rkt)), (int)message->partition,
        bytes_or_none(message->key, message->key_len),
        bytes_or_none(message->payload, message->len), state->timestamp_ms,
        headers_of(message), state->token, partition_key, state->attempt,
        state->maybe_in_kafka ? Py_True : Py_False, (int)p_rd_kafka_message_status(message));
    return append_new(result->failures, item);
}

static int
report_ack(Producer *self, poll_result *result, const rd_kafka_message_t *message,
           msg_state *state)
{
    if (result->acks == Py_None)
        return add_to_sums(self, result, message, state->token);
    PyObject *item = record(
        &AckType, "(NiNNLL)", text_of(p_rd_kafka_topic_name(message->rkt)),
        (int)message->partition, bytes_or_none(message->key, message->key_len),
        bytes_or_none(message->payload, message->len), state->timestamp_ms, state->token);
    return append_new(result->acks, item);
}

/* 1 if a delivery report event, 0 if another kind. */
static int
is_report(held_event *held)
{
    return p_rd_kafka_event_type(held->event) == RD_KAFKA_EVENT_DR;
}

/* Take a report event's messages out (once). -1 (MemoryError) if it cannot yet. */
static int
take_messages(held_event *held)
{
    if (held->messages != NULL || !is_report(held))
        return 0;
    size_t count = p_rd_kafka_event_message_count(held->event);
    held->messages = malloc((count ? count : 1) * sizeof *held->messages);
    if (held->messages == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    held->count = p_rd_kafka_event_message_array(held->event, held->messages, count);
    return 0;
}

/* Report the messages of a report event not reported yet, each state freed once its
 * report is in the result: a failure stops at that message, which stays held. */
static int
serve_delivery_reports(Producer *self, poll_result *result, held_event *held)
{
    if (take_messages(held) < 0)
        return -1;
    self->last_rkt = NULL; /* a handle of another event's may name another topic now */
    for (; held->reported < held->count; held->reported++) {
        const rd_kafka_message_t *message = held->messages[held->reported];
        msg_state *state = (msg_state *)message->_private;
        if (state == NULL)
            continue; /* not produced here: cannot happen, nothing to report */
        if (report_fault() < 0)
            return -1;
        int rc = message->err ? report_failure(result, message, state)
                              : report_ack(self, result, message, state);
        if (rc < 0)
            return -1;
        state_free(self, state);
    }
    return 0;
}

/* Destroy a served event, with the states of its messages not reported. */
static void
release_event(Producer *self, held_event *held)
{
    for (size_t i = held->reported; i < held->count; i++)
        state_free(self, held->messages[i]->_private);
    free(held->messages);
    p_rd_kafka_event_destroy(held->event);
    memset(held, 0, sizeof *held);
}

static int
serve_other_event(Producer *self, poll_result *result, rd_kafka_event_t *event)
{
    PyObject *item = NULL;
    switch (p_rd_kafka_event_type(event)) {
    case RD_KAFKA_EVENT_STATS:
        item = record(&StatisticsType, "(N)", text_of(p_rd_kafka_event_stats(event)));
        break;
    case RD_KAFKA_EVENT_ERROR: {
        int fatal = p_rd_kafka_event_error_is_fatal(event);
        rd_kafka_resp_err_t code = p_rd_kafka_event_error(event);
        const char *text = p_rd_kafka_event_error_string(event);
        char fatal_text[512];
        if (fatal) { /* the original error, as confluent-kafka raises it */
            code = p_rd_kafka_fatal_error(self->rk, fatal_text, sizeof fatal_text);
            text = fatal_text;
        }
        char garbled[1024];
        text = maybe_garbled(text, garbled, sizeof garbled);
        item = record(&ErrorType, "(iNO)", (int)code, text_of(text), fatal ? Py_True : Py_False);
        break;
    }
    case RD_KAFKA_EVENT_LOG: {
        const char *facility, *text;
        int level;
        if (p_rd_kafka_event_log(event, &facility, &text, &level) != 0)
            return 0;
        char garbled[1024];
        text = maybe_garbled(text, garbled, sizeof garbled);
        item = record(&LogType, "(iNNN)", level, text_of(facility),
                      text_of(p_rd_kafka_name(self->rk)), text_of(text));
        break;
    }
    default:
        return 0;
    }
    return append_new(result->events, item);
}

/* Take what is ready off the queue, up to MAX_EVENTS_PER_POLL held; the first waits up to
 * timeout_ms (without the GIL) if nothing is held. 0 if nothing is held after it. */
static int
take_events(Producer *self, int timeout_ms)
{
    if (self->first == self->n_held)
        self->first = self->n_held = 0;
    else if (self->first > 0) { /* a stopped poll's rest: moved to the front */
        memmove(self->held, self->held + self->first,
                (size_t)(self->n_held - self->first) * sizeof *self->held);
        self->n_held -= self->first;
        self->first = 0;
    }
    while (self->n_held < MAX_EVENTS_PER_POLL) {
        rd_kafka_event_t *event;
        if (self->n_held == 0 && timeout_ms > 0) {
            Py_BEGIN_ALLOW_THREADS
            event = p_rd_kafka_queue_poll(self->queue, timeout_ms);
            Py_END_ALLOW_THREADS
        } else {
            event = p_rd_kafka_queue_poll(self->queue, 0);
        }
        if (event == NULL)
            break;
        held_event *held = &self->held[self->n_held++];
        memset(held, 0, sizeof *held);
        held->event = event;
        if (take_messages(held) < 0)
            PyErr_Clear(); /* taken out when served (which reports a MemoryError then) */
    }
    return self->n_held > 0;
}

/* Whether a held report event has a failure not yet reported (or cannot tell yet). */
static int
holds_failure(Producer *self)
{
    for (int i = self->first; i < self->n_held; i++) {
        held_event *held = &self->held[i];
        if (held->messages == NULL && is_report(held))
            return 1;
        for (size_t m = held->reported; m < held->count; m++)
            if (held->messages[m]->err != RD_KAFKA_RESP_ERR_NO_ERROR)
                return 1;
    }
    return 0;
}

static PyObject *
new_list_or_none(int list)
{
    return list ? PyList_New(0) : Py_NewRef(Py_None);
}

/* Serve the held events in order until done or one fails (its exception is then the
 * result's stopped_by, cleared: the poll still hands over what it served). */
static PyObject *
serve_held(Producer *self, int each_ack)
{
    PyObject *polled = PyStructSequence_New(&PolledType);
    poll_result result = {PyList_New(0), new_list_or_none(each_ack || holds_failure(self)),
                          PyList_New(0), PyList_New(0)};
    if (!(polled && result.ack_sums && result.acks && result.failures && result.events)) {
        Py_XDECREF(polled); /* nothing served: everything stays held */
        Py_XDECREF(result.ack_sums);
        Py_XDECREF(result.acks);
        Py_XDECREF(result.failures);
        Py_XDECREF(result.events);
        return NULL;
    }
    int rc = 0;
    for (; rc == 0 && self->first < self->n_held; self->first++) {
        held_event *held = &self->held[self->first];
        rc = is_report(held) ? serve_delivery_reports(self, &result, held)
                             : serve_other_event(self, &result, held->event);
        if (rc < 0 && !is_report(held))
            rc = 0, PyErr_Clear(); /* not a report: dropped (a log line, statistics) */
        if (rc < 0)
            break; /* held (the report that failed and what follows): the next poll's */
        release_event(self, held);
    }
    if (rc == 0)
        rc = flush_sums(self, &result);
    PyObject *stopped_by = NULL;
    if (rc < 0) { /* the type alone: naming it allocates nothing */
        PyObject *value, *traceback;
        PyErr_Fetch(&stopped_by, &value, &traceback);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
    }
    PyStructSequence_SET_ITEM(polled, 0, result.ack_sums);
    PyStructSequence_SET_ITEM(polled, 1, result.acks);
    PyStructSequence_SET_ITEM(polled, 2, result.failures);
    PyStructSequence_SET_ITEM(polled, 3, result.events);
    PyStructSequence_SET_ITEM(polled, 4, stopped_by != NULL ? stopped_by : Py_NewRef(Py_None));
    return polled;
}

/* poll(timeout_s, each_ack) -> Polled, or None if nothing was ready. Waits up to timeout_s
 * for the first event (without the GIL) unless events are held, then takes what else is
 * ready, at most MAX_EVENTS_PER_POLL held. Acknowledgements are summed per (token, topic)
 * unless each_ack is true or a held report is a failure: then each comes back on its own
 * (message debugging and the possible-duplicate window read them one by one).
 *
 * No report is lost to another's failure: a report whose conversion fails stops the
 * poll, and it and every event after it stay held for the next poll (confluent-kafka's
 * CallState_crash and rd_kafka_yield: stop serving, keep the rest queued); the poll hands
 * over what it served, and names the exception type in stopped_by. */
static PyObject *
Producer_poll(Producer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "poll() takes 2 arguments");
        return NULL;
    }
    if (require_open(self) < 0)
        return NULL;
    if (self->polling) {
        PyErr_SetString(PyExc_RuntimeError, "a poll of this producer is in progress");
        return NULL;
    }
    double timeout_s = PyFloat_AsDouble(args[0]);
    int each_ack = PyObject_IsTrue(args[1]);
    if (PyErr_Occurred())
        return NULL;
    int timeout_ms = timeout_s > 0 ? (int)(timeout_s * 1000) : 0;
    self->polling = 1;
    PyObject *polled = NULL;
    if (take_events(self, timeout_ms) || self->n_sums > 0)
        polled = serve_held(self, each_ack);
    else
        polled = Py_NewRef(Py_None);
    self->polling = 0;
    return polled;
}

static PyObject *
Producer_purge(Producer *self, PyObject *Py_UNUSED(ignored))
{
    if (require_open(self) < 0)
        return NULL;
    /* Non-blocking: the purged messages are reported at once (_PURGE_QUEUE and
     * _PURGE_INFLIGHT), collected by the polls after it. */
    int flags = RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT | RD_KAFKA_PURGE_F_NON_BLOCKING;
    return PyLong_FromLong((long)p_rd_kafka_purge(self->rk, flags));
}

/* close(): refused while a poll runs (it may be waiting on the queue without the GIL). */
static PyObject *
Producer_close(Producer *self, PyObject *Py_UNUSED(ignored))
{
    if (self->polling) {
        PyErr_SetString(PyExc_RuntimeError, "close() while a poll of this producer runs");
        return NULL;
    }
    Producer_close0(self);
    Py_RETURN_NONE;
}

static Py_ssize_t
Producer_len(Producer *self)
{
    if (self->rk == NULL)
        return 0;
    /* librdkafka counts a message until its event is destroyed (held events included);
     * acknowledgements summed and not yet handed over are counted here. */
    Py_ssize_t held = p_rd_kafka_outq_len(self->rk);
    for (int i = 0; i < self->n_sums; i++)
        held += (Py_ssize_t)self->sums[i].count;
    return held;
}

static PyMethodDef Producer_methods[] = {
    {"produce", (PyCFunction)(void (*)(void))Producer_produce, METH_FASTCALL,
     "produce(topic, partition, value, key, timestamp_ms, partition_key, attempt, token, "
     "maybe_in_kafka, headers) -> 0 or librdkafka's error code"},
    {"produce_burst", (PyCFunction)(void (*)(void))Producer_produce_burst, METH_FASTCALL,
     "produce_burst(parsed, headers, topic, max_data, runs, token) -> [(index, code)]"},
    {"poll", (PyCFunction)(void (*)(void))Producer_poll, METH_FASTCALL,
     "poll(timeout_s, each_ack) -> (acks, each_ack, failures, events) or None"},
    {"purge", (PyCFunction)Producer_purge, METH_NOARGS,
     "purge() -> error code: every message queued or in flight fails at once"},
    {"close", (PyCFunction)Producer_close, METH_NOARGS,
     "close(): destroy the librdkafka instance (without the GIL)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Producer_members[] = {
    {"polling", T_INT, offsetof(Producer, polling), READONLY,
     "1 while a poll runs (close() is refused then)"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods Producer_as_sequence = {
    .sq_length = (lenfunc)Producer_len,
};

static PyTypeObject ProducerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pydory._cproducer.Producer",
    .tp_basicsize = sizeof(Producer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Producer(properties: dict[str, str]): a librdkafka producer served by poll()",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Producer_init,
    .tp_dealloc = (destructor)Producer_dealloc,
    .tp_methods = Producer_methods,
    .tp_members = Producer_members,
    .tp_as_sequence = &Producer_as_sequence,
};

static PyMethodDef module_methods[] = {
    {"burst_topics", (PyCFunction)(void (*)(void))burst_topics, METH_FASTCALL,
     "burst_topics(parsed, max_data) -> {topic: (count, data_bytes)} or None"},
    {"library_version", library_version, METH_O,
     "library_version(module_path) -> (version, library_path): the librdkafka the "
     "extension module at module_path loaded (its rd_kafka_version()), binding nothing"},
    {"bind", bind_library, METH_O,
     "bind(module_path) -> (version, library_path): resolve librdkafka's functions from "
     "the librdkafka the extension module at module_path loaded"},
    {"_inject_faults", inject_faults, METH_VARARGS,
     "_inject_faults(fail_report, garble_texts): tests only: the fail_report-th report "
     "converted from now fails (MemoryError), the next garble_texts log lines and error "
     "strings carry bytes not UTF-8 (as a broker may send); 0, 0 disarms"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pydory._cproducer",
    .m_doc = "A librdkafka producer driven from C: see _cproducer.c.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__cproducer(void)
{
    if (PyType_Ready(&ProducerType) < 0)
        return NULL;
    find_parsed_burst();
    PyTypeObject *records[] = {&AckSumType, &AckType,   &FailureType, &StatisticsType,
                               &ErrorType,  &LogType,   &PolledType};
    PyStructSequence_Desc *descs[] = {&AckSumType_desc, &AckType_desc,   &FailureType_desc,
                                      &StatisticsType_desc, &ErrorType_desc, &LogType_desc,
                                      &PolledType_desc};
    for (size_t i = 0; i < sizeof records / sizeof *records; i++)
        if (records[i]->tp_name == NULL && PyStructSequence_InitType2(records[i], descs[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    /* The librdkafka version of the header this file was compiled against. */
    if (PyModule_AddIntConstant(m, "HEADER_VERSION", RD_KAFKA_VERSION) < 0 ||
        PyModule_AddObjectRef(m, "Producer", (PyObject *)&ProducerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    for (size_t i = 0; i < sizeof records / sizeof *records; i++) {
        const char *name = strrchr(records[i]->tp_name, '.') + 1;
        if (PyModule_AddObjectRef(m, name, (PyObject *)records[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
