"""The fixed C text of an exported model: the safetensors reader, the loader and the demo program (c.py fills in the rest)."""

# A safetensors header is JSON: {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}.
# The reader below parses that JSON (any key order, any whitespace; values it does not need are skipped) and points
# each weight into the file's bytes after checking its dtype, shape, size, bounds and alignment.
READER = r"""
/* ---- the weights file: a small reader for safetensors (an 8-byte little-endian header length, a JSON header, the data) */
typedef struct { const char *p, *end; } model_cur;

static void model_ws(model_cur *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static int model_lit(model_cur *c, char ch) {
  model_ws(c);
  if (c->p < c->end && *c->p == ch) { c->p++; return 1; }
  return 0;
}

/* a JSON string into out[cap] (out NULL: skipped); 0 when malformed or too long */
static int model_str(model_cur *c, char *out, size_t cap) {
  size_t n = 0;
  model_ws(c);
  if (c->p >= c->end || *c->p != '"') return 0;
  c->p++;
  while (c->p < c->end && *c->p != '"') {
    char ch = *c->p++;
    if (ch == '\\') {
      if (c->p >= c->end) return 0;
      ch = *c->p++;
      if (ch == 'u') {
        unsigned v = 0;
        for (int k = 0; k < 4; k++) {
          if (c->p >= c->end) return 0;
          char h = (char)(*c->p++ | 32);
          v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : 0);
        }
        ch = v < 128 ? (char)v : '?';
      } else if (ch == 'n') ch = '\n'; else if (ch == 't') ch = '\t'; else if (ch == 'r') ch = '\r';
      else if (ch == 'b') ch = '\b'; else if (ch == 'f') ch = '\f';
    }
    if (out) { if (n + 1 >= cap) return 0; out[n++] = ch; }
  }
  if (c->p >= c->end) return 0;
  c->p++;
  if (out) out[n] = 0;
  return 1;
}

static int model_int(model_cur *c, int64_t *v) {
  int neg = 0;
  int64_t x = 0;
  model_ws(c);
  if (c->p < c->end && *c->p == '-') { neg = 1; c->p++; }
  if (c->p >= c->end || *c->p < '0' || *c->p > '9') return 0;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') x = x * 10 + (*c->p++ - '0');
  *v = neg ? -x : x;
  return 1;
}

static int model_skip(model_cur *c, int depth) {
  model_ws(c);
  if (c->p >= c->end || depth > 64) return 0;
  char ch = *c->p;
  if (ch == '"') return model_str(c, NULL, 0);
  if (ch == '{' || ch == '[') {
    char close = ch == '{' ? '}' : ']';
    c->p++;
    if (model_lit(c, close)) return 1;
    do {
      if (ch == '{' && (!model_str(c, NULL, 0) || !model_lit(c, ':'))) return 0;
      if (!model_skip(c, depth + 1)) return 0;
    } while (model_lit(c, ','));
    return model_lit(c, close);
  }
  const char *start = c->p;  /* a number, true, false or null */
  while (c->p < c->end && *c->p != ',' && *c->p != '}' && *c->p != ']' && *c->p != ' ' && *c->p != '\n') c->p++;
  return c->p > start;
}

static int model_parse(unsigned char *file, size_t size) {
  uint64_t hlen = 0;
  char key[256], field[32], dt[16];
  int found[MODEL_NUM_WEIGHTS + 1] = {0};
  if (size < 8) return model_fail("the weights file is too short (%zu bytes) to be safetensors", size);
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | file[i];
  if (hlen > size - 8) return model_fail("the weights file's header length (%llu) exceeds the file", (unsigned long long)hlen);
  model_cur c = {(const char *)file + 8, (const char *)file + 8 + hlen};
  unsigned char *data = file + 8 + hlen;
  size_t dsize = size - 8 - (size_t)hlen;
  if (!model_lit(&c, '{')) return model_fail("the weights file's header is not a JSON object");
  if (!model_lit(&c, '}')) {
    do {
      int w = -1, ndim = -1;
      int64_t shape[8], a = -1, b = -1;
      if (!model_str(&c, key, sizeof key) || !model_lit(&c, ':')) return model_fail("malformed safetensors header (a key)");
      for (int i = 0; i < MODEL_NUM_WEIGHTS; i++) if (strcmp(key, model_tensors[i].name) == 0) w = i;
      if (w < 0) {
        if (!model_skip(&c, 0)) return model_fail("malformed safetensors header (the value of '%s')", key);
        continue;
      }
      dt[0] = 0;
      if (!model_lit(&c, '{')) return model_fail("tensor '%s': its header entry is not an object", key);
      if (!model_lit(&c, '}')) {
        do {
          if (!model_str(&c, field, sizeof field) || !model_lit(&c, ':')) return model_fail("tensor '%s': malformed header entry", key);
          if (strcmp(field, "dtype") == 0) {
            if (!model_str(&c, dt, sizeof dt)) return model_fail("tensor '%s': malformed dtype", key);
          } else if (strcmp(field, "shape") == 0) {
            ndim = 0;
            if (!model_lit(&c, '[')) return model_fail("tensor '%s': malformed shape", key);
            if (!model_lit(&c, ']')) {
              do {
                if (ndim == 8 || !model_int(&c, &shape[ndim])) return model_fail("tensor '%s': malformed shape", key);
                ndim++;
              } while (model_lit(&c, ','));
              if (!model_lit(&c, ']')) return model_fail("tensor '%s': malformed shape", key);
            }
          } else if (strcmp(field, "data_offsets") == 0) {
            if (!model_lit(&c, '[') || !model_int(&c, &a) || !model_lit(&c, ',') || !model_int(&c, &b) || !model_lit(&c, ']'))
              return model_fail("tensor '%s': malformed data_offsets", key);
          } else if (!model_skip(&c, 0)) return model_fail("tensor '%s': malformed header entry", key);
        } while (model_lit(&c, ','));
        if (!model_lit(&c, '}')) return model_fail("tensor '%s': malformed header entry", key);
      }
      const model_tensor_t *t = &model_tensors[w];
      if (strcmp(dt, t->dtype) != 0) return model_fail("tensor '%s' is %s in the weights file, the model needs %s", key, dt, t->dtype);
      int same = ndim == t->ndim;
      for (int i = 0; same && i < ndim; i++) same = shape[i] == t->shape[i];
      if (!same) return model_fail("tensor '%s' has another shape in the weights file than the model needs", key);
      if (a < 0 || b < a || (uint64_t)b > dsize || (uint64_t)(b - a) != t->nbytes)
        return model_fail("tensor '%s': data_offsets [%lld, %lld] do not hold its %zu bytes inside the file", key, (long long)a,
                          (long long)b, t->nbytes);
      if ((uintptr_t)(data + a) % t->align != 0) return model_fail("tensor '%s' is not aligned to %d bytes in memory", key, t->align);
      model_w[w] = data + a;
      found[w] = 1;
    } while (model_lit(&c, ','));
    if (!model_lit(&c, '}')) return model_fail("malformed safetensors header (its end)");
  }
  for (int i = 0; i < MODEL_NUM_WEIGHTS; i++) if (!found[i]) return model_fail("the weights file has no tensor '%s'", model_tensors[i].name);
  return 0;
}

static int model_load_file(const char *path) {
  FILE *f = fopen(path, "rb");
  long size;
  if (!f) return model_fail("cannot open the weights file %s", path);
  if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return model_fail("cannot read %s", path); }
  model_file_raw = malloc((size_t)size + 64);
  if (!model_file_raw) { fclose(f); return model_fail("out of memory reading %s (%ld bytes)", path, size); }
  unsigned char *file = model_file_raw + (64 - (uintptr_t)model_file_raw % 64) % 64;  /* tensors sit at multiples of 64 in the file */
  if (fread(file, 1, (size_t)size, f) != (size_t)size) { fclose(f); return model_fail("cannot read %s", path); }
  fclose(f);
  return model_parse(file, (size_t)size);
}
"""

