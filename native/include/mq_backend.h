/* mq_backend.h: the device-backend ABI that the native runtime loads at run time with dlopen.
 *
 * Why: one Go binary serves CPU and GPU. The CPU runtime (native/*.cc) never links CUDA; when an
 * engine is opened with device "cuda" it dlopen()s libmodelqual_cuda.so (path from the
 * MODELQUAL_CUDA_LIB environment variable, else next to the executable, else the loader path) and
 * resolves the symbols below. The CPU runtime keeps scheduling, batching, sampling of non-greedy
 * requests, stop conditions and cancellation; the backend owns weights, the KV cache and the
 * forward pass on the device.
 */
#ifndef MQ_BACKEND_H
#define MQ_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MQB_ABI_VERSION 6

typedef struct mqb_model mqb_model; /* opaque */

/* Element types of stored tensors (the bundle stores tensors at the build precision). */
typedef enum { MQB_DTYPE_F32 = 0, MQB_DTYPE_BF16 = 1, MQB_DTYPE_F16 = 2 } mqb_dtype;

/* A host tensor as stored in the bundle (row-major, Hugging Face names and layouts), read in
 * place from the bundle's mapping. */
typedef struct {
  const char *name;
  const void *data;
  int32_t dtype; /* mqb_dtype */
  int64_t shape[4];
  int32_t ndim;
} mqb_tensor;

/* One resolved hyper-parameter, by its canonical name (e.g. "hidden_size", "num_kv_heads",
 * "rope_theta", "tie_word_embeddings"). The runtime parses config.json once (in Go) and the
 * family's resolve step fills in defaults and derived values, so a backend reads numbers and
 * never parses JSON. Integers and booleans are exact in value; str is non-NULL only for string
 * values. */
typedef struct {
  const char *key;
  double value;
  const char *str;
} mqb_hparam;

typedef struct {
  int32_t abi_version;       /* MQB_ABI_VERSION */
  const char *family;        /* the runtime family, e.g. "gpt2", "qwen3" */
  const mqb_hparam *hparams; /* resolved hyper-parameters of the family */
  int32_t n_hparams;
  const char *precision;     /* "bf16" | "fp16" | "fp32": the precision to compute in */
  int32_t max_batch;         /* number of KV-cache slots */
  int32_t max_context;       /* tokens per slot */
  int32_t device_index;      /* CUDA device ordinal */
  const mqb_tensor *tensors;
  int32_t n_tensors;
} mqb_model_params;

/* Families this library implements, as a NULL-terminated list (each .cu family file registers
 * itself); the runtime asks before opening so an unsupported family fails with a clear message.
 * Added in ABI version 4. */
const char *const *mqb_families(void);

/* Error convention: functions return 0 on success, non-zero on failure and then write a
 * NUL-terminated message of at most errlen bytes into err. */

int32_t mqb_abi_version(void);
int mqb_model_open(const mqb_model_params *p, mqb_model **out, char *err, size_t errlen);
void mqb_model_close(mqb_model *m);
int32_t mqb_vocab_size(const mqb_model *m);

/* One batched forward step over n entries. Entry i appends n_tokens[i] tokens (a prompt on
 * prefill, 1 on decode) taken consecutively from tokens[], to KV-cache slot slots[i], at
 * positions start_pos[i] .. start_pos[i]+n_tokens[i]-1. For each entry the logits of its last
 * new token are written to logits_out + i*vocab (when logits_out != NULL) and their argmax to
 * argmax_out[i] (when argmax_out != NULL). */
int mqb_forward(mqb_model *m, int32_t n, const int32_t *slots, const int32_t *n_tokens,
                const int32_t *tokens, const int32_t *start_pos, float *logits_out,
                int32_t *argmax_out, char *err, size_t errlen);

/* mqb_forward with the next token of every entry drawn on the device: temperature[i] <= 0 takes
 * the argmax (as mqb_forward), temperature[i] > 0 draws from softmax(logits / temperature[i])
 * over the whole vocabulary with the Gumbel-max trick, its randomness hashed from rng_key[i]
 * (the caller passes a fresh key per entry and step; equal keys give equal draws). Top-k and
 * top-p are not applied here: a caller with such entries passes temperature 0 for them and
 * logits_out (else NULL: no logits cross to the host), and samples them from their logits, so
 * the other entries are still drawn here whatever their batch-mates ask for.
 * Added in ABI version 2; logits_out in version 3. */
int mqb_forward_sampled(mqb_model *m, int32_t n, const int32_t *slots, const int32_t *n_tokens,
                        const int32_t *tokens, const int32_t *start_pos, const float *temperature,
                        const uint64_t *rng_key, int32_t *token_out, float *logits_out, char *err,
                        size_t errlen);

