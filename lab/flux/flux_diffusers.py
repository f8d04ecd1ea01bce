"""diffusers' FluxPipeline in bf16 on the GPU, the reference of the flux family's CUDA pipeline
(lab: run by lab/flux/gpu_check.sh; diffusers from its public source on PYTHONPATH, never copied).

    python flux_diffusers.py golden SNAPSHOT FIXTURE DIFFUSERS_COMMIT OUT_DIR
        the GPU golden: the plain cases of fixtures/golden/make_flux_golden.py (3 prompts x 64x64
        and 96x64; steps 4, 3 for the lighthouse; seeds 42 + i; guidance 3.5 for dev, 0 for
        schnell; max_sequence_length 512 for dev, 256 for schnell) as a diffusers user runs them
        in bf16 on cuda: the seed's noise drawn by a CPU generator in the pipeline's dtype, bf16
        (torch makes bf16 normals from 8 bits of each 32-bit draw where fp32 takes 24: the same
        seed gives noise unrelated to the fp32 pipeline's), written as
        OUT_DIR/FIXTURE-cuda-bf16.json (the format of zimage-tiny-cuda-bf16.json: cases with 8-bit
        HWC RGB pixels in base64) and one PNG per case; for dev also the true-CFG case (negative
        "blurry, dark", true_cfg_scale 2) as FIXTURE-cuda-bf16-fox-truecfg.png (not in the JSON:
        ImageGoldenCase has no negative); also the fox from fp32-drawn noise passed as latents=
        (FIXTURE-cuda-bf16-fox-fp32noise.png: the bf16 pipeline on the fp32 pipeline's noise) and,
        in the JSON's "noise", the correlation of torch's bf16 and fp32 draws of one seed and the
        bf16 draws of seeds 42 and 43 at the fox latent shape
    python flux_diffusers.py run SNAPSHOT OUT.png W H STEPS GUIDANCE SEED PROMPT REPEAT MAXSEQ
        one pipeline in bf16 on cuda; the first call is the warmup, the others timed
        (torch.cuda.synchronize around each): prints JSON with images_per_s
    python flux_diffusers.py compare A.png B.png
        scikit-image's PSNR and SSIM (data_range 255, channel_axis 2) as JSON
    python flux_diffusers.py comparemany PAIRS
        compare for each line "A.png B.png" of PAIRS, JSON lines
    python flux_diffusers.py gemmrate
        the card's bf16 GEMM rate (8192^3 torch.matmul), TFLOP/s
    python flux_diffusers.py shape TINY_SNAPSHOT OUT_DIR dev|schnell
        a FluxPipeline folder with FLUX.1's sizes (fixtures/flux.go's flux-*-shape: 19 double and
        38 single blocks of 24 heads x 128, T5-XXL, CLIP-L, the 16-channel VAE) and random bf16
        weights drawn on the GPU (the modules' own initialisation; throughput does not depend on
        the values), the tokenizers and scheduler of the tiny fixture
"""
import base64
import json
import os
import platform
import shutil
import sys
import time

import numpy as np


def load_png(p):
    from PIL import Image

    return np.asarray(Image.open(p).convert("RGB"))


def compare(a, b):
    x, y = load_png(a), load_png(b)
    out = {"a": os.path.basename(a), "b": os.path.basename(b)}
    if x.shape != y.shape:
        out["error"] = "shapes differ: %s vs %s" % (x.shape, y.shape)
        return out
    d = x.astype(np.float64) - y.astype(np.float64)
    out["max_abs_diff"] = float(np.abs(d).max())
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    out["psnr"] = float(peak_signal_noise_ratio(x, y, data_range=255))
    out["ssim"] = float(structural_similarity(x, y, channel_axis=2, data_range=255))
    return out


