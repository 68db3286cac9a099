/*
 * pydory._cwire: the compiled twin of the hot part of pydory/wire.py (issue 25, step 1).
 *
 * Each piece has the same rule as its pure-Python reference, one call per read burst
 * instead of several Python calls per message:
 *
 *   StreamFramer   wire.StreamFramer's rule (cut a byte stream into frames by Size; an
 *                  oversized Size or a Size < 4 is a sticky fatal error), plus drain():
 *                  every whole frame held, as a list, in one call.
 *   DatagramReader recvmmsg(2): up to 64 datagrams per system call (Python's socket
 *                  module has none), each copied out as bytes, an oversized one as
 *                  (size, its first 64 bytes), as inputs/datagram.py's loop does; with
 *                  a max_size of 256 KiB or more, one at a time, its size peeked first,
 *                  a large one's memory taken when it arrives. read_runs(): the same,
 *                  with each datagram's sender (SCM_CREDENTIALS) as runs of one uid.
 *   StreamDrain    a thread of its own doing the UNIX stream connections' reads into a
 *                  bounded pool of chunks, each connection's bytes taken by the loop a
 *                  read's worth a turn (issue 34, lever 1, for the streams).
 *   parse_any_partition_burst(frames, topic_cache)
 *                  [wire.parse_any_partition(f) for f in frames], the topic looked up in
 *                  wire's cache of legal topics (the same dict), None for anything the
 *                  pure decode must judge.
 *   parse_burst(frames, topic_cache)
 *                  the same parses as a ParsedBurst (_cburst.h): no object per message;
 *                  burst[i] makes the tuple when asked, the compiled producer reads the
 *                  fields in place (issue 34, lever 2).
 *   identity_headers(name, prefix, first, count)
 *                  a burst's pydory-id headers (daemon/spool/identity.py forms the prefix):
 *                  [[(name, prefix + b"%d" % s)] for s in range(first, first + count)].
 *
 * The bytes parsed here come from clients: every length is checked against what is held
 * before it is read (the fuzzer, ./dev fuzz, holds it to "parse, or our protocol error,
 * never a crash"). The errors are pydory.errors' classes, made by calling them, so they
 * carry the same detail, prefix and size as the pure framer's.
 */
#define _GNU_SOURCE /* recvmmsg */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#if defined(__GLIBC__)
#include <malloc.h> /* malloc_trim */
#endif

#include "_cburst.h"

#define SIZE_FIELD 4
#define HEADER_SIZE 8
#define ANY_PARTITION_OVERHEAD 28
#define ANY_PARTITION_TOPIC_OFFSET 12
#define AFTER_TOPIC_SIZE 12
#define ANY_PARTITION_API_KEY 256
#define DEFAULT_PREFIX_SIZE 256
/* Above this capacity, a buffer holding little is shrunk when it waits for data, so an
 * idle connection keeps no more than wire.StreamFramer would. */
#define SHRINK_ABOVE (64 * 1024)

static PyObject *OversizedFrame;   /* pydory.errors.OversizedFrame */
static PyObject *MalformedMessage; /* pydory.errors.MalformedMessage */
static PyObject *NEED_DATA;        /* pydory.wire.NEED_DATA */
static PyObject *str_prefix, *str_size;

static inline int32_t read_i32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static inline int16_t read_i16(const unsigned char *p) {
    return (int16_t)(((uint16_t)p[0] << 8) | (uint16_t)p[1]);
}

static inline int64_t read_i64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return (int64_t)v;
}

/* --- StreamFramer ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    unsigned char *data; /* held bytes are data[start:end] */
    Py_ssize_t start, end, capacity;
    Py_ssize_t max_message_size;
    Py_ssize_t prefix_size;
    PyObject *error; /* the sticky fatal error, or NULL */
} Framer;

static int Framer_init(Framer *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"max_message_size", "prefix_size", NULL};
    Py_ssize_t max_message_size, prefix_size = DEFAULT_PREFIX_SIZE;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|n", names, &max_message_size,
                                     &prefix_size))
        return -1;
    if (max_message_size < SIZE_FIELD) {
        PyErr_Format(PyExc_ValueError, "max_message_size must be at least 4, got %zd",
                     max_message_size);
        return -1;
    }
    if (prefix_size < 0) {
        PyErr_Format(PyExc_ValueError, "prefix_size must not be negative, got %zd", prefix_size);
        return -1;
    }
    self->max_message_size = max_message_size;
    self->prefix_size = prefix_size;
    self->start = self->end = 0;
    Py_CLEAR(self->error);
    return 0;
}

/* The stored error may hold a traceback whose frames hold this framer: a cycle the
 * garbage collector must be able to see and break. */
static int Framer_traverse(Framer *self, visitproc visit, void *arg) {
    Py_VISIT(self->error);
    return 0;
}

static int Framer_clear(Framer *self) {
    Py_CLEAR(self->error);
    return 0;
}

