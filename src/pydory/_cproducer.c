/* pydory._cproducer: a librdkafka producer driven from C (issue 25, lever 3).
 *
 * Rule: a message handed to librdkafka from here carries a msg_state of its own, freed
 * here alone, when its delivery report is served (poll) -- never before, never twice.
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
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

/* ---- the librdkafka functions used, resolved by bind() ---------------------------- */

#define RDK_FUNCTIONS(X)                                                                   \
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

static PyObject *
bind_library(PyObject *Py_UNUSED(module), PyObject *arg)
{
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    if (library != NULL)
        return PyUnicode_FromString(p_rd_kafka_version_str());
    /* RTLD_NOLOAD first: the copy confluent-kafka loaded, never a second one. */
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        handle = dlopen(path, RTLD_NOW);
    if (handle == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot load librdkafka %s: %s", path, dlerror());
        return NULL;
    }
#define RESOLVE(name)                                                                      \
    p_##name = (__typeof__(name) *)dlsym(handle, #name);                                   \
    if (p_##name == NULL) {                                                                \
        PyErr_Format(PyExc_ImportError, "librdkafka %s has no %s", path, #name);           \
        dlclose(handle);                                                                   \
        return NULL;                                                                       \
    }
    RDK_FUNCTIONS(RESOLVE)
#undef RESOLVE
    library = handle;
    return PyUnicode_FromString(p_rd_kafka_version_str());
}

/* ---- one message's state: what its delivery report must give back ----------------- */

typedef struct {
    long long token;        /* the caller's opaque int (the commit point's epoch) */
    long long timestamp_ms; /* the client's timestamp it was sent with */
    long long partition_key;
    int attempt;
    unsigned char has_partition_key; /* PartitionKey; else AnyPartition */
    unsigned char maybe_in_kafka;    /* an earlier attempt may have reached the log */
} msg_state;

/* ---- the Producer type ---------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue; /* the main queue: delivery reports, stats, errors, logs */
} Producer;

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

static void
Producer_close0(Producer *self)
{
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

/* One message to librdkafka, copied; its state kept as the message's opaque; ``headers``
 * (or NULL) handed over. 0, or librdkafka's error code (then it holds nothing: neither
 * the state nor the headers, which are destroyed). -1 with a Python exception set. */
static long
produce_one(Producer *self, const char *topic, int32_t partition, PyObject *value,
            PyObject *key, long long timestamp_ms, rd_kafka_headers_t *headers,
            long long token, PyObject *partition_key, int attempt, int maybe_in_kafka)
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
    msg_state *state = malloc(sizeof *state);
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
    const char *key_data = NULL;
    size_t key_size = 0;
    if (key != Py_None) {
        key_data = PyBytes_AS_STRING(key);
        key_size = (size_t)PyBytes_GET_SIZE(key);
    }
    char *value_data = PyBytes_AS_STRING(value); /* copied (F_COPY), never written */
    size_t value_size = (size_t)PyBytes_GET_SIZE(value);
    rd_kafka_resp_err_t err;
    if (headers == NULL)
        err = p_rd_kafka_producev(
            self->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_VALUE(value_data, value_size),
            RD_KAFKA_V_KEY(key_data, key_size), RD_KAFKA_V_TIMESTAMP(timestamp_ms),
            RD_KAFKA_V_OPAQUE(state), RD_KAFKA_V_END);
    else
        err = p_rd_kafka_producev(
            self->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_VALUE(value_data, value_size),
            RD_KAFKA_V_KEY(key_data, key_size), RD_KAFKA_V_TIMESTAMP(timestamp_ms),
            RD_KAFKA_V_OPAQUE(state), RD_KAFKA_V_HEADERS(headers), RD_KAFKA_V_END);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        free(state);
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
    long err = produce_one(self, topic, (int32_t)partition, args[2], args[3], timestamp_ms,
                           headers, token, partition_key, (int)attempt, maybe_in_kafka);
    return err == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(err);
}

/* The fields parse_any_partition_burst gives a message: (topic, key, value, timestamp_ms),
 * or None; 0 if ``item`` is not such a tuple of ``topic`` (any topic if NULL) whose key and
 * value fit ``max_data``. */
