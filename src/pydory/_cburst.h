/*
 * pydory/_cburst.h: a parsed burst, as _cwire.c makes it (parse_burst) and _cproducer.c
 * reads it (burst_topics, produce_burst) -- issue 34, lever 2.
 *
 * Why: the burst path made a tuple, a value bytes and an int per message out of the
 * parser only for the compiled producer to take them apart again. A ParsedBurst keeps
 * each message's fields as pointers into its frames (which it holds), so a message the
 * burst path sends is never a Python object between its frame and librdkafka's copy;
 * the tuple the reference path wants is made when it asks for it (burst[i]).
 *
 * _cproducer.c finds the type through the capsule PARSED_BURST_CAPSULE (no link between
 * the two extensions) and checks the layout's size before it trusts it.
 */
#ifndef PYDORY_CBURST_H
#define PYDORY_CBURST_H

#include <Python.h>
#include <stddef.h>

/* One message's fields: pointers into its frame, which the entry holds. */
typedef struct {
    PyObject *frame; /* a strong reference to the frame (exact bytes); NULL with topic */
    PyObject *topic; /* a strong reference to the topic cache's str; NULL: the frame is not
                        a well-formed AnyPartition message of a known topic */
    const char *key;
    const char *value;
    Py_ssize_t key_size;
    Py_ssize_t value_size;
    long long timestamp_ms;
} burst_entry;

/* Not tracked by the cyclic collector: it refers to bytes and str objects only. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t length;    /* how many messages */
    Py_ssize_t capacity;  /* entries allocated (reused from burst to burst: see _cwire.c) */
    burst_entry *entries;
} ParsedBurstObject;

#define PARSED_BURST_CAPSULE "pydory._cwire._parsed_burst_api"

typedef struct {
    PyTypeObject *type;  /* pydory._cwire.ParsedBurst */
    size_t object_size;  /* sizeof(ParsedBurstObject), checked by the reader */
    size_t entry_size;   /* sizeof(burst_entry), likewise */
} parsed_burst_api;

#endif