static void Framer_dealloc(Framer *self) {
    PyObject_GC_UnTrack(self);
    Framer_clear(self);
    PyMem_Free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t held(Framer *self) { return self->end - self->start; }

static PyObject *held_prefix(Framer *self) {
    Py_ssize_t n = held(self) < self->prefix_size ? held(self) : self->prefix_size;
    return PyBytes_FromStringAndSize((const char *)self->data + self->start, n);
}

/* Make room for `extra` more bytes after end: move the held bytes to the front, grow. */
static int reserve(Framer *self, Py_ssize_t extra) {
    Py_ssize_t have = held(self);
    if (self->start > 0) {
        if (have) memmove(self->data, self->data + self->start, (size_t)have);
        self->start = 0;
        self->end = have;
    }
    if (have > PY_SSIZE_T_MAX - extra) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = have + extra;
    if (need <= self->capacity) return 0;
    Py_ssize_t capacity = self->capacity ? self->capacity : 4096;
    while (capacity < need) capacity = capacity > PY_SSIZE_T_MAX / 2 ? need : capacity * 2;
    unsigned char *data = PyMem_Realloc(self->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->data = data;
    self->capacity = capacity;
    return 0;
}

/* Waiting for data: the consumed bytes go (and a large buffer holding little shrinks). */
static void settle_held(Framer *self) {
    Py_ssize_t have = held(self);
    if (have == 0) {
        self->start = self->end = 0;
    }
    if (self->capacity > SHRINK_ABOVE && have < self->capacity / 4) {
        if (self->start && have) memmove(self->data, self->data + self->start, (size_t)have);
        self->start = 0;
        self->end = have;
        Py_ssize_t capacity = have > 4096 ? have : 4096;
        unsigned char *data = PyMem_Realloc(self->data, (size_t)capacity);
        if (data != NULL) { /* if not, keep the larger buffer: still correct */
            self->data = data;
            self->capacity = capacity;
        }
    }
}

static PyObject *Framer_feed(Framer *self, PyObject *arg) {
    if (self->error != NULL) Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len > 0) {
        if (reserve(self, view.len) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        memcpy(self->data + self->end, view.buf, (size_t)view.len);
        self->end += view.len;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* The fatal error of a frame announcing `size`, made by pydory.errors' classes. */
static PyObject *framing_error(Framer *self, int32_t size) {
    PyObject *prefix = held_prefix(self);
    if (prefix == NULL) return NULL;
    PyObject *error = NULL, *detail = NULL, *kwargs = NULL, *args = NULL;
    if (size > self->max_message_size) {
        detail = PyUnicode_FromFormat("Size %d exceeds the stream limit of %zd bytes", (int)size,
                                      self->max_message_size);
        kwargs = Py_BuildValue("{OOOi}", str_prefix, prefix, str_size, (int)size);
    } else {
        detail = PyUnicode_FromFormat(
            "Size %d is less than 4; the stream cannot be resynchronised", (int)size);
        kwargs = Py_BuildValue("{OO}", str_prefix, prefix);
    }
    if (detail != NULL && kwargs != NULL) args = PyTuple_Pack(1, detail);
    if (args != NULL)
        error = PyObject_Call(size > self->max_message_size ? OversizedFrame : MalformedMessage,
                              args, kwargs);
    Py_DECREF(prefix);
    Py_XDECREF(detail);
    Py_XDECREF(kwargs);
    Py_XDECREF(args);
    return error;
}

/* The next whole frame (a new reference), NEED_DATA (borrowed, not increfed: compare it),
 * or NULL with the error stored (sticky) and raised. */
static PyObject *cut_frame(Framer *self) {
    Py_ssize_t available = held(self);
    if (available < SIZE_FIELD) return NEED_DATA;
    int32_t size = read_i32(self->data + self->start);
    if (size > self->max_message_size || size < SIZE_FIELD) {
        PyObject *error = framing_error(self, size);
        if (error == NULL) return NULL;
        self->error = error;
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        return NULL;
    }
    if (available < size) return NEED_DATA;
    PyObject *frame = PyBytes_FromStringAndSize((const char *)self->data + self->start, size);
    if (frame != NULL) self->start += size;
    return frame;
}

static PyObject *raise_sticky(Framer *self) {
    PyObject *error = self->error;
    /* Raised again without its old traceback (as error.with_traceback(None) does). */
    PyException_SetTraceback(error, Py_None);
    PyErr_SetObject((PyObject *)Py_TYPE(error), error);
    return NULL;
}

static PyObject *Framer_next_frame(Framer *self, PyObject *Py_UNUSED(ignored)) {
    if (self->error != NULL) return raise_sticky(self);
    PyObject *frame = cut_frame(self);
    if (frame == NEED_DATA) {
        settle_held(self);
        return Py_NewRef(NEED_DATA);
    }
    return frame;
}

/* How many whole frames of sane size the held bytes begin with (what drain will cut
 * before it stops for data or a bad Size): the list is made that long at once. */
static Py_ssize_t whole_frames(Framer *self) {
    Py_ssize_t count = 0, at = self->start;
    while (self->end - at >= SIZE_FIELD) {
        int32_t size = read_i32(self->data + at);
        if (size > self->max_message_size || size < SIZE_FIELD || self->end - at < size) break;
        at += size;
        count++;
    }
    return count;
}

/* Every whole frame held, in a list sized once (appending a read's ~100-300 frames one by
 * one resized it about ten times, the larger resizes through malloc, each able to make
 * glibc consolidate its free chunks: ~70 instructions a message, issue 34). */
static PyObject *Framer_drain(Framer *self, PyObject *Py_UNUSED(ignored)) {
    if (self->error != NULL) return PyList_New(0);
    Py_ssize_t count = whole_frames(self);
    PyObject *frames = PyList_New(count);
    if (frames == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *frame = cut_frame(self); /* whole and of sane size: a frame or NULL */
        if (frame == NULL || frame == NEED_DATA) { /* out of memory (NEED_DATA: cannot be) */
            Py_DECREF(frames);
            return NULL;
        }
        PyList_SET_ITEM(frames, i, frame);
    }
    /* What follows: a partial frame (wait for data) or a bad Size (the error, kept). */
    PyObject *next = cut_frame(self);
    if (next == NEED_DATA) {
        settle_held(self);
        return frames;
    }
    if (next == NULL) {
        if (self->error == NULL) { /* not a framing error: out of memory */
            Py_DECREF(frames);
            return NULL;
        }
        PyErr_Clear(); /* the framing error is kept in .error, after these frames */
        return frames;
    }
    Py_DECREF(next); /* cannot happen: whole_frames counted every whole frame */
    Py_DECREF(frames);
    PyErr_SetString(PyExc_SystemError, "Framer.drain: a frame beyond those counted");
    return NULL;
}

static PyObject *Framer_unclean_remainder(Framer *self, PyObject *Py_UNUSED(ignored)) {
    return held_prefix(self);
}

static PyObject *Framer_get_buffered(Framer *self, void *Py_UNUSED(closure)) {
    return PyLong_FromSsize_t(held(self));
}

static PyObject *Framer_get_error(Framer *self, void *Py_UNUSED(closure)) {
    return Py_NewRef(self->error != NULL ? self->error : Py_None);
}

static PyObject *Framer_get_max(Framer *self, void *Py_UNUSED(closure)) {
    return PyLong_FromSsize_t(self->max_message_size);
}

static PyObject *Framer_get_prefix_size(Framer *self, void *Py_UNUSED(closure)) {
    return PyLong_FromSsize_t(self->prefix_size);
}

static PyMethodDef Framer_methods[] = {
    {"feed", (PyCFunction)Framer_feed, METH_O, "Append bytes received from the stream."},
    {"next_frame", (PyCFunction)Framer_next_frame, METH_NOARGS,
     "The next whole frame, or NEED_DATA; raises a fatal framing error (sticky)."},
    {"drain", (PyCFunction)Framer_drain, METH_NOARGS,
     "Every whole frame held, in order, up to a fatal framing error (then kept in .error)."},
    {"unclean_remainder", (PyCFunction)Framer_unclean_remainder, METH_NOARGS,
     "At end of stream: the first prefix_size bytes of the partial frame held."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Framer_getset[] = {
    {"buffered", (getter)Framer_get_buffered, NULL, "Bytes received, not yet a frame.", NULL},
    {"error", (getter)Framer_get_error, NULL, "The fatal framing error, or None.", NULL},
    {"max_message_size", (getter)Framer_get_max, NULL, "The stream's largest Size.", NULL},
    {"prefix_size", (getter)Framer_get_prefix_size, NULL, "Bytes of prefix in errors.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FramerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pydory._cwire.StreamFramer",
    .tp_basicsize = sizeof(Framer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Framer_traverse,
    .tp_clear = (inquiry)Framer_clear,
    .tp_doc = "wire.StreamFramer's rule in C: cuts a client byte stream into frames by Size.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Framer_init,
    .tp_dealloc = (destructor)Framer_dealloc,
    .tp_methods = Framer_methods,
    .tp_getset = Framer_getset,
};

/* --- DatagramReader ---------------------------------------------------------------------- */

/* Datagrams per recvmmsg call. With max_size < SLOT_BYTES each slot has a buffer of
 * max_size + 1 bytes (one more tells an oversized datagram apart, as recv_into's does):
 * at most 64 * SLOT_BYTES reserved, only the pages datagrams reach resident. A larger
 * max_size reads one datagram at a time instead: its size peeked (MSG_PEEK | MSG_TRUNC
 * into one buffer of SLOT_BYTES, which holds a small one whole), a larger one received
 * straight into a bytes object of its own size, allocated when it arrives and owned by
 * the message from then on; so no memory is held for large datagrams while none come,
 * and every max_size the config accepts (1 .. INT32_MAX) is honoured. */
#define DATAGRAM_SLOTS 64
#define SLOT_BYTES (256 * 1024)
#define OVERSIZED_PREFIX 64
#define MAX_SIZE_LIMIT 0x7fffffffL

/* Each datagram's sender (issue 33, point 1: every client's share of the pool, on every
 * transport): with SO_PASSCRED on the socket, recvmmsg gets each one's SCM_CREDENTIALS
 * into a small control buffer per slot, and the reads hand on, beside the items, their
 * runs of one sender: [(uid or None, end)], each run ending before items[end], in the
 * order read; so Python walks one run per sender change, never one uid per datagram. */
#define NO_UID 0xffffffffu /* no SCM_CREDENTIALS with it (or not asked) */
#define CREDENTIALS_CONTROL_BYTES CMSG_SPACE(sizeof(struct ucred))

typedef union { /* aligned as a cmsghdr */
    struct cmsghdr align;
    unsigned char bytes[CREDENTIALS_CONTROL_BYTES];
} CredentialsControl;

/* The sender's uid in a datagram's ancillary data (SCM_CREDENTIALS), or NO_UID. */
static uint32_t control_uid(struct msghdr *header) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(header); c != NULL; c = CMSG_NXTHDR(header, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            struct ucred credentials;
            memcpy(&credentials, CMSG_DATA(c), sizeof credentials);
            return (uint32_t)credentials.uid;
        }
    }
    return NO_UID;
}

/* Appends the run (uid, or None for NO_UID; end) to the list `runs`; -1: an error is set. */
static int append_run(PyObject *runs, uint32_t uid, Py_ssize_t end) {
    PyObject *sender = uid == NO_UID ? Py_NewRef(Py_None) : PyLong_FromUnsignedLong(uid);
    if (sender == NULL) return -1;
    PyObject *run = Py_BuildValue("(Nn)", sender, end);
    if (run == NULL) return -1;
    int failed = PyList_Append(runs, run);
    Py_DECREF(run);
    return failed;
}

/* Cuts runs as items are added: the uid of item `index` (items before it already seen). */
typedef struct {
    uint32_t uid;
} RunCutter;

static int run_next(RunCutter *cutter, PyObject *runs, Py_ssize_t index, uint32_t uid) {
    if (index > 0 && uid != cutter->uid && append_run(runs, cutter->uid, index) < 0) return -1;
    cutter->uid = uid;
    return 0;
}

static int run_end(RunCutter *cutter, PyObject *runs, Py_ssize_t count) {
    return count > 0 ? append_run(runs, cutter->uid, count) : 0;
}

typedef struct {
    PyObject_HEAD
    int fd;
    Py_ssize_t max_size;
    int one_at_a_time;      /* max_size >= SLOT_BYTES: peek each datagram's size */
    size_t slot_bytes;      /* each slot's buffer */
    unsigned char *buffers; /* DATAGRAM_SLOTS slots, or one when one_at_a_time */
    int credentials;        /* each datagram's SCM_CREDENTIALS asked for (recvmmsg, or the peek) */
    struct mmsghdr messages[DATAGRAM_SLOTS];
    struct iovec vectors[DATAGRAM_SLOTS];
    CredentialsControl control[DATAGRAM_SLOTS];
} DatagramReader;

static int Reader_init(DatagramReader *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"fd", "max_size", "credentials", NULL};
    int fd, credentials = 0;
    Py_ssize_t max_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "in|p", names, &fd, &max_size, &credentials))
        return -1;
    if (max_size < 1 || max_size > MAX_SIZE_LIMIT) {
        PyErr_Format(PyExc_ValueError, "max_size must be 1..%ld, got %zd", MAX_SIZE_LIMIT,
                     max_size);
        return -1;
    }
    int one_at_a_time = max_size >= SLOT_BYTES;
    size_t slot_bytes = one_at_a_time ? (size_t)SLOT_BYTES : (size_t)max_size + 1;
    size_t slots = one_at_a_time ? 1 : DATAGRAM_SLOTS;
    PyMem_Free(self->buffers);
    self->buffers = PyMem_Malloc(slots * slot_bytes);
    if (self->buffers == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->fd = fd;
    self->max_size = max_size;
    self->one_at_a_time = one_at_a_time;
    self->slot_bytes = slot_bytes;
    self->credentials = credentials;
    for (size_t i = 0; i < slots; i++) {
        self->vectors[i].iov_base = self->buffers + i * slot_bytes;
        self->vectors[i].iov_len = slot_bytes;
    }
    return 0;
}

static void Reader_dealloc(DatagramReader *self) {
    PyMem_Free(self->buffers);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* An oversized datagram as the reader hands it on: (size, at most OVERSIZED_PREFIX of the
 * `held` bytes a buffer kept of it). */
static PyObject *oversized_item(Py_ssize_t size, const char *data, Py_ssize_t held) {
    return Py_BuildValue("(ny#)", size, data, held < OVERSIZED_PREFIX ? held : OVERSIZED_PREFIX);
}

/* One datagram as the reader hands it on: bytes, or (size, prefix) when oversized. */
static PyObject *datagram_item(DatagramReader *self, int slot) {
    const char *data = self->vectors[slot].iov_base;
    Py_ssize_t size = (Py_ssize_t)self->messages[slot].msg_len; /* MSG_TRUNC: the true size */
    if (size <= self->max_size) return PyBytes_FromStringAndSize(data, size);
    return oversized_item(size, data, (Py_ssize_t)self->slot_bytes);
}

/* recv(2) that retries on EINTR (PEP 475); -1 with errno otherwise. -2: a signal handler
 * raised (the Python error is set). */
static Py_ssize_t recv_retrying(int fd, void *buffer, size_t length, int flags) {
    for (;;) {
        Py_ssize_t got = recv(fd, buffer, length, flags | MSG_DONTWAIT);
        if (got >= 0 || errno != EINTR) return got;
        if (PyErr_CheckSignals() < 0) return -2;
    }
}

/* recv_retrying's MSG_PEEK | MSG_TRUNC with the datagram's SCM_CREDENTIALS: the kernel
 * gives a peek the datagram's own credentials, and nothing else reads the socket between
 * this peek and the read that consumes the datagram. *uid: its sender, or NO_UID. */
static Py_ssize_t peek_named(DatagramReader *self, void *buffer, size_t length,
                             uint32_t *uid) {
    struct iovec vector = {buffer, length};
    for (;;) {
        struct msghdr header = {.msg_iov = &vector, .msg_iovlen = 1};
        header.msg_control = self->control[0].bytes;
        header.msg_controllen = sizeof self->control[0].bytes;
        Py_ssize_t got = recvmsg(self->fd, &header, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
        if (got >= 0) {
            *uid = control_uid(&header);
            return got;
        }
        if (errno != EINTR) return got;
        if (PyErr_CheckSignals() < 0) return -2;
    }
}

/* The next datagram, one_at_a_time: its size peeked; small, already copied by the peek
 * and then dropped from the queue; up to max_size, received into a bytes object of its
 * own size; larger, consumed as (size, prefix). With `uid`, its sender is named by the
 * peek (peek_named). NULL with *again = 1 on EAGAIN (no Python error); NULL otherwise: a
 * Python error is set. */
static PyObject *read_one(DatagramReader *self, int *again, uint32_t *uid) {
    unsigned char *buffer = self->buffers;
    size_t held = self->slot_bytes;
    *again = 0;
    Py_ssize_t size = uid != NULL ? peek_named(self, buffer, held, uid)
                                  : recv_retrying(self->fd, buffer, held, MSG_PEEK | MSG_TRUNC);
    if (size == -2) return NULL;
    if (size < 0) goto os_error;
    if ((size_t)size < held) { /* whole in the buffer: drop it from the queue */
        if (recv_retrying(self->fd, buffer, 0, MSG_TRUNC) < 0) goto os_error_or_signal;
        return PyBytes_FromStringAndSize((const char *)buffer, size);
    }
    if (size <= self->max_size) {
        PyObject *data = PyBytes_FromStringAndSize(NULL, size);
        if (data != NULL) {
            Py_ssize_t got = recv_retrying(self->fd, PyBytes_AS_STRING(data), (size_t)size, 0);
            if (got == size) return data;
            Py_DECREF(data);
            if (got < 0) goto os_error_or_signal;
            PyErr_Format(PyExc_OSError, "a datagram of %zd bytes read as %zd", size, got);
            return NULL;
        }
        /* No memory for it now: it is consumed and reported as too large, not left to be
         * met again on every turn of the loop. */
        PyErr_Clear();
    }
    Py_ssize_t got = recv_retrying(self->fd, buffer, held, MSG_TRUNC);
    if (got < 0) goto os_error_or_signal;
    return oversized_item(got, (const char *)buffer, (Py_ssize_t)held);
os_error_or_signal:
    if (PyErr_Occurred()) return NULL;
os_error:
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *again = 1;
        return NULL;
    }
    PyErr_SetFromErrno(PyExc_OSError);
    return NULL;
}

/* read_one's loop for read(): the same (items, oversized, drained) contract; `runs`, if
 * not NULL, gets the items' runs of one sender, as recvmmsg's reads cut them (each
 * sender named by its datagram's peek when credentials are asked for). */
static PyObject *read_one_at_a_time(DatagramReader *self, Py_ssize_t limit, PyObject *runs) {
    PyObject *items = PyList_New(0);
    if (items == NULL) return NULL;
    int oversized = 0, drained = 0;
    int credentials = self->credentials && runs != NULL;
    RunCutter cutter = {NO_UID};
    while (PyList_GET_SIZE(items) < limit) {
        int again;
        uint32_t uid = NO_UID;
        PyObject *item = read_one(self, &again, credentials ? &uid : NULL);
        if (item == NULL) {
            if (again) {
                drained = 1;
                break;
            }
            if (PyList_GET_SIZE(items) > 0 && PyErr_ExceptionMatches(PyExc_OSError)) {
                PyErr_Clear(); /* what was read goes on; the error comes back next time */
                break;
            }
            Py_DECREF(items);
            return NULL;
        }
        oversized |= !PyBytes_CheckExact(item);
        int failed = (runs != NULL && run_next(&cutter, runs, PyList_GET_SIZE(items), uid) < 0) ||
                     PyList_Append(items, item) < 0;
        Py_DECREF(item);
        if (failed) {
            Py_DECREF(items);
            return NULL;
        }
    }
    if (runs != NULL && run_end(&cutter, runs, PyList_GET_SIZE(items)) < 0) {
        Py_DECREF(items);
        return NULL;
    }
    return Py_BuildValue("(NOO)", items, oversized ? Py_True : Py_False,
                         drained ? Py_True : Py_False);
}

/* read(limit) -> (items, oversized, drained): up to `limit` datagrams in arrival order;
 * `oversized`: whether any item is a (size, prefix) tuple; `drained`: a read found the
 * queue empty (EAGAIN). An error other than EAGAIN/EINTR raises OSError if nothing was
 * read, else ends the burst (the next read meets it again). With `runs` (a list), each
 * item's sender's runs are appended to it (read_runs). */
static PyObject *read_batch(DatagramReader *self, PyObject *arg, PyObject *runs) {
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "limit must not be negative");
        return NULL;
    }
    if (self->buffers == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "DatagramReader was not initialised");
        return NULL;
    }
    if (self->one_at_a_time) return read_one_at_a_time(self, limit, runs);
    PyObject *items = PyList_New(0);
    if (items == NULL) return NULL;
    int oversized = 0, drained = 0;
    Py_ssize_t read = 0;
    RunCutter cutter = {NO_UID};
    int credentials = self->credentials && runs != NULL;
    while (read < limit) {
        unsigned int want = (unsigned int)(limit - read < DATAGRAM_SLOTS ? limit - read
                                                                          : DATAGRAM_SLOTS);
        for (unsigned int i = 0; i < want; i++) {
            memset(&self->messages[i].msg_hdr, 0, sizeof(struct msghdr));
            self->messages[i].msg_hdr.msg_iov = &self->vectors[i];
            self->messages[i].msg_hdr.msg_iovlen = 1;
            if (credentials) {
                self->messages[i].msg_hdr.msg_control = self->control[i].bytes;
                self->messages[i].msg_hdr.msg_controllen = sizeof self->control[i].bytes;
            }
        }
        int got = recvmmsg(self->fd, self->messages, want, MSG_DONTWAIT | MSG_TRUNC, NULL);
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                drained = 1;
                break;
            }
            if (errno == EINTR) { /* as Python's socket calls do (PEP 475): retry */
                if (PyErr_CheckSignals() < 0) goto fail;
                continue;
            }
            if (read > 0) break; /* what was read goes on; the error comes back next time */
            PyErr_SetFromErrno(PyExc_OSError);
            goto fail;
        }
        for (int i = 0; i < got; i++) {
            if (runs != NULL) {
                uint32_t uid = credentials ? control_uid(&self->messages[i].msg_hdr) : NO_UID;
                if (run_next(&cutter, runs, read + i, uid) < 0) goto fail;
            }
            PyObject *item = datagram_item(self, i);
            if (item == NULL || PyList_Append(items, item) < 0) {
                Py_XDECREF(item);
                goto fail;
            }
            oversized |= !PyBytes_CheckExact(item);
            Py_DECREF(item);
        }
        /* Fewer than asked means the queue is likely empty, but only EAGAIN says so: the
         * commit point counts a datagram input read when a read found it empty
         * (times_drained), as the recv_into loop does. */
        read += got;
    }
    if (runs != NULL && run_end(&cutter, runs, read) < 0) goto fail;
    return Py_BuildValue("(NOO)", items, oversized ? Py_True : Py_False,
                         drained ? Py_True : Py_False);
fail:
    Py_DECREF(items);
    return NULL;
}

static PyObject *Reader_read(DatagramReader *self, PyObject *arg) {
    return read_batch(self, arg, NULL);
}

