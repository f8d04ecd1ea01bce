/* modelqual.h: the C ABI of the modelqual native runtime (C++17, fp32 CPU inference with an
 * optional CUDA backend loaded at run time).
 *
 * Why a C ABI: the Go package native is its only caller today, but a stable C surface keeps the
 * cgo boundary in one file and lets other hosts (a C test, a Python ctypes probe) drive the
 * same engine. Conventions follow llama.h: opaque handles, *_default_params() returning a
 * struct by value, paired mq_engine_open/mq_engine_close, callbacks with a user pointer, and
 * status codes whose message is read with mq_last_error() on the failing thread.
 *
 * Threading: an engine is driven by one thread (mq_engine_add/step/logits/info/close);
 * mq_engine_cancel may be called from any thread at any time before close.
 */
#ifndef MODELQUAL_H
#define MODELQUAL_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define MQ_API __declspec(dllexport)
#else
#define MQ_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MQ_ABI_VERSION 4

/* The most top candidates an event carries with its token's log-probability (OpenAI's limit
 * for top_logprobs, and vLLM's default max_logprobs is larger: 20 keeps an event fixed-size). */
#define MQ_MAX_TOP_LOGPROBS 20

typedef struct mq_engine mq_engine; /* opaque */

typedef enum {
  MQ_OK = 0,
  MQ_ERR_INVALID_ARGUMENT = 1, /* a request or parameter failed validation */
  MQ_ERR_BATCH_FULL = 2,       /* every KV-cache slot holds a live sequence */
  MQ_ERR_LOAD = 3,             /* model or backend could not be loaded */
  MQ_ERR_BACKEND = 4,          /* the forward pass failed (device error) */
  MQ_ERR_INTERNAL = 5
} mq_status;

/* Why a sequence ended (mq_event.reason when done != 0). */
typedef enum {
  MQ_FINISH_NONE = 0,
  MQ_FINISH_STOP = 1,      /* an EOS token was generated */
  MQ_FINISH_LENGTH = 2,    /* max_new_tokens reached */
  MQ_FINISH_CANCELLED = 3, /* mq_engine_cancel */
  MQ_FINISH_ERROR = 4      /* the forward pass failed */
} mq_finish_reason;

/* Element types of stored tensors: a bundle stores tensors at its build precision. */
typedef enum { MQ_DTYPE_F32 = 0, MQ_DTYPE_BF16 = 1, MQ_DTYPE_F16 = 2 } mq_dtype;

/* A host tensor (row-major, its checkpoint's name and layout). The data must stay valid until
 * mq_engine_close: the runtime reads tensors in place (zero copy from the bundle mmap) and
 * converts only what its compute precision needs. */
typedef struct {
  const char *name;
  const void *data;
  int32_t dtype; /* mq_dtype */
  int64_t shape[4];
  int32_t ndim;
} mq_tensor;

/* One value of config.json, flattened by the caller: nested objects become dotted keys
 * ("vision_config.depth", "rope_parameters.rope_theta"; a pipeline's components are the first
 * part: "transformer.dim"). Lists of numbers or of strings keep their elements. The family's
 * resolve step reads these; nothing in the runtime parses JSON. */
typedef enum {
  MQ_KV_NULL = 0,
  MQ_KV_NUMBER = 1,
  MQ_KV_BOOL = 2,   /* number is 0 or 1 */
  MQ_KV_STRING = 3,
  MQ_KV_NUMBERS = 4, /* numbers[0..n) */
  MQ_KV_STRINGS = 5  /* strings[0..n) */
} mq_kv_type;

typedef struct {
  const char *key;
  int32_t type; /* mq_kv_type */
  double number;
  const char *string;
  const double *numbers;
  const char *const *strings;
  int32_t n;
} mq_kv;

typedef struct {
  int32_t n_threads;   /* 0 = all online cores */
  int32_t max_batch;   /* concurrent sequences (KV-cache slots) */
  int32_t max_context; /* prompt + generated tokens per sequence */
  const char *device;  /* "cpu" (default) | "cuda" */
  int32_t device_index;
  const char *family;    /* a registered family (mq_family_info) */
  const char *precision; /* compute precision: "fp32" (cpu); cuda may take "bf16" | "fp16" */
  const mq_kv *config;   /* config.json, flattened (copied at open) */
  int32_t n_config;
  const mq_tensor *tensors; /* copied by name at open; data pointers are kept */
  int32_t n_tensors;
  const int32_t *eos_ids; /* copied at open */
  int32_t n_eos_ids;
} mq_engine_params;

