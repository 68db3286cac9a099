/* pydory._cproducer: a librdkafka producer driven from C (issue 25, lever 3).
 *
 * Rule: a message handed to librdkafka from here carries a msg_state of its own, freed
 * (or kept on the producer's free list for a next message) here alone, when its delivery
 * report is served (poll, or the report thread summing it) -- never before, never twice.
 *
 * Why: confluent-kafka's Producer builds, per message, a callback state holding a Python
 * callable, and per delivery report a Message object and a Python call; on the daemon's
 * stream path that was ~45 % of its CPU. Here a message's state is a small C struct, and
 * the delivery reports come through librdkafka's event API a batch at a time: the
 * acknowledged ones are summed per (token, topic) in C and handed to Python as a few
 * tuples per poll; failures (rare) come back one tuple each, with everything a resend
 * needs (their headers read back from the report). With a report thread (issue 34, lever
 * 4: "the report thread" below) the acknowledgements are summed, and their events
 * destroyed, on a thread of the producer's own without the GIL; the poll takes the sums.
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
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

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
    X(rd_kafka_queue_yield)                                                                \
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

/* The n-th report converted from now fails. Atomic: a report thread reads it (armed, it
 * hands every report event over whole, so each report is converted on the loop). */
static long fail_report_countdown = 0;
static long garble_texts = 0; /* the next n log lines and error strings carry bytes not UTF-8 */

static int
faults_armed(void)
{
    return __atomic_load_n(&fail_report_countdown, __ATOMIC_ACQUIRE) > 0;
}

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
    if (faults_armed() &&
        __atomic_sub_fetch(&fail_report_countdown, 1, __ATOMIC_ACQ_REL) == 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *
inject_faults(PyObject *Py_UNUSED(module), PyObject *args)
{
    long fail_report;
    if (!PyArg_ParseTuple(args, "ll", &fail_report, &garble_texts))
        return NULL;
    __atomic_store_n(&fail_report_countdown, fail_report, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* Report events with a failure handed over whole by any producer's thread, and of them
 * released by a poll (served, or dropped at close). While they differ, a failure is on its
 * way to the loop's settlement, which may open the possible-duplicate window for every
 * producer's acknowledgements after it: no thread sums then. Once they are equal, a
 * thread sums again from its producer's second poll after that (the first may have been
 * in the very turn of the loop that took the failure, before its settlement; the second
 * is in a later one, which asks for each_ack if the window opened). */
static unsigned long failures_seen = 0, failures_released = 0;

static unsigned long
failures_load(unsigned long *counter)
{
    return __atomic_load_n(counter, __ATOMIC_ACQUIRE);
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
    int has_failure; /* a report with a failure (or not taken out: cannot tell) */
} held_event;

#define MAX_SUMS 64
#define MAX_EVENTS_PER_POLL 256
/* Events held for the loop, taken off the queue and not yet served: the hand-over's bound
 * (a power of two). The loop's own taking holds at most MAX_EVENTS_PER_POLL of them. */
#define REPORT_RING_EVENTS 1024
#if REPORT_RING_EVENTS < MAX_EVENTS_PER_POLL || (REPORT_RING_EVENTS & (REPORT_RING_EVENTS - 1))
#error "REPORT_RING_EVENTS is a power of two, at least MAX_EVENTS_PER_POLL"
#endif
/* At most this many states kept for reuse (64 KiB); more are given back to malloc. */
#define MAX_FREE_STATES 1024
/* Topic handles held per producer; a producer sending to more topics sends the others by
 * name (librdkafka's lookup), as before. */
#define MAX_TOPIC_HANDLES 16

typedef struct {
    PyObject *name; /* the str it was first asked for (held: compared by identity) */
    rd_kafka_topic_t *rkt;
} topic_handle;

/* The report thread's side (see "the report thread" below): everything here but the
 * thread's own scratch is read and written under ``lock`` only. */
typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t ready_cond; /* something became ready (a poll that waits) */
    pthread_cond_t room_cond;  /* the loop made room in the ring */
    int stop;
    /* Hand every report event over whole (no summing): asked by a poll with each_ack (or
     * report_each_ack), until a poll without it. */
    int keep_whole;
    /* Whether a failure may be unsettled (see failures_seen): the thread sums only while
     * failures_seen is clean_epoch, and clean_takes (polls without each_ack since it was
     * reached, none of them with a failure seen and not released) is 2. */
    unsigned long clean_epoch;
    int clean_takes;
    /* wake_fd was written and not yet read: written when something becomes ready. */
    int ready;
    int wake_fd;
    /* Acknowledgements the thread summed (their events destroyed), not yet taken. */
    ack_sum sums[MAX_SUMS];
    int n_sums;
    /* States of messages the thread summed, for the loop's free list (a chain). */
    msg_state *spare, *spare_last;
    int n_spare;
    /* Counts (tests, benchmarks). */
    unsigned long long room_waits, events_summed, events_whole, wakes;
    /* The thread's own: a report event's messages, taken out. */
    const rd_kafka_message_t **scratch;
    size_t scratch_size;
} report_thread;

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue; /* the main queue: delivery reports, stats, errors, logs */
    /* A poll is running (maybe waiting without the GIL): close() and a second poll are
     * refused until it returns. */
    int polling;
    /* Events taken off the queue and not yet served: ring[head:tail] (indices modulo
     * REPORT_RING_EVENTS), in the order librdkafka queued them. The loop serves from
     * head; they are added at tail by the loop's poll, or by the report thread (then
     * head and tail are read and written under its lock; a slot is written before tail
     * moves past it, and released before head does). A poll that stops (a report it could
     * not convert) leaves the rest here for the next one, as if still queued. */
    held_event ring[REPORT_RING_EVENTS];
    unsigned long head, tail;
    int failures_held; /* events in the ring with has_failure */
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
    /* The report thread, or NULL: the loop's poll serves the queue itself. */
    report_thread *reaper;
    /* close() began: a second one (from another thread while the first waits for the
     * report thread without the GIL, or the dealloc) does nothing. */
    int closed;
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

static void release_event(Producer *self, held_event *held);
static int reaper_start(Producer *self);
static void reaper_stop(Producer *self);
static void Producer_close0(Producer *self);

static int
Producer_init(Producer *self, PyObject *args, PyObject *kwargs)
{
    PyObject *properties;
    int thread = 0;
    static char *keywords[] = {"properties", "thread", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|p", keywords, &PyDict_Type, &properties,
                                     &thread))
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
    self->closed = 0;
    self->queue = p_rd_kafka_queue_get_main(rk);
    p_rd_kafka_set_log_queue(rk, NULL); /* NULL: the main queue */
    if (thread && reaper_start(self) < 0) {
        Producer_close0(self);
        return -1;
    }
    return 0;
}