def pipeline(snap):
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(snap, torch_dtype=torch.bfloat16).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def fp32_latents(pipe, c):
    """The seed's initial noise as FluxPipeline.prepare_latents draws it in an fp32 pipeline
    (randn_tensor on the CPU generator, then 2x2 packing), for latents= of a bf16 pipeline."""
    import torch
    from diffusers.utils.torch_utils import randn_tensor

    ch = pipe.transformer.config.in_channels // 4
    h = 2 * (int(c["height"]) // (pipe.vae_scale_factor * 2))
    w = 2 * (int(c["width"]) // (pipe.vae_scale_factor * 2))
    g = torch.Generator("cpu").manual_seed(c["seed"])
    x = randn_tensor((1, ch, h, w), generator=g, device=torch.device("cpu"), dtype=torch.float32)
    return pipe._pack_latents(x, 1, ch, h, w)


def call(pipe, c, max_seq, fp32_noise=False):
    import torch

    kw = {}
    if "negative_prompt" in c:
        kw = {"negative_prompt": c["negative_prompt"], "true_cfg_scale": c["true_cfg_scale"]}
    if fp32_noise:
        kw["latents"] = fp32_latents(pipe, c).to("cuda")
    img = pipe(
        prompt=c["prompt"],
        height=c["height"],
        width=c["width"],
        num_inference_steps=c["steps"],
        guidance_scale=c["guidance"],
        max_sequence_length=max_seq,
        generator=torch.Generator("cpu").manual_seed(c["seed"]),
        output_type="np",
        **kw,
    ).images[0]
    return (img * 255).round().astype("uint8")  # VaeImageProcessor.numpy_to_pil


def golden(snap, fixture, commit, out):
    import diffusers
    import torch
    import transformers
    from PIL import Image

    t0 = time.perf_counter()
    pipe = pipeline(snap)
    dev = bool(pipe.transformer.config.guidance_embeds)
    max_seq = 512 if dev else 256
    g = {
        "snapshot": os.path.basename(snap.rstrip("/")),
        "diffusers_commit": commit,
        "dtype": "bfloat16",
        "device": torch.cuda.get_device_name(0),
        "variant": "dev" if dev else "schnell",
        "max_sequence_length": max_seq,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "diffusers": diffusers.__version__,
            "numpy": np.__version__,
        },
        "load_seconds": time.perf_counter() - t0,
        "cases": [],
    }
    long_prompt = (
        "a very detailed watercolor painting of an old stone harbour town at sunrise, fishing boats with red "
        "and blue sails, gulls over the water, a lighthouse on the cliff, narrow streets with lanterns, "
        "flower boxes in every window, children running along the quay, mist over the hills, soft golden light, "
        "reflections in the calm sea, a cat asleep on a barrel, nets drying on wooden posts"
    )
    prompts = [("fox", "a red fox in the snow"), ("lighthouse", "a lighthouse at dusk, oil painting"), ("long", long_prompt)]
    for i, (pn, p) in enumerate(prompts):
        for w, h in [(64, 64), (96, 64)]:
            c = {"name": "%s-%dx%d" % (pn, w, h), "prompt": p, "width": w, "height": h, "steps": 4 if i != 1 else 3,
                 "guidance": 3.5 if dev else 0.0, "seed": 42 + i}
            px = call(pipe, c, max_seq)
            Image.fromarray(px).save(os.path.join(out, "%s-cuda-bf16-%s.png" % (fixture, c["name"])))
            c["pixels"] = base64.b64encode(np.ascontiguousarray(px).tobytes()).decode()
            g["cases"].append(c)
    if dev:
        c = {"name": "fox-truecfg", "prompt": "a red fox in the snow", "negative_prompt": "blurry, dark", "true_cfg_scale": 2.0,
             "width": 64, "height": 64, "steps": 4, "guidance": 3.5, "seed": 42}
        Image.fromarray(call(pipe, c, max_seq)).save(os.path.join(out, "%s-cuda-bf16-fox-truecfg.png" % fixture))
    c = dict(g["cases"][0])
    c.pop("pixels")
    Image.fromarray(call(pipe, c, max_seq, fp32_noise=True)).save(os.path.join(out, "%s-cuda-bf16-fox-fp32noise.png" % fixture))
    a = torch.randn(4096, generator=torch.Generator("cpu").manual_seed(42), dtype=torch.float32)
    b = torch.randn(4096, generator=torch.Generator("cpu").manual_seed(42), dtype=torch.bfloat16).float()
    g["noise"] = {"seed": 42, "n": 4096, "corr_bf16_fp32": float(np.corrcoef(a.numpy(), b.numpy())[0, 1]),
                  "fp32_std": float(a.std()), "bf16_std": float(b.std()),
                  # torch's CPU bf16 draws for seeds 42 and 43 at the fox latent shape (1, 16, 8, 8),
                  # as float32 little-endian base64: the reference for a Go reproduction of the draw
                  "bf16_draws": {str(sd): base64.b64encode(torch.randn((1, 16, 8, 8), generator=torch.Generator("cpu").manual_seed(sd),
                                                                          dtype=torch.bfloat16).float().numpy().tobytes()).decode()
                                 for sd in (42, 43)}}
    with open(os.path.join(out, "%s-cuda-bf16.json" % fixture), "w") as f:
        json.dump(g, f)
    print(json.dumps({k: v for k, v in g.items() if k != "cases"}))


def run(snap, out, w, h, steps, g, seed, prompt, repeat, max_seq):
    import torch
    from PIL import Image

    t0 = time.perf_counter()
    pipe = pipeline(snap)
    load_s = time.perf_counter() - t0
    c = {"prompt": prompt, "width": w, "height": h, "steps": steps, "guidance": g, "seed": seed}
    times = []
    px = None
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        px = call(pipe, c, max_seq)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    Image.fromarray(px).save(out)
    timed = times[1:] if len(times) > 1 else times
    return {
        "png": os.path.basename(out), "size": [w, h], "steps": steps, "guidance": g, "seed": seed, "max_sequence_length": max_seq,
        "load_s": round(load_s, 2), "seconds": [round(x, 4) for x in times], "images_per_s": len(timed) / sum(timed),
        "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
        "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }


def shape(tiny, out, variant):
    import torch

    t0 = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    for d in ["scheduler", "tokenizer", "tokenizer_2"]:
        shutil.copytree(os.path.join(tiny, d), os.path.join(out, d), dirs_exist_ok=True)
    shutil.copy(os.path.join(tiny, "model_index.json"), out)

    def cfg(part, **kw):
        c = json.load(open(os.path.join(tiny, part, "config.json")))
        c.update(kw)
        return {k: v for k, v in c.items() if not k.startswith("_")}

    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    parts = [
        ("text_encoder", lambda: CLIPTextModel(CLIPTextConfig.from_dict(cfg("text_encoder", hidden_size=768, intermediate_size=3072,
                                                                    num_attention_heads=12, num_hidden_layers=12)))),
        ("text_encoder_2", lambda: T5EncoderModel(T5Config.from_dict(cfg("text_encoder_2", d_model=4096, d_kv=64, num_heads=64, d_ff=10240,
                                                                 num_layers=24)))),
        ("transformer", lambda: FluxTransformer2DModel.from_config(cfg("transformer", num_attention_heads=24, attention_head_dim=128,
                                                                       num_layers=19, num_single_layers=38, axes_dims_rope=[16, 56, 56],
                                                                       joint_attention_dim=4096, pooled_projection_dim=768,
                                                                       guidance_embeds=variant == "dev"))),
        ("vae", lambda: AutoencoderKL.from_config(cfg("vae", block_out_channels=[128, 256, 512, 512], layers_per_block=2,
                                                      norm_num_groups=32))),
    ]
    for name, make in parts:
        with torch.device("cuda"):
            m = make().to(torch.bfloat16)
        m.save_pretrained(os.path.join(out, name), max_shard_size="100GB", safe_serialization=True)
        del m
        torch.cuda.empty_cache()
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    print(json.dumps({"dir": out, "variant": variant, "bytes": size, "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    a = sys.argv[2:]
    if sys.argv[1] == "compare":
        print(json.dumps(compare(a[0], a[1])))
    elif sys.argv[1] == "comparemany":  # a file of "A.png B.png" lines -> JSON lines
        for line in open(a[0]):
            x, y = line.split()
            try:
                print(json.dumps(compare(x, y)), flush=True)
            except Exception as e:  # a missing image: say which
                print(json.dumps({"a": os.path.basename(x), "b": os.path.basename(y), "error": str(e)}), flush=True)
    elif sys.argv[1] == "gemmrate":  # the card's bf16 GEMM rate: 8192^3 torch.matmul, TFLOP/s
        import torch

        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            x @ y
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            x @ y
        torch.cuda.synchronize()
        print(json.dumps({"bf16_gemm_tflops": 20 * 2 * 8192**3 / (time.perf_counter() - t) / 1e12, "device": torch.cuda.get_device_name(0)}))
    elif sys.argv[1] == "golden":
        golden(a[0], a[1], a[2], a[3])
    elif sys.argv[1] == "shape":
        shape(a[0], a[1], a[2])
    else:
        print(json.dumps(run(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), float(a[5]), int(a[6]), a[7], int(a[8]), int(a[9]))))