typedef struct {
  uint32_t max_new_tokens; /* >= 1 */
  float temperature;       /* 0 = greedy */
  int32_t top_k;           /* 0 = off */
  float top_p;             /* 0 or >= 1 = off */
  uint64_t seed;           /* per-sequence PRNG seed */
  int32_t ignore_eos;
  /* Non-zero: every event's token carries its log-probability and the top_logprobs most
   * likely tokens' (log_softmax of the model's fp32 logits: the raw distribution, before
   * temperature, top-k or top-p). Zero costs nothing: a greedy step stays on the argmax path. */
  int32_t logprobs;
  int32_t top_logprobs; /* 0..MQ_MAX_TOP_LOGPROBS; only with logprobs */
  /* Logits processors, applied before temperature in the order transformers' generate applies
   * its own (repetition penalty, then min_tokens, then temperature, top-k, top-p, min-p), with
   * OpenAI's presence and frequency penalties right after the repetition penalty (as vLLM
   * applies them). Any of them set makes the sequence sample on the host (and makes a greedy
   * sequence take the argmax of the processed logits). */
  float repetition_penalty; /* 0 or 1 = off; > 0: transformers' RepetitionPenaltyLogitsProcessor over
                               prompt + generated ids (positive logits divided, negative multiplied) */
  float presence_penalty;   /* OpenAI: logit -= presence_penalty if the token was generated before */
  float frequency_penalty;  /* OpenAI: logit -= frequency_penalty * times the token was generated */
  float min_p;              /* 0 = off; transformers' MinPLogitsWarper: drop tokens whose probability is
                               below min_p times the most likely token's */
  int32_t min_tokens;       /* 0 = off; the EOS ids are suppressed until this many tokens are generated
                               (vLLM's min_tokens, transformers' MinNewTokensLengthLogitsProcessor) */
} mq_sampling;

typedef struct {
  uint64_t seq;
  int32_t token; /* -1 when the event carries no token (cancel, error) */
  int32_t done;
  int32_t reason; /* mq_finish_reason */
  /* Set when done: CLOCK_MONOTONIC nanoseconds and token counts. */
  int64_t added_ns;
  int64_t first_token_ns;
  int64_t done_ns;
  int32_t prompt_tokens;
  int32_t output_tokens;
  /* Set when the sequence asked for logprobs and the event carries a token: the token's
   * log-probability and the n_top most likely tokens' (descending; ties: the lowest id). */
  int32_t has_logprob;
  float logprob;
  int32_t rank; /* 1 + the number of tokens more likely than this one */
  int32_t n_top;
  int32_t top_ids[MQ_MAX_TOP_LOGPROBS];
  float top_logprobs[MQ_MAX_TOP_LOGPROBS];
  /* Set when done: nanoseconds the vision tower and projector spent encoding the sequence's
   * images (part of added_ns..first_token_ns): wall time on cpu, on cuda the device time between
   * two events around the encode (mqb_vision_ns); 0 without images. */
  int64_t vision_ns;
} mq_event;

typedef void (*mq_event_callback)(const mq_event *ev, void *user);

typedef struct {
  int32_t vocab_size;
  int32_t max_context;
  int32_t max_batch;
  int32_t n_threads;
  const char *device; /* valid until close */
  const char *task;   /* the family's task: "text" | "image" | "vision"; valid until close */
} mq_engine_info;

MQ_API int32_t mq_abi_version(void);

/* The message of the last failing call on this thread ("" when none). */
MQ_API const char *mq_last_error(void);

MQ_API mq_engine_params mq_engine_default_params(void);
MQ_API mq_sampling mq_sampling_default(void);

/* The family registry. Every native/models/<family>.cc registers itself at start-up
 * (MQ_REGISTER_FAMILY in runtime.h); nothing else lists families. mq_family_info(i) for
 * 0 <= i < mq_family_count() is a JSON object {"name", "task", "architectures": [...]}, valid
 * for the life of the process. */
MQ_API int32_t mq_family_count(void);
MQ_API const char *mq_family_info(int32_t i);

/* Resolves a family's hyper-parameters from its flattened config.json: defaults filled in,
 * derived values computed, unsupported settings refused (the error names the config key). On
 * success *json_out is a JSON object of the canonical hyper-parameters (every text family has
 * "vocab_size" and "max_positions"); free it with mq_free. */
MQ_API mq_status mq_family_resolve(const char *family, const mq_kv *config, int32_t n_config, char **json_out);

/* The tensors a family reads for a config, for a bundle builder to check a checkpoint against
 * before writing it: *json_out is {"tensors": [{"name", "shape"}], "renames": [{"from", "to"}],
 * "carried": [pattern], "dropped": [pattern]} (see TensorLayout in runtime.h); free it with
 * mq_free. The family's CPU model is constructed over no data to list what it reads, so config
 * errors the model refuses at open are refused here too. */