static int
short_path_fields(PyObject *item, PyObject *topic, long long max_data, PyObject **key,
                  PyObject **value, long long *timestamp_ms)
{
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4)
        return 0;
    PyObject *its_topic = PyTuple_GET_ITEM(item, 0);
    if (topic != NULL && its_topic != topic &&
        !(PyUnicode_Check(its_topic) && PyUnicode_Compare(its_topic, topic) == 0))
        return 0;
    *key = PyTuple_GET_ITEM(item, 1);
    *value = PyTuple_GET_ITEM(item, 2);
    if (!PyBytes_Check(*key) || !PyBytes_Check(*value))
        return 0;
    if (PyBytes_GET_SIZE(*key) + PyBytes_GET_SIZE(*value) > max_data)
        return 0;
    *timestamp_ms = as_long_long(PyTuple_GET_ITEM(item, 3));
    return 1;
}

/* produce_burst(parsed, headers, topic, max_data, runs, token) -> [(index, code)]: every
 * message of ``parsed`` (parse_any_partition_burst's list) of ``topic`` whose key and
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
    if (!PyList_Check(parsed) ||
        !(headers == Py_None || PyList_Check(headers) || PyTuple_Check(headers)) ||
        !PyList_Check(runs) || !PyUnicode_Check(topic)) {
        PyErr_SetString(PyExc_TypeError,
                        "produce_burst(list, list | tuple | None, str, int, list, int)");
        return NULL;
    }
    if (PyList_Check(headers) && PyList_GET_SIZE(headers) < PyList_GET_SIZE(parsed)) {
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
    Py_ssize_t run = -1;
    long long left_in_run = 0;
    int32_t partition = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parsed); i++) {
        PyObject *key, *value;
        long long timestamp_ms;
        if (!short_path_fields(PyList_GET_ITEM(parsed, i), topic, max_data, &key, &value,
                               &timestamp_ms))
            continue;
        if (timestamp_ms == -1 && PyErr_Occurred())
            goto fail;
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
        long err = produce_one(self, topic_name, partition, value,
                               PyBytes_GET_SIZE(key) ? key : Py_None,
                               timestamp_ms > 0 ? timestamp_ms : 0, message_headers, token,
                               Py_None, 1, 0);
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
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "burst_topics(parsed: list, max_data: int)");
        return NULL;
    }
    long long max_data = PyLong_AsLongLong(args[1]);
    if (max_data == -1 && PyErr_Occurred())
        return NULL;
    PyObject *topics[MAX_BURST_TOPICS];
    long long counts[MAX_BURST_TOPICS], data_bytes[MAX_BURST_TOPICS];
    int n_topics = 0, last = 0;
    PyObject *parsed = args[0];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parsed); i++) {
        PyObject *key, *value, *item = PyList_GET_ITEM(parsed, i);
        long long timestamp_ms;
        if (!short_path_fields(item, NULL, max_data, &key, &value, &timestamp_ms))
            continue;
        if (timestamp_ms == -1 && PyErr_Occurred())
            return NULL;
        PyObject *topic = PyTuple_GET_ITEM(item, 0);
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
        data_bytes[found] += PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(value);
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

/* Acknowledged messages of one (token, topic) within one event, summed. */
typedef struct {
    long long token;
    rd_kafka_topic_t *rkt;
    long long count;
    long long data_bytes; /* keys and values */
} ack_sum;

#define MAX_SUMS 32
#define MAX_EVENTS_PER_POLL 256

typedef struct {
    PyObject *acks;     /* [(token, topic, count, data_bytes)] */
    PyObject *each_ack; /* [(topic, partition, key, value, timestamp_ms, token)] or None */
    PyObject *failures; /* [(code, topic, partition, key, value, timestamp_ms, headers,
                           token, partition_key, attempt, maybe_in_kafka, status)] */
    PyObject *events;   /* [("stats", json) | ("error", code, text, fatal)
                           | ("log", level, facility, text)] */
    ack_sum sums[MAX_SUMS];
    int n_sums;
} poll_result;

static PyObject *
bytes_or_none(const void *data, size_t size)
{
    if (data == NULL)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
}