/* read_runs(limit) -> (items, oversized, drained, runs): read()'s, with the items' runs of
 * one sender, [(uid or None, end)] (None: no credentials came with it, or the reader was
 * made without them, or reads one datagram at a time). */
static PyObject *Reader_read_runs(DatagramReader *self, PyObject *arg) {
    PyObject *runs = PyList_New(0);
    if (runs == NULL) return NULL;
    PyObject *read = read_batch(self, arg, runs);
    if (read == NULL) {
        Py_DECREF(runs);
        return NULL;
    }
    PyObject *result = Py_BuildValue("(OOON)", PyTuple_GET_ITEM(read, 0),
                                     PyTuple_GET_ITEM(read, 1), PyTuple_GET_ITEM(read, 2), runs);
    Py_DECREF(read);
    return result;
}

static PyMethodDef Reader_methods[] = {
    {"read", (PyCFunction)Reader_read, METH_O,
     "read(limit) -> (items, oversized, drained): up to limit datagrams, recvmmsg(2)."},
    {"read_runs", (PyCFunction)Reader_read_runs, METH_O,
     "read_runs(limit) -> (items, oversized, drained, runs): read()'s, with the runs of one "
     "sender [(uid or None, end)]."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pydory._cwire.DatagramReader",
    .tp_basicsize = sizeof(DatagramReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reads a non-blocking datagram socket many datagrams per system call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
};

/* --- DatagramDrain ----------------------------------------------------------------------- */

/* A thread of its own that empties a datagram socket's kernel queue into bursts held in C
 * (issue 34, lever 1), so that a loop thread off the CPU no longer leaves the kernel's
 * queue (max_dgram_qlen: ~11 datagrams) to fill and block the senders, and the loop takes
 * hundreds of datagrams per wake-up instead of 11-16.
 *
 * The thread never touches a Python object and never takes the GIL: it loops on
 * recvmmsg(MSG_DONTWAIT) into DATAGRAM_SLOTS scratch slots (each max_size + 1 bytes, as
 * DatagramReader's), copies each datagram into the burst it fills (a record of its true
 * size, the bytes kept, its sender's uid when SO_PASSCRED is on and the drain was made
 * with credentials, the bytes), and, when the queue is empty (EAGAIN), waits in poll(2)
 * on the socket and a stop eventfd. A ring of DRAIN_BURSTS bursts, each closed at
 * burst_datagrams datagrams or DRAIN_BURST_BYTES bytes; with every burst of the ring full
 * (the loop has not taken them) the thread stops reading and the kernel's queue backs up,
 * as it does when a loop reader is slow: the senders meet a full queue. So what the thread
 * holds is bounded: DRAIN_BURSTS * (DRAIN_BURST_BYTES + one slot) plus the scratch slots.
 *
 * The loop is told through an eventfd (wake_fd, for loop.add_reader): written when a burst
 * gets its first datagram (or an error is met); take() reads it first, then hands over the
 * oldest burst as DatagramReader.read's items (bytes, or (size, prefix) for an oversized
 * one), one burst per call (at most burst_datagrams: the loop's fairness per turn stays),
 * and writes it again when more bursts wait. stop() ends and joins the thread; what it
 * read stays for take() (nothing read is dropped). Counters (recvmmsg calls, datagrams,
 * empty queues, waits for room, takes) are for the benchmarks and the commit point. */
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* The ring's bursts: exported as the module's DRAIN_BURSTS (what a SIGKILL can lose beyond
 * the kernel's queue is counted from it: tests/test_spool_daemon.py's bound, the status
 * page's datagram_input.ring); a -D may choose another for a benchmark's build. */
#ifndef DRAIN_BURSTS
#define DRAIN_BURSTS 4
#endif
#if DRAIN_BURSTS < 2 /* the thread fills one burst while the loop takes another */
#error "DRAIN_BURSTS must be at least 2"
#endif
#define DRAIN_BURST_BYTES (1024 * 1024)
#define DRAIN_RECORD_HEAD 12 /* u32 true size, u32 bytes kept, u32 sender's uid */
#define DRAIN_NO_UID NO_UID

typedef struct {
    unsigned char *bytes; /* malloc'd (the thread has no GIL for PyMem) */
    size_t used, capacity;
    Py_ssize_t count;
    int oversized;
    int busy; /* the loop is turning it into Python objects */
    unsigned long long empties_at_start; /* empties when its first datagram was read */
} DrainBurst;

typedef struct {
    PyObject_HEAD
    int fd, wake_fd, stop_fd;
    Py_ssize_t max_size;
    size_t slot_bytes;
    Py_ssize_t burst_datagrams;
    int credentials; /* SO_PASSCRED is on: each datagram's sender's uid is kept */
    unsigned char *slots;
    struct mmsghdr messages[DATAGRAM_SLOTS];
    struct iovec vectors[DATAGRAM_SLOTS];
    CredentialsControl control[DATAGRAM_SLOTS];
    pthread_t thread;
    int started, joined;
    pthread_mutex_t lock;
    pthread_cond_t room;
    int lock_ready;
    /* Under lock: */
    DrainBurst ring[DRAIN_BURSTS];
    int head, tail; /* the thread fills ring[head]; the loop takes ring[tail] */
    int stopping;
    int error;             /* an errno the loop has not been told of */
    unsigned int in_flight; /* a recvmmsg's most, read but not yet in a burst */
    unsigned long long empties, calls, datagrams, waits, takes, lost;
} DatagramDrain;

static int burst_full(const DatagramDrain *self, const DrainBurst *burst) {
    return burst->count >= self->burst_datagrams || burst->used >= DRAIN_BURST_BYTES;
}

static void wake_loop(DatagramDrain *self) {
    uint64_t one = 1;
    ssize_t ignored = write(self->wake_fd, &one, sizeof one); /* EAGAIN: already awake */
    (void)ignored;
}

/* The burst the thread fills now, moving on from a full one when the next is free; NULL
 * when every burst is full or being taken (under lock). */
static DrainBurst *burst_to_fill(DatagramDrain *self) {
    DrainBurst *burst = &self->ring[self->head];
    if (!burst_full(self, burst) && !burst->busy) return burst;
    int next = (self->head + 1) % DRAIN_BURSTS;
    if (self->ring[next].count > 0 || self->ring[next].busy) return NULL;
    if (burst->count > 0 || burst->busy) self->head = next;
    return &self->ring[self->head];
}

/* How many datagrams the next recvmmsg may bring into `burst`: its room in datagrams and
 * in bytes (at least one). */
static unsigned int drain_want(const DatagramDrain *self, const DrainBurst *burst) {
    Py_ssize_t room = self->burst_datagrams - burst->count;
    size_t by_bytes = (DRAIN_BURST_BYTES - burst->used) / (self->slot_bytes + DRAIN_RECORD_HEAD);
    if ((Py_ssize_t)by_bytes < room) room = (Py_ssize_t)by_bytes;
    if (room > DATAGRAM_SLOTS) room = DATAGRAM_SLOTS;
    return room < 1 ? 1u : (unsigned int)room;
}

/* The sender's uid in slot i's ancillary data (SCM_CREDENTIALS), or DRAIN_NO_UID. */
static uint32_t slot_uid(DatagramDrain *self, int i) {
    return self->credentials ? control_uid(&self->messages[i].msg_hdr) : DRAIN_NO_UID;
}

/* Copies the `got` datagrams of the scratch slots into `burst` (under lock); -1: no memory
 * (nothing copied). */
static int drain_append(DatagramDrain *self, DrainBurst *burst, int got) {
    size_t need = burst->used;
    for (int i = 0; i < got; i++) {
        size_t size = self->messages[i].msg_len;
        need += DRAIN_RECORD_HEAD + (size < self->slot_bytes ? size : self->slot_bytes);
    }
    if (need > burst->capacity) {
        size_t capacity = need > DRAIN_BURST_BYTES / 16 ? need : DRAIN_BURST_BYTES / 16;
        unsigned char *bytes = realloc(burst->bytes, capacity);
        if (bytes == NULL) return -1;
        burst->bytes = bytes, burst->capacity = capacity;
    }
    if (burst->count == 0) burst->empties_at_start = self->empties;
    for (int i = 0; i < got; i++) {
        uint32_t size = self->messages[i].msg_len; /* MSG_TRUNC: the true size */
        uint32_t kept = size < self->slot_bytes ? size : (uint32_t)self->slot_bytes;
        if ((Py_ssize_t)size > self->max_size) {
            kept = kept < OVERSIZED_PREFIX ? kept : OVERSIZED_PREFIX;
            burst->oversized = 1;
        }
        unsigned char *at = burst->bytes + burst->used;
        uint32_t uid = slot_uid(self, i);
        memcpy(at, &size, 4);
        memcpy(at + 4, &kept, 4);
        memcpy(at + 8, &uid, 4);
        memcpy(at + DRAIN_RECORD_HEAD, self->vectors[i].iov_base, kept);
        burst->used += DRAIN_RECORD_HEAD + kept;
    }
    burst->count += got;
    return 0;
}

static void *drain_main(void *arg) {
    DatagramDrain *self = arg;
    struct pollfd watch[2] = {{.fd = self->fd, .events = POLLIN},
                              {.fd = self->stop_fd, .events = POLLIN}};
    pthread_mutex_lock(&self->lock);
    for (;;) {
        DrainBurst *burst = NULL;
        while (!self->stopping && (self->error || (burst = burst_to_fill(self)) == NULL)) {
            self->waits++;
            pthread_cond_wait(&self->room, &self->lock);
        }
        if (self->stopping) break;
        unsigned int want = drain_want(self, burst);
        self->in_flight = want;
        pthread_mutex_unlock(&self->lock);
        for (unsigned int i = 0; i < want; i++) {
            memset(&self->messages[i].msg_hdr, 0, sizeof(struct msghdr));
            self->messages[i].msg_hdr.msg_iov = &self->vectors[i];
            self->messages[i].msg_hdr.msg_iovlen = 1;
            if (self->credentials) {
                self->messages[i].msg_hdr.msg_control = self->control[i].bytes;
                self->messages[i].msg_hdr.msg_controllen = sizeof self->control[i].bytes;
            }
        }
        int got = recvmmsg(self->fd, self->messages, want, MSG_DONTWAIT | MSG_TRUNC, NULL);
        int failure = got < 0 ? errno : 0;
        if (failure == EAGAIN || failure == EWOULDBLOCK) {
            pthread_mutex_lock(&self->lock);
            self->in_flight = 0;
            self->empties++;
            pthread_mutex_unlock(&self->lock);
            while (poll(watch, 2, -1) < 0 && errno == EINTR) {
            }
            pthread_mutex_lock(&self->lock);
            continue;
        }
        pthread_mutex_lock(&self->lock);
        self->in_flight = 0;
        if (failure == EINTR) continue;
        if (failure == 0) {
            self->calls++;
            /* take() may have taken the burst meanwhile: then it moved head on to an
             * empty one. ring[head] is never busy and has room for `want`. */
            burst = &self->ring[self->head];
            if (drain_append(self, burst, got) == 0) {
                self->datagrams += (unsigned long long)got;
                if (burst->count == got) wake_loop(self);
                continue;
            }
            self->lost += (unsigned long long)got; /* consumed: counted, the loop told */
            failure = ENOMEM;
        }
        self->error = failure; /* waits (above) until the loop has taken it */
        wake_loop(self);
    }
    pthread_mutex_unlock(&self->lock);
    return NULL;
}

static void drain_stop(DatagramDrain *self) {
    if (!self->started || self->joined) return;
    pthread_mutex_lock(&self->lock);
    self->stopping = 1;
    pthread_cond_signal(&self->room);
    pthread_mutex_unlock(&self->lock);
    uint64_t one = 1;
    ssize_t ignored = write(self->stop_fd, &one, sizeof one);
    (void)ignored;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->joined = 1;
}

static void drain_free(DatagramDrain *self) {
    for (int i = 0; i < DRAIN_BURSTS; i++) {
        free(self->ring[i].bytes);
        self->ring[i] = (DrainBurst){0};
    }
    PyMem_Free(self->slots);
    self->slots = NULL;
    if (self->wake_fd >= 0) close(self->wake_fd);
    if (self->stop_fd >= 0) close(self->stop_fd);
    self->wake_fd = self->stop_fd = -1;
}

static PyObject *Drain_new(PyTypeObject *type, PyObject *Py_UNUSED(args),
                           PyObject *Py_UNUSED(kwargs)) {
    DatagramDrain *self = (DatagramDrain *)type->tp_alloc(type, 0);
    if (self != NULL) self->fd = self->wake_fd = self->stop_fd = -1;
    return (PyObject *)self;
}

static int Drain_init(DatagramDrain *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"fd", "max_size", "burst_datagrams", "credentials", NULL};
    int fd, credentials = 0;
    Py_ssize_t max_size, burst_datagrams = 512;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "in|np", names, &fd, &max_size,
                                     &burst_datagrams, &credentials))
        return -1;
    if (self->slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a DatagramDrain is initialised once");
        return -1;
    }
    if (max_size < 1 || max_size >= SLOT_BYTES) {
        PyErr_Format(PyExc_ValueError, "max_size must be 1..%d, got %zd", SLOT_BYTES - 1,
                     max_size);
        return -1;
    }
    if (burst_datagrams < 1 || burst_datagrams > 1 << 20) {
        PyErr_Format(PyExc_ValueError, "burst_datagrams must be 1..%d, got %zd", 1 << 20,
                     burst_datagrams);
        return -1;
    }
    self->fd = fd;
    self->max_size = max_size;
    self->slot_bytes = (size_t)max_size + 1;
    self->burst_datagrams = burst_datagrams;
    self->credentials = credentials;
    self->slots = PyMem_Malloc(DATAGRAM_SLOTS * self->slot_bytes);
    if (self->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < DATAGRAM_SLOTS; i++) {
        self->vectors[i].iov_base = self->slots + i * self->slot_bytes;
        self->vectors[i].iov_len = self->slot_bytes;
    }
    self->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    self->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->wake_fd < 0 || self->stop_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (pthread_mutex_init(&self->lock, NULL) != 0 || pthread_cond_init(&self->room, NULL) != 0) {
        PyErr_SetString(PyExc_OSError, "cannot make the drain's lock");
        return -1;
    }
    self->lock_ready = 1;
    return 0;
}

