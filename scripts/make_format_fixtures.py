"""Regenerate the small committed fixtures under ``tests/fixtures/formats/``.

Run with the reference venv (torch + transformers + onnx + tokenizers)::

    /root/.cache/modelc-ref-venv/bin/python scripts/make_format_fixtures.py

Everything is seeded, tiny (each file < 300 KB) and written from scratch:

* ``mlp.safetensors``, ``mlp.bin`` (torch zip), ``mlp.onnx`` (inline initializers),
  ``mlp_ext.onnx`` + ``mlp_ext.weights`` (all initializers segmented into one external file),
  ``mlp_matmul.onnx`` (same weights stored ``(in, out)`` and used through MatMul + Add),
  ``mlp_golden.npz`` (an input and the torch output);
* ``ops.onnx``: one graph touching every op the plan executor supports;
* ``gpt2-st/`` (HF dir, safetensors), ``gpt2-bin/`` (HF dir, pytorch_model.bin with tied
  lm_head/wte sharing one storage), ``gpt2_golden.npz`` (block-0 c_attn output);
* ``gpt2_golden.npz`` / ``llama_golden.npz`` also hold Hugging Face logits for ``GOLDEN_TOKENS``;
* ``llama-st/`` (LlamaForCausalLM, safetensors in two shards + index),
  ``llama-bin/`` (same weights, pytorch_model.bin in two shards + index),
  ``llama_golden.npz`` (block-0 q/k after Hugging Face RoPE);
* ``malicious.bin``: a torch-like zip whose ``data.pkl`` calls ``os.system`` when unpickled
  (built with plain pickle; the test proves modelc refuses it and the command never runs).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "formats"
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny tokenizer for modelc tests",
    "models are compiled into one file and served locally",
] * 20
GOLDEN_TOKENS = [5, 17, 42, 99, 3, 250]  # full-model logits for these are stored with each LM


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16),
            torch.nn.ReLU(),
            torch.nn.Linear(16, 12),
            torch.nn.ReLU(),
            torch.nn.Linear(12, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_mlp() -> None:
    torch.manual_seed(0)
    m = MLP().eval()
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    save_file(sd, str(OUT / "mlp.safetensors"), metadata={"format": "pt"})
    torch.save(m.state_dict(), OUT / "mlp.bin")
    x = torch.randn(3, 8)
    with torch.no_grad():
        y = m(x)
    np.savez(OUT / "mlp_golden.npz", x=x.numpy(), y=y.numpy())

    torch.onnx.export(
        m,
        (x,),
        str(OUT / "mlp.onnx"),
        dynamo=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
    )
    model = onnx.load(str(OUT / "mlp.onnx"))
    ext = OUT / "mlp_ext.weights"
    if ext.exists():
        ext.unlink()
    onnx.save_model(
        model,
        str(OUT / "mlp_ext.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mlp_ext.weights",
        size_threshold=0,
        convert_attribute=False,
    )

    # The same weights as MatMul(x, W^T) + b, initializers stored (in, out).
    nodes, inits, cur = [], [], "x"
    linears = [k[: -len(".weight")] for k in sd if k.endswith(".weight")]
    for i, prefix in enumerate(linears):
        w = sd[prefix + ".weight"].numpy().T.copy()
        b = sd[prefix + ".bias"].numpy()
        inits += [
            numpy_helper.from_array(w, prefix + ".weight"),
            numpy_helper.from_array(b, prefix + ".bias"),
        ]
        nodes.append(helper.make_node("MatMul", [cur, prefix + ".weight"], [f"mm{i}"]))
        out = "y" if i == len(linears) - 1 else f"add{i}"
        nodes.append(helper.make_node("Add", [f"mm{i}", prefix + ".bias"], [out]))
        if out != "y":
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}"]))
            cur = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        "mlp_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        inits,
    )
    mm = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(mm)
    onnx.save(mm, str(OUT / "mlp_matmul.onnx"))


def make_ops_graph() -> None:
    """A graph exercising every supported op, checked against onnx.reference in the tests."""
    rng = np.random.default_rng(1)
    f = TensorProto.FLOAT
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 8)).astype(np.float32), "w_gemm"),
        numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "b_gemm"),
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w_mm"),
        numpy_helper.from_array(np.ones(8, np.float32) * 1.5, "ln_scale"),
        numpy_helper.from_array(np.zeros(8, np.float32) + 0.1, "ln_bias"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(0.25, np.float32), "quarter"),
        numpy_helper.from_array(np.array([-1, 2, 4], np.int64), "shape3"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w_gemm", "b_gemm"], ["g"], alpha=0.5, beta=2.0),
        helper.make_node("Tanh", ["g"], ["t"]),
        helper.make_node("MatMul", ["t", "w_mm"], ["m"]),
        helper.make_node(
            "LayerNormalization", ["m", "ln_scale", "ln_bias"], ["ln"], axis=-1, epsilon=1e-5
        ),
        helper.make_node("Sigmoid", ["ln"], ["s"]),
        helper.make_node("Mul", ["s", "two"], ["s2"]),
        helper.make_node("Sub", ["s2", "quarter"], ["s3"]),
        helper.make_node("Div", ["s3", "two"], ["s4"]),
        helper.make_node("Relu", ["s4"], ["r"]),
        helper.make_node("Reshape", ["r", "shape3"], ["rs"]),
        helper.make_node("Transpose", ["rs"], ["tr"], perm=[0, 2, 1]),
        helper.make_node("Softmax", ["tr"], ["sm"], axis=-1),
        helper.make_node("Identity", ["sm"], ["id"]),
        helper.make_node("Cast", ["id"], ["y"], to=TensorProto.DOUBLE),
    ]
    graph = helper.make_graph(
        nodes,
        "ops",
        [helper.make_tensor_value_info("x", f, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 4, 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(OUT / "ops.onnx"))


def make_tokenizer(specials: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def fresh_dir(name: str) -> Path:
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def make_gpt2() -> None:
    tok = make_tokenizer(["<|endoftext|>"])
    eot = tok.token_to_id("<|endoftext|>")
    cfg = GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=eot,
        eos_token_id=eot,
    )
    torch.manual_seed(1)
    model = GPT2LMHeadModel(cfg).eval()
    tcfg = {
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "model_max_length": 64,
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": False,
    }
    for name, safe in (("gpt2-st", True), ("gpt2-bin", False)):
        d = fresh_dir(name)
        cfg.save_pretrained(d)
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1))
        if safe:
            sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
            save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
        else:
            sd = model.state_dict()
            assert sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr()
            torch.save(sd, d / "pytorch_model.bin")
    x = torch.randn(4, 32)
    with torch.no_grad():
        qkv = model.transformer.h[0].attn.c_attn(x)
        logits = model(torch.tensor([GOLDEN_TOKENS])).logits[0]
    np.savez(
        OUT / "gpt2_golden.npz",
        x=x.numpy(),
        qkv=qkv.numpy(),
        tokens=np.array(GOLDEN_TOKENS),
        logits=logits.numpy(),
    )


def make_llama() -> None:
    tok = make_tokenizer(["<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
    )
    torch.manual_seed(2)
    model = LlamaForCausalLM(cfg).eval()
    tcfg = {
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    }
    gen = {
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": [cfg.eos_token_id, tok.token_to_id("<|im_end|>")],
        "temperature": 0.7,
        "top_p": 0.9,
        "do_sample": True,
    }
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = list(sd)
    shards = [names[: len(names) // 2], names[len(names) // 2 :]]
    for name, ext in (("llama-st", "safetensors"), ("llama-bin", "bin")):
        d = fresh_dir(name)
        cfg.save_pretrained(d)
        (d / "generation_config.json").write_text(json.dumps(gen, indent=1))
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1))
        weight_map = {}
        for i, keys in enumerate(shards):
            base = "model" if ext == "safetensors" else "pytorch_model"
            fname = f"{base}-{i + 1:05d}-of-00002.{ext}"
            part = {k: sd[k] for k in keys}
            if ext == "safetensors":
                save_file(part, str(d / fname), metadata={"format": "pt"})
            else:
                torch.save(part, d / fname)
            weight_map.update(dict.fromkeys(keys, fname))
        index = {
            "metadata": {"total_size": sum(v.numel() * 4 for v in sd.values())},
            "weight_map": weight_map,
        }
        idx_name = (
            "model.safetensors.index.json"
            if ext == "safetensors"
            else "pytorch_model.bin.index.json"
        )
        (d / idx_name).write_text(json.dumps(index, indent=1))
    # Golden: block-0 q/k projections of x after Hugging Face's (rotate_half) RoPE at positions 0..3.
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    x = torch.randn(1, 4, 32)
    pos = torch.arange(4)[None]
    attn = model.model.layers[0].self_attn
    hd = cfg.hidden_size // cfg.num_attention_heads
    with torch.no_grad():
        q = attn.q_proj(x).view(1, 4, -1, hd).transpose(1, 2)
        k = attn.k_proj(x).view(1, 4, -1, hd).transpose(1, 2)
        cos, sin = model.model.rotary_emb(x, pos)
        qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
        logits = model(torch.tensor([GOLDEN_TOKENS])).logits[0]
    np.savez(
        OUT / "llama_golden.npz",
        x=x[0].numpy(),
        q=qr[0].numpy(),
        k=kr[0].numpy(),
        tokens=np.array(GOLDEN_TOKENS),
        logits=logits.numpy(),
    )


class _Boom:
    """Unpickling this runs ``os.system`` -- the attack a restricted unpickler must refuse."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def make_malicious() -> None:
    # The marker path is relative so the test can run it in a temp cwd and look for the file.
    payload = pickle.dumps({"fc.weight": _Boom("MODELC_PWNED")}, protocol=2)
    with zipfile.ZipFile(OUT / "malicious.bin", "w", zipfile.ZIP_STORED) as zf:
        for name, data in (("data.pkl", payload), ("version", b"3\n"), ("byteorder", b"little")):
            zf.writestr(zipfile.ZipInfo(f"archive/{name}", date_time=(2024, 1, 1, 0, 0, 0)), data)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    make_mlp()
    make_ops_graph()
    make_gpt2()
    make_llama()
    make_malicious()
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            assert p.stat().st_size < 300_000, p
            print(f"{p.stat().st_size:>8}  {p.relative_to(OUT)}")


if __name__ == "__main__":
    main()
