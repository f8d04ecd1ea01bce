"""diffusers' ZImagePipeline in bf16 on the GPU, the reference of the zimage family's CUDA
pipeline (lab: run by lab/cuda/zimage_gpu.sh; diffusers from its public source on PYTHONPATH).

    python zimage_diffusers.py run SNAPSHOT OUT.png W H STEPS GUIDANCE SEED PROMPT [REPEAT]
        one pipeline in bf16 on cuda; with REPEAT > 1 the first call is the warmup and the
        others are timed (torch.cuda.synchronize around each): prints JSON with images_per_s
    python zimage_diffusers.py compare A.png B.png
        scikit-image's PSNR and SSIM (data_range 255, channel_axis 2) as JSON
"""
import json
import sys
import time

import numpy as np


def load_png(p):
    from PIL import Image

    return np.asarray(Image.open(p).convert("RGB"))


def compare(a, b):
    x, y = load_png(a), load_png(b)
    out = {"a": a, "b": b, "shape": list(x.shape)}
    if x.shape != y.shape:
        out["error"] = "shapes differ: %s vs %s" % (x.shape, y.shape)
        return out
    d = x.astype(np.float64) - y.astype(np.float64)
    out["max_abs_diff"] = float(np.abs(d).max())
    try:
        from skimage.metrics import peak_signal_noise_ratio, structural_similarity

        out["psnr"] = float(peak_signal_noise_ratio(x, y, data_range=255))
        out["ssim"] = float(structural_similarity(x, y, channel_axis=2, data_range=255))
        out["by"] = "skimage"
    except ImportError:
        mse = float((d ** 2).mean())
        out["psnr"] = float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))
        out["by"] = "numpy (no skimage: no SSIM)"
    return out


def run(snap, out, w, h, steps, g, seed, prompt, repeat=1):
    import torch
    from diffusers import ZImagePipeline
    from PIL import Image

    t0 = time.perf_counter()
    pipe = ZImagePipeline.from_pretrained(snap, torch_dtype=torch.bfloat16).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - t0
    times = []
    img = None
    for i in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        img = pipe(
            prompt=prompt,
            height=h,
            width=w,
            num_inference_steps=steps,
            guidance_scale=g,
            generator=torch.Generator("cpu").manual_seed(seed),
            output_type="np",
        ).images[0]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    px = (img * 255).round().astype("uint8")  # VaeImageProcessor.numpy_to_pil
    Image.fromarray(px).save(out)
    timed = times[1:] if len(times) > 1 else times
    res = {
        "png": out,
        "size": [w, h],
        "steps": steps,
        "guidance": g,
        "seed": seed,
        "load_s": round(load_s, 2),
        "seconds": [round(x, 4) for x in times],
        "images_per_s": len(timed) / sum(timed),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }
    return res


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        print(json.dumps(compare(sys.argv[2], sys.argv[3])))
    else:
        a = sys.argv[2:]
        rep = int(a[8]) if len(a) > 8 else 1
        print(json.dumps(run(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), float(a[5]), int(a[6]), a[7], rep)))