static void Drain_dealloc(DatagramDrain *self) {
    drain_stop(self);
    drain_free(self);
    if (self->lock_ready) {
        pthread_mutex_destroy(&self->lock);
        pthread_cond_destroy(&self->room);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Drain_start(DatagramDrain *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->lock_ready || self->started) {
        PyErr_SetString(PyExc_RuntimeError, "a DatagramDrain is started once, when initialised");
        return NULL;
    }
    int failed = pthread_create(&self->thread, NULL, drain_main, self);
    if (failed != 0) {
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    /* Named, so per-thread counts (perf stat --per-thread, top -H) tell it from the loop. */
    (void)pthread_setname_np(self->thread, "pydory-drain");
    self->started = 1;
    Py_RETURN_NONE;
}

static PyObject *Drain_stop(DatagramDrain *self, PyObject *Py_UNUSED(ignored)) {
    drain_stop(self);
    Py_RETURN_NONE;
}

/* The items of `burst` (taken: the thread does not touch it), and into *runs (when not
 * NULL) a list of their runs of one sender, [(uid or None, end)]. */
static PyObject *burst_items(DrainBurst *burst, Py_ssize_t max_size, PyObject **runs) {
    PyObject *items = PyList_New(burst->count);
    if (items == NULL) return NULL;
    if (runs != NULL && (*runs = PyList_New(0)) == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    RunCutter cutter = {DRAIN_NO_UID};
    const unsigned char *at = burst->bytes;
    for (Py_ssize_t i = 0; i < burst->count; i++) {
        uint32_t size, kept, uid;
        memcpy(&size, at, 4);
        memcpy(&kept, at + 4, 4);
        memcpy(&uid, at + 8, 4);
        if (runs != NULL && run_next(&cutter, *runs, i, uid) < 0) {
            Py_DECREF(items);
            Py_CLEAR(*runs);
            return NULL;
        }
        const char *data = (const char *)at + DRAIN_RECORD_HEAD;
        PyObject *item = (Py_ssize_t)size <= max_size
                             ? PyBytes_FromStringAndSize(data, kept)
                                      : Py_BuildValue("(ny#)", (Py_ssize_t)size, data,
                                                      (Py_ssize_t)kept);
        if (item == NULL) {
            Py_DECREF(items);
            if (runs != NULL) Py_CLEAR(*runs);
            return NULL;
        }
        PyList_SET_ITEM(items, i, item);
        at += DRAIN_RECORD_HEAD + kept;
    }
    if (runs != NULL && run_end(&cutter, *runs, burst->count) < 0) {
        Py_DECREF(items);
        Py_CLEAR(*runs);
        return NULL;
    }
    return items;
}

/* take() -> (items, oversized, error, runs): the oldest burst (DatagramReader.read's
 * items), an errno the thread met (0: none; it reads again once told), and the items' runs
 * of one sender, [(uid or None, end)] (made with credentials only, else None). */
static PyObject *Drain_take(DatagramDrain *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->lock_ready) {
        PyErr_SetString(PyExc_RuntimeError, "DatagramDrain was not initialised");
        return NULL;
    }
    uint64_t ignored_count;
    ssize_t ignored = read(self->wake_fd, &ignored_count, sizeof ignored_count);
    (void)ignored;
    pthread_mutex_lock(&self->lock);
    DrainBurst *burst = &self->ring[self->tail];
    int error = self->error;
    self->error = 0;
    if (burst->count == 0 || burst->busy) { /* busy: a take re-entered from a finalizer */
        if (error) pthread_cond_signal(&self->room);
        pthread_mutex_unlock(&self->lock);
        if (self->credentials)
            return Py_BuildValue("(NOiN)", PyList_New(0), Py_False, error, PyList_New(0));
        return Py_BuildValue("(NOiO)", PyList_New(0), Py_False, error, Py_None);
    }
    if (self->head == self->tail) /* the thread goes on in the next burst */
        self->head = (self->head + 1) % DRAIN_BURSTS;
    burst->busy = 1;
    self->takes++;
    pthread_mutex_unlock(&self->lock);
    PyObject *runs = NULL;
    PyObject *items = burst_items(burst, self->max_size, self->credentials ? &runs : NULL);
    int oversized = burst->oversized;
    pthread_mutex_lock(&self->lock);
    if (items != NULL) { /* else kept, for the next take */
        burst->used = 0, burst->count = 0, burst->oversized = 0;
        if (burst->capacity > 2 * DRAIN_BURST_BYTES) {
            free(burst->bytes);
            burst->bytes = NULL, burst->capacity = 0;
        }
        self->tail = (self->tail + 1) % DRAIN_BURSTS;
    }
    burst->busy = 0;
    if (items == NULL) self->error = error;
    if (self->ring[self->tail].count > 0) wake_loop(self);
    pthread_cond_signal(&self->room);
    pthread_mutex_unlock(&self->lock);
    if (items == NULL) return NULL;
    if (runs == NULL) runs = Py_NewRef(Py_None);
    return Py_BuildValue("(NOiN)", items, oversized ? Py_True : Py_False, error, runs);
}

/* Under lock: (datagrams held, empty queues whose datagrams were all taken). */
static PyObject *Drain_position(DatagramDrain *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->lock_ready) return Py_BuildValue("(nK)", (Py_ssize_t)0, 0ULL);
    pthread_mutex_lock(&self->lock);
    Py_ssize_t held = self->in_flight;
    for (int i = 0; i < DRAIN_BURSTS; i++) held += self->ring[i].count;
    const DrainBurst *oldest = &self->ring[self->tail];
    unsigned long long empties = oldest->count > 0 ? oldest->empties_at_start : self->empties;
    pthread_mutex_unlock(&self->lock);
    return Py_BuildValue("(nK)", held, empties);
}

static PyObject *Drain_stats(DatagramDrain *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->lock_ready) return PyDict_New();
    pthread_mutex_lock(&self->lock);
    unsigned long long calls = self->calls, datagrams = self->datagrams, waits = self->waits,
                       takes = self->takes, empties = self->empties, lost = self->lost;
    pthread_mutex_unlock(&self->lock);
    return Py_BuildValue("{sKsKsKsKsKsK}", "recvmmsg_calls", calls, "datagrams", datagrams,
                         "waits_for_room", waits, "takes", takes, "empty_queues", empties,
                         "lost_no_memory", lost);
}

static PyObject *Drain_get_wake_fd(DatagramDrain *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLong(self->wake_fd);
}

/* The most datagrams the drain holds at once, read from the kernel and not yet taken (a
 * recvmmsg in flight included: it reads only into the room of the burst it fills). */
static PyObject *Drain_get_capacity(DatagramDrain *self, void *Py_UNUSED(closure)) {
    return PyLong_FromSsize_t(DRAIN_BURSTS * self->burst_datagrams);
}

