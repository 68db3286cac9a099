/* pydory_tools._cloadgen: the benchmark's load generator's write loop in C (issue 25).
 *
 * Rule: it writes exactly what pydory_tools/bench/generator.py's Writer.send_messages writes, in
 * the same order and the same writes (one send per message or per batch of messages), and
 * nothing else; the Python loop stays the reference (tests/test_bench.py compares them).
 *
 * Why: where the daemon keeps up, `pydory bench` measured the Python generator, not the
 * daemon (BENCHMARKS.md, "Issue 25, steps 4-5"). This loop runs without the GIL and makes
 * one system call per write, as a C generator would. It parses nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Write all of buf (a stream: as sendall; a datagram: one send), waiting for room until
 * deadline. 0, or an errno (ETIMEDOUT past the deadline). */
static int write_one(int fd, const char *buf, size_t size, int stream, double deadline) {
    size_t done = 0;
    do {
        ssize_t n = send(fd, buf + done, size - done, MSG_NOSIGNAL);
        if (n >= 0) {
            done += (size_t)n;
            if (!stream) return 0;
            continue;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS) return errno;
        double left = deadline - now_s();
        if (left <= 0) return ETIMEDOUT;
        struct pollfd wait = {.fd = fd, .events = POLLOUT};
        int timeout_ms = left > 1.0 ? 1000 : (int)(left * 1000) + 1;
        if (poll(&wait, 1, timeout_ms) < 0 && errno != EINTR) return errno;
    } while (done < size);
    return 0;
}

/* send_writes(fd, writes, start, count, stream, deadline) -> next index: writes[start],
 * writes[start + 1], ... (wrapping around) count times, each a send (all of it on a
 * stream), waiting for room until deadline (time.monotonic()). OSError on failure. */
static PyObject *send_writes(PyObject *Py_UNUSED(module), PyObject *const *args,
                             Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "send_writes(fd, writes: list, start, count, stream, deadline)");
        return NULL;
    }
    int fd = PyLong_AsLong(args[0]);
    Py_ssize_t start = PyLong_AsSsize_t(args[2]), count = PyLong_AsSsize_t(args[3]);
    int stream = PyObject_IsTrue(args[4]);
    double deadline = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred()) return NULL;
    PyObject *writes = args[1];
    Py_ssize_t total = PyList_GET_SIZE(writes);
    if (total == 0 || start < 0 || start >= total) {
        PyErr_SetString(PyExc_ValueError, "start must index a non-empty list of writes");
        return NULL;
    }
    /* The buffers, taken while holding the GIL; the list keeps them alive meanwhile. */
    const char **data = PyMem_Malloc((size_t)total * sizeof *data);
    size_t *sizes = PyMem_Malloc((size_t)total * sizeof *sizes);
    if (data == NULL || sizes == NULL) {
        PyMem_Free(data);
        PyMem_Free(sizes);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < total; i++) {
        PyObject *item = PyList_GET_ITEM(writes, i);
        if (!PyBytes_Check(item)) {
            PyMem_Free(data);
            PyMem_Free(sizes);
            PyErr_SetString(PyExc_TypeError, "a write must be bytes");
            return NULL;
        }
        data[i] = PyBytes_AS_STRING(item);
        sizes[i] = (size_t)PyBytes_GET_SIZE(item);
    }
    Py_INCREF(writes);
    int error = 0;
    Py_ssize_t index = start;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t sent = 0; sent < count && error == 0; sent++) {
        error = write_one(fd, data[index], sizes[index], stream, deadline);
        if (++index == total) index = 0;
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(writes);
    PyMem_Free(data);
    PyMem_Free(sizes);
    if (error != 0) {
        errno = error;
        return PyErr_SetFromErrno(error == ETIMEDOUT ? PyExc_TimeoutError : PyExc_OSError);
    }
    return PyLong_FromSsize_t(index);
}

static PyMethodDef module_methods[] = {
    {"send_writes", (PyCFunction)(void (*)(void))send_writes, METH_FASTCALL,
     "send_writes(fd, writes, start, count, stream, deadline) -> next index"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pydory_tools._cloadgen",
    .m_doc = "The benchmark's load generator's write loop in C (see _cloadgen.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__cloadgen(void) { return PyModule_Create(&module_def); }