LOADER = r"""
static int model_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(model_err, sizeof model_err, fmt, ap);
  va_end(ap);
  return -1;
}

const char *model_error(void) { return model_err; }
"""

API = r"""
void model_free(void) {
  free(model_file_raw);
  free(model_scratch_raw);
  model_file_raw = model_scratch_raw = NULL;
  model_ready = 0;
}

int model_init(const char *weights_path) {
  model_free();
  model_err[0] = 0;
  if (MODEL_SCRATCH_BYTES) {
    model_scratch_raw = malloc(MODEL_SCRATCH_BYTES + 64);
    if (!model_scratch_raw) return model_fail("out of memory for %zu bytes of scratch", (size_t)MODEL_SCRATCH_BYTES);
    model_scratch = model_scratch_raw + (64 - (uintptr_t)model_scratch_raw % 64) % 64;
  }
  int rc = %LOAD%;
  if (rc != 0) { model_free(); return rc; }
  model_ready = 1;
  return 0;
}
"""

MAIN = r"""/* A demo runner of the exported model (not needed to use it): reads each input from a raw little-endian file, runs
   the model once, writes each output to a raw file.

     ./model_main [-w WEIGHTS] [-v NAME=VALUE]... INPUT_FILE... OUTPUT_FILE...

   The files hold exactly the bytes model.h lists (MODEL_INPUT_BYTES / MODEL_OUTPUT_BYTES); -v sets a variable
   (a symbolic dimension), by default its value at export time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model.h"

int main(int argc, char **argv) {
  const char *weights = NULL;
  int64_t vars[MODEL_NUM_VARS + 1] = {0};
  void *in[MODEL_NUM_INPUTS + 1], *out[MODEL_NUM_OUTPUTS + 1];
  const char *files[MODEL_NUM_INPUTS + MODEL_NUM_OUTPUTS + 1];
  int nfiles = 0;
  for (int i = 0; i < MODEL_NUM_VARS; i++) vars[i] = model_var_default[i];
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-w") == 0 && i + 1 < argc) weights = argv[++i];
    else if (strcmp(argv[i], "-v") == 0 && i + 1 < argc) {
      const char *eq = strchr(argv[++i], '=');
      int k = -1;
      for (int j = 0; eq && j < MODEL_NUM_VARS; j++)
        if (strlen(model_var_names[j]) == (size_t)(eq - argv[i]) && strncmp(argv[i], model_var_names[j], (size_t)(eq - argv[i])) == 0) k = j;
      if (k < 0) { fprintf(stderr, "unknown variable in -v %s\n", argv[i]); return 2; }
      vars[k] = strtoll(eq + 1, NULL, 10);
    } else if (nfiles < MODEL_NUM_INPUTS + MODEL_NUM_OUTPUTS) files[nfiles++] = argv[i];
    else { fprintf(stderr, "too many files: the model has %d inputs and %d outputs\n", MODEL_NUM_INPUTS, MODEL_NUM_OUTPUTS); return 2; }
  }
  if (nfiles != MODEL_NUM_INPUTS + MODEL_NUM_OUTPUTS) {
    fprintf(stderr, "usage: %s [-w WEIGHTS] [-v NAME=VALUE]... INPUT_FILE (x%d) OUTPUT_FILE (x%d)\n", argv[0], MODEL_NUM_INPUTS, MODEL_NUM_OUTPUTS);
    return 2;
  }
  if (model_init(weights) != 0) { fprintf(stderr, "model_init: %s\n", model_error()); return 1; }
  for (int i = 0; i < MODEL_NUM_INPUTS; i++) {
    FILE *f = fopen(files[i], "rb");
    in[i] = malloc(model_input_bytes[i] + 1);
    if (!f || fread(in[i], 1, model_input_bytes[i], f) != model_input_bytes[i]) {
      fprintf(stderr, "input %d: cannot read %zu bytes from %s\n", i, model_input_bytes[i], files[i]);
      return 1;
    }
    fclose(f);
  }
  for (int i = 0; i < MODEL_NUM_OUTPUTS; i++) out[i] = malloc(model_output_bytes[i] + 1);
  if (model_run_v((const void *const *)in, out, vars) != 0) { fprintf(stderr, "model_run: %s\n", model_error()); return 1; }
  for (int i = 0; i < MODEL_NUM_OUTPUTS; i++) {
    FILE *f = fopen(files[MODEL_NUM_INPUTS + i], "wb");
    if (!f || fwrite(out[i], 1, model_output_bytes[i], f) != model_output_bytes[i]) {
      fprintf(stderr, "cannot write %s\n", files[MODEL_NUM_INPUTS + i]);
      return 1;
    }
    fclose(f);
    printf("output %d %s -> %s", i, model_output_desc[i], files[MODEL_NUM_INPUTS + i]);
    int64_t last = model_output_f32_last[i], rows = last ? (int64_t)(model_output_bytes[i] / 4) / last : 0;
    if (rows) printf("; argmax over the last axis (a classifier's prediction):");
    for (int64_t r = 0; r < rows && r < 32; r++) {  /* the first NaN wins, else the first largest value */
      const float *row = (const float *)out[i] + r * last;
      int64_t best = 0;
      for (int64_t j = 1; j < last; j++) if (row[best] == row[best] && (row[j] != row[j] || row[j] > row[best])) best = j;
      printf(" %lld", (long long)best);
    }
    printf("%s\n", rows > 32 ? " ..." : "");
  }
  model_free();
  return 0;
}
"""

