/* A C program over libckpt_c (include/ckpt/ckpt_c.h), run by tests/interop/test_c_api.py:
 *
 *   ckpt_c_dump FILE             one line per tensor: name, dtype, shape, nbytes, CRC32 of its
 *                                bytes; each tensor read four ways (ckpt_read_tensor,
 *                                ckpt_load_all, ckpt_load_into, the zero-copy view where there
 *                                is one) and its first row by ckpt_read_slice, all compared
 *   ckpt_c_dump --convert IN OUT FORMAT    ckpt_convert, prints the tensors written
 *   ckpt_c_dump --verify FILE              ckpt_verify, prints the records checked
 *   ckpt_c_dump --errors MISSING           the error paths: prints each status and message
 *
 * Exits with the status of the first failing call (the CLI's exit codes), 0 when all agree,
 * 99 when two ways of reading disagree. Built with the ASan build too. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_c.h"

static uint32_t crc32_of(const unsigned char* p, uint64_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (uint64_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

static int check(ckpt_status s, const char* what) {
  if (s != CKPT_OK) fprintf(stderr, "%s: %s: %s\n", what, ckpt_status_name(s), ckpt_last_error());
  return s;
}

static int dump(const char* path) {
  ckpt_options* opts = ckpt_options_new();
  ckpt_checkpoint* c = NULL;
  int rc = check(ckpt_open(path, opts, &c), "ckpt_open");
  if (rc) goto out;
  size_t n = ckpt_tensor_count(c);
  ckpt_loaded* all = NULL;
  if ((rc = check(ckpt_load_all(c, opts, &all), "ckpt_load_all"))) goto out;
  void** dst = calloc(n ? n : 1, sizeof(void*));
  size_t* sizes = calloc(n ? n : 1, sizeof(size_t));
  ckpt_tensor_info* infos = calloc(n ? n : 1, sizeof(ckpt_tensor_info));
  for (size_t i = 0; i < n; ++i) {
    infos[i].struct_size = sizeof(ckpt_tensor_info);
    if ((rc = check(ckpt_tensor_info_at(c, i, &infos[i]), "ckpt_tensor_info_at"))) goto done;
    sizes[i] = (size_t)infos[i].nbytes;
    dst[i] = malloc(sizes[i] ? sizes[i] : 1);
  }
  if ((rc = check(ckpt_load_into(c, dst, sizes, n, opts), "ckpt_load_into"))) goto done;
  printf("format\t%s\nfiles\t%zu\n", ckpt_format(c), ckpt_file_count(c));
  for (size_t i = 0; i < n; ++i) {
    const ckpt_tensor_info* t = &infos[i];
    unsigned char* one = malloc(sizes[i] ? sizes[i] : 1);
    if ((rc = check(ckpt_read_tensor(c, i, one, sizes[i], opts), "ckpt_read_tensor"))) {
      free(one);
      goto done;
    }
    const void* view = NULL;
    int has_view = ckpt_tensor_data(c, i, &view) == CKPT_OK;
    size_t found = (size_t)-1;
    int agree = memcmp(one, dst[i], sizes[i]) == 0 &&
                ckpt_loaded_nbytes(all, i) == t->nbytes &&
                memcmp(one, ckpt_loaded_data(all, i), sizes[i]) == 0 &&
                (!has_view || memcmp(one, view, sizes[i]) == 0) &&
                ckpt_find_tensor(c, t->name, &found) == CKPT_OK && found == i;
    if (agree && t->ndim > 0 && t->shape[0] > 0) {  /* the first row, by slice */
      int64_t begin[16] = {0}, end[16];
      uint64_t row = t->nbytes / (uint64_t)t->shape[0];
      for (size_t d = 0; d < t->ndim && d < 16; ++d) end[d] = t->shape[d];
      end[0] = 1;
      unsigned char* first = malloc(row ? row : 1);
      if (t->ndim <= 16 &&
          (rc = check(ckpt_read_slice(c, i, begin, end, t->ndim, first, row, opts),
                      "ckpt_read_slice"))) {
        free(first);
        free(one);
        goto done;
      }
      agree = t->ndim > 16 || memcmp(first, one, row) == 0;
      free(first);
    }
    printf("%s\t%s\t[", t->name, t->dtype);
    for (size_t d = 0; d < t->ndim; ++d) printf(d ? ",%" PRId64 : "%" PRId64, t->shape[d]);
    printf("]\t%" PRIu64 "\t%08x\t%s\n", t->nbytes, crc32_of(one, t->nbytes),
           has_view ? "view" : "read");
    free(one);
    if (!agree) {
      fprintf(stderr, "%s: the ways of reading disagree\n", t->name);
      rc = 99;
      goto done;
    }
  }
done:
  for (size_t i = 0; i < n; ++i) free(dst[i]);
  free(dst);
  free(sizes);
  free(infos);
  ckpt_loaded_free(all);
out:
  ckpt_close(c);
  ckpt_options_free(opts);
  return rc;
}

static int convert(const char* in, const char* out, const char* format) {
  ckpt_options* opts = ckpt_options_new();
  ckpt_checkpoint* c = NULL;
  size_t written = 0;
  int rc = check(ckpt_options_set(opts, "format", format), "ckpt_options_set");
  if (!rc) rc = check(ckpt_open(in, opts, &c), "ckpt_open");
  if (!rc) rc = check(ckpt_convert(c, out, opts, &written), "ckpt_convert");
  if (!rc) printf("written\t%zu\n", written);
  ckpt_close(c);
  ckpt_options_free(opts);
  return rc;
}

static int verify(const char* path) {
  ckpt_checkpoint* c = NULL;
  size_t records = 0;
  int rc = check(ckpt_open(path, NULL, &c), "ckpt_open");
  if (!rc) {
    rc = ckpt_verify(c, &records);
    printf("verify\t%s\t%zu\t%s\n", ckpt_status_name(rc), records, ckpt_last_error());
  }
  ckpt_close(c);
  return rc;
}

/* Each error path: the status, and the message with its parts. */
static int errors(const char* missing) {
  ckpt_checkpoint* c = (ckpt_checkpoint*)1;
  ckpt_status s = ckpt_open(missing, NULL, &c);
  printf("open\t%s\t%s\t%s\t%d\n", ckpt_status_name(s), c == NULL ? "null" : "set",
         ckpt_last_error_source(), ckpt_last_error_has_offset());
  printf("message\t%s\n", ckpt_last_error());
  ckpt_options* opts = ckpt_options_new();
  s = ckpt_options_set(opts, "no_such_option", "1");
  printf("option\t%s\t%s\n", ckpt_status_name(s), ckpt_last_error());
  s = ckpt_options_set(opts, "mmap", "maybe");
  printf("value\t%s\t%s\n", ckpt_status_name(s), ckpt_last_error());
  s = ckpt_options_set(opts, "mmap", "0");
  printf("ok\t%s\t[%s]\n", ckpt_status_name(s), ckpt_last_error());
  s = ckpt_open(NULL, opts, &c);
  printf("null\t%s\n", ckpt_status_name(s));
  printf("version\t%s\t%d\n", ckpt_version(), ckpt_abi_version());
  ckpt_options_free(opts);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 2) return dump(argv[1]);
  if (argc == 5 && strcmp(argv[1], "--convert") == 0) return convert(argv[2], argv[3], argv[4]);
  if (argc == 3 && strcmp(argv[1], "--verify") == 0) return verify(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--errors") == 0) return errors(argv[2]);
  fprintf(stderr, "usage: ckpt_c_dump FILE | --convert IN OUT FORMAT | --verify FILE | --errors PATH\n");
  return 64;
}