static PyMethodDef Drain_methods[] = {
    {"start", (PyCFunction)Drain_start, METH_NOARGS, "start() -> None: the thread starts reading."},
    {"stop", (PyCFunction)Drain_stop, METH_NOARGS,
     "stop() -> None: the thread ends (joined); what it read stays for take()."},
    {"take", (PyCFunction)Drain_take, METH_NOARGS,
     "take() -> (items, oversized, errno, runs or None): the oldest burst read."},
    {"position", (PyCFunction)Drain_position, METH_NOARGS,
     "position() -> (held, empties): datagrams read and not taken (at most); empty queues "
     "met with every datagram read before them taken."},
    {"stats", (PyCFunction)Drain_stats, METH_NOARGS, "stats() -> dict of counters."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Drain_getset[] = {
    {"wake_fd", (getter)Drain_get_wake_fd, NULL, "readable when a burst waits", NULL},
    {"capacity", (getter)Drain_get_capacity, NULL,
     "the most datagrams held at once: DRAIN_BURSTS bursts of burst_datagrams", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DrainType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pydory._cwire.DatagramDrain",
    .tp_basicsize = sizeof(DatagramDrain),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Empties a datagram socket from a thread of its own into bursts for the loop.",
    .tp_new = Drain_new,
    .tp_init = (initproc)Drain_init,
    .tp_dealloc = (destructor)Drain_dealloc,
    .tp_methods = Drain_methods,
    .tp_getset = Drain_getset,
};

/* --- StreamDrain ------------------------------------------------------------------------- */

/* A thread of its own that does the UNIX stream connections' reads (issue 34, lever 1, for
 * the streams: ARCHITECTURE.md), so that the kernel's per-skb work of a read (one skb per
 * client write) runs off the loop thread and off the GIL, and the loop takes a connection's
 * bytes in chunks gathered while it was busy.
 *
 * The thread never touches a Python object and never takes the GIL. It owns an epoll set
 * (level-triggered) of *duplicates* of the connections' sockets (made at add(), closed at
 * remove() once no read of it is in flight: the loop's transport may close its own
 * descriptor whenever it likes, and a number the process reuses is never read here; a
 * connection that may not be read now, paused or full, is out of the set, so that it wakes
 * nobody), a control eventfd, and a pool of at most SDRAIN_CHUNKS chunks of SDRAIN_CHUNK_BYTES
 * (malloc'd when first needed, then kept on a free list): all it holds, whatever the number
 * of connections. Each connection keeps its bytes as a FIFO of chunks, at most
 * SDRAIN_CONNECTION_BYTES. The thread reads the readable connections in turn, one read of
 * at most a chunk each (round robin), into a chunk of its own, then keeps the bytes in the
 * connection's last chunk when they fit, else that chunk becomes its last. It does not read
 * a connection that is paused, full, or ended, nor any when no chunk is free: then the
 * kernel's buffer of that connection fills and its sender blocks, as with a loop that reads
 * no more.
 *
 * The loop learns through an eventfd (wake_fd), written when its ready queue (connections
 * holding bytes or an end, not paused) goes from empty to not empty. ready() hands the queue
 * over as it is (a snapshot: each connection once per call); take(token, limit) hands up to
 * limit of that connection's bytes, and its end (0: EOF, or an errno) once every byte before
 * it is handed; a connection still holding bytes is queued again. pause(token) stops both
 * the thread reading it (a read in flight finishes) and the loop taking from it;
 * resume(token) undoes it. remove(token) waits out a read of it in flight, closes the
 * duplicate and hands back everything held (a close or a shutdown: nothing read is dropped
 * unless the caller drops it). unread(token) is the kernel's unread bytes (FIONREAD) plus
 * what is held, taken with no read of it in flight, so that no byte is counted twice or not
 * at all (the commit point's marks). Every method holds the GIL; the lock is never held
 * while an object the collector tracks is made (a collection could run a finalizer that
 * calls back in). */
#include <fcntl.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>

#ifndef SDRAIN_CHUNKS
#define SDRAIN_CHUNKS 16
#endif
#if SDRAIN_CHUNKS < 3 /* the thread reads into one while connections hold the others */
#error "SDRAIN_CHUNKS must be at least 3"
#endif
#define SDRAIN_CHUNK_BYTES (64 * 1024)
#define SDRAIN_CONNECTION_BYTES (2 * SDRAIN_CHUNK_BYTES)
#define SDRAIN_EVENTS 64
#define SDRAIN_CONTROL UINT64_MAX /* the control eventfd's epoll data (no token is) */
#define SDRAIN_NO_END (-1)

typedef struct SChunk {
    struct SChunk *next;
    size_t start, end; /* the bytes not taken yet: data[start:end] */
    unsigned char data[SDRAIN_CHUNK_BYTES];
} SChunk;

typedef struct SLink {
    struct SLink *prev, *next; /* next is NULL when not in a list */
} SLink;

typedef struct {
    int fd; /* the drain's duplicate of the connection's socket */
    uint32_t slot, generation;
    int paused;      /* the loop's: neither read nor taken */
    int armed;       /* in the epoll set (not while paused, full or ended) */
    int readable;    /* epoll said so, and no read found it empty since */
    int reading;     /* the thread is in a read of it (without the lock) */
    int end;         /* SDRAIN_NO_END, 0 (EOF) or an errno: handed after its last byte */
    int end_handed;
    size_t held;
    SChunk *head, *tail;
    SLink to_read, to_take; /* in the thread's readable list, the loop's ready queue */
} SConn;

typedef struct {
    PyObject_HEAD
    int epoll_fd, wake_fd, control_fd;
    pthread_t thread;
    int started, joined;
    pthread_mutex_t lock;
    pthread_cond_t read_done;
    int lock_ready;
    /* Under lock: */
    SConn **table;
    uint32_t table_size, generation;
    SLink to_read, to_take;
    Py_ssize_t ready_count, connections;
    SChunk *free_chunks, *spare; /* spare: the thread's chunk to read into */
    int chunks_made;
    pthread_cond_t room; /* a chunk may be free again */
    int stopping, sleeping, control_written, starved;
    int error; /* an epoll_wait failure that ended the thread */
    size_t held;
    unsigned long long reads, bytes, empties, takes, waits_for_chunks, ends;
} StreamDrain;

#define SCONN_OF(link, field) ((SConn *)(void *)((char *)(link) - offsetof(SConn, field)))

static void slist_init(SLink *list) { list->prev = list->next = list; }
static int slist_empty(const SLink *list) { return list->next == list; }
static int slinked(const SLink *link) { return link->next != NULL; }

static void slist_append(SLink *list, SLink *link) {
    link->prev = list->prev, link->next = list;
    list->prev->next = link, list->prev = link;
}

static void slist_prepend(SLink *list, SLink *link) {
    link->next = list->next, link->prev = list;
    list->next->prev = link, list->next = link;
}

static void slist_remove(SLink *link) {
    if (link->next == NULL) return;
    link->prev->next = link->next, link->next->prev = link->prev;
    link->next = link->prev = NULL;
}

static uint64_t sconn_token(const SConn *conn) {
    return (uint64_t)conn->generation << 32 | conn->slot;
}

static SConn *sconn_of(StreamDrain *self, unsigned long long token) {
    uint32_t slot = (uint32_t)(token & 0xffffffffu);
    if (slot >= self->table_size || self->table[slot] == NULL) return NULL;
    SConn *conn = self->table[slot];
    return conn->generation == (uint32_t)(token >> 32) ? conn : NULL;
}

/* Wakes the thread from epoll_wait (under lock; once until it reads the control fd). */
static void sdrain_nudge(StreamDrain *self) {
    if (!self->sleeping || self->control_written || slist_empty(&self->to_read)) return;
    uint64_t one = 1;
    ssize_t ignored = write(self->control_fd, &one, sizeof one);
    (void)ignored;
    self->control_written = 1;
}

static int sconn_may_read(const SConn *conn) {
    return conn->readable && !conn->paused && conn->end == SDRAIN_NO_END &&
           conn->held < SDRAIN_CONNECTION_BYTES;
}

/* In the epoll set exactly while it may be read (under lock). Out of it, not even a peer's
 * close (EPOLLHUP, reported whatever is asked) wakes the thread; put back, epoll reports
 * at once what waits. */
static void sconn_arm(StreamDrain *self, SConn *conn) {
    int want = !conn->paused && conn->end == SDRAIN_NO_END && conn->held < SDRAIN_CONNECTION_BYTES;
    if (want == conn->armed) return;
    struct epoll_event event = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = sconn_token(conn)};
    if (epoll_ctl(self->epoll_fd, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, conn->fd, &event) == 0)
        conn->armed = want;
}

/* A chunk may be free again: the thread, if it waits for one, looks (under lock). */
static void sdrain_room(StreamDrain *self) {
    if (!self->starved) return;
    self->starved = 0;
    pthread_cond_signal(&self->room);
}

/* Under lock: in the thread's list if it may be read now. */
static void sconn_want_read(StreamDrain *self, SConn *conn) {
    if (!sconn_may_read(conn) || slinked(&conn->to_read)) return;
    slist_append(&self->to_read, &conn->to_read);
    sdrain_nudge(self);
}

/* Under lock: in the loop's queue if it holds something to take and is not paused. */
static void sconn_want_take(StreamDrain *self, SConn *conn) {
    int holds = conn->held > 0 || (conn->end != SDRAIN_NO_END && !conn->end_handed);
    if (conn->paused || !holds || slinked(&conn->to_take)) return;
    slist_append(&self->to_take, &conn->to_take);
    if (self->ready_count++ == 0) {
        uint64_t one = 1;
        ssize_t ignored = write(self->wake_fd, &one, sizeof one);
        (void)ignored;
    }
}

static void sconn_unqueue(StreamDrain *self, SConn *conn) {
    if (!slinked(&conn->to_take)) return;
    slist_remove(&conn->to_take);
    self->ready_count--;
}

/* A free chunk, or NULL: all SDRAIN_CHUNKS in use, or no memory (under lock). */
static SChunk *schunk_get(StreamDrain *self) {
    SChunk *chunk = self->free_chunks;
    if (chunk != NULL) {
        self->free_chunks = chunk->next;
    } else {
        if (self->chunks_made >= SDRAIN_CHUNKS || (chunk = malloc(sizeof *chunk)) == NULL)
            return NULL;
        self->chunks_made++;
    }
    chunk->next = NULL, chunk->start = chunk->end = 0;
    return chunk;
}

static void schunk_put(StreamDrain *self, SChunk *chunk) {
    chunk->next = self->free_chunks;
    self->free_chunks = chunk;
}

/* Copies `n` of the connection's bytes to `to`, giving emptied chunks back (under lock). */
static void sconn_copy_out(StreamDrain *self, SConn *conn, char *to, size_t n) {
    conn->held -= n, self->held -= n;
    while (n > 0) {
        SChunk *chunk = conn->head;
        size_t part = chunk->end - chunk->start;
        if (part > n) part = n;
        memcpy(to, chunk->data + chunk->start, part);
        to += part, n -= part, chunk->start += part;
        if (chunk->start == chunk->end) {
            conn->head = chunk->next;
            if (conn->head == NULL) conn->tail = NULL;
            schunk_put(self, chunk);
        }
    }
}

/* Keeps `got` bytes the thread read into its spare chunk (under lock). */
static void sconn_keep(StreamDrain *self, SConn *conn, size_t got) {
    SChunk *tail = conn->tail, *chunk = self->spare;
    if (tail != NULL && SDRAIN_CHUNK_BYTES - tail->end >= got) {
        memcpy(tail->data + tail->end, chunk->data, got); /* the spare stays the thread's */
        tail->end += got;
    } else {
        chunk->start = 0, chunk->end = got, chunk->next = NULL;
        if (tail != NULL)
            tail->next = chunk;
        else
            conn->head = chunk;
        conn->tail = chunk;
        self->spare = NULL;
    }
    conn->held += got, self->held += got;
}

/* One read of `conn` into the spare chunk: under lock on entry and on return. */
static void sdrain_read(StreamDrain *self, SConn *conn) {
    size_t want = SDRAIN_CONNECTION_BYTES - conn->held;
    if (want > SDRAIN_CHUNK_BYTES) want = SDRAIN_CHUNK_BYTES;
    unsigned char *into = self->spare->data;
    int fd = conn->fd;
    conn->reading = 1;
    pthread_mutex_unlock(&self->lock);
    ssize_t got = recv(fd, into, want, MSG_DONTWAIT);
    int failure = got < 0 ? errno : 0;
    pthread_mutex_lock(&self->lock);
    conn->reading = 0;
    pthread_cond_broadcast(&self->read_done); /* remove() and unread() wait for it */
    self->reads++;
    if (got > 0) {
        self->bytes += (unsigned long long)got;
        sconn_keep(self, conn, (size_t)got);
        if ((size_t)got < want) conn->readable = 0; /* epoll says when there is more */
        sconn_arm(self, conn);                      /* out of the set once full */
        sconn_want_read(self, conn);                /* else to the back: round robin */
        sconn_want_take(self, conn);
    } else if (failure == EINTR) {
        sconn_want_read(self, conn);
    } else if (failure == EAGAIN || failure == EWOULDBLOCK) {
        conn->readable = 0;
        self->empties++;
    } else { /* 0: EOF; else an error (ECONNRESET...): after the bytes held */
        conn->end = got == 0 ? 0 : failure;
        conn->readable = 0;
        self->ends++;
        sconn_arm(self, conn); /* out of the set for good */
        sconn_want_take(self, conn);
    }
}

/* The next connection to read (taken out of the list), or NULL; those that may not be read
 * now leave the list (resume() or a take puts them back). Under lock. */
static SConn *sdrain_next(StreamDrain *self) {
    while (!slist_empty(&self->to_read)) {
        SLink *link = self->to_read.next;
        slist_remove(link);
        SConn *conn = SCONN_OF(link, to_read);
        if (sconn_may_read(conn)) return conn;
    }
    return NULL;
}

static void sdrain_event(StreamDrain *self, uint64_t data) {
    if (data == SDRAIN_CONTROL) {
        uint64_t count;
        ssize_t ignored = read(self->control_fd, &count, sizeof count);
        (void)ignored;
        self->control_written = 0;
        return;
    }
    SConn *conn = sconn_of(self, data);
    if (conn == NULL || conn->end != SDRAIN_NO_END) return; /* removed meanwhile */
    conn->readable = 1;
    sconn_want_read(self, conn);
}

static void *sdrain_main(void *arg) {
    StreamDrain *self = arg;
    struct epoll_event events[SDRAIN_EVENTS];
    pthread_mutex_lock(&self->lock);
    while (!self->stopping) {
        SConn *conn = sdrain_next(self);
        if (conn != NULL && self->spare == NULL && (self->spare = schunk_get(self)) == NULL) {
            /* No chunk: wait for a take to free one (not in epoll_wait: the readable
             * connections would wake it at once), then read this one first. */
            slist_prepend(&self->to_read, &conn->to_read);
            self->waits_for_chunks++;
            self->starved = 1;
            while (self->starved && !self->stopping) pthread_cond_wait(&self->room, &self->lock);
            continue;
        }
        if (conn != NULL) {
            sdrain_read(self, conn);
            continue;
        }
        self->sleeping = 1;
        pthread_mutex_unlock(&self->lock);
        int got = epoll_wait(self->epoll_fd, events, SDRAIN_EVENTS, -1);
        int failure = got < 0 ? errno : 0;
        pthread_mutex_lock(&self->lock);
        self->sleeping = 0;
        for (int i = 0; i < got; i++) sdrain_event(self, events[i].data.u64);
        if (failure != 0 && failure != EINTR) { /* a bug, not a client: the loop is told */
            self->error = failure;
            uint64_t one = 1;
            ssize_t ignored = write(self->wake_fd, &one, sizeof one);
            (void)ignored;
            break;
        }
    }
    pthread_mutex_unlock(&self->lock);
    return NULL;
}

static void sdrain_stop(StreamDrain *self) {
    if (!self->started || self->joined) return;
    pthread_mutex_lock(&self->lock);
    self->stopping = 1;
    pthread_cond_signal(&self->room);
    pthread_mutex_unlock(&self->lock);
    uint64_t one = 1;
    ssize_t ignored = write(self->control_fd, &one, sizeof one);
    (void)ignored;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->joined = 1;
}

static void sconn_free(StreamDrain *self, SConn *conn) {
    while (conn->head != NULL) {
        SChunk *chunk = conn->head;
        conn->head = chunk->next;
        schunk_put(self, chunk);
    }
    self->held -= conn->held;
    conn->held = 0;
    if (conn->fd >= 0) close(conn->fd);
    free(conn);
}

static PyObject *SDrain_new(PyTypeObject *type, PyObject *Py_UNUSED(args),
                            PyObject *Py_UNUSED(kwargs)) {
    StreamDrain *self = (StreamDrain *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->epoll_fd = self->wake_fd = self->control_fd = -1;
    slist_init(&self->to_read);
    slist_init(&self->to_take);
    return (PyObject *)self;
}

static int SDrain_init(StreamDrain *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "", names)) return -1;
    if (self->epoll_fd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "a StreamDrain is initialised once");
        return -1;
    }
    self->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    self->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    self->control_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->epoll_fd < 0 || self->wake_fd < 0 || self->control_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event control = {.events = EPOLLIN, .data.u64 = SDRAIN_CONTROL};
    if (epoll_ctl(self->epoll_fd, EPOLL_CTL_ADD, self->control_fd, &control) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (pthread_mutex_init(&self->lock, NULL) != 0 ||
        pthread_cond_init(&self->read_done, NULL) != 0 ||
        pthread_cond_init(&self->room, NULL) != 0) {
        PyErr_SetString(PyExc_OSError, "cannot make the stream drain's lock");
        return -1;
    }
    self->lock_ready = 1;
    return 0;
}

static void SDrain_dealloc(StreamDrain *self) {
    sdrain_stop(self);
    for (uint32_t slot = 0; slot < self->table_size; slot++)
        if (self->table[slot] != NULL) sconn_free(self, self->table[slot]);
    free(self->table);
    while (self->free_chunks != NULL) {
        SChunk *chunk = self->free_chunks;
        self->free_chunks = chunk->next;
        free(chunk);
    }
    free(self->spare);
    if (self->epoll_fd >= 0) close(self->epoll_fd);
    if (self->wake_fd >= 0) close(self->wake_fd);
    if (self->control_fd >= 0) close(self->control_fd);
    if (self->lock_ready) {
        pthread_mutex_destroy(&self->lock);
        pthread_cond_destroy(&self->read_done);
        pthread_cond_destroy(&self->room);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int sdrain_initialised(StreamDrain *self) {
    if (self->lock_ready) return 1;
    PyErr_SetString(PyExc_RuntimeError, "StreamDrain was not initialised");
    return 0;
}

static PyObject *SDrain_start(StreamDrain *self, PyObject *Py_UNUSED(ignored)) {
    if (!sdrain_initialised(self)) return NULL;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "a StreamDrain is started once");
        return NULL;
    }
    int failed = pthread_create(&self->thread, NULL, sdrain_main, self);
    if (failed != 0) {
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    (void)pthread_setname_np(self->thread, "pydory-sdrain");
    self->started = 1;
    Py_RETURN_NONE;
}

static PyObject *SDrain_stop(StreamDrain *self, PyObject *Py_UNUSED(ignored)) {
    sdrain_stop(self);
    Py_RETURN_NONE;
}

/* add(fd, paused=False) -> token: the thread reads a duplicate of fd from now on. */
static PyObject *SDrain_add(StreamDrain *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"fd", "paused", NULL};
    int fd, paused = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|p", names, &fd, &paused)) return NULL;
    if (!sdrain_initialised(self)) return NULL;
    SConn *conn = calloc(1, sizeof *conn);
    if (conn == NULL) return PyErr_NoMemory();
    conn->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (conn->fd < 0) {
        free(conn);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    conn->end = SDRAIN_NO_END, conn->paused = paused, conn->readable = 1;
    pthread_mutex_lock(&self->lock);
    uint32_t slot = 0;
    while (slot < self->table_size && self->table[slot] != NULL) slot++;
    if (slot == self->table_size) {
        uint32_t size = self->table_size ? 2 * self->table_size : 16;
        SConn **table = realloc(self->table, size * sizeof *table);
        if (table == NULL) {
            pthread_mutex_unlock(&self->lock);
            close(conn->fd);
            free(conn);
            return PyErr_NoMemory();
        }
        memset(table + self->table_size, 0, (size - self->table_size) * sizeof *table);
        self->table = table, self->table_size = size;
    }
    if (++self->generation == 0) self->generation = 1;
    conn->slot = slot, conn->generation = self->generation;
    uint64_t token = sconn_token(conn);
    struct epoll_event event = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = token};
    if (!paused && epoll_ctl(self->epoll_fd, EPOLL_CTL_ADD, conn->fd, &event) < 0) {
        int failure = errno;
        pthread_mutex_unlock(&self->lock);
        close(conn->fd);
        free(conn);
        errno = failure;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    conn->armed = !paused;
    self->table[slot] = conn;
    self->connections++;
    sconn_want_read(self, conn);
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromUnsignedLongLong(token);
}

static int token_of(PyObject *arg, unsigned long long *token) {
    *token = PyLong_AsUnsignedLongLong(arg);
    return !(*token == (unsigned long long)-1 && PyErr_Occurred());
}

static PyObject *end_object(int end) {
    return end == SDRAIN_NO_END ? Py_NewRef(Py_None) : PyLong_FromLong(end);
}

/* remove(token) -> (bytes, end or None): what is held, the duplicate closed. */
static PyObject *SDrain_remove(StreamDrain *self, PyObject *arg) {
    unsigned long long token;
    if (!token_of(arg, &token) || !sdrain_initialised(self)) return NULL;
    pthread_mutex_lock(&self->lock);
    SConn *conn = sconn_of(self, token);
    while (conn != NULL && conn->reading) {
        pthread_cond_wait(&self->read_done, &self->lock);
        conn = sconn_of(self, token);
    }
    if (conn == NULL) {
        pthread_mutex_unlock(&self->lock);
        return Py_BuildValue("(yO)", "", Py_None);
    }
    /* Not tracked by the collector: no finalizer can run (and call back in) here. */
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)conn->held);
    if (data == NULL) {
        pthread_mutex_unlock(&self->lock);
        return NULL;
    }
    sconn_copy_out(self, conn, PyBytes_AS_STRING(data), conn->held);
    int end = conn->end_handed ? SDRAIN_NO_END : conn->end;
    if (conn->armed) (void)epoll_ctl(self->epoll_fd, EPOLL_CTL_DEL, conn->fd, NULL);
    slist_remove(&conn->to_read);
    sconn_unqueue(self, conn);
    self->table[conn->slot] = NULL;
    self->connections--;
    sconn_free(self, conn);
    sdrain_room(self); /* its chunks are free again */
    pthread_mutex_unlock(&self->lock);
    return Py_BuildValue("(NN)", data, end_object(end));
}

