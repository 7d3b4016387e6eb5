/* ckpt_c.h: the C ABI of ckpt, for every language that can call C (Rust, Go, Julia, .NET,
 * Python's ctypes, ...). libckpt_c.so exports only the functions below (the list is checked by
 * the tests, capi/ckpt_c.symbols); no C++ type or exception crosses it.
 *
 * Conventions
 * - Every function that can fail returns a ckpt_status: CKPT_OK (0) or the code of the failure,
 *   which is the `ckpt` command's exit status for the same failure (docs/cli.md). The message of
 *   the last failure on the calling thread is ckpt_last_error(); its parts (file, record or
 *   tensor, byte offset) are ckpt_last_error_source/_record/_offset().
 * - Strings are UTF-8 and NUL-terminated. Strings and arrays returned by the library are owned by
 *   the object they came from and stay valid while it lives, unless a function says otherwise.
 * - Handles (ckpt_checkpoint, ckpt_options, ckpt_loaded) are opaque. Closing or freeing one
 *   must not race with another call on it; apart from that, a ckpt_checkpoint may be used from
 *   any number of threads at once (every call on it is read-only). A ckpt_options is not
 *   thread-safe while it is being changed; reading it from several calls at once is fine.
 * - No function calls back into the caller, and none keeps a pointer the caller passed after it
 *   returns.
 */
#ifndef CKPT_CKPT_C_H
#define CKPT_CKPT_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CKPT_C_EXPORT __attribute__((visibility("default")))
#else
#define CKPT_C_EXPORT
#endif

/* The version of this header's ABI. ckpt_abi_version() returns the library's; a caller built
 * against version N works with a library whose ABI version is N. */
#define CKPT_C_ABI_VERSION 1

typedef enum ckpt_status {
  CKPT_OK = 0,
  CKPT_ERR_UNEXPECTED = 1,       /* a failure that is no ckpt error (a bug, out of memory) */
  CKPT_ERR_NOT_FOUND = 2,        /* a file, record, tensor or key that should exist */
  CKPT_ERR_IO = 3,               /* the OS refused a read, write, open, mmap... */
  CKPT_ERR_TRUNCATED = 4,        /* the data ends before a structure it declares */
  CKPT_ERR_CORRUPT = 5,          /* bytes that cannot be what the format says; a failed check */
  CKPT_ERR_UNSUPPORTED = 6,      /* valid but not handled (unknown global, dtype...) */
  CKPT_ERR_LIMIT_EXCEEDED = 7,   /* a configured limit was hit */
  CKPT_ERR_INVALID_ARGUMENT = 8, /* the caller asked for something impossible */
  CKPT_ERR_AUTH = 9,             /* a wrong key or password, or tampered ciphertext */
  CKPT_ERR_NOT_VERIFIED = 10     /* ckpt_verify: the checkpoint stores no checksum to check */
} ckpt_status;

typedef struct ckpt_options ckpt_options;
typedef struct ckpt_checkpoint ckpt_checkpoint;
typedef struct ckpt_loaded ckpt_loaded;

/* One tensor's description. Filled by ckpt_tensor_info; `struct_size` must be set by the caller
 * to sizeof(ckpt_tensor_info) (later versions only append fields). The pointers stay valid while
 * the checkpoint is open. */
typedef struct ckpt_tensor_info {
  size_t struct_size;
  const char* name;    /* the tensor's name (a state dict key) */
  const char* dtype;   /* torch's name without "torch.": "float32", "bfloat16", "int64"... */
  size_t element_size; /* bytes per element (0 for sub-byte types) */
  size_t ndim;
  const int64_t* shape;   /* ndim entries (never NULL, also when ndim is 0) */
  const int64_t* strides; /* ndim entries, in elements, as stored (never NULL) */
  uint64_t nbytes;        /* the bytes of its elements, row-major and contiguous */
  uint64_t file_offset;   /* where its first byte is in its file; UINT64_MAX if not stored raw */
  size_t file_index;      /* the file that holds it: ckpt_file_name(checkpoint, file_index) */
  int contiguous;         /* 1 when its stored layout is row-major contiguous */
} ckpt_tensor_info;

