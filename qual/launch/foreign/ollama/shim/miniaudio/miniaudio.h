/* A stand-in for miniaudio.h, written for modelqual (not miniaudio's code).
 *
 * Ollama's Go module zip leaves out llama.cpp's vendor/ folder, and its multimodal helper
 * (tools/mtmd/mtmd-helper.cpp) includes miniaudio to decode audio inputs. modelqual qualifies
 * text models on Ollama and never sends audio, so this header declares the few decoder names
 * the helper uses and makes every decode fail: an audio input is refused, nothing else changes.
 */
#ifndef MODELQUAL_MINIAUDIO_STANDIN_H
#define MODELQUAL_MINIAUDIO_STANDIN_H

#include <stddef.h>
#include <stdint.h>

typedef int ma_result;
typedef uint64_t ma_uint64;
typedef uint32_t ma_uint32;
typedef enum { ma_format_unknown = 0, ma_format_f32 = 5 } ma_format;
#define MA_SUCCESS 0
#define MA_NOT_IMPLEMENTED (-29)

typedef struct {
    ma_format format;
    ma_uint32 channels;
    ma_uint32 sampleRate;
} ma_decoder_config;

typedef struct {
    int unused;
} ma_decoder;

static inline ma_decoder_config ma_decoder_config_init(ma_format format, ma_uint32 channels, ma_uint32 sampleRate) {
    ma_decoder_config c = {format, channels, sampleRate};
    return c;
}
static inline ma_result ma_decoder_init_memory(const void *data, size_t size, const ma_decoder_config *config, ma_decoder *decoder) {
    (void)data; (void)size; (void)config; (void)decoder;
    return MA_NOT_IMPLEMENTED; /* no audio decoding in this build */
}
static inline ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder *decoder, ma_uint64 *length) {
    (void)decoder; *length = 0;
    return MA_NOT_IMPLEMENTED;
}
static inline ma_result ma_decoder_read_pcm_frames(ma_decoder *decoder, void *out, ma_uint64 count, ma_uint64 *read) {
    (void)decoder; (void)out; (void)count; *read = 0;
    return MA_NOT_IMPLEMENTED;
}
static inline ma_result ma_decoder_uninit(ma_decoder *decoder) {
    (void)decoder;
    return MA_SUCCESS;
}

#endif