static PyObject *SDrain_pause(StreamDrain *self, PyObject *arg) {
    unsigned long long token;
    if (!token_of(arg, &token) || !sdrain_initialised(self)) return NULL;
    pthread_mutex_lock(&self->lock);
    SConn *conn = sconn_of(self, token);
    if (conn != NULL) {
        conn->paused = 1;
        sconn_unqueue(self, conn); /* the thread drops it from its list when it meets it */
        sconn_arm(self, conn);
    }
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

static PyObject *SDrain_resume(StreamDrain *self, PyObject *arg) {
    unsigned long long token;
    if (!token_of(arg, &token) || !sdrain_initialised(self)) return NULL;
    pthread_mutex_lock(&self->lock);
    SConn *conn = sconn_of(self, token);
    if (conn != NULL && conn->paused) {
        conn->paused = 0;
        sconn_arm(self, conn); /* epoll reports at once what waits in the kernel */
        sconn_want_take(self, conn);
        sconn_want_read(self, conn);
    }
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

/* ready() -> [token]: the connections to take from now, each once, the queue emptied. */
static PyObject *SDrain_ready_(StreamDrain *self, PyObject *Py_UNUSED(ignored)) {
    if (!sdrain_initialised(self)) return NULL;
    pthread_mutex_lock(&self->lock);
    uint64_t count;
    ssize_t ignored = read(self->wake_fd, &count, sizeof count);
    (void)ignored;
    int error = self->error;
    self->error = 0;
    Py_ssize_t n = self->ready_count;
    uint64_t *tokens = n > 0 ? malloc((size_t)n * sizeof *tokens) : NULL;
    if (n > 0 && tokens == NULL) { /* the queue stays, the loop is woken again */
        uint64_t one = 1;
        ignored = write(self->wake_fd, &one, sizeof one);
        pthread_mutex_unlock(&self->lock);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        SLink *link = self->to_take.next;
        slist_remove(link);
        tokens[i] = sconn_token(SCONN_OF(link, to_take));
    }
    self->ready_count = 0;
    pthread_mutex_unlock(&self->lock);
    if (error != 0) {
        free(tokens);
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list != NULL && i < n; i++) {
        PyObject *token = PyLong_FromUnsignedLongLong(tokens[i]);
        if (token == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, token);
    }
    if (list == NULL) { /* queued again: their bytes wait for the next call */
        pthread_mutex_lock(&self->lock);
        for (Py_ssize_t i = 0; i < n; i++) {
            SConn *conn = sconn_of(self, tokens[i]);
            if (conn != NULL) sconn_want_take(self, conn);
        }
        pthread_mutex_unlock(&self->lock);
    }
    free(tokens);
    return list;
}

/* take(token, limit) -> (bytes, end or None): at most limit of its bytes, and its end
 * once every byte before it is handed; nothing while it is paused. */
static PyObject *SDrain_take(StreamDrain *self, PyObject *const *args, Py_ssize_t nargs) {
    unsigned long long token;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take(token, limit)");
        return NULL;
    }
    if (!token_of(args[0], &token)) return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if ((limit == -1 && PyErr_Occurred()) || !sdrain_initialised(self)) return NULL;
    if (limit < 1) {
        PyErr_Format(PyExc_ValueError, "limit must be at least 1, got %zd", limit);
        return NULL;
    }
    pthread_mutex_lock(&self->lock);
    SConn *conn = sconn_of(self, token);
    if (conn == NULL || conn->paused) {
        pthread_mutex_unlock(&self->lock);
        return Py_BuildValue("(yO)", "", Py_None);
    }
    size_t n = conn->held < (size_t)limit ? conn->held : (size_t)limit;
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n); /* untracked: above */
    if (data == NULL) {
        sconn_want_take(self, conn); /* for the next call */
        pthread_mutex_unlock(&self->lock);
        return NULL;
    }
    sconn_copy_out(self, conn, PyBytes_AS_STRING(data), n);
    int end = SDRAIN_NO_END;
    if (conn->held == 0 && conn->end != SDRAIN_NO_END && !conn->end_handed) {
        end = conn->end;
        conn->end_handed = 1;
    }
    self->takes++;
    sconn_unqueue(self, conn); /* taken out of turn (not from ready()): back of the queue */
    sconn_want_take(self, conn);
    sconn_arm(self, conn); /* room again */
    sconn_want_read(self, conn);
    sdrain_room(self); /* chunks again */
    pthread_mutex_unlock(&self->lock);
    return Py_BuildValue("(NN)", data, end_object(end));
}

/* unread(token) -> int: the kernel's unread bytes and those held, with no read in flight. */
static PyObject *SDrain_unread(StreamDrain *self, PyObject *arg) {
    unsigned long long token;
    if (!token_of(arg, &token) || !sdrain_initialised(self)) return NULL;
    pthread_mutex_lock(&self->lock);
    SConn *conn = sconn_of(self, token);
    while (conn != NULL && conn->reading) {
        pthread_cond_wait(&self->read_done, &self->lock);
        conn = sconn_of(self, token);
    }
    long long unread = 0;
    if (conn != NULL) {
        int queued = 0;
        if (conn->end == SDRAIN_NO_END && ioctl(conn->fd, FIONREAD, &queued) < 0) queued = 0;
        unread = (long long)queued + (long long)conn->held;
    }
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromLongLong(unread);
}

/* held(token) -> int: the bytes the drain holds for that connection (read, not taken). */
static PyObject *SDrain_held(StreamDrain *self, PyObject *arg) {
    unsigned long long token;
    if (!token_of(arg, &token) || !sdrain_initialised(self)) return NULL;
    pthread_mutex_lock(&self->lock);
    SConn *conn = sconn_of(self, token);
    size_t held = conn != NULL ? conn->held : 0;
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromSize_t(held);
}

static PyObject *SDrain_stats(StreamDrain *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->lock_ready) return PyDict_New();
    pthread_mutex_lock(&self->lock);
    unsigned long long reads = self->reads, bytes = self->bytes, empties = self->empties,
                       takes = self->takes, waits = self->waits_for_chunks, ends = self->ends;
    size_t held = self->held;
    Py_ssize_t connections = self->connections;
    int chunks = self->chunks_made;
    pthread_mutex_unlock(&self->lock);
    return Py_BuildValue("{sKsKsKsKsKsKsnsnsi}", "reads", reads, "bytes", bytes,
                         "empty_reads", empties, "takes", takes, "waits_for_chunks", waits,
                         "ends", ends, "held", (Py_ssize_t)held, "connections", connections,
                         "chunks", chunks);
}

static PyObject *SDrain_get_wake_fd(StreamDrain *self, void *Py_UNUSED(closure)) {
    return PyLong_FromLong(self->wake_fd);
}

static PyObject *SDrain_get_capacity(StreamDrain *Py_UNUSED(self), void *Py_UNUSED(closure)) {
    return PyLong_FromLong((long)SDRAIN_CHUNKS * SDRAIN_CHUNK_BYTES);
}

static PyObject *SDrain_get_connection_capacity(StreamDrain *Py_UNUSED(self),
                                                 void *Py_UNUSED(closure)) {
    return PyLong_FromLong(SDRAIN_CONNECTION_BYTES);
}

static PyMethodDef SDrain_methods[] = {
    {"start", (PyCFunction)SDrain_start, METH_NOARGS, "start() -> None: the thread starts."},
    {"stop", (PyCFunction)SDrain_stop, METH_NOARGS,
     "stop() -> None: the thread ends (joined); what it holds stays for take() and remove()."},
    {"add", (PyCFunction)(void (*)(void))SDrain_add, METH_VARARGS | METH_KEYWORDS,
     "add(fd, paused=False) -> token: the thread reads a duplicate of fd from now on."},
    {"remove", (PyCFunction)SDrain_remove, METH_O,
     "remove(token) -> (bytes, end or None): everything held; the thread reads it no more."},
    {"pause", (PyCFunction)SDrain_pause, METH_O,
     "pause(token) -> None: neither read (a read in flight ends) nor taken until resume."},
    {"resume", (PyCFunction)SDrain_resume, METH_O, "resume(token) -> None."},
    {"ready", (PyCFunction)SDrain_ready_, METH_NOARGS,
     "ready() -> [token]: the connections holding bytes or an end, each once; reads wake_fd."},
    {"take", (PyCFunction)(void (*)(void))SDrain_take, METH_FASTCALL,
     "take(token, limit) -> (bytes, end or None): at most limit bytes, then its end "
     "(0: EOF, or an errno) once all before it are taken."},
    {"unread", (PyCFunction)SDrain_unread, METH_O,
     "unread(token) -> int: the kernel's unread bytes (FIONREAD) plus those held."},
    {"held", (PyCFunction)SDrain_held, METH_O,
     "held(token) -> int: the bytes held for that connection (read, not taken)."},
    {"stats", (PyCFunction)SDrain_stats, METH_NOARGS, "stats() -> dict of counters."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SDrain_getset[] = {
    {"wake_fd", (getter)SDrain_get_wake_fd, NULL, "readable when connections hold bytes", NULL},
    {"capacity", (getter)SDrain_get_capacity, NULL,
     "the most bytes held at once: SDRAIN_CHUNKS chunks of SDRAIN_CHUNK_BYTES", NULL},
    {"connection_capacity", (getter)SDrain_get_connection_capacity, NULL,
     "the most bytes held for one connection", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StreamDrainType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pydory._cwire.StreamDrain",
    .tp_basicsize = sizeof(StreamDrain),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reads stream connections from a thread of its own into chunks for the loop.",
    .tp_new = SDrain_new,
    .tp_init = (initproc)SDrain_init,
    .tp_dealloc = (destructor)SDrain_dealloc,
    .tp_methods = SDrain_methods,
    .tp_getset = SDrain_getset,
};

/* --- parse_any_partition_burst ----------------------------------------------------------- */

/* The last topic seen in a burst: most bursts carry one topic, so a memcmp replaces the
 * dict lookup (and the bytes object it needs) for every message after the first. */
typedef struct {
    const unsigned char *bytes; /* points into a frame the burst's tuple keeps alive */
    Py_ssize_t length;
    PyObject *name; /* a strong reference: a finalizer run by an allocation could change
                       the cache meanwhile */
} LastTopic;

/* The fields of one well-formed AnyPartition message whose topic is in the cache, into
 * ``entry`` (pointers into ``frame``, and a strong reference to the frame and the topic:
 * release with entry_release); entry->topic NULL (nothing held) for any other bytes. -1 on
 * an error (set), else 0. */
static int parse_entry(PyObject *frame, PyObject *cache, LastTopic *last, burst_entry *entry) {
    entry->topic = entry->frame = NULL;
    if (!PyBytes_CheckExact(frame)) return 0; /* decode judges it */
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(frame);
    Py_ssize_t length = PyBytes_GET_SIZE(frame);
    if (length < ANY_PARTITION_OVERHEAD) return 0;
    int32_t size = read_i32(p);
    int16_t api_key = read_i16(p + 4), api_version = read_i16(p + 6), flags = read_i16(p + 8);
    int16_t topic_size = read_i16(p + 10);
    if (size != length || api_key != ANY_PARTITION_API_KEY || api_version != 0 || flags != 0 ||
        topic_size <= 0)
        return 0;
    /* All in Py_ssize_t (64-bit): no sum below can overflow from int32 fields. */
    Py_ssize_t topic_end = ANY_PARTITION_TOPIC_OFFSET + (Py_ssize_t)topic_size;
    Py_ssize_t key_start = topic_end + AFTER_TOPIC_SIZE;
    if (key_start > length) return 0;
    int64_t timestamp_ms = read_i64(p + topic_end);
    int32_t key_size = read_i32(p + topic_end + 8);
    Py_ssize_t key_end = key_start + (Py_ssize_t)key_size;
    if (key_size < 0 || key_end + 4 > length) return 0;
    int32_t value_size = read_i32(p + key_end);
    if (key_end + 4 + (Py_ssize_t)value_size != length) return 0;

    const unsigned char *topic_bytes = p + ANY_PARTITION_TOPIC_OFFSET;
    PyObject *topic; /* borrowed: last->name holds it from here on */
    if (last->name != NULL && last->length == topic_size &&
        memcmp(last->bytes, topic_bytes, (size_t)topic_size) == 0) {
        topic = last->name;
    } else {
        PyObject *raw = PyBytes_FromStringAndSize((const char *)topic_bytes, topic_size);
        if (raw == NULL) return -1;
        topic = PyDict_GetItemWithError(cache, raw);
        Py_DECREF(raw);
        if (topic == NULL) return PyErr_Occurred() ? -1 : 0; /* decode judges (and remembers) */
        last->bytes = topic_bytes;
        last->length = topic_size;
        Py_XSETREF(last->name, Py_NewRef(topic));
    }
    entry->topic = Py_NewRef(topic);
    entry->frame = Py_NewRef(frame);
    entry->key = (const char *)p + key_start;
    entry->key_size = key_size;
    entry->value = (const char *)p + key_end + 4;
    entry->value_size = value_size;
    entry->timestamp_ms = timestamp_ms;
    return 0;
}

static void entry_release(burst_entry *entry) {
    Py_CLEAR(entry->topic);
    Py_CLEAR(entry->frame);
}

/* (topic, key, value, timestamp_ms) of an entry, or Py_None (new references). */
static PyObject *entry_fields(const burst_entry *entry) {
    if (entry->topic == NULL) Py_RETURN_NONE;
    PyObject *key = PyBytes_FromStringAndSize(entry->key, entry->key_size);
    PyObject *value = PyBytes_FromStringAndSize(entry->value, entry->value_size);
    PyObject *timestamp = PyLong_FromLongLong(entry->timestamp_ms);
    PyObject *fields = NULL;
    if (key != NULL && value != NULL && timestamp != NULL)
        fields = PyTuple_Pack(4, entry->topic, key, value, timestamp);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(timestamp);
    return fields;
}

/* A tuple copy of ``frames`` (pointers only: no finalizer can change what is parsed, and
 * the bytes an entry points into live as long as the copy), or NULL; checks the cache. */
static PyObject *frames_to_parse(PyObject *const *args, Py_ssize_t nargs, const char *name) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(frames, topic_cache) takes 2 arguments", name);
        return NULL;
    }
    if (!PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "topic_cache must be a dict");
        return NULL;
    }
    return PySequence_Tuple(args[0]);
}

