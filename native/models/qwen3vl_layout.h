// models/qwen3vl_layout.h: where Qwen3-VL's images sit in a prompt and which rotary positions
// every prompt token takes (owner: qwen3vl family). One copy for both devices: the CPU model
// (qwen3vl.cc) and the GPU model (qwen3vl.cu, host side of the CUDA library) lay out a request's
// images with this function, so the two cannot drift apart; transformers' goldens test the CPU
// model, and the CUDA emulation harness (lab/qwen3vl) holds the GPU model to the CPU one.
//
// Pure C++ (no runtime types): errors are std::invalid_argument, which each side turns into its
// own error with the message unchanged.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace qwen3vl_layout {

// Grid is one image as the processor made it: t x h x w patches, count pixel values.
struct Grid {
  int t = 0, h = 0, w = 0;
  int64_t count = 0;
};

// Options are the planted faults that move positions (MODELQUAL_FAULTS qwen3vl.flat_rope,
// qwen3vl.shared_image_start), read by each side from its own fault switch.
struct Options {
  bool flat_rope = false;     // image tokens take 1-D positions
  bool shared_start = false;  // every image's positions start where the first image's did
};

// Layout is a prompt of n tokens with its images placed: per position its (t, h, w) rotary
// position and its merged image token index over all images (-1: text), each image's first
// token index (first[k], first[n_images] the total), and the rope delta (get_rope_index's
// mrope_position_deltas: decoding continues at cache position + delta).
struct Layout {
  std::vector<int32_t> pos3;
  std::vector<int> img_index;
  std::vector<int> first;
  int delta = 0;
};

// layout checks every image's grid and pixel count against the prompt's placeholder runs (run k
// is image k's, of exactly its merged token count) and lays out the prompt's 3-axis M-RoPE
// positions as transformers 5.17's Qwen3VLModel.get_rope_index does: text advances all three
// axes together; image k's tokens take (start, start + row, start + column) on its own merged
// grid, start being the position after the text before it; the text after an image resumes at
// start + max(rows, columns), the largest position so far + 1. merge is the spatial merge size,
// patch_values the values of one patch (3 * temporal_patch * patch^2).
inline Layout layout(const int32_t *prompt, int n, int32_t image_token, int merge, int64_t patch_values,
                     const std::vector<Grid> &grids, const Options &o = Options()) {
  const int n_images = (int)grids.size();
  if (n_images < 1) throw std::invalid_argument("images: at least one image is required");
  std::vector<int> lh(n_images), lw(n_images);
  Layout L;
  L.first.assign(n_images + 1, 0);
  for (int k = 0; k < n_images; k++) {
    const Grid &g = grids[k];
    const std::string which = n_images > 1 ? "image " + std::to_string(k) : "image";
    if (g.t != 1) throw std::invalid_argument(which + ": grid_t must be 1 (an image, not a video)");
    if (g.h <= 0 || g.w <= 0 || g.h % merge || g.w % merge)
      throw std::invalid_argument(which + ": grid " + std::to_string(g.h) + "x" + std::to_string(g.w) +
                                  " is not a positive multiple of the merge size " + std::to_string(merge));
    const int64_t want = (int64_t)g.t * g.h * g.w * patch_values;
    if (g.count != want)
      throw std::invalid_argument(which + ": " + std::to_string(g.count) + " pixel values, the grid needs " +
                                  std::to_string(want));
    lh[k] = g.h / merge, lw[k] = g.w / merge;
    L.first[k + 1] = L.first[k] + lh[k] * lw[k];
  }
  L.pos3.resize((size_t)n * 3);
  L.img_index.assign(n, -1);
  int next = 0, runs = 0, image_start = 0;
  for (int i = 0; i < n;) {
    if (prompt[i] != image_token) {
      for (int x = 0; x < 3; x++) L.pos3[(size_t)i * 3 + x] = next;
      next++, i++;
      continue;
    }
    const int k = runs++;
    int j = 0;
    const int at = i;
    for (; i < n && prompt[i] == image_token; i++, j++) {}
    if (k >= n_images || j != lh[k] * lw[k])
      throw std::invalid_argument(
          "prompt's image placeholder run " + std::to_string(k) + " holds " + std::to_string(j) + " image tokens; " +
          (k >= n_images ? "there are only " + std::to_string(n_images) + " images"
                         : "image " + std::to_string(k) + " (grid " + std::to_string(grids[k].h) + "x" +
                               std::to_string(grids[k].w) + ") needs " + std::to_string(lh[k] * lw[k])));
    if (k == 0) image_start = next;
    const int start = o.shared_start ? image_start : next;
    for (int q = 0; q < j; q++) {
      const int r = q / lw[k], c = q % lw[k], row = at + q;
      L.pos3[(size_t)row * 3] = start;
      L.pos3[(size_t)row * 3 + 1] = o.flat_rope ? start + q : start + r;
      L.pos3[(size_t)row * 3 + 2] = o.flat_rope ? start + q : start + c;
      L.img_index[row] = L.first[k] + q;
    }
    next += o.flat_rope ? j : std::max(lh[k], lw[k]);
  }
  if (runs != n_images)
    throw std::invalid_argument("prompt holds " + std::to_string(runs) + " image placeholder runs for " +
                                std::to_string(n_images) + (n_images == 1 ? " image" : " images"));
  L.delta = next - n;
  return L;
}

}  // namespace qwen3vl_layout