MQ_API mq_status mq_family_layout(const char *family, const mq_kv *config, int32_t n_config, char **json_out);
MQ_API void mq_free(void *p);

/* Opens an engine. The family's faults (MODELQUAL_FAULTS, comma-separated) are read once here,
 * by the family's own code. */
MQ_API mq_status mq_engine_open(const mq_engine_params *p, mq_engine **out);
MQ_API void mq_engine_close(mq_engine *e);

MQ_API mq_status mq_engine_info_get(const mq_engine *e, mq_engine_info *out);

/* Queues a sequence; it is prefilled at the next step. */
MQ_API mq_status mq_engine_add(mq_engine *e, const int32_t *prompt, int32_t n_prompt,
                               const mq_sampling *s, uint64_t *seq_out);

/* One image of a vision-language prompt (a family of task "vision"): pixel_values as the
 * family's image processor lays them out (n_pixels floats) and the image's grid in patches
 * (temporal, height, width). The prompt carries the image's placeholder tokens, one per image
 * token; the family checks the counts agree and puts the image's embeddings in their place.
 * The runtime copies the pixels; the caller's buffer may be freed when the call returns. */
typedef struct {
  const float *pixels;
  int64_t n_pixels;
  int32_t grid_t, grid_h, grid_w;
} mq_image;

/* mq_engine_add with one image (see mq_image). A family without images refuses it. */
MQ_API mq_status mq_engine_add_image(mq_engine *e, const int32_t *prompt, int32_t n_prompt, const mq_image *image,
                                     const mq_sampling *s, uint64_t *seq_out);

/* mq_engine_logits with one image. */
MQ_API mq_status mq_engine_logits_image(mq_engine *e, const int32_t *ids, int32_t n, const mq_image *image,
                                        float *out);

/* mq_engine_add with several images of one prompt, each on its own grid: images[k] (k <
 * n_images) is the image of the prompt's k-th run of placeholder tokens. For a family whose
 * images do not stack into one grid (each gets its own vision-tower pass and positions); a
 * family or device that takes one image per sequence refuses n_images > 1, naming the server's
 * --max-images-per-request. n_images 1 is mq_engine_add_image. */
MQ_API mq_status mq_engine_add_images(mq_engine *e, const int32_t *prompt, int32_t n_prompt, const mq_image *images,
                                      int32_t n_images, const mq_sampling *s, uint64_t *seq_out);

/* mq_engine_logits with several images (see mq_engine_add_images). */
MQ_API mq_status mq_engine_logits_images(mq_engine *e, const int32_t *ids, int32_t n, const mq_image *images,
                                         int32_t n_images, float *out);

/* Thread-safe. Ends the sequence at the next step (reason CANCELLED); unknown ids are ignored. */
MQ_API void mq_engine_cancel(mq_engine *e, uint64_t seq);

/* One engine step: applies cancels, prefills queued sequences, decodes one token for every
 * running sequence in one batched forward pass, and calls cb once per sequence touched
 * (a token, and/or done). *active_out receives the sequences still live afterwards. */
MQ_API mq_status mq_engine_step(mq_engine *e, mq_event_callback cb, void *user,
                                int32_t *active_out);

MQ_API int32_t mq_engine_active(const mq_engine *e);

/* Mixture-of-experts routing: the tokens each layer has routed to each expert since the engine
 * opened (prefill, decode and logits calls alike). Writes *layers and *experts (experts 0: the
 * model is not a mixture of experts); with out non-NULL also the counts, out[layer*experts + e],
 * which needs cap >= layers*experts. Safe to call beside mq_engine_step on another thread. */
MQ_API mq_status mq_engine_routing(const mq_engine *e, uint64_t *out, int64_t cap, int32_t *layers,
                                   int32_t *experts);

/* Full-vocabulary logits at every position of ids: out holds n*vocab_size floats. Uses a
 * scratch KV slot, so it never disturbs live sequences. */
MQ_API mq_status mq_engine_logits(mq_engine *e, const int32_t *ids, int32_t n, float *out);

/* The sampling distribution of one logits row, for parity tests against transformers' logits
 * processors: processed_out (vocab floats, optional) receives the logits after the processors
 * (penalties, min_tokens) and before temperature; probs_out (vocab doubles, optional) the
 * probabilities the engine samples from after temperature, top-k, top-p and min-p (zero for
 * removed tokens; one-hot at the argmax when temperature is 0). prompt and output are the
 * sequence's token history; n_output is the number of tokens generated so far. */
MQ_API mq_status mq_sampling_probs(int32_t vocab, const float *logits, const int32_t *prompt, int32_t n_prompt,
                                   const int32_t *output, int32_t n_output, const int32_t *eos_ids, int32_t n_eos,
                                   const mq_sampling *s, float *processed_out, double *probs_out);