static PyObject *parse_any_partition_burst(PyObject *Py_UNUSED(module), PyObject *const *args,
                                           Py_ssize_t nargs) {
    PyObject *frames = frames_to_parse(args, nargs, "parse_any_partition_burst");
    if (frames == NULL) return NULL;
    PyObject *cache = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(frames);
    PyObject *parsed = PyList_New(n);
    LastTopic last = {NULL, 0, NULL};
    for (Py_ssize_t i = 0; parsed != NULL && i < n; i++) {
        burst_entry entry;
        PyObject *fields = NULL;
        if (parse_entry(PyTuple_GET_ITEM(frames, i), cache, &last, &entry) == 0) {
            fields = entry_fields(&entry);
            entry_release(&entry);
        }
        if (fields == NULL) Py_CLEAR(parsed);
        else PyList_SET_ITEM(parsed, i, fields);
    }
    Py_XDECREF(last.name);
    Py_DECREF(frames);
    return parsed;
}

/* --- ParsedBurst: the same parses, no object per message (see _cburst.h) ------------------ */

/* The entries of the last burst freed, kept for the next (GIL held): a burst's array is
 * often over 1 KiB, where glibc's malloc first consolidates every small chunk freed (the
 * producer's, librdkafka's), a cost per burst as large as the parse. At most SPARE_MAX. */
#define SPARE_MAX 4096
static burst_entry *spare_entries = NULL;
static Py_ssize_t spare_capacity = 0;

static burst_entry *entries_new(Py_ssize_t n, Py_ssize_t *capacity) {
    if (spare_entries != NULL && spare_capacity >= n) {
        burst_entry *entries = spare_entries;
        *capacity = spare_capacity;
        spare_entries = NULL;
        return entries;
    }
    *capacity = n > 0 ? n : 1;
    burst_entry *entries = PyMem_Malloc((size_t)*capacity * sizeof *entries);
    if (entries == NULL) PyErr_NoMemory();
    return entries;
}

static void entries_free(burst_entry *entries, Py_ssize_t capacity) {
    if (capacity <= SPARE_MAX && (spare_entries == NULL || spare_capacity < capacity)) {
        PyMem_Free(spare_entries);
        spare_entries = entries;
        spare_capacity = capacity;
    } else {
        PyMem_Free(entries);
    }
}

static void Parsed_dealloc(ParsedBurstObject *self) {
    for (Py_ssize_t i = 0; i < self->length; i++) entry_release(&self->entries[i]);
    if (self->entries != NULL) entries_free(self->entries, self->capacity);
    PyObject_Free(self);
}

static Py_ssize_t Parsed_length(ParsedBurstObject *self) { return self->length; }

static PyObject *Parsed_item(ParsedBurstObject *self, Py_ssize_t i) {
    if (i < 0 || i >= self->length) {
        PyErr_SetString(PyExc_IndexError, "ParsedBurst index out of range");
        return NULL;
    }
    return entry_fields(&self->entries[i]);
}

static PySequenceMethods Parsed_as_sequence = {
    .sq_length = (lenfunc)Parsed_length,
    .sq_item = (ssizeargfunc)Parsed_item,
};

static PyTypeObject ParsedBurstType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pydory._cwire.ParsedBurst",
    .tp_basicsize = sizeof(ParsedBurstObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Parsed_dealloc,
    .tp_as_sequence = &Parsed_as_sequence,
    .tp_doc = "parse_burst's answer: burst[i] is wire.parse_any_partition(frames[i]), made "
              "when asked; the compiled producer reads the fields without them.",
};

static parsed_burst_api parsed_burst_capsule = {&ParsedBurstType, sizeof(ParsedBurstObject),
                                                 sizeof(burst_entry)};

/* Each entry holds its frame: no copy of the sequence. Each item is read again at its
 * turn (a dict key's __eq__ run by the lookup could change the list), the entries never
 * more than allocated. */
static PyObject *parse_burst(PyObject *Py_UNUSED(module), PyObject *const *args,
                             Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "parse_burst(frames, topic_cache) takes 2 arguments");
        return NULL;
    }
    if (!PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "topic_cache must be a dict");
        return NULL;
    }
    PyObject *frames = PySequence_Fast(args[0], "parse_burst(frames, ...): frames is a sequence");
    if (frames == NULL) return NULL;
    ParsedBurstObject *parsed = PyObject_New(ParsedBurstObject, &ParsedBurstType);
    if (parsed == NULL) {
        Py_DECREF(frames);
        return NULL;
    }
    parsed->length = 0;
    parsed->entries = entries_new(PySequence_Fast_GET_SIZE(frames), &parsed->capacity);
    LastTopic last = {NULL, 0, NULL};
    int failed = parsed->entries == NULL;
    for (Py_ssize_t i = 0; !failed && i < parsed->capacity && i < PySequence_Fast_GET_SIZE(frames);
         i++) {
        PyObject *frame = Py_NewRef(PySequence_Fast_GET_ITEM(frames, i));
        failed = parse_entry(frame, args[1], &last, &parsed->entries[i]) < 0;
        Py_DECREF(frame);
        if (!failed) parsed->length = i + 1;
    }
    Py_XDECREF(last.name);
    Py_DECREF(frames);
    if (failed) Py_CLEAR(parsed);
    return (PyObject *)parsed;
}

/* --- identity_headers -------------------------------------------------------------------- */

/* One message's produce() headers, [(name, prefix + digits)]: a new list, tuple and bytes,
 * as the pure code's list comprehension makes them. */
static PyObject *one_header(PyObject *name, PyObject *prefix, const char *digits,
                            Py_ssize_t digit_count) {
    Py_ssize_t prefix_size = PyBytes_GET_SIZE(prefix);
    PyObject *value = PyBytes_FromStringAndSize(NULL, prefix_size + digit_count);
    if (value == NULL) return NULL;
    memcpy(PyBytes_AS_STRING(value), PyBytes_AS_STRING(prefix), (size_t)prefix_size);
    memcpy(PyBytes_AS_STRING(value) + prefix_size, digits, (size_t)digit_count);
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    Py_INCREF(name);
    PyTuple_SET_ITEM(pair, 0, name);
    PyTuple_SET_ITEM(pair, 1, value);
    PyObject *headers = PyList_New(1);
    if (headers == NULL) {
        Py_DECREF(pair);
        return NULL;
    }
    PyList_SET_ITEM(headers, 0, pair);
    return headers;
}

/* A negative first sequence (never given out; kept equal to the pure code all the same):
 * each number formatted by Python, as b"%d" does. */
static int fill_from_negative(PyObject *list, PyObject *name, PyObject *prefix,
                              PyObject *first) {
    PyObject *number = Py_NewRef(first), *one = PyLong_FromLong(1);
    int status = one == NULL ? -1 : 0;
    for (Py_ssize_t i = 0; status == 0 && i < PyList_GET_SIZE(list); i++) {
        PyObject *text = PyObject_Str(number), *headers = NULL;
        Py_ssize_t size;
        const char *digits = text == NULL ? NULL : PyUnicode_AsUTF8AndSize(text, &size);
        if (digits != NULL) headers = one_header(name, prefix, digits, size);
        Py_XDECREF(text);
        if (headers == NULL) {
            status = -1;
            break;
        }
        PyList_SET_ITEM(list, i, headers);
        Py_SETREF(number, PyNumber_Add(number, one));
        if (number == NULL) status = -1;
    }
    Py_XDECREF(number);
    Py_XDECREF(one);
    return status;
}

/* [[(name, prefix + b"%d" % s)] for s in range(first, first + count)] in one call: the
 * decimal digits of the first sequence are Python's (any size), then incremented in place
 * like an odometer, so no number is formatted per message. */
static PyObject *identity_headers(PyObject *Py_UNUSED(module), PyObject *const *args,
                                  Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "identity_headers(name, prefix, first, count) takes 4 arguments");
        return NULL;
    }
    PyObject *name = args[0], *prefix = args[1];
    if (!PyUnicode_Check(name) || !PyBytes_Check(prefix)) {
        PyErr_SetString(PyExc_TypeError, "identity_headers: name must be str, prefix bytes");
        return NULL;
    }
    Py_ssize_t count = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
    if (count == -1 && PyErr_Occurred()) return NULL;
    PyObject *first = PyNumber_Index(args[2]);
    if (first == NULL) return NULL;
    PyObject *list = PyList_New(count > 0 ? count : 0), *text = NULL;
    const char *first_digits = NULL;
    char *buffer = NULL;
    Py_ssize_t size = 0;
    if (list != NULL && count > 0) {
        text = PyObject_Str(first); /* b"%d" % first, as text: any size */
        if (text != NULL) first_digits = PyUnicode_AsUTF8AndSize(text, &size);
        if (first_digits == NULL) Py_CLEAR(list);
    }
    if (first_digits != NULL && first_digits[0] == '-') {
        if (fill_from_negative(list, name, prefix, first) < 0) Py_CLEAR(list);
    } else if (first_digits != NULL) {
        /* first + count - 1 has at most max(size, 19) + 1 digits: 24 spare are enough. */
        buffer = PyMem_Malloc((size_t)size + 24);
        if (buffer == NULL) {
            PyErr_NoMemory();
            Py_CLEAR(list);
        } else {
            char *end = buffer + size + 24, *start = end - size;
            memcpy(start, first_digits, (size_t)size);
            for (Py_ssize_t i = 0; i < count; i++) {
                PyObject *headers = one_header(name, prefix, start, end - start);
                if (headers == NULL) {
                    Py_CLEAR(list);
                    break;
                }
                PyList_SET_ITEM(list, i, headers);
                char *digit = end - 1;
                while (digit >= start && *digit == '9') *digit-- = '0';
                if (digit >= start) ++*digit;
                else *--start = '1';
            }
        }
    }
    PyMem_Free(buffer);
    Py_XDECREF(text);
    Py_DECREF(first);
    return list;
}

/* --- the spool's frames ------------------------------------------------------------------ */

/* zlib's crc32, from the libz Python's zlib module loaded (no header, no link: its ABI has
 * not changed since 1995); NULL if there is none, and then no encode_payload_frames. */
typedef unsigned long (*crc32_function)(unsigned long, const unsigned char *, unsigned int);
static crc32_function zlib_crc32 = NULL;

static void find_crc32(void) {
    PyObject *zlib = PyImport_ImportModule("zlib"); /* loads libz, if it is a library */
    if (zlib == NULL) {
        PyErr_Clear();
        return;
    }
    Py_DECREF(zlib);
    void *library = dlopen("libz.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL) library = dlopen("libz.so.1", RTLD_NOW);
    if (library != NULL) zlib_crc32 = (crc32_function)dlsym(library, "crc32");
}

static int cpu_folds_crc32 = 0; /* PCLMULQDQ and SSE4.1, asked once at import */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_FOLDED_CRC32 1

/* zlib's CRC-32 of ``len`` bytes (a multiple of 16, at least 64) by carry-less
 * multiplication, on the inverted register as zlib keeps it: the folding of Gopal et al.,
 * "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Intel,
 * 2009), with its constants for the bit-reflected polynomial 0x04C11DB7, as zlib-ng and
 * Chromium's zlib use them. zlib's own table-driven crc32 takes ~1 ns a byte on a
 * 100-byte message; this, a few cycles a 16 bytes. */
__attribute__((target("sse4.1,pclmul"))) static uint32_t
folded_crc32(uint32_t crc, const unsigned char *buf, size_t len) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    buf += 64;
    len -= 64;
    while (len >= 64) { /* four lanes, 64 bytes a turn */
        __m128i *lanes[4] = {&x1, &x2, &x3, &x4};
        for (int lane = 0; lane < 4; lane++) {
            __m128i low = _mm_clmulepi64_si128(*lanes[lane], k1k2, 0x00);
            __m128i high = _mm_clmulepi64_si128(*lanes[lane], k1k2, 0x11);
            __m128i next = _mm_loadu_si128((const __m128i *)(buf + 16 * lane));
            *lanes[lane] = _mm_xor_si128(_mm_xor_si128(high, low), next);
        }
        buf += 64;
        len -= 64;
    }
    __m128i rest[3] = {x2, x3, x4};
    for (int lane = 0; lane < 3; lane++) { /* the four lanes folded into one */
        __m128i low = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, rest[lane]), low);
    }
    while (len >= 16) { /* then 16 bytes a turn */
        __m128i low = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)buf)), low);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64, then Barrett's reduction to 32 */
    __m128i x = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x);
    x = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k5k0, 0x00), x);
    x = _mm_and_si128(x1, mask32);
    x = _mm_clmulepi64_si128(x, poly, 0x10);
    x = _mm_and_si128(x, mask32);
    x = _mm_clmulepi64_si128(x, poly, 0x00);
    x1 = _mm_xor_si128(x1, x);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

