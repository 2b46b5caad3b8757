#!/usr/bin/env python3
"""End-to-end CPU speed of the model runtime beside the reference library, same machine, same run.

Builds (once) a random-weight Qwen3-MoE checkpoint of a realistic small shape with the reference
library — hidden 1024, 8 layers, 16 query / 4 KV heads of 64, 32 experts of 512, top-4, vocab 16384
(~460M parameters, saved in bf16) — then measures on the CPU:
  * moex:      `moex bench-model` (prefill = forward of 1 × L tokens, all logits; decode = (generate(N)
               − generate(1)) / (N − 1) per new token; medians of --repeat rounds)
  * reference: the same prompt through the model's forward and `generate` (greedy, its default experts
               backend), timed the same way, torch threads = --threads
and the largest committed fixture the same way. Prints JSON lines and a markdown table.

    python3 bench/model_side_by_side.py [--moex build/moex] [--dir /tmp/moex_qwen3_small] [--threads 2]
                                        [--prompt-len 256] [--new-tokens 16] [--repeat 3]
Needs torch + transformers (pip).
"""
import argparse, json, os, statistics, subprocess, sys, time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("--moex", default="build/moex")
ap.add_argument("--dir", default="/tmp/moex_qwen3_small")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--prompt-len", type=int, default=256)
ap.add_argument("--new-tokens", type=int, default=16)
ap.add_argument("--dtype", default="bf16")
ap.add_argument("--repeat", type=int, default=3)
a = ap.parse_args()
torch.set_num_threads(a.threads)
os.environ["OMP_NUM_THREADS"] = str(a.threads)
tdt = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]

if not os.path.exists(os.path.join(a.dir, "config.json")):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=16384, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
        norm_topk_prob=True, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    m = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    m.to(torch.bfloat16).save_pretrained(a.dir)
    print(f"wrote {a.dir}", file=sys.stderr)

def ref_bench(path):
    """The reference measured as moex bench-model measures moex: after a warm-up, --repeat rounds of
    forward (prefill tok/s) and of generate(1) / generate(N) (decode tok/s = (N - 1) new tokens over
    their difference); the medians."""
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=tdt)
    m.eval()
    vocab = m.config.get_text_config().vocab_size if hasattr(m.config, "get_text_config") else m.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, a.prompt_len), generator=g)
    def timed(f):
        t0 = time.perf_counter(); f(); return time.perf_counter() - t0
    def gen(n):
        return lambda: m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    prefill, decode = [], []
    with torch.no_grad():
        m(ids)
        gen(2)()
        for _ in range(a.repeat):
            prefill.append(a.prompt_len / timed(lambda: m(ids)))
            first = timed(gen(1))
            d = timed(gen(a.new_tokens)) - first
            if d > 0:  # as moex bench-model: a round within the prefill's noise measures nothing
                decode.append((a.new_tokens - 1) / d)
    return statistics.median(prefill), statistics.median(decode) if decode else None

rows = []
fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "qwen3_vl_moe")
for name, path in [("qwen3_moe random 1024x8L, 32 experts x 512, top-4", a.dir), ("fixture qwen2_moe", fixtures.replace("qwen3_vl_moe", "qwen2_moe"))]:
    out = subprocess.run([a.moex, "bench-model", "--model", path, "--dtype", a.dtype, "--batch", "1", "--prompt-len", str(a.prompt_len),
                          "--new-tokens", str(a.new_tokens), "--repeat", str(a.repeat), "--format", "json"], capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr); sys.exit(1)
    moex = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    rp, rd = ref_bench(path)
    for r in moex:
        r.update(case=name, threads=a.threads, ref_prefill_tok_s=round(rp, 1), ref_decode_tok_s=None if rd is None else round(rd, 1))
        print(json.dumps(r), flush=True)
        rows.append(r)

print(f"\n| model | dtype | threads | moex backend | moex prefill tok/s | moex decode tok/s | reference prefill tok/s | reference decode tok/s |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    dec = "n/a" if r["decode_tok_s"] is None else f"{r['decode_tok_s']:.1f}"  # null: not measurable (moex bench-model says why)
    print(f"| {r['case']} | {r['dtype']} | {r['threads']} | {r['backend']} | {r['prefill_tok_s']:.1f} | {dec} | "
          f"{r['ref_prefill_tok_s']:.1f} | {'n/a' if r['ref_decode_tok_s'] is None else format(r['ref_decode_tok_s'], '.1f')} |")
