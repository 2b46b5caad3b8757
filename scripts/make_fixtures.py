#!/usr/bin/env python3
"""Builds the tiny reference checkpoints under tests/fixtures/ with the reference library.

For each of the six MoE families of SPEC §3 and one composite config (Qwen3-VL-MoE), this script
builds a tiny random model with a fixed seed (hidden 64, 2-3 layers, 8 experts, top-2, expert
intermediate 24 so that no two of H, I, 2I coincide and fused layouts are unambiguous, vocab 128),
saves it with `save_pretrained` (safetensors, f32, the reference library's on-disk format), and
writes beside it:

  (qwen3_vl_moe is saved in shards with model.safetensors.index.json)
  logits_f32.safetensors   F32 tensors `logits.<i>` [1, L_i, V] of the f32 model for prompt i,
                           and I64 `input_ids.<i>` [1, L_i] (each prompt run alone, no padding)
  logits_bf16.safetensors  the same from the reference's bf16 model (the same weights rounded to
                           bf16), stored as F32
  greedy.json              prompts, greedy continuations (`max_new_tokens` new tokens each, EOS
                           from the generation config), the reference's own bf16-vs-f32 relative L2
                           per prompt, versions and seed

The reference runs in eager attention and with eager experts. Weights are re-initialised with
O(1) activations (normal, std 1/sqrt(fan_in)) so logits are well separated and greedy decoding is
not decided by near-ties.

Usage: python3 scripts/make_fixtures.py [--out tests/fixtures] [--only NAME,...]
Needs: torch, transformers (5.x), safetensors.
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file

SEED = 1234
PROMPTS = [[1, 5, 9, 13, 2, 7], [3, 4, 8]]
MAX_NEW_TOKENS = 8
VOCAB = 128
EOS = 2

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=EOS,
    pad_token_id=0,
    tie_word_embeddings=False,
)


def family_configs():
    """name -> (config class name, kwargs)."""
    c = {}
    c["qwen2_moe"] = ("Qwen2MoeConfig", dict(
        COMMON, intermediate_size=96, moe_intermediate_size=24, shared_expert_intermediate_size=48,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
        rope_theta=10000.0, rms_norm_eps=1e-6, qkv_bias=True))
    c["qwen3_moe"] = ("Qwen3MoeConfig", dict(
        COMMON, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rope_theta=1000000.0, rms_norm_eps=1e-6))
    c["olmoe"] = ("OlmoeConfig", dict(
        COMMON, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        rope_theta=10000.0, rms_norm_eps=1e-5))
    c["mixtral"] = ("MixtralConfig", dict(
        COMMON, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, rope_theta=1000000.0,
        rms_norm_eps=1e-5, sliding_window=None))
    c["deepseek_v3"] = ("DeepseekV3Config", dict(
        COMMON, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
        routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
        v_head_dim=16, qk_nope_head_dim=16, n_group=4, topk_group=2, num_experts_per_tok=2,
        first_k_dense_replace=1, norm_topk_prob=True, rms_norm_eps=1e-6, rope_interleave=True,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0,
                             mscale=1.0, mscale_all_dim=1.0)))
    c["gpt_oss"] = ("GptOssConfig", dict(
        COMMON, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=4, layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-5,
        swiglu_limit=7.0, attention_bias=True, max_position_embeddings=131072,
        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                             beta_slow=1.0, truncate=False, original_max_position_embeddings=4096)))
    return c


def composite_config():
    from transformers import Qwen3VLMoeConfig
    text = dict(COMMON, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
                rope_parameters=dict(rope_type="default", rope_theta=500000.0,
                                     mrope_section=[4, 2, 2], mrope_interleaved=True))
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                  num_position_embeddings=16, deepstack_visual_indexes=[0])
    return Qwen3VLMoeConfig(text_config=text, vision_config=vision, image_token_id=120,
                            video_token_id=121, vision_start_token_id=122, vision_end_token_id=123,
                            tie_word_embeddings=False)


def reinit_(model, seed):
    """O(1)-activation random weights, deterministic."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            shape = p.shape
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith("_norm.weight"):
                v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif p.dim() == 1:
                # biases, attention sinks, router biases, correction biases
                v = 0.1 * torch.randn(shape, generator=g)
                if name.endswith("sinks"):
                    v = torch.randn(shape, generator=g)
            elif "embed_tokens" in name:
                v = torch.randn(shape, generator=g)
            else:
                fan_in = shape[-1]
                if p.dim() == 3 and "gpt_oss" in type(model).__module__:
                    fan_in = shape[-2]  # GPT-OSS experts are [E, in, out]
                v = torch.randn(shape, generator=g) / math.sqrt(fan_in)
            p.copy_(v.to(p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def build(name, out_root):
    from transformers import AutoModelForCausalLM, GenerationConfig
    torch.manual_seed(SEED)
    if name == "qwen3_vl_moe":
        from transformers import Qwen3VLMoeForConditionalGeneration
        cfg = composite_config()
        cfg._attn_implementation = "eager"
        model = Qwen3VLMoeForConditionalGeneration._from_config(
            cfg, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32)
    else:
        cls_name, kw = family_configs()[name]
        cfg = getattr(transformers, cls_name)(**kw)
        model = AutoModelForCausalLM.from_config(
            cfg, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32)
    model.eval()
    reinit_(model, SEED)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=EOS, pad_token_id=0,
                                               do_sample=False)

    d = os.path.join(out_root, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    # The composite is saved sharded (model-0000x-of-0000y.safetensors + model.safetensors.index.json),
    # as real multimodal checkpoints are, so the index reader is tested on the reference's own output.
    shard = dict(max_shard_size="300KB") if name == "qwen3_vl_moe" else {}
    model.save_pretrained(d, safe_serialization=True, **shard)
    assert getattr(model.config, "_experts_implementation", "eager") == "eager", model.config._experts_implementation

    logits32, logits16, seqs = {}, {}, []
    errs = []
    model16 = None
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ids = torch.tensor([p], dtype=torch.long)
            l32 = model(input_ids=ids).logits.float()
            logits32[f"logits.{i}"] = l32.contiguous()
            logits32[f"input_ids.{i}"] = ids.contiguous()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                 do_sample=False)
            seqs.append(out[0].tolist())
        import copy
        model16 = copy.deepcopy(model).to(torch.bfloat16)
        for i, p in enumerate(PROMPTS):
            ids = torch.tensor([p], dtype=torch.long)
            l16 = model16(input_ids=ids).logits.float()
            logits16[f"logits.{i}"] = l16.contiguous()
            logits16[f"input_ids.{i}"] = ids.contiguous()
            errs.append(rel_l2(l16, logits32[f"logits.{i}"]))
    save_file(logits32, os.path.join(d, "logits_f32.safetensors"), metadata={"format": "pt"})
    save_file(logits16, os.path.join(d, "logits_bf16.safetensors"), metadata={"format": "pt"})
    meta = {
        "prompts": PROMPTS,
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_token_id": EOS,
        "sequences": seqs,
        "new_tokens": [s[len(p):] for s, p in zip(seqs, PROMPTS)],
        "reference": {
            "library": "transformers",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "seed": SEED,
            "attn_implementation": "eager",
            "experts_implementation": "eager",
            "bf16_vs_f32_rel_l2": errs,
            "model_class": type(model).__name__,
        },
    }
    with open(os.path.join(d, "greedy.json"), "w") as f:
        # one key per line, lists inline
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items()) + "\n}\n")
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{name}: {type(model).__name__}, {size / 1024:.0f} KiB, bf16 rel L2 {[round(e, 5) for e in errs]}, "
          f"greedy {meta['new_tokens']}", flush=True)
    return size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = list(family_configs().keys()) + ["qwen3_vl_moe"]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    os.makedirs(args.out, exist_ok=True)
    for n in names:
        size = build(n, args.out)
        if size > 2 * 1024 * 1024:
            print(f"error: fixture {n} is {size} bytes (limit 2 MiB)", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