static int
flush_sums(poll_result *result)
{
    for (int i = 0; i < result->n_sums; i++) {
        ack_sum *sum = &result->sums[i];
        PyObject *item = Py_BuildValue("(LsLL)", sum->token, p_rd_kafka_topic_name(sum->rkt),
                                       sum->count, sum->data_bytes);
        if (append_new(result->acks, item) < 0)
            return -1;
    }
    result->n_sums = 0;
    return 0;
}

static int
add_to_sums(poll_result *result, const rd_kafka_message_t *message, long long token)
{
    for (int i = result->n_sums - 1; i >= 0; i--) {
        ack_sum *sum = &result->sums[i];
        if (sum->token == token && sum->rkt == message->rkt) {
            sum->count++;
            sum->data_bytes += (long long)(message->len + message->key_len);
            return 0;
        }
    }
    if (result->n_sums == MAX_SUMS && flush_sums(result) < 0)
        return -1;
    ack_sum *sum = &result->sums[result->n_sums++];
    sum->token = token;
    sum->rkt = message->rkt;
    sum->count = 1;
    sum->data_bytes = (long long)(message->len + message->key_len);
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
        PyObject *item = Py_BuildValue("(sN)", name, bytes_or_none(value, size));
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
    PyObject *item = Py_BuildValue(
        "(isiNNLNLNiOi)", (int)message->err, p_rd_kafka_topic_name(message->rkt),
        (int)message->partition, bytes_or_none(message->key, message->key_len),
        bytes_or_none(message->payload, message->len), state->timestamp_ms,
        headers_of(message), state->token, partition_key, state->attempt,
        state->maybe_in_kafka ? Py_True : Py_False, (int)p_rd_kafka_message_status(message));
    return append_new(result->failures, item);
}

static int
report_ack(poll_result *result, const rd_kafka_message_t *message, msg_state *state)
{
    if (result->each_ack == Py_None)
        return add_to_sums(result, message, state->token);
    PyObject *item = Py_BuildValue(
        "(siNNLL)", p_rd_kafka_topic_name(message->rkt), (int)message->partition,
        bytes_or_none(message->key, message->key_len),
        bytes_or_none(message->payload, message->len), state->timestamp_ms, state->token);
    return append_new(result->each_ack, item);
}

/* The messages of one delivery report event, taken out of it once (librdkafka's
 * iterator walks an event only once; the messages live until the event is destroyed). */
typedef struct {
    rd_kafka_event_t *event;
    const rd_kafka_message_t **messages; /* NULL for another event type */
    size_t count;
} served_event;

/* Report every message of a delivery report event. */
static int
serve_delivery_reports(poll_result *result, served_event *served)
{
    for (size_t i = 0; i < served->count; i++) {
        const rd_kafka_message_t *message = served->messages[i];
        msg_state *state = (msg_state *)message->_private;
        if (state == NULL)
            continue; /* not produced here: cannot happen, nothing to report */
        int rc = message->err ? report_failure(result, message, state)
                              : report_ack(result, message, state);
        if (rc < 0)
            return -1;
    }
    return flush_sums(result); /* before the event goes: a sum names its topic handle */
}

/* Free every message's state and the event: whatever happened while reporting. */
static void
release_event(served_event *served)
{
    for (size_t i = 0; i < served->count; i++)
        free(served->messages[i]->_private);
    free(served->messages);
    p_rd_kafka_event_destroy(served->event);
}

static int
serve_other_event(Producer *self, poll_result *result, rd_kafka_event_t *event)
{
    PyObject *item = NULL;
    switch (p_rd_kafka_event_type(event)) {
    case RD_KAFKA_EVENT_STATS:
        item = Py_BuildValue("(ss)", "stats", p_rd_kafka_event_stats(event));
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
        item = Py_BuildValue("(sisO)", "error", (int)code, text, fatal ? Py_True : Py_False);
        break;
    }
    case RD_KAFKA_EVENT_LOG: {
        const char *facility, *text;
        int level;
        if (p_rd_kafka_event_log(event, &facility, &text, &level) != 0)
            return 0;
        item = Py_BuildValue("(sisss)", "log", level, facility, p_rd_kafka_name(self->rk), text);
        break;
    }
    default:
        return 0;
    }
    return append_new(result->events, item);
}