/* Full-vocabulary logits at every position of ids (n*vocab floats), using a scratch slot;
 * for parity gates. */
int mqb_logits_all(mqb_model *m, const int32_t *ids, int32_t n, float *out, char *err,
                   size_t errlen);

/* Forget slot's KV cache (the request ended or was cancelled) and its image, if any. */
void mqb_slot_reset(mqb_model *m, int32_t slot);

/* Mixture-of-experts routing counts since open: *layers and *experts (0: not a mixture of
 * experts), and with out non-NULL out[layer*experts + e] (cap >= layers*experts). Optional: a
 * library without it serves no routing counts. */
int mqb_routing(mqb_model *m, uint64_t *out, int64_t cap, int32_t *layers, int32_t *experts, char *err,
                size_t errlen);

/* Attach one image to the sequence about to be prefilled in slot (0..max_batch-1, or max_batch:
 * the scratch slot of mqb_logits_all) with prompt (n ids, the image's placeholder tokens among
 * them): the processor's patches (grid_t*grid_h*grid_w rows of 3*temporal_patch*patch^2 values)
 * and the grid. Checked against the prompt here; the family's vision tower runs on the device
 * in the forward step that first reaches the image. mqb_slot_reset drops it. Families without
 * images fail. Added in ABI version 5 (family qwen3vl). */
int mqb_set_image(mqb_model *m, int32_t slot, const float *pixels, int64_t n_pixels, int32_t grid_t,
                  int32_t grid_h, int32_t grid_w, const int32_t *prompt, int32_t n, char *err,
                  size_t errlen);

/* mqb_set_image with several images, each on its own grid: pixels holds them one after another
 * (image k's grid grids[3k], grids[3k+1], grids[3k+2] as (t, h, w), its values following the
 * previous image's), n_images >= 1. The prompt holds one placeholder run per image, in order;
 * a family whose images stack into one grid (fixed-size tiles) takes the list as that stack.
 * Added in ABI version 6. */
int mqb_set_images(mqb_model *m, int32_t slot, const float *pixels, int64_t n_pixels, const int32_t *grids,
                   int32_t n_images, const int32_t *prompt, int32_t n, char *err, size_t errlen);

/* The device time (ns) of the vision tower and projector over slot's images since they were set:
 * two events recorded on the model's stream around the encode, read here (by then the prefill
 * that ran the tower has synchronised, so reading waits for nothing). 0: no image, not yet
 * encoded, or a family without images. Added in ABI version 6. */
int64_t mqb_vision_ns(mqb_model *m, int32_t slot);

/* Text-to-image models (task "image"; the family's native/models/<family>.cu, opened by name
 * through the registry). Symbols beside the text entry points:
 * the runtime resolves them only for an image family. The runtime validates the request, draws
 * the initial noise (torch-identical, as the CPU pipeline) and computes the scheduler's sigmas,
 * so both devices start from the same numbers; the library runs the text encoder, the denoising
 * loop (guidance and Euler steps on the device) and the VAE. */
typedef struct mqb_image mqb_image; /* opaque */

typedef struct {
  const int32_t *prompt;   /* prompt token ids (chat-formatted) */
  int32_t n_prompt;
  const int32_t *negative; /* negative prompt ids; NULL or n_negative 0: no guidance */
  int32_t n_negative;
  int32_t width, height, steps;
  float guidance;
  const float *noise;  /* initial latents [C, height/s, width/s] */
  const float *sigmas; /* steps+1 scheduler sigmas, the last 0 */
  uint8_t *rgb;        /* out: height*width*3 bytes */
  float *image;        /* out, optional: height*width*3 floats in [0, 1] */
  float *latents;      /* out, optional: (steps+1) latents; the library writes entries 1..steps */
  /* A pipeline with two text encoders takes the second one's ids here; prompt and negative
   * are then the first's. true_cfg: the pipeline's true_cfg_scale, real CFG when
   * > 1 and a negative prompt is given (guidance is then the guidance embedding's scale). Zero
   * (memset) for families without them. */
  const int32_t *prompt_2;
  int32_t n_prompt_2;
  const int32_t *negative_2;
  int32_t n_negative_2;
  float true_cfg;
} mqb_image_args;

int mqb_image_open(const mqb_model_params *p, mqb_image **out, char *err, size_t errlen);
int mqb_image_generate(mqb_image *m, const mqb_image_args *a, char *err, size_t errlen);
void mqb_image_close(mqb_image *m);

#ifdef __cplusplus
}
#endif

#endif /* MQ_BACKEND_H */
