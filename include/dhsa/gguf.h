/* dhsa/gguf.h: GGUF files: reading metadata and tensors, writing a new file
 * (src/model/gguf.c, docs/gguf.md).
 *
 * A section of the public interface: users include <dhsa.h>, which
 * includes every section in order. This file includes the sections it
 * builds on, so it compiles alone too. The rules every call follows
 * (errors, threads, tensors) are at the top of dhsa.h and in dhsa/core.h.
 */
#ifndef DHSA_GGUF_H
#define DHSA_GGUF_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* GGUF files (src/model/gguf.c, docs/gguf.md)                              */

/* Value types of GGUF metadata (the ids the file stores). */
typedef enum {
    DHSA_GGUF_UINT8 = 0,
    DHSA_GGUF_INT8 = 1,
    DHSA_GGUF_UINT16 = 2,
    DHSA_GGUF_INT16 = 3,
    DHSA_GGUF_UINT32 = 4,
    DHSA_GGUF_INT32 = 5,
    DHSA_GGUF_FLOAT32 = 6,
    DHSA_GGUF_BOOL = 7,
    DHSA_GGUF_STRING = 8,
    DHSA_GGUF_ARRAY = 9,
    DHSA_GGUF_UINT64 = 10,
    DHSA_GGUF_INT64 = 11,
    DHSA_GGUF_FLOAT64 = 12
} dhsa_gguf_type;

/* Tensor types (ggml ids) whose sizes dhsa knows. Other ids are kept, with
 * an unknown size. */
typedef enum {
    DHSA_GGML_F32 = 0,
    DHSA_GGML_F16 = 1,
    DHSA_GGML_Q4_0 = 2,
    DHSA_GGML_Q4_1 = 3,
    DHSA_GGML_Q5_0 = 6,
    DHSA_GGML_Q5_1 = 7,
    DHSA_GGML_Q8_0 = 8,
    DHSA_GGML_Q2_K = 10,
    DHSA_GGML_Q3_K = 11,
    DHSA_GGML_Q4_K = 12,
    DHSA_GGML_Q5_K = 13,
    DHSA_GGML_Q6_K = 14,
    DHSA_GGML_IQ4_NL = 20,
    DHSA_GGML_IQ4_XS = 23,
    DHSA_GGML_BF16 = 30
} dhsa_ggml_type;

/* "UINT32", "STRING", ...; "?" for an id outside the enum. */
DHSA_API const char *dhsa_gguf_type_name(dhsa_gguf_type t);
/* "F32", "Q4_K", ...; "?" for an id dhsa does not know. */
DHSA_API const char *dhsa_ggml_type_name(uint32_t ggml_type);
/* Bytes of a tensor of n_dims dims (fastest first) of a known type; dims[0]
 * must be a multiple of the type's block. DHSA_ERR_UNSUPPORTED for an
 * unknown type, DHSA_ERR_SHAPE / DHSA_ERR_TOO_LARGE for bad dims. */
DHSA_API dhsa_status dhsa_ggml_tensor_bytes(uint32_t ggml_type, int n_dims, const int64_t *dims, int64_t *bytes);

/* A string from a GGUF file: a NUL-terminated copy owned by the dhsa_gguf;
 * len is authoritative (the bytes may hold a NUL). */
typedef struct {
    const char *str;
    int64_t len;
} dhsa_gguf_str;

/* An array value. data holds n elements as C types (uint8_t ... double;
 * BOOL as uint8_t 0/1; STRING as dhsa_gguf_str), decoded from little endian
 * and 8-byte aligned. An array of arrays is listed (type ARRAY, n) but its
 * elements are not kept: data is NULL. */
typedef struct {
    dhsa_gguf_type type;
    int64_t n;
    const void *data;
} dhsa_gguf_array;

/* One metadata key/value, read-only, owned by the dhsa_gguf. Which value
 * field holds the value depends on type: u (UINT8/16/32/64, BOOL as 0/1),
 * i (INT8/16/32/64), f (FLOAT32, FLOAT64), str (STRING), arr (ARRAY). */