MAKEFILE = """\
# Builds the exported model: libmodel.a (model.c) and the demo runner model_main (main.c).
#   make                 single-threaded
#   make OPENMP=1        kernels with a parallel loop split it across OpenMP threads (OMP_NUM_THREADS)
# The kernels need GCC or Clang (GNU C vector extensions). The MODEL_CFLAGS keep plugrad's float and integer semantics:
# no FMA contraction (every op rounds once), wrapping signed integers, no strict aliasing (vector loads through
# re-typed pointers). Keep them when changing CFLAGS.
CC ?= cc
CFLAGS ?= -O2 -march=native
MODEL_CFLAGS = -fwrapv -ffp-contract=off -fno-math-errno -fno-strict-aliasing
LDLIBS = -lm
ifeq ($(OPENMP),1)
MODEL_CFLAGS += -fopenmp
LDLIBS += -fopenmp
endif

all: libmodel.a model_main

model.o: model.c model.h
\t$(CC) $(CFLAGS) $(MODEL_CFLAGS) -c model.c -o model.o

libmodel.a: model.o
\t$(AR) rcs $@ model.o

model_main: main.c libmodel.a
\t$(CC) $(CFLAGS) main.c libmodel.a -o $@ $(LDLIBS)

clean:
\trm -f model.o libmodel.a model_main

.PHONY: all clean
"""