/* zlib's CRC-32 a byte at a time (the bit-reflected 0x04C11DB7), for the 0-15 bytes the
 * folding leaves: a call into zlib cost ~130 instructions for a 14-byte tail, this ~6 a
 * byte. Filled at import. */
static uint32_t crc_table[256];

static void fill_crc_table(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

/* crc32(crc, buf, len) as zlib computes it: folded where the CPU can and the bytes are
 * enough (>= 64), the last 0-15 bytes by the table above; zlib's for the rest. */
static unsigned long spool_crc32(unsigned long crc, const unsigned char *buf, size_t len) {
#ifdef HAVE_FOLDED_CRC32
    if (cpu_folds_crc32 && len >= 64) {
        size_t chunk = len & ~(size_t)15;
        uint32_t c = folded_crc32(~(uint32_t)crc, buf, chunk);
        for (const unsigned char *end = buf + len, *at = buf + chunk; at < end; at++)
            c = crc_table[(c ^ *at) & 0xFF] ^ (c >> 8);
        return (~c) & 0xFFFFFFFFul;
    }
#endif
    return zlib_crc32(crc, buf, (unsigned int)len);
}

/* The checks and the size of a burst's spool frames (encode_payload_frames' arguments):
 * 0 and *total set, or -1 with an exception. */
static int payload_frames_size(PyObject *payloads, unsigned long long first,
                               Py_ssize_t head_size, Py_ssize_t *total) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(payloads);
    PyObject **items = PySequence_Fast_ITEMS(payloads);
    if (n > 0 && first + (unsigned long long)(n - 1) > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_ValueError, "a spool sequence past 2**32 - 1");
        return -1;
    }
    Py_ssize_t sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(items[i])) {
            PyErr_SetString(PyExc_TypeError, "a payload must be bytes");
            return -1;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(items[i]);
        if ((unsigned long long)size + (unsigned long long)head_size + 4 > 0xFFFFFFFFull) {
            PyErr_SetString(PyExc_ValueError, "a payload too large for a spool frame");
            return -1;
        }
        sum += 16 + head_size + 4 + size;
    }
    *total = sum;
    return 0;
}

static inline void store_u32(unsigned char *at, uint32_t value) { /* big-endian, one store */
    value = __builtin_bswap32(value);
    memcpy(at, &value, 4);
}

/* Writes the frames into `at` (payload_frames_size's bytes): per payload, the frame header
 * (marker, sequence, body length, crc ^ sequence), `head` (whose crc32 is `head_crc`), the
 * payload's length and the payload. */
static void fill_payload_frames(unsigned char *at, PyObject *payloads, unsigned long long first,
                                const unsigned char *head, Py_ssize_t head_size,
                                unsigned long head_crc, const unsigned char *marker) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(payloads);
    PyObject **items = PySequence_Fast_ITEMS(payloads);
    uint32_t mark;
    memcpy(&mark, marker, 4);
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *payload = (const unsigned char *)PyBytes_AS_STRING(items[i]);
        uint32_t size = (uint32_t)PyBytes_GET_SIZE(items[i]);
        uint32_t sequence = (uint32_t)(first + (unsigned long long)i);
        memcpy(at, &mark, 4);
        store_u32(at + 4, sequence);
        store_u32(at + 8, (uint32_t)head_size + 4 + size);
        memcpy(at + 16, head, (size_t)head_size);
        unsigned char *length = at + 16 + head_size; /* the length, then the payload */
        store_u32(length, size);
        memcpy(length + 4, payload, size);
        unsigned long crc = spool_crc32(head_crc, length, 4 + (size_t)size);
        store_u32(at + 12, (uint32_t)crc ^ sequence);
        at = length + 4 + size;
    }
}

/* The arguments encode_payload_frames and write_payload_frames share, from args[offset]:
 * payloads, first_sequence, head, head_crc, marker. */
typedef struct {
    PyObject *payloads; /* a new reference (PySequence_Fast) */
    unsigned long long first;
    const unsigned char *head, *marker;
    Py_ssize_t head_size, total;
    unsigned long head_crc;
} FrameArgs;

static int frame_args(PyObject *const *args, FrameArgs *out) {
    if (!PyBytes_Check(args[2]) || !PyBytes_Check(args[4]) || PyBytes_GET_SIZE(args[4]) != 4) {
        PyErr_SetString(PyExc_TypeError, "(payloads, first_sequence: int, head: bytes, "
                                         "head_crc: int, marker: 4 bytes)");
        return -1;
    }
    out->first = PyLong_AsUnsignedLongLong(args[1]);
    out->head_crc = PyLong_AsUnsignedLong(args[3]);
    if (PyErr_Occurred()) return -1;
    out->payloads = PySequence_Fast(args[0], "payloads must be a sequence");
    if (out->payloads == NULL) return -1;
    out->head = (const unsigned char *)PyBytes_AS_STRING(args[2]);
    out->head_size = PyBytes_GET_SIZE(args[2]);
    out->marker = (const unsigned char *)PyBytes_AS_STRING(args[4]);
    if (payload_frames_size(out->payloads, out->first, out->head_size, &out->total) < 0) {
        Py_CLEAR(out->payloads);
        return -1;
    }
    return 0;
}

/* encode_payload_frames(payloads, first_sequence, head, head_crc, marker) -> bytes:
 * pydory/daemon/spool/records.py's encode_payloads (without origins), the same bytes. */
static PyObject *encode_payload_frames(PyObject *Py_UNUSED(module), PyObject *const *args,
                                       Py_ssize_t nargs) {
    FrameArgs frames;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "encode_payload_frames(payloads, first_sequence: int, "
                                         "head: bytes, head_crc: int, marker: 4 bytes)");
        return NULL;
    }
    if (frame_args(args, &frames) < 0) return NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, frames.total);
    if (result != NULL)
        fill_payload_frames((unsigned char *)PyBytes_AS_STRING(result), frames.payloads,
                            frames.first, frames.head, frames.head_size, frames.head_crc,
                            frames.marker);
    Py_DECREF(frames.payloads);
    return result;
}

/* write_payload_frames(fd, payloads, first_sequence, head, head_crc, marker, limit) -> int:
 * encode_payload_frames' bytes written to fd, in one write(2) (again after a short one, as
 * the spool's Python loop does; EINTR retried), the GIL released around the writes as
 * os.write releases it, without a bytes object of them: the spool's write-ahead of a burst
 * in one call (issue 34, lever 3). Returns the bytes written; if they would be more than
 * `limit`, writes nothing and returns -(their number); OSError if a write fails (what
 * reached the file is then the caller's to cut back). */
static PyObject *write_payload_frames(PyObject *Py_UNUSED(module), PyObject *const *args,
                                      Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "write_payload_frames(fd: int, payloads, "
                                         "first_sequence: int, head: bytes, head_crc: int, "
                                         "marker: 4 bytes, limit: int)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "write_payload_frames: a bad file descriptor");
        return NULL;
    }
    FrameArgs frames;
    if (frame_args(args + 1, &frames) < 0) return NULL;
    if (frames.total > limit) {
        Py_DECREF(frames.payloads);
        return PyLong_FromSsize_t(-frames.total);
    }
    unsigned char *buffer = PyMem_RawMalloc(frames.total > 0 ? (size_t)frames.total : 1);
    if (buffer == NULL) {
        Py_DECREF(frames.payloads);
        return PyErr_NoMemory();
    }
    fill_payload_frames(buffer, frames.payloads, frames.first, frames.head, frames.head_size,
                        frames.head_crc, frames.marker);
    Py_DECREF(frames.payloads);
    Py_ssize_t written = 0;
    int failure = 0;
    Py_BEGIN_ALLOW_THREADS
    while (written < frames.total) { /* a short write is followed by the error, or by more */
        ssize_t done = write((int)fd, buffer + written, (size_t)(frames.total - written));
        if (done < 0 && errno == EINTR) continue;
        if (done <= 0) { /* nothing written of a regular file's write: only a full disk */
            failure = done < 0 ? errno : ENOSPC;
            break;
        }
        written += done;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(buffer);
    if (failure) {
        errno = failure;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(written);
}

/* crc32(data, crc) -> int: zlib.crc32(data, crc), as the spool's frames compute it (the
 * folded path held to zlib's by a test). */
static PyObject *spool_crc32_of(PyObject *Py_UNUSED(module), PyObject *const *args,
                                Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "crc32(data: bytes, crc: int)");
        return NULL;
    }
    unsigned long crc = PyLong_AsUnsignedLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    return PyLong_FromUnsignedLong(spool_crc32(crc, data, (size_t)PyBytes_GET_SIZE(args[0])));
}

/* --- the module -------------------------------------------------------------------------- */

/* trim_heap() -> bool: glibc's malloc_trim(0), the free pages inside the heap given back
 * to the system (daemon/heap_trim.py says when); False where the C library is not glibc. */
static PyObject *trim_heap(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(unused)) {
#if defined(__GLIBC__)
    int released;
    Py_BEGIN_ALLOW_THREADS
    released = malloc_trim(0);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(released);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef module_methods[] = {
    {"trim_heap", trim_heap, METH_NOARGS,
     "trim_heap() -> bool: glibc's malloc_trim(0) (True if pages were given back)."},
    {"parse_any_partition_burst", (PyCFunction)(void (*)(void))parse_any_partition_burst,
     METH_FASTCALL,
     "parse_any_partition_burst(frames, topic_cache) -> list: wire.parse_any_partition of "
     "each frame, in one call."},
    {"parse_burst", (PyCFunction)(void (*)(void))parse_burst, METH_FASTCALL,
     "parse_burst(frames, topic_cache) -> ParsedBurst: parse_any_partition_burst's parses, "
     "each made when asked (burst[i]); the compiled producer reads them without."},
    {"identity_headers", (PyCFunction)(void (*)(void))identity_headers, METH_FASTCALL,
     "identity_headers(name, prefix, first, count) -> list: [[(name, prefix + b'%d' % s)] "
     "for s in range(first, first + count)], in one call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pydory._cwire",
    .m_doc = "The compiled twin of pydory.wire's hot path (see pydory.hotpath).",
    .m_size = -1,
    .m_methods = module_methods,
};

static PyObject *attribute_of(const char *module_name, const char *name) {
    PyObject *module = PyImport_ImportModule(module_name);
    if (module == NULL) return NULL;
    PyObject *value = PyObject_GetAttrString(module, name);
    Py_DECREF(module);
    return value;
}

PyMODINIT_FUNC PyInit__cwire(void) {
    if (PyType_Ready(&FramerType) < 0 || PyType_Ready(&ReaderType) < 0 ||
        PyType_Ready(&DrainType) < 0 || PyType_Ready(&StreamDrainType) < 0 ||
        PyType_Ready(&ParsedBurstType) < 0)
        return NULL;
    OversizedFrame = attribute_of("pydory.errors", "OversizedFrame");
    MalformedMessage = attribute_of("pydory.errors", "MalformedMessage");
    NEED_DATA = attribute_of("pydory.wire", "NEED_DATA");
    str_prefix = PyUnicode_InternFromString("prefix");
    str_size = PyUnicode_InternFromString("size");
    if (!OversizedFrame || !MalformedMessage || !NEED_DATA || !str_prefix || !str_size)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "StreamFramer", (PyObject *)&FramerType) < 0 ||
        PyModule_AddObjectRef(module, "DatagramReader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObjectRef(module, "DatagramDrain", (PyObject *)&DrainType) < 0 ||
        PyModule_AddObjectRef(module, "StreamDrain", (PyObject *)&StreamDrainType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&parsed_burst_capsule, PARSED_BURST_CAPSULE, NULL);
    int added = capsule != NULL &&
                PyModule_AddObjectRef(module, "ParsedBurst", (PyObject *)&ParsedBurstType) == 0 &&
                PyModule_AddObjectRef(module, "_parsed_burst_api", capsule) == 0;
    Py_XDECREF(capsule);
    if (!added) {
        Py_DECREF(module);
        return NULL;
    }
#ifdef HAVE_FOLDED_CRC32
    __builtin_cpu_init();
    cpu_folds_crc32 = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    find_crc32();
    fill_crc_table();
    if (zlib_crc32 != NULL) { /* else the spool encodes its frames in Python */
        static PyMethodDef functions[] = {
            {"encode_payload_frames", (PyCFunction)(void (*)(void))encode_payload_frames,
             METH_FASTCALL,
             "encode_payload_frames(payloads, first_sequence, head, head_crc, marker) -> bytes: "
             "the spool's frames of client messages, in one call."},
            {"write_payload_frames", (PyCFunction)(void (*)(void))write_payload_frames,
             METH_FASTCALL,
             "write_payload_frames(fd, payloads, first_sequence, head, head_crc, marker, limit) "
             "-> int: encode_payload_frames' bytes written to fd (or, above limit, none: "
             "-their size)."},
            {"crc32", (PyCFunction)(void (*)(void))spool_crc32_of, METH_FASTCALL,
             "crc32(data, crc) -> int: zlib.crc32(data, crc), as the spool's frames compute it."},
        };
        for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++) {
            PyObject *function = PyCFunction_NewEx(&functions[i], NULL, NULL);
            if (function == NULL || PyModule_AddObject(module, functions[i].ml_name, function) < 0) {
                Py_XDECREF(function);
                Py_DECREF(module);
                return NULL;
            }
        }
    }
    if (PyModule_AddIntConstant(module, "FOLDS_CRC32", cpu_folds_crc32) < 0 ||
        PyModule_AddIntConstant(module, "DRAIN_BURSTS", DRAIN_BURSTS) < 0 ||
        PyModule_AddIntConstant(module, "SDRAIN_CONNECTION_BYTES", SDRAIN_CONNECTION_BYTES) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