static void
Producer_close0(Producer *self)
{
    if (self->closed) /* a second close (or the dealloc after close) while or after one */
        return;
    self->closed = 1;
    rd_kafka_t *rk = self->rk;
    self->rk = NULL; /* from here produce, purge and poll are refused, len() is 0 */
    /* The report thread first (joined without the GIL): from then on nothing but this
     * thread touches the ring, the sums or the states. */
    int had_thread = self->reaper != NULL;
    reaper_stop(self);
    /* Events still held: their unreported messages' states go with them (the instance
     * goes too: nothing can report them any more); a thread's failures among them are
     * released (see failures_seen). */
    unsigned long released_failures = 0;
    for (; self->head != self->tail; self->head++) {
        held_event *held = &self->ring[self->head % REPORT_RING_EVENTS];
        released_failures += (unsigned long)held->has_failure;
        release_event(self, held);
    }
    if (had_thread)
        __atomic_add_fetch(&failures_released, released_failures, __ATOMIC_ACQ_REL);
    self->head = self->tail = 0;
    self->failures_held = self->n_sums = 0;
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
    rd_kafka_queue_t *queue = self->queue;
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

/* Whether a held event is a report with a failure (or cannot tell: not taken out yet). */
static int
has_failure(held_event *held)
{
    if (held->messages == NULL)
        return is_report(held);
    for (size_t m = 0; m < held->count; m++)
        if (held->messages[m]->err != RD_KAFKA_RESP_ERR_NO_ERROR)
            return 1;
    return 0;
}

/* Without a report thread: take what is ready off the queue, up to MAX_EVENTS_PER_POLL
 * held; the first waits up to timeout_ms (without the GIL) if nothing is held. */
static void
take_events(Producer *self, int timeout_ms)
{
    while (self->tail - self->head < MAX_EVENTS_PER_POLL) {
        rd_kafka_event_t *event;
        if (self->tail == self->head && timeout_ms > 0) {
            Py_BEGIN_ALLOW_THREADS
            event = p_rd_kafka_queue_poll(self->queue, timeout_ms);
            Py_END_ALLOW_THREADS
        } else {
            event = p_rd_kafka_queue_poll(self->queue, 0);
        }
        if (event == NULL)
            break;
        held_event *held = &self->ring[self->tail % REPORT_RING_EVENTS];
        memset(held, 0, sizeof *held);
        held->event = event;
        if (take_messages(held) < 0)
            PyErr_Clear(); /* taken out when served (which reports a MemoryError then) */
        held->has_failure = has_failure(held);
        self->failures_held += held->has_failure;
        self->tail++;
    }
}

/* Whether a held report event up to ``until`` has a failure not yet reported (or cannot
 * tell yet). */
static int
holds_failure(Producer *self, unsigned long until)
{
    for (unsigned long i = self->head; i != until; i++) {
        held_event *held = &self->ring[i % REPORT_RING_EVENTS];
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

/* ---- the report thread ---------------------------------------------------------------
 *
 * With Producer(thread=True) a thread of its own serves the main queue, never holding the
 * GIL and never touching a Python object (its memory is malloc's): it waits in
 * rd_kafka_queue_poll, and for a delivery report event whose messages all succeeded it
 * sums them per (token, topic) here (report->sums), gives their states back (a chain the
 * loop's poll splices into its free list) and destroys the event, so librdkafka frees the
 * messages and their headers on this thread, not the loop's. Every other event (a report
 * with a failure, statistics, an error, a log line) is handed over whole, in the order
 * librdkafka queued it, into the ring the loop's poll serves as before. When the ring is
 * full the thread stops taking events (they wait in librdkafka's queue). It tells the
 * loop through an eventfd (wake_fd), written when something becomes ready and nothing
 * was pending. Summing after a failure would let an acknowledgement the
 * possible-duplicate window needs pass unseen (the window covers every producer's), so
 * from a failure seen by any producer's thread on, every thread hands every report event
 * over whole until that failure has been taken by the loop and settled (failures_seen);
 * and while a poll asks for each_ack (keep_whole). */

/* Whether the thread may sum now (it keeps every report whole otherwise). Under the lock. */
static int
may_sum(report_thread *report)
{
    return !report->keep_whole && !faults_armed() && report->clean_takes >= 2 &&
           failures_load(&failures_seen) == report->clean_epoch;
}

/* A poll's take: note whether every failure seen is released (see failures_seen). Under
 * the lock. */
static void
note_clean_take(Producer *self, report_thread *report)
{
    unsigned long seen = failures_load(&failures_seen);
    if (seen != failures_load(&failures_released) || self->failures_held > 0)
        report->clean_takes = 0;
    else if (report->clean_epoch != seen) {
        report->clean_epoch = seen;
        report->clean_takes = 1;
    } else if (report->clean_takes < 2)
        report->clean_takes++;
}

/* Tell the loop something is ready, once until it takes it. Under the lock. */
static void
wake_locked(report_thread *report)
{
    if (report->ready)
        return;
    report->ready = 1;
    report->wakes++;
    uint64_t one = 1;
    ssize_t written = write(report->wake_fd, &one, sizeof one); /* a counter: cannot fill */
    (void)written;
    pthread_cond_broadcast(&report->ready_cond);
}

/* The thread's array for a report event's messages, at least ``count`` long. */
static int
ensure_scratch(report_thread *report, size_t count)
{
    if (report->scratch != NULL && count <= report->scratch_size)
        return 0;
    size_t size = count > 64 ? count : 64;
    const rd_kafka_message_t **bigger = realloc(report->scratch, size * sizeof *bigger);
    if (bigger == NULL)
        return -1;
    report->scratch = bigger;
    report->scratch_size = size;
    return 0;
}

/* A report event's acknowledgements summed into sums[:*n_sums] per (token, topic), as
 * add_to_sums does (the topic's name looked up once per topic handle and token); -1 if
 * a message failed (held->has_failure set) or they need more than MAX_SUMS pairs. */
static int
sum_locally(held_event *held, ack_sum *sums, int *n_sums)
{
    const rd_kafka_topic_t *last_rkt = NULL;
    int last = 0, overflow = 0;
    for (size_t i = 0; i < held->count; i++) {
        const rd_kafka_message_t *message = held->messages[i];
        if (message->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            held->has_failure = 1;
            return -1;
        }
        const msg_state *state = message->_private;
        if (state == NULL || overflow)
            continue; /* not produced here: cannot happen; or the failures looked for only */
        long long data_bytes = (long long)(message->len + message->key_len);
        if (message->rkt != last_rkt || sums[last].token != state->token) {
            const char *topic = p_rd_kafka_topic_name(message->rkt);
            last = -1;
            for (int s = *n_sums - 1; s >= 0 && last < 0; s--)
                if (sums[s].token == state->token && strcmp(sums[s].topic, topic) == 0)
                    last = s;
            if (last < 0 && *n_sums == MAX_SUMS) {
                overflow = 1;
                last = 0;
                continue;
            }
            if (last < 0) {
                last = (*n_sums)++;
                sums[last].token = state->token;
                sums[last].count = sums[last].data_bytes = 0;
                snprintf(sums[last].topic, sizeof sums[last].topic, "%s", topic);
            }
            last_rkt = message->rkt;
        }
        sums[last].count++;
        sums[last].data_bytes += data_bytes;
    }
    return overflow ? -1 : 0;
}

/* Add an event's sums to the thread's, if they fit. Under the lock. */
static int
merge_sums(report_thread *report, const ack_sum *sums, int n_sums)
{
    int where[MAX_SUMS], new_pairs = 0;
    for (int i = 0; i < n_sums; i++) {
        where[i] = -1;
        for (int s = report->n_sums - 1; s >= 0 && where[i] < 0; s--)
            if (report->sums[s].token == sums[i].token &&
                strcmp(report->sums[s].topic, sums[i].topic) == 0)
                where[i] = s;
        new_pairs += where[i] < 0;
    }
    if (report->n_sums + new_pairs > MAX_SUMS)
        return -1;
    for (int i = 0; i < n_sums; i++) {
        if (where[i] < 0) {
            report->sums[report->n_sums++] = sums[i];
            continue;
        }
        report->sums[where[i]].count += sums[i].count;
        report->sums[where[i]].data_bytes += sums[i].data_bytes;
    }
    return 0;
}

/* Serve a report event whose messages all succeeded: summed, their states given back, the
 * event destroyed (its sums counted before it goes: len() never misses them). -1 if it
 * is to be handed over whole instead (a failure, may_sum says not, the sums full). */
static int
reap_acknowledged(Producer *self, held_event *held)
{
    report_thread *report = self->reaper;
    ack_sum sums[MAX_SUMS];
    int n_sums = 0;
    if (sum_locally(held, sums, &n_sums) < 0)
        return -1;
    /* Their states chained (next_free is not used while a message is in flight). */
    msg_state *chain = NULL, *chain_last = NULL;
    int n_states = 0;
    for (size_t i = 0; i < held->count; i++) {
        msg_state *state = held->messages[i]->_private;
        if (state == NULL)
            continue;
        state->next_free = chain;
        if (chain == NULL)
            chain_last = state;
        chain = state;
        n_states++;
    }
    int spliced = 0;
    pthread_mutex_lock(&report->lock);
    int summed = may_sum(report) && merge_sums(report, sums, n_sums) == 0;
    if (summed) {
        if (chain != NULL && report->n_spare + n_states <= MAX_FREE_STATES) {
            chain_last->next_free = report->spare;
            if (report->spare == NULL)
                report->spare_last = chain_last;
            report->spare = chain;
            report->n_spare += n_states;
            spliced = 1;
        }
        report->events_summed++;
        if (n_sums > 0)
            wake_locked(report);
    }
    pthread_mutex_unlock(&report->lock);
    if (!summed)
        return -1;
    while (!spliced && chain != NULL) {
        msg_state *next = chain->next_free;
        free(chain);
        chain = next;
    }
    p_rd_kafka_event_destroy(held->event);
    return 0;
}

/* Hand an event over whole, at the ring's tail (room was made sure of before the queue
 * was polled, and only this thread adds). */
static void
hand_whole(Producer *self, const held_event *held)
{
    report_thread *report = self->reaper;
    self->ring[self->tail % REPORT_RING_EVENTS] = *held; /* not the loop's until tail moves */
    pthread_mutex_lock(&report->lock);
    self->tail++;
    if (held->has_failure) { /* counted before the loop can release it */
        self->failures_held++;
        __atomic_add_fetch(&failures_seen, 1, __ATOMIC_ACQ_REL);
    }
    report->events_whole++;
    wake_locked(report);
    pthread_mutex_unlock(&report->lock);
}

static void
reap_event(Producer *self, rd_kafka_event_t *event)
{
    report_thread *report = self->reaper;
    held_event held = {event, NULL, 0, 0, 0};
    if (p_rd_kafka_event_type(event) == RD_KAFKA_EVENT_DR) {
        size_t count = p_rd_kafka_event_message_count(event);
        if (ensure_scratch(report, count) < 0) {
            held.has_failure = 1; /* cannot tell: the loop takes them out, or says why not */
        } else {
            held.messages = report->scratch;
            held.count = p_rd_kafka_event_message_array(event, held.messages, count);
            if (reap_acknowledged(self, &held) == 0)
                return;
            report->scratch = NULL; /* the array goes with the event */
            report->scratch_size = 0;
        }
    }
    hand_whole(self, &held);
}

static void *
reaper_main(void *arg)
{
    Producer *self = arg;
    report_thread *report = self->reaper;
    for (;;) {
        pthread_mutex_lock(&report->lock);
        while (!report->stop && self->tail - self->head >= REPORT_RING_EVENTS) {
            report->room_waits++;
            pthread_cond_wait(&report->room_cond, &report->lock);
        }
        int stop = report->stop;
        pthread_mutex_unlock(&report->lock);
        if (stop)
            return NULL;
        /* Until an event comes, or a stop yields the poll (rd_kafka_queue_yield). */
        rd_kafka_event_t *event = p_rd_kafka_queue_poll(self->queue, -1);
        if (event != NULL)
            reap_event(self, event);
    }
}

static void
reaper_free(report_thread *report)
{
    while (report->spare != NULL) {
        msg_state *next = report->spare->next_free;
        free(report->spare);
        report->spare = next;
    }
    free(report->scratch);
    if (report->wake_fd >= 0)
        close(report->wake_fd);
    free(report);
}

static int
reaper_start(Producer *self)
{
    report_thread *report = calloc(1, sizeof *report);
    if (report == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    report->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (report->wake_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        reaper_free(report);
        return -1;
    }
    /* A poll waits for the thread on the monotonic clock (a timeout in seconds). */
    pthread_condattr_t monotonic;
    int failed = pthread_condattr_init(&monotonic) ||
                 pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC) ||
                 pthread_mutex_init(&report->lock, NULL) ||
                 pthread_cond_init(&report->ready_cond, &monotonic) ||
                 pthread_cond_init(&report->room_cond, NULL);
    pthread_condattr_destroy(&monotonic);
    if (failed) {
        PyErr_SetString(PyExc_OSError, "cannot make the report thread's lock");
        reaper_free(report);
        return -1;
    }
    /* Summing from the start, unless a failure is on its way somewhere (failures_seen). */
    report->clean_epoch = failures_load(&failures_seen);
    report->clean_takes = report->clean_epoch == failures_load(&failures_released) ? 2 : 0;
    self->reaper = report;
    failed = pthread_create(&report->thread, NULL, reaper_main, self);
    if (failed != 0) {
        self->reaper = NULL;
        pthread_mutex_destroy(&report->lock);
        pthread_cond_destroy(&report->ready_cond);
        pthread_cond_destroy(&report->room_cond);
        reaper_free(report);
        errno = failed;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    /* Named, so per-thread counts (perf stat --per-thread, top -H) tell it from the loop. */
    (void)pthread_setname_np(report->thread, "pydory-reports");
    return 0;
}

/* Stop and join the thread (without the GIL). What it summed and did not hand over goes
 * with it, as the held events do at close: nothing can report them any more (the
 * closing thread polls until len() is 0 before it closes). */
static void
reaper_stop(Producer *self)
{
    report_thread *report = self->reaper;
    if (report == NULL)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&report->lock);
    report->stop = 1;
    pthread_cond_broadcast(&report->room_cond);
    pthread_mutex_unlock(&report->lock);
    p_rd_kafka_queue_yield(self->queue);
    pthread_join(report->thread, NULL);
    Py_END_ALLOW_THREADS
    self->reaper = NULL;
    pthread_mutex_destroy(&report->lock);
    pthread_cond_destroy(&report->ready_cond);
    pthread_cond_destroy(&report->room_cond);
    reaper_free(report);
}

/* Whether the thread left anything for the loop. Under the lock. */
static int
nothing_ready(Producer *self)
{
    return self->head == self->tail && self->reaper->n_sums == 0 && self->n_sums == 0;
}

/* The loop's side of the hand-over: wait up to timeout_ms (without the GIL) if nothing is
 * ready, then take what the thread left (its sums, if the loop's are empty; its states)
 * and say whether from now on it sums (each_ack, or a failure held: not). The events up
 * to the tail returned are the poll's. */
static unsigned long
take_ready(Producer *self, int each_ack, int timeout_ms)
{
    report_thread *report = self->reaper;
    if (timeout_ms > 0) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&report->lock);
        while (nothing_ready(self))
            if (pthread_cond_timedwait(&report->ready_cond, &report->lock, &until) != 0)
                break; /* timed out */
        pthread_mutex_unlock(&report->lock);
        Py_END_ALLOW_THREADS
    }
    pthread_mutex_lock(&report->lock);
    report->keep_whole = each_ack;
    note_clean_take(self, report);
    if (report->ready) {
        uint64_t count;
        ssize_t got = read(report->wake_fd, &count, sizeof count);
        (void)got;
        report->ready = 0;
    }
    if (self->n_sums == 0 && report->n_sums > 0) { /* else kept until the loop's are out */
        memcpy(self->sums, report->sums, (size_t)report->n_sums * sizeof *self->sums);
        self->n_sums = report->n_sums;
        report->n_sums = 0;
        self->last_rkt = NULL;
    }
    if (report->spare != NULL && self->n_free_states + report->n_spare <= MAX_FREE_STATES) {
        report->spare_last->next_free = self->free_states;
        self->free_states = report->spare;
        self->n_free_states += report->n_spare;
        report->spare = report->spare_last = NULL;
        report->n_spare = 0;
    }
    unsigned long tail = self->tail;
    pthread_mutex_unlock(&report->lock);
    return tail;
}

/* The loop served ring[head:to]: they are released (``released_failures`` of them with a
 * failure), their slots free for the thread. Unless the poll stopped (then the timers
 * bring the next one), what is still held wakes the loop again. */
static void
advance_head(Producer *self, unsigned long to, int released_failures, int stopped)
{
    report_thread *report = self->reaper;
    if (report == NULL) {
        self->head = to;
        self->failures_held -= released_failures;
        return;
    }
    pthread_mutex_lock(&report->lock);
    if (to != self->head)
        pthread_cond_signal(&report->room_cond);
    self->head = to;
    self->failures_held -= released_failures;
    __atomic_add_fetch(&failures_released, (unsigned long)released_failures, __ATOMIC_ACQ_REL);
    if (!stopped && (self->head != self->tail || report->n_sums > 0))
        wake_locked(report);
    pthread_mutex_unlock(&report->lock);
}

/* Serve the held events up to ``until`` in order until done or one fails (its exception
 * is then the result's stopped_by, cleared: the poll still hands over what it served). */
static PyObject *
serve_held(Producer *self, int each_ack, unsigned long until)
{
    PyObject *polled = PyStructSequence_New(&PolledType);
    poll_result result = {PyList_New(0), new_list_or_none(each_ack || holds_failure(self, until)),
                          PyList_New(0), PyList_New(0)};
    if (!(polled && result.ack_sums && result.acks && result.failures && result.events)) {
        Py_XDECREF(polled); /* nothing served: everything stays held */
        Py_XDECREF(result.ack_sums);
        Py_XDECREF(result.acks);
        Py_XDECREF(result.failures);
        Py_XDECREF(result.events);
        return NULL;
    }
    int rc = 0, released_failures = 0;
    unsigned long served = self->head;
    for (; served != until; served++) {
        held_event *held = &self->ring[served % REPORT_RING_EVENTS];
        rc = is_report(held) ? serve_delivery_reports(self, &result, held)
                             : serve_other_event(self, &result, held->event);
        if (rc < 0 && !is_report(held))
            rc = 0, PyErr_Clear(); /* not a report: dropped (a log line, statistics) */
        if (rc < 0)
            break; /* held (the report that failed and what follows): the next poll's */
        released_failures += held->has_failure;
        release_event(self, held);
    }
    advance_head(self, served, released_failures, rc < 0);
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
 * ready, at most MAX_EVENTS_PER_POLL served. Acknowledgements are summed per (token,
 * topic) unless each_ack is true or a held report is a failure: then each comes back on
 * its own (message debugging and the possible-duplicate window read them one by one).
 * With a report thread, what it summed before comes summed; from this poll on it sums
 * nothing while each_ack is asked (or a failure is held).
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
    unsigned long until;
    if (self->reaper != NULL) {
        until = take_ready(self, each_ack, timeout_ms);
    } else {
        take_events(self, timeout_ms);
        until = self->tail;
    }
    if (until - self->head > MAX_EVENTS_PER_POLL)
        until = self->head + MAX_EVENTS_PER_POLL;
    PyObject *polled;
    if (until != self->head || self->n_sums > 0)
        polled = serve_held(self, each_ack, until);
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

/* close(): refused while a poll runs (it may be waiting on the queue without the GIL).
 * With a report thread, the thread is stopped and joined first (without the GIL). */
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
     * acknowledgements summed and not yet handed over are counted here (the thread adds
     * to its sums before it destroys their event). */
    Py_ssize_t held = p_rd_kafka_outq_len(self->rk);
    for (int i = 0; i < self->n_sums; i++)
        held += (Py_ssize_t)self->sums[i].count;
    report_thread *report = self->reaper;
    if (report != NULL) {
        pthread_mutex_lock(&report->lock);
        for (int i = 0; i < report->n_sums; i++)
            held += (Py_ssize_t)report->sums[i].count;
        pthread_mutex_unlock(&report->lock);
    }
    return held;
}

/* report_each_ack(): from now on the report thread sums nothing, until a poll without
 * each_ack (message debugging just started: every acknowledgement from now on is
 * wanted one by one, before the next poll asks). Without a thread the poll decides. */
static PyObject *
Producer_report_each_ack(Producer *self, PyObject *Py_UNUSED(ignored))
{
    report_thread *report = self->reaper;
    if (report != NULL) {
        pthread_mutex_lock(&report->lock);
        report->keep_whole = 1;
        pthread_mutex_unlock(&report->lock);
    }
    Py_RETURN_NONE;
}

/* thread_counts() -> {...} of the report thread, or None without one (tests, benchmarks). */
static PyObject *
Producer_thread_counts(Producer *self, PyObject *Py_UNUSED(ignored))
{
    report_thread *report = self->reaper;
    if (report == NULL)
        Py_RETURN_NONE;
    pthread_mutex_lock(&report->lock);
    unsigned long held = self->tail - self->head;
    unsigned long long counts[] = {report->room_waits, report->events_summed,
                                   report->events_whole, report->wakes};
    int summed = report->n_sums, summing = may_sum(report);
    pthread_mutex_unlock(&report->lock);
    return Py_BuildValue("{s:k,s:i,s:i,s:K,s:K,s:K,s:K}", "held_events", held, "sums", summed,
                         "summing", summing, "room_waits", counts[0], "events_summed",
                         counts[1], "events_whole", counts[2], "wakes", counts[3]);
}

static PyObject *
Producer_get_wake_fd(Producer *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->reaper != NULL ? self->reaper->wake_fd : -1);
}

static PyGetSetDef Producer_getset[] = {
    {"wake_fd", (getter)Producer_get_wake_fd, NULL,
     "the report thread's eventfd, readable when a poll has something to take (for "
     "loop.add_reader; a poll reads it), or -1 without a thread",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

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
     "close(): stop the report thread, destroy the librdkafka instance (without the GIL)"},
    {"report_each_ack", (PyCFunction)Producer_report_each_ack, METH_NOARGS,
     "report_each_ack(): the report thread sums nothing until a poll without each_ack"},
    {"thread_counts", (PyCFunction)Producer_thread_counts, METH_NOARGS,
     "thread_counts() -> dict of the report thread's counts, or None without one"},
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
    .tp_doc = "Producer(properties: dict[str, str], thread: bool = False): a librdkafka "
              "producer served by poll(); with thread, its event queue is served by a "
              "thread of its own that sums acknowledgements without the GIL",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Producer_init,
    .tp_dealloc = (destructor)Producer_dealloc,
    .tp_methods = Producer_methods,
    .tp_members = Producer_members,
    .tp_getset = Producer_getset,
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
        PyModule_AddIntConstant(m, "REPORT_RING_EVENTS", REPORT_RING_EVENTS) < 0 ||
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