/* ---- library ---------------------------------------------------------------------------- */

/* "0.1.0": the library's version. Static storage; thread-safe. */
CKPT_C_EXPORT const char* ckpt_version(void);
/* CKPT_C_ABI_VERSION of the library. Thread-safe. */
CKPT_C_EXPORT int ckpt_abi_version(void);
/* "corrupt" for CKPT_ERR_CORRUPT, "ok" for CKPT_OK: static storage; thread-safe. */
CKPT_C_EXPORT const char* ckpt_status_name(int status);

/* The last failure on the calling thread: the whole message (file, record, offset, context and
 * code), and its parts. "" (and 0 from _has_offset) when the last call succeeded. Valid until
 * the calling thread's next ckpt_* call. */
CKPT_C_EXPORT const char* ckpt_last_error(void);
CKPT_C_EXPORT const char* ckpt_last_error_source(void);
CKPT_C_EXPORT const char* ckpt_last_error_record(void);
CKPT_C_EXPORT int ckpt_last_error_has_offset(void);
CKPT_C_EXPORT uint64_t ckpt_last_error_offset(void);

/* ---- options ------------------------------------------------------------------------------
 * Options for opening, loading and converting, as text keys and values (the same names as the
 * C++ options and the CLI's flags):
 *   "mmap"             "1"/"0"  map local files (zero-copy views); default 1
 *   "strict"           "1"/"0"  refuse pickled classes ckpt does not know; default 0
 *   "verify"           "1"/"0"  check CRC32s while loading; default 0
 *   "threads"          N        reader threads, 0 = pick for the machine
 *   "decrypt_password" TEXT     tensorizer decryption
 *   "remote.region", "remote.endpoint", "remote.access_key", "remote.secret_key",
 *   "remote.session_token", "remote.ca_file", "remote.connections"   HTTP(S) and S3 sources
 *   "format"           NAME     convert: pt, safetensors, tensorizer, dcp (default: from the path)
 *   "max_shard_size"   SIZE     convert: shards of at most SIZE ("5GB", "500MB", bytes)
 *   "memory_budget"    SIZE     convert: bytes held at once when streaming
 * Unset keys take the library's defaults. */
CKPT_C_EXPORT ckpt_options* ckpt_options_new(void);          /* NULL only when out of memory */
CKPT_C_EXPORT void ckpt_options_free(ckpt_options* options); /* NULL is fine */
/* Copies key and value. CKPT_ERR_INVALID_ARGUMENT for an unknown key or a value that does not
 * parse (the message names both); the options are then unchanged. */
CKPT_C_EXPORT ckpt_status ckpt_options_set(ckpt_options* options, const char* key,
                                           const char* value);

/* ---- checkpoints --------------------------------------------------------------------------- */

/* Opens a checkpoint: a file of any supported format, an index of shards, a DCP folder, or an
 * http(s):// or s3:// URL of one. Reads metadata only. `options` may be NULL. On success *out
 * holds a handle to close with ckpt_close; on failure *out is NULL. */
CKPT_C_EXPORT ckpt_status ckpt_open(const char* path, const ckpt_options* options,
                                    ckpt_checkpoint** out);
/* Closes the handle. Memory from ckpt_tensor_data stays valid only until then; a ckpt_loaded
 * keeps what it needs alive by itself. NULL is fine. */
CKPT_C_EXPORT void ckpt_close(ckpt_checkpoint* checkpoint);

/* "torch-zip", "safetensors", "tensorizer", "onnx", "torch-dcp"... */
CKPT_C_EXPORT const char* ckpt_format(const ckpt_checkpoint* checkpoint);
CKPT_C_EXPORT size_t ckpt_tensor_count(const ckpt_checkpoint* checkpoint);
CKPT_C_EXPORT size_t ckpt_file_count(const ckpt_checkpoint* checkpoint);
/* NULL for an index past the end. */
CKPT_C_EXPORT const char* ckpt_file_name(const ckpt_checkpoint* checkpoint, size_t index);
/* CKPT_ERR_NOT_FOUND for an index past the end or an unknown name. */
CKPT_C_EXPORT ckpt_status ckpt_tensor_info_at(const ckpt_checkpoint* checkpoint, size_t index,
                                              ckpt_tensor_info* info);
