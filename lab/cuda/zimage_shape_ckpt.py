"""A diffusers ZImagePipeline folder with Z-Image-Turbo's layer sizes and random bf16 weights,
made on the GPU in seconds (lab: the throughput comparison of lab/cuda/zimage_gpu.sh).

    python zimage_shape_ckpt.py TINY_SNAPSHOT OUT_DIR

Why not `qual fixtures --name zimage-shape`: that recipe draws its ~10 billion values on one CPU
core (about 70 ns each here), minutes of device time this comparison cannot spend. The sizes are
the zimage-shape recipe's (fixtures/zimage.go); the configs are the zimage-tiny fixture's with
those sizes substituted, the tokenizer and scheduler are the tiny fixture's; the weights are the
modules' own default initialisation (throughput does not depend on their values).
"""
import json
import os
import shutil
import sys
import time

import torch

tiny, out = sys.argv[1], sys.argv[2]
t0 = time.time()
os.makedirs(out, exist_ok=True)
for d in ["scheduler", "tokenizer"]:
    shutil.copytree(os.path.join(tiny, d), os.path.join(out, d), dirs_exist_ok=True)
shutil.copy(os.path.join(tiny, "model_index.json"), out)


def cfg(part, **kw):
    c = json.load(open(os.path.join(tiny, part, "config.json")))
    c.update(kw)
    return c


te = cfg("text_encoder", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
         intermediate_size=9728, max_position_embeddings=40960, max_window_layers=36, torch_dtype="bfloat16")
tr = cfg("transformer", dim=3840, n_heads=30, n_kv_heads=30, n_layers=30, n_refiner_layers=2, cap_feat_dim=2560, axes_dims=[32, 48, 48])
vae = cfg("vae", block_out_channels=[128, 256, 512, 512], layers_per_block=2, norm_num_groups=32)

from transformers import Qwen3Config, Qwen3Model  # noqa: E402
from diffusers import AutoencoderKL, ZImageTransformer2DModel  # noqa: E402

torch.manual_seed(0)
with torch.device("cuda"):
    m = Qwen3Model(Qwen3Config(**{k: v for k, v in te.items() if not k.startswith("_")})).to(torch.bfloat16)
m.save_pretrained(os.path.join(out, "text_encoder"), max_shard_size="100GB", safe_serialization=True)
del m
with torch.device("cuda"):
    t = ZImageTransformer2DModel.from_config({k: v for k, v in tr.items() if not k.startswith("_")}).to(torch.bfloat16)
t.save_pretrained(os.path.join(out, "transformer"), max_shard_size="100GB", safe_serialization=True)
del t
with torch.device("cuda"):
    v = AutoencoderKL.from_config({k: val for k, val in vae.items() if not k.startswith("_")}).to(torch.bfloat16)
v.save_pretrained(os.path.join(out, "vae"), max_shard_size="100GB", safe_serialization=True)
torch.cuda.empty_cache()
size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
print(json.dumps({"dir": out, "bytes": size, "seconds": round(time.time() - t0, 1)}))