/* poll(timeout_s, each_ack) -> (acks, each_ack, failures, events), or None if nothing
 * was ready. Waits up to timeout_s for the first event (without the GIL), then takes
 * what else is ready, at most MAX_EVENTS_PER_POLL events. Acknowledgements are summed
 * per (token, topic) unless each_ack is true or the poll also saw a failure: then each
 * comes back on its own (message debugging and the possible-duplicate window read them
 * one by one). */
static PyObject *
Producer_poll(Producer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "poll() takes 2 arguments");
        return NULL;
    }
    if (require_open(self) < 0)
        return NULL;
    double timeout_s = PyFloat_AsDouble(args[0]);
    int each_ack = PyObject_IsTrue(args[1]);
    if (PyErr_Occurred())
        return NULL;
    served_event events[MAX_EVENTS_PER_POLL];
    int n_events = 0;
    int timeout_ms = timeout_s > 0 ? (int)(timeout_s * 1000) : 0;
    rd_kafka_event_t *event;
    if (timeout_ms > 0) {
        Py_BEGIN_ALLOW_THREADS
        event = p_rd_kafka_queue_poll(self->queue, timeout_ms);
        Py_END_ALLOW_THREADS
    } else {
        event = p_rd_kafka_queue_poll(self->queue, 0);
    }
    if (event == NULL)
        Py_RETURN_NONE;
    int rc = 0;
    do {
        served_event *served = &events[n_events++];
        served->event = event;
        served->messages = NULL;
        served->count = 0;
        if (p_rd_kafka_event_type(event) != RD_KAFKA_EVENT_DR)
            continue;
        size_t count = p_rd_kafka_event_message_count(event);
        served->messages = malloc((count ? count : 1) * sizeof *served->messages);
        if (served->messages == NULL) {
            /* Nothing taken out: destroying the event frees its messages, not their
             * states (a leak of a few bytes each, under an out-of-memory error). */
            rc = -1;
            PyErr_NoMemory();
            break;
        }
        served->count = p_rd_kafka_event_message_array(event, served->messages, count);
        for (size_t i = 0; i < served->count && !each_ack; i++)
            each_ack = served->messages[i]->err != RD_KAFKA_RESP_ERR_NO_ERROR;
    } while (n_events < MAX_EVENTS_PER_POLL &&
             (event = p_rd_kafka_queue_poll(self->queue, 0)) != NULL);
    poll_result result = {0};
    result.acks = PyList_New(0);
    result.each_ack = each_ack ? PyList_New(0) : Py_NewRef(Py_None);
    result.failures = PyList_New(0);
    result.events = PyList_New(0);
    if (rc == 0 && !(result.acks && result.each_ack && result.failures && result.events))
        rc = -1;
    for (int i = 0; i < n_events; i++) {
        served_event *served = &events[i];
        if (rc == 0)
            rc = served->messages != NULL ? serve_delivery_reports(&result, served)
                                          : serve_other_event(self, &result, served->event);
        release_event(served);
    }
    if (rc < 0) {
        Py_XDECREF(result.acks);
        Py_XDECREF(result.each_ack);
        Py_XDECREF(result.failures);
        Py_XDECREF(result.events);
        return NULL;
    }
    return Py_BuildValue("(NNNN)", result.acks, result.each_ack, result.failures, result.events);
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

static PyObject *
Producer_close(Producer *self, PyObject *Py_UNUSED(ignored))
{
    Producer_close0(self);
    Py_RETURN_NONE;
}

static Py_ssize_t
Producer_len(Producer *self)
{
    return self->rk == NULL ? 0 : (Py_ssize_t)p_rd_kafka_outq_len(self->rk);
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
    .tp_as_sequence = &Producer_as_sequence,
};

static PyMethodDef module_methods[] = {
    {"burst_topics", (PyCFunction)(void (*)(void))burst_topics, METH_FASTCALL,
     "burst_topics(parsed, max_data) -> {topic: (count, data_bytes)} or None"},
    {"bind", bind_library, METH_O,
     "bind(path) -> version: resolve librdkafka's functions from the library at path"},
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
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Producer", (PyObject *)&ProducerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