CKPT_C_EXPORT ckpt_status ckpt_find_tensor(const ckpt_checkpoint* checkpoint, const char* name,
                                           size_t* index);

/* Copies tensor `index`'s elements (row-major, contiguous) into dst, which must hold exactly
 * info.nbytes bytes (CKPT_ERR_INVALID_ARGUMENT otherwise). Thread-safe. */
CKPT_C_EXPORT ckpt_status ckpt_read_tensor(const ckpt_checkpoint* checkpoint, size_t index,
                                           void* dst, size_t dst_bytes,
                                           const ckpt_options* options);
/* Copies the box [begin[d], end[d]) (ndim pairs) of tensor `index` into dst (row-major,
 * contiguous, exactly the box's bytes), reading only what the box needs where the layout allows
 * it (the chunks of a DCP folder that meet the box). Thread-safe. */
CKPT_C_EXPORT ckpt_status ckpt_read_slice(const ckpt_checkpoint* checkpoint, size_t index,
                                          const int64_t* begin, const int64_t* end, size_t ndim,
                                          void* dst, size_t dst_bytes, const ckpt_options* options);
/* Zero copy: where the checkpoint is a mapped local file and tensor `index` is stored raw,
 * contiguous and in native byte order, *data points at its first element in the mapping
 * (read-only) and CKPT_OK is returned; the pointer stays valid until ckpt_close. Otherwise *data
 * is NULL and CKPT_ERR_UNSUPPORTED is returned (read it with ckpt_read_tensor instead). */
CKPT_C_EXPORT ckpt_status ckpt_tensor_data(const ckpt_checkpoint* checkpoint, size_t index,
                                           const void** data);

/* Loads every tensor into memory the caller owns: dst[i] receives tensor i (ckpt_tensor_count
 * entries; a NULL dst[i] skips tensor i) and must hold exactly dst_bytes[i] == its nbytes. Every
 * size is checked before any byte is read. Reads in parallel. */
CKPT_C_EXPORT ckpt_status ckpt_load_into(const ckpt_checkpoint* checkpoint, void* const* dst,
                                         const size_t* dst_bytes, size_t count,
                                         const ckpt_options* options);
/* Loads every tensor into memory the library owns, with a coalesced parallel read. The result
 * keeps its memory (and whatever it needs of the checkpoint) alive until ckpt_loaded_free, also
 * after ckpt_close. */
CKPT_C_EXPORT ckpt_status ckpt_load_all(const ckpt_checkpoint* checkpoint,
                                        const ckpt_options* options, ckpt_loaded** out);
/* Tensor i of a load (in ckpt_tensor_info_at order): its elements, row-major and contiguous, and
 * their size. NULL / 0 for an index past the end. Valid until ckpt_loaded_free. */
CKPT_C_EXPORT const void* ckpt_loaded_data(const ckpt_loaded* loaded, size_t index);
CKPT_C_EXPORT uint64_t ckpt_loaded_nbytes(const ckpt_loaded* loaded, size_t index);
CKPT_C_EXPORT void ckpt_loaded_free(ckpt_loaded* loaded); /* NULL is fine */

/* Checks every stored checksum (CRC32s of a torch zip, stored digests). *records (may be NULL)
 * receives the number checked. CKPT_ERR_CORRUPT names the first bad record;
 * CKPT_ERR_NOT_VERIFIED when the checkpoint stores nothing to check. */
CKPT_C_EXPORT ckpt_status ckpt_verify(const ckpt_checkpoint* checkpoint, size_t* records);

/* Converts the checkpoint to `out_path` (a file, a folder for "dcp", or an s3:// URL) in the
 * format the options' "format" names or the path's extension says, streamed within the memory
 * budget. Nothing appears under out_path unless it succeeds. *written (may be NULL) receives the
 * number of tensors written. */
CKPT_C_EXPORT ckpt_status ckpt_convert(const ckpt_checkpoint* checkpoint, const char* out_path,
                                       const ckpt_options* options, size_t* written);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_CKPT_C_H */