/* Draws n tokens from one logits row with the engine's sampler (a fresh generator seeded with
 * seed, one draw after another), for statistical tests of the sampler against the exact
 * distribution. candidate_budget overrides the plain-temperature sampler's candidate budget
 * (0: the engine's; negative: weigh the whole vocabulary, as MODELQUAL_SAMPLER=full does) so a
 * small vocabulary exercises every path. */
MQ_API mq_status mq_sampling_draw(int32_t vocab, const float *logits, const mq_sampling *s, uint64_t seed,
                                  int32_t candidate_budget, int32_t n, int32_t *out);

/* Text-to-image engines (task "image"). */
typedef struct {
  int32_t latent_channels;   /* latents are [latent_channels, height/vae_scale, width/vae_scale] */
  int32_t vae_scale;         /* pixels per latent cell */
  int32_t size_multiple;     /* width and height must be multiples of this */
  int32_t max_size;          /* largest width or height accepted */
  int32_t max_prompt_tokens; /* the text encoder's context */
  int32_t max_steps;
  int32_t text_hidden; /* width of the text encoder's embeddings (mq_image_output.prompt_embeds) */
  int32_t pooled_hidden; /* width of a pooled text embedding (mq_image_output.pooled_embeds); 0: none */
} mq_image_spec;

typedef struct {
  const int32_t *prompt; /* token ids of the prompt as the pipeline formats it (chat template) */
  int32_t n_prompt;
  const int32_t *negative; /* token ids of the negative (unconditional) prompt; used when guidance > 0 */
  int32_t n_negative;
  int32_t width, height, steps;
  float guidance;
  uint64_t seed;
  /* optional, CPU pipelines: the VAE stage alone. These latent_channels*(height/vae_scale)*
   * (width/vae_scale) floats are the VAE decoder's input (the denoised latents after the
   * pipeline's scaling and shift); text encoder, noise and denoising are skipped and the
   * decoded image is returned. A component check against the reference's own decode. */
  const float *decode_latents;
  /* A family with two text encoders (FLUX: CLIP, then T5) takes the second one's ids here, as
   * its resolve step declares them (prompt_2.*); prompt and negative are then the first's. */
  const int32_t *prompt_2;
  int32_t n_prompt_2;
  const int32_t *negative_2;
  int32_t n_negative_2;
  /* FLUX's true_cfg_scale: > 1 with a negative prompt runs real classifier-free guidance (guidance
   * is then the distilled guidance embedding's scale); families without it refuse values != 0. */
  float true_cfg;
} mq_image_request;

typedef struct {
  uint8_t *rgb;   /* required: height*width*3 bytes, row-major RGB */
  float *image;   /* optional: height*width*3 floats in [0, 1], before rounding to 8 bits */
  float *latents; /* optional: (steps+1) latent tensors: the initial noise, then after each step */
  int64_t pipeline_ns; /* written: wall time of the pipeline call (text encoder to decoded pixels) */
  /* optional, CPU pipelines (a GPU pipeline refuses them), for component checks against the
   * reference's intermediates: the text encoder's embeddings of the prompt (n_prompt*text_hidden
   * floats), and the transformer's first call's outputs, the prompt's then, with guidance, the
   * negative prompt's (1 or 2 latent tensors). */
  float *prompt_embeds;
  float *first_velocity;
  /* optional, CPU pipelines with a pooled text embedding (pooled_hidden > 0): the prompt's. With
   * prompt_2 the prompt_embeds are the second encoder's (n_prompt_2*text_hidden floats). */
  float *pooled_embeds;
} mq_image_output;

MQ_API mq_status mq_engine_image_spec(const mq_engine *e, mq_image_spec *out);
/* Runs the whole pipeline for one request on the calling thread (the engine's one driver). */
MQ_API mq_status mq_engine_generate_image(mq_engine *e, const mq_image_request *r, mq_image_output *out);

/* Fills out[0..n) with what torch.randn(n, generator=torch.Generator("cpu").manual_seed(seed))
 * draws in float32 (MT19937 and torch's CPU normal sampling): a diffusion pipeline's initial
 * latents for seed, as diffusers' randn_tensor makes them. */
MQ_API mq_status mq_torch_randn(uint64_t seed, float *out, int64_t n);
/* The same draw in bfloat16 (torch.randn(n, generator=..., dtype=torch.bfloat16): another
 * stream, unrelated to the float32 one), each value widened to float. */
MQ_API mq_status mq_torch_randn_bf16(uint64_t seed, float *out, int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* MODELQUAL_H */
