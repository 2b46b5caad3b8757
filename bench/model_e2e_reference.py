#!/usr/bin/env python3
"""bench/model_e2e_reference.py — the reference library's side of the end-to-end benchmark (issue 5).

Builds the same random model as bench/model_e2e.cpp — the shape of Qwen3-30B-A3B (48 layers, hidden
2048, 32 q / 4 kv heads of 128, 128 experts of 768, top-8, vocab 151936) — in transformers
(Qwen3MoeForCausalLM from a config, random init, bf16, cuda) and measures its `generate` with its
default backends (and its own decode-stage switching) the same way:
  prefill tok/s = prompt tokens / time of generate(max_new_tokens=1) on 1 x PROMPT tokens
  decode tok/s  = B * N / (time of generate(N + 1) - time of generate(1)) on B x DECODE_PROMPT tokens
Prints one JSON object (also written to --out).

  python3 bench/model_e2e_reference.py [--layers 48] [--prompt 2048] [--decode-prompt 128] [--new 32]
                                       [--batches 1,8,64] [--out ref.json] [--deadline SECONDS]
"""
import argparse
import json
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--decode-prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--out", default="")
    ap.add_argument("--deadline", type=float, default=0, help="stop starting new measurements after this many seconds")
    a = ap.parse_args()
    t_start = time.time()

    import transformers
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=a.layers,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    t0 = time.time()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build directly in bf16 (an f32 build would need ~120 GB)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(cfg)
    torch.set_default_dtype(prev)
    model = model.to(torch.bfloat16).eval()
    torch.cuda.synchronize()
    build_s = time.time() - t0
    res = {"library": "transformers " + transformers.__version__, "torch": torch.__version__, "layers": a.layers,
           "dtype": "bf16", "build_s": build_s,
           "experts_implementation": str(getattr(model.config, "_experts_implementation", None))}
    print(f"# reference: transformers {transformers.__version__}, torch {torch.__version__}, built in {build_s:.1f} s, "
          f"experts implementation {res['experts_implementation']}", flush=True)
    gen = torch.Generator(device="cpu").manual_seed(7)

    def prompts(b, n):
        return torch.randint(0, cfg.vocab_size, (b, n), generator=gen).cuda()

    def timed(ids, new, reps=3):
        kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(ids),
                  pad_token_id=0)
        with torch.inference_mode():
            model.generate(ids, **kw)  # warm-up
            t = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t0 = time.time()
                model.generate(ids, **kw)
                torch.cuda.synchronize()
                t.append(time.time() - t0)
        t.sort()
        return t[len(t) // 2]

    def late():
        return a.deadline > 0 and time.time() - t_start > a.deadline

    ids = prompts(1, a.prompt)
    s = timed(ids, 1)
    res["prefill_tokens"] = a.prompt
    res["prefill_tok_s"] = a.prompt / s
    print(f"prefill 1 x {a.prompt}: {s * 1e3:.1f} ms, {a.prompt / s:.0f} tok/s", flush=True)
    res["decode"] = []
    for b in [int(x) for x in a.batches.split(",") if x]:
        if late():
            print(f"deadline reached: batch {b} skipped", flush=True)
            break
        ids = prompts(b, a.decode_prompt)
        t1 = timed(ids, 1, reps=2)
        tn = timed(ids, a.new + 1, reps=2)
        step_ms = (tn - t1) / a.new * 1e3
        tps = b * a.new / (tn - t1)
        res["decode"].append({"batch": b, "step_ms": step_ms, "decode_tok_s": tps})
        print(f"decode batch {b:3d}: {step_ms:.3f} ms/step, {tps:.0f} tok/s", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f)
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