typedef struct {
    const char *key;
    int64_t key_len;
    dhsa_gguf_type type;
    uint64_t u;
    int64_t i;
    double f;
    dhsa_gguf_str str;
    dhsa_gguf_array arr;
    uint64_t offset; /* byte offset of the key/value in the file */
} dhsa_gguf_kv;

/* One tensor, read-only, owned by the dhsa_gguf. */
typedef struct {
    const char *name;
    uint32_t type;       /* ggml type id (dhsa_ggml_type or another id) */
    int n_dims;          /* 0..4 */
    int64_t dims[4];     /* fastest-varying first (GGUF order); unused = 1 */
    int64_t n_elements;
    uint64_t offset;     /* from the start of the data section */
    int64_t bytes;       /* -1 when the type's size is unknown */
    const void *data;    /* inside the file, aligned as the file says;
                            NULL when bytes = -1 */
} dhsa_gguf_tensor;

typedef struct dhsa_gguf dhsa_gguf;

/* Opens a GGUF v2/v3 file read-only (mmap; read() when mmap fails). Every
 * count, length, offset, type and alignment is checked against the file
 * size before use; a malformed file gives DHSA_ERR_FORMAT and a sentence
 * naming what is wrong and at which byte. *out is NULL on failure. */
DHSA_API dhsa_status dhsa_gguf_open(const char *path, dhsa_gguf **out);
/* The same over a caller's buffer, which is borrowed: it must outlive the
 * dhsa_gguf (tensor data pointers point into it). */
DHSA_API dhsa_status dhsa_gguf_open_memory(const void *data, size_t size, dhsa_gguf **out);
/* Unmaps and frees; every pointer obtained from g dies. NULL is allowed. */
DHSA_API void dhsa_gguf_close(dhsa_gguf *g);

DHSA_API uint32_t dhsa_gguf_version(const dhsa_gguf *g);
DHSA_API uint64_t dhsa_gguf_alignment(const dhsa_gguf *g);
/* Byte offset of the (aligned) data section in the file. */
DHSA_API uint64_t dhsa_gguf_data_offset(const dhsa_gguf *g);
DHSA_API uint64_t dhsa_gguf_file_size(const dhsa_gguf *g);

/* Metadata, in file order (every key, known to dhsa or not). */
DHSA_API int64_t dhsa_gguf_n_kv(const dhsa_gguf *g);
/* NULL when i is out of range. */
DHSA_API const dhsa_gguf_kv *dhsa_gguf_kv_at(const dhsa_gguf *g, int64_t i);
/* Index of key, or -1 when absent. */
DHSA_API int64_t dhsa_gguf_find_kv(const dhsa_gguf *g, const char *key);

/* Typed getters. They fail with DHSA_ERR_FORMAT (sentence names the key)
 * when the key is absent or its type does not fit: the integer getters take
 * any integer type whose value fits the result; get_f32 takes FLOAT32 (and
 * FLOAT64, rounded); get_bool only BOOL; get_str only STRING (*len may be
 * NULL); get_arr only ARRAY. */
DHSA_API dhsa_status dhsa_gguf_get_u32(const dhsa_gguf *g, const char *key, uint32_t *out);
DHSA_API dhsa_status dhsa_gguf_get_u64(const dhsa_gguf *g, const char *key, uint64_t *out);
DHSA_API dhsa_status dhsa_gguf_get_i64(const dhsa_gguf *g, const char *key, int64_t *out);
DHSA_API dhsa_status dhsa_gguf_get_f32(const dhsa_gguf *g, const char *key, float *out);
DHSA_API dhsa_status dhsa_gguf_get_bool(const dhsa_gguf *g, const char *key, int *out);
DHSA_API dhsa_status dhsa_gguf_get_str(const dhsa_gguf *g, const char *key, const char **out, int64_t *len);
DHSA_API dhsa_status dhsa_gguf_get_arr(const dhsa_gguf *g, const char *key, dhsa_gguf_array *out);

