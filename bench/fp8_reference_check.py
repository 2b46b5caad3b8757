#!/usr/bin/env python3
"""FP8 checkpoints against the reference library (transformers' FineGrainedFP8), issue 6 parts 5-6.

Two subcommands, meant for the GPU machine (bench/gpu_fp8_ckpt.sh calls both):

  load DIR [--moex BIN] [--prompt 1,5,9]
      (a) the reference library loads an FP8 checkpoint written by `moex quantize`: on CUDA as FP8
      (FP8Linear / FP8Experts modules with e4m3 weights and *_scale_inv), which must succeed; it then
      tries a forward pass there (its FP8 kernels come from the hub, so offline this may fail: the
      error is reported, not fatal). It also loads it with FineGrainedFP8Config(dequantize=True) on the
      CPU and compares those logits with `moex forward --dequantize` (relative L2, should be ~1e-6),
      and checks that the FP8 experts it loaded on CUDA dequantize to the same weights.

  fixture OUT [--block 32x128]
      (b) the reference library quantizes a tiny random Qwen3-MoE (hidden 128, expert intermediate
      128, 4 experts, 2 layers: the reference quantizes only matrices whose sizes are multiples of
      the block, and moex's FP8 kernels need blocks 128 wide along the input) with its
      FineGrainedFP8Config and saves it to OUT (< 1 MB), plus logits_dequantized.safetensors:
      `logits.<i>` F32 [1, L_i, V] and `input_ids.<i>` I64 [1, L_i] computed by the reference from
      the DEQUANTIZED weights (f32, eager), and reference.json (versions, block, prompts). Commit OUT
      as tests/fixtures/qwen3_moe_fp8 (test QuantCheckpoint.ReferenceLibraryFp8Fixture).

--emulate-on-cpu lets the reference's quantizer run without a GPU (it refuses otherwise) by skipping
its environment check; used for local checks only.

Prints one line per check, "ok ..." / "FAIL ..." / "note ...", and exits non-zero on a FAIL.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

PROMPTS = [[1, 5, 9, 13, 2, 7], [3, 4, 8]]
FAILED = []


def ok(msg):
    print("ok   " + msg, flush=True)


def fail(msg):
    FAILED.append(msg)
    print("FAIL " + msg, flush=True)


def note(msg):
    print("note " + msg, flush=True)


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def emulate_on_cpu():
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer
    FineGrainedFP8HfQuantizer.validate_environment = lambda self, *a, **k: None


def auto_class(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    if "text_config" in cfg:
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def dequantize_grid(w, s, block_n, half_rows=None):
    """e4m3 [..., rows, cols] x block scales [..., sr, sc] -> f32. Scale row of matrix row r: r // block_n,
    or per half (gate, up) when `half_rows` (I) is given and the grid has 2*ceil(I/bn) rows."""
    w = w.float()
    s = s.float() if s.dtype != torch.uint8 else torch.exp2(s.float() - 127)
    rows, cols = w.shape[-2:]
    sr, sc = s.shape[-2:]
    bk = math.ceil(cols / sc)
    r = torch.arange(rows)
    if half_rows is not None and sr == 2 * math.ceil(half_rows / block_n) and sr != math.ceil(rows / block_n):
        hb = math.ceil(half_rows / block_n)
        ridx = torch.where(r < half_rows, r // block_n, hb + (r - half_rows) // block_n)
    else:
        ridx = r // block_n
    cidx = torch.arange(cols) // bk
    return w * s[..., ridx, :][..., :, cidx]


def dequantized_model(q, cls, block_n):
    """The unquantized f32 model (eager, CPU) holding q's weights dequantized: every e4m3 parameter times
    its block scales (`X_scale_inv` / `X.weight_scale_inv`), every other parameter copied."""
    import copy
    cfg = copy.deepcopy(q.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    m = cls.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    m.eval()
    params = {k: v.detach().cpu() for k, v in q.named_parameters()}
    n = 0
    with torch.no_grad():
        for name, p in m.named_parameters():
            src = params[name]
            if src.dtype == torch.float8_e4m3fn:
                scale = params.get(name + "_scale_inv", params.get(name.removesuffix(".weight") + ".weight_scale_inv"))
                if scale.dtype != torch.float32:
                    scale = scale.view(torch.uint8)
                half = src.shape[-2] // 2 if name.endswith("gate_up_proj") else None  # [E, 2I, H]: gate then up
                src = dequantize_grid(src, scale, block_n, half)
                n += 1
            p.copy_(src.float())
        qbuf = dict(q.named_buffers())
        for name, b in m.named_buffers():  # e.g. DeepSeek-V3's e_score_correction_bias
            if name in qbuf and qbuf[name].shape == b.shape:
                b.copy_(qbuf[name].detach().cpu().to(b.dtype))
    return m, n


def cmd_load(a):
    d = a.dir
    cfg = json.load(open(os.path.join(d, "config.json")))
    qc = cfg.get("quantization_config", {})
    block_n = qc.get("weight_block_size", [128, 128])[0]
    cls = auto_class(d)
    ids = torch.tensor([[int(x) for x in a.prompt.split(",")]])

    # (a) FP8 load (CUDA; with --emulate-on-cpu on the CPU): must succeed
    fp8_model = None
    device = "cuda" if torch.cuda.is_available() else ("cpu" if a.emulate_on_cpu else None)
    if device:
        try:
            fp8_model = cls.from_pretrained(d, device_map=device, dtype=torch.float32)
            kinds = sorted({type(m).__name__ for m in fp8_model.modules() if "FP8" in type(m).__name__})
            n_e4m3 = sum(1 for p in fp8_model.parameters() if p.dtype == torch.float8_e4m3fn)
            if n_e4m3 == 0:
                fail(f"reference loaded {d} without any e4m3 parameter (modules {kinds})")
                fp8_model = None
            else:
                ok(f"reference loads {d} as FP8 on {device}: modules {kinds}, {n_e4m3} e4m3 parameters")
        except Exception as e:  # noqa: BLE001
            fail(f"reference cannot load {d} as FP8 on {device}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        if fp8_model is not None:
            try:
                with torch.no_grad():
                    out = fp8_model(ids.to(device)).logits
                ok(f"reference runs the FP8 model on {device}: logits {list(out.shape)}, finite {bool(torch.isfinite(out).all())}")
            except Exception as e:  # noqa: BLE001
                note(f"reference cannot run the FP8 model here (expected offline: its kernels come from the hub): "
                     f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    else:
        note("no CUDA device: skipping the FP8 (non-dequantized) load (--emulate-on-cpu runs it on the CPU)")

    # reference logits: from the weights the reference loaded as FP8, dequantized; and from its own
    # dequantize=True load (which ignores fused experts' *_scale_inv)
    refs = {}
    if fp8_model is not None:
        try:
            m, n = dequantized_model(fp8_model, cls, block_n)
            with torch.no_grad():
                refs["its FP8 load, dequantized"] = m(ids).logits.float()
            ok(f"dequantized {n} e4m3 parameters of the reference's FP8 load")
        except Exception as e:  # noqa: BLE001
            fail(f"cannot dequantize the reference's FP8 load: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    try:
        deq = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                  quantization_config=transformers.FineGrainedFP8Config(dequantize=True))
        deq.eval()
        with torch.no_grad():
            refs["its dequantize=True load"] = deq(ids).logits.float()
        ok(f"reference loads {d} with dequantize=True on the CPU")
    except Exception as e:  # noqa: BLE001
        note(f"reference cannot load {d} with dequantize=True: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    if not a.moex or not refs:
        return
    fused = any(k.endswith("experts.gate_up_proj_scale_inv") for k in _keys(d))
    with tempfile.TemporaryDirectory() as t:
        out = os.path.join(t, "l.st")
        got = {}
        for label, extra in (("moex --dequantize", ["--dequantize"]), ("moex FP8 (grouped_mm)", [])):
            r = subprocess.run([a.moex, "forward", "--model", d, "--ids", a.prompt, "--out", out] + extra,
                               capture_output=True, text=True)
            if r.returncode:
                fail(f"{label} failed: {r.stderr.strip()}")
            else:
                got[label] = load_file(out)["logits"]
    for ref_label, ref in refs.items():
        for label, l in got.items():
            e = rel_l2(l, ref)
            bar = 1e-4 if "dequantize" in label else 8e-2
            msg = f"{label} vs reference ({ref_label}): rel L2 {e:.2e} (bar {bar:g})"
            if e < bar:
                ok(msg)
            elif fused and "dequantize=True" in ref_label:
                note(msg + " — the reference's dequantize path ignores fused experts' *_scale_inv")
            else:
                fail(msg)


def _keys(d):
    keys = []
    for f in os.listdir(d):
        if f.endswith(".safetensors") and not f.startswith("logits"):
            from safetensors import safe_open
            with safe_open(os.path.join(d, f), "pt") as h:
                keys += list(h.keys())
    return keys


def cmd_fixture(a):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from make_fixtures import reinit_  # the fixtures' O(1)-activation initialisation
    bn, bk = (int(x) for x in a.block.split("x"))
    seed = 1234
    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=256,
        rope_theta=1000000.0, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    reinit_(model, seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as src:
        model.save_pretrained(src)
        q = transformers.AutoModelForCausalLM.from_pretrained(
            src, dtype=torch.float32, device_map=device,
            quantization_config=transformers.FineGrainedFP8Config(weight_block_size=[bn, bk]))
        n_e4m3 = sum(1 for p in q.parameters() if p.dtype == torch.float8_e4m3fn)
        if n_e4m3 == 0:
            fail("the reference quantized nothing (block sizes must divide the matrices)")
            return
        q.save_pretrained(a.out)
    keys = _keys(a.out)
    e4m3 = [k for k in keys if "scale_inv" in k]
    ok(f"reference quantized a tiny Qwen3-MoE with FineGrainedFP8Config(weight_block_size=[{bn}, {bk}]) on {device}: "
       f"{n_e4m3} e4m3 parameters, {len(e4m3)} scale tensors saved in {a.out}")
    # Reference logits from the DEQUANTIZED weights: the quantized model's e4m3 parameters times their
    # block scales, loaded into the unquantized f32 model (eager, CPU). (The reference's own
    # dequantize=True load cannot read back what its save_pretrained wrote for MoE experts: per-expert
    # e4m3 weights beside fused *_scale_inv tensors.)
    deq, n_deq = dequantized_model(q, transformers.AutoModelForCausalLM, bn)
    ok(f"dequantized {n_deq} FP8 parameters of the reference's quantized model into its f32 model")
    tensors = {}
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ids = torch.tensor([p], dtype=torch.long)
            tensors[f"logits.{i}"] = deq(input_ids=ids).logits.float().contiguous()
            tensors[f"input_ids.{i}"] = ids.contiguous()
    save_file(tensors, os.path.join(a.out, "logits_dequantized.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump({"library": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
                   "seed": seed, "quantized_on": device, "weight_block_size": [bn, bk], "prompts": PROMPTS,
                   "logits": "reference forward (eager, f32) of the quantized model's weights dequantized "
                             "(e4m3 x block scale)"}, f, indent=1)
    size = sum(os.path.getsize(os.path.join(a.out, x)) for x in os.listdir(a.out))
    (ok if size < 1 << 20 else fail)(f"fixture {a.out}: {size / 1024:.0f} KiB, files {sorted(os.listdir(a.out))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emulate-on-cpu", action="store_true", help="skip the reference quantizer's GPU check (local tests)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("dir")
    lp.add_argument("--moex", default="")
    lp.add_argument("--prompt", default="1,5,9,13,2,7")
    fp = sub.add_parser("fixture")
    fp.add_argument("out")
    fp.add_argument("--block", default="32x128")
    a = ap.parse_args()
    if a.emulate_on_cpu:
        emulate_on_cpu()
    transformers.logging.set_verbosity_error()
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}", flush=True)
    (cmd_load if a.cmd == "load" else cmd_fixture)(a)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