/* Tensors, in file order. */
DHSA_API int64_t dhsa_gguf_n_tensors(const dhsa_gguf *g);
/* NULL when i is out of range. */
DHSA_API const dhsa_gguf_tensor *dhsa_gguf_tensor_at(const dhsa_gguf *g, int64_t i);
/* Index of the tensor, or -1 when absent. */
DHSA_API int64_t dhsa_gguf_find_tensor(const dhsa_gguf *g, const char *name);
/* The tensor's bytes; DHSA_ERR_UNSUPPORTED (sentence names the tensor and
 * the type id) when its type's size is unknown. */
DHSA_API dhsa_status dhsa_gguf_tensor_data(const dhsa_gguf *g, int64_t i, const void **data, int64_t *bytes);

/* Writer: a builder of a GGUF v3 file (alignment 32, or general.alignment
 * when set as a UINT32 power of two). Keys and tensor names must be unique
 * (a second set of the same key fails); values are copied at once; tensor
 * data is borrowed until the write. */
typedef struct dhsa_gguf_writer dhsa_gguf_writer;

DHSA_API dhsa_status dhsa_gguf_writer_create(dhsa_gguf_writer **out);
DHSA_API void dhsa_gguf_writer_free(dhsa_gguf_writer *w);
DHSA_API dhsa_status dhsa_gguf_writer_set_u8(dhsa_gguf_writer *w, const char *key, uint8_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_i8(dhsa_gguf_writer *w, const char *key, int8_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_u16(dhsa_gguf_writer *w, const char *key, uint16_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_i16(dhsa_gguf_writer *w, const char *key, int16_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_u32(dhsa_gguf_writer *w, const char *key, uint32_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_i32(dhsa_gguf_writer *w, const char *key, int32_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_u64(dhsa_gguf_writer *w, const char *key, uint64_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_i64(dhsa_gguf_writer *w, const char *key, int64_t v);
DHSA_API dhsa_status dhsa_gguf_writer_set_f32(dhsa_gguf_writer *w, const char *key, float v);
DHSA_API dhsa_status dhsa_gguf_writer_set_f64(dhsa_gguf_writer *w, const char *key, double v);
DHSA_API dhsa_status dhsa_gguf_writer_set_bool(dhsa_gguf_writer *w, const char *key, int v);
/* A NUL-terminated string. */
DHSA_API dhsa_status dhsa_gguf_writer_set_str(dhsa_gguf_writer *w, const char *key, const char *s);
/* A string of len bytes (may hold NULs). */
DHSA_API dhsa_status dhsa_gguf_writer_set_strn(dhsa_gguf_writer *w, const char *key, const char *s, int64_t len);
/* An array of n numeric or BOOL elements of type elem, packed as C types
 * (BOOL as uint8_t). */
DHSA_API dhsa_status dhsa_gguf_writer_set_arr(dhsa_gguf_writer *w, const char *key, dhsa_gguf_type elem,
                                              const void *data, int64_t n);
/* An array of n NUL-terminated strings. */
DHSA_API dhsa_status dhsa_gguf_writer_set_arr_str(dhsa_gguf_writer *w, const char *key, const char *const *strs,
                                                  int64_t n);
/* A tensor of a known ggml type; bytes must equal dhsa_ggml_tensor_bytes. */
DHSA_API dhsa_status dhsa_gguf_writer_add_tensor(dhsa_gguf_writer *w, const char *name, uint32_t ggml_type, int n_dims,
                                                 const int64_t *dims, const void *data, int64_t bytes);
/* Exact size of the file the writer would write. */
DHSA_API dhsa_status dhsa_gguf_writer_size(const dhsa_gguf_writer *w, size_t *bytes);
/* Writes the file into buf (cap >= dhsa_gguf_writer_size). */
DHSA_API dhsa_status dhsa_gguf_writer_write_memory(const dhsa_gguf_writer *w, void *buf, size_t cap);
/* Writes the file at path (removed again if writing fails). */
/* The file goes to a temporary in path's folder (PATH.part.PID.N), is
 * flushed, fsync'ed and renamed over path only when complete: a process
 * that has the old file mapped keeps its bytes, and a failure removes the
 * temporary and leaves the old file untouched (docs/files.md). */
DHSA_API dhsa_status dhsa_gguf_writer_write_file(const dhsa_gguf_writer *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* DHSA_GGUF_H */
