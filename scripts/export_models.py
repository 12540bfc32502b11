"""Regenerate tests/data/models/*.onnx: tiny networks with random weights, exported by PyTorch.

    python scripts/export_models.py [--only NAME ...] [--exporter torchscript|dynamo ...]

Each model is built from a config (no downloads: Hugging Face models come from their *Config and
*Model classes, the others are written here), seeded, and exported with fixed small input shapes by
the TorchScript exporter (dynamo=False) and the dynamo exporter (dynamo=True). A pair that fails is
skipped with the reason printed. Needs torch, transformers and, for the dynamo exporter, onnxscript (all in
the dev extra; without onnxscript the dynamo pairs are skipped); tests/test_exported_models.py, which uses the
files, needs none of them. Small enough to commit: hidden size 32, 2 layers, vocabulary 128,
sequence 8, 16x16 images. The hand-built families (EfficientNet, MobileNetV3, ConvNeXt, Swin, VGG,
Wide&Deep) are in scripts/model_families.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings

import torch
from model_families import FAMILIES
from torch import nn

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "models")


class ResNetBlock(nn.Module):
    """Conv+BatchNorm+ReLU stem, one basic residual block, GlobalAveragePool and a classifier."""

    def __init__(self, c=16, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        x = torch.relu(x + y)
        return self.fc(torch.flatten(self.pool(x), 1))


class UNetBlock(nn.Module):
    """A diffusion-UNet residual block: GroupNorm+SiLU+Conv twice, a time embedding and a skip."""

    def __init__(self, c_in=16, c_out=32, t_dim=32, groups=8):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.temb = nn.Linear(t_dim, c_out)
        self.norm2 = nn.GroupNorm(groups, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x, t):
        h = self.conv1(nn.functional.silu(self.norm1(x)))
        h = h + self.temb(nn.functional.silu(t))[:, :, None, None]
        h = self.conv2(nn.functional.silu(self.norm2(h)))
        return self.skip(x) + h


class HF(nn.Module):
    """A Hugging Face model returning its last hidden state as a plain tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args, return_dict=True).last_hidden_state


def hf(kind):
    import transformers as tf

    small = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64)
    if kind == "bert":
        cfg = tf.BertConfig(vocab_size=128, num_hidden_layers=2, max_position_embeddings=32, **small)
        m = tf.BertModel(cfg, add_pooling_layer=False)
        seq = 8
        return (
            HF(m),
            (torch.randint(0, 128, (1, seq)), torch.ones(1, seq, dtype=torch.int64)),
            ["input_ids", "attention_mask"],
        )
    if kind == "gpt2":
        cfg = tf.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=2, n_positions=32, use_cache=False)
        ids = torch.randint(0, 128, (1, 8))  # with a mask, as LLaMA below
        return HF(tf.GPT2Model(cfg)), (ids, None, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    if kind == "llama":
        cfg = tf.LlamaConfig(vocab_size=128, num_hidden_layers=2, num_key_value_heads=1, max_position_embeddings=32,
                             use_cache=False, **small)  # fmt: skip
        # with an attention mask: without one, transformers looks for packed sequences with aten::diff,
        # which the TorchScript exporter lacks
        ids = torch.randint(0, 128, (1, 8))
        return HF(tf.LlamaModel(cfg)), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    ids = torch.randint(0, 128, (1, 8))
    if kind == "t5":  # the encoder: relative position buckets, RMS norm, no biases
        cfg = tf.T5Config(vocab_size=128, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, use_cache=False)
        return HF(tf.T5EncoderModel(cfg)), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    if kind == "whisper":  # the encoder: two Conv1d over log-mel frames, sinusoidal positions
        cfg = tf.WhisperConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                               encoder_ffn_dim=64, max_source_positions=8, vocab_size=128, pad_token_id=0, decoder_layers=1,
                               decoder_attention_heads=2, decoder_ffn_dim=64,
                               bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)  # fmt: skip
        return HF(tf.WhisperModel(cfg).get_encoder()), (torch.randn(1, 16, 16),), ["input_features"]
    if kind == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=128, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                  max_position_embeddings=32)  # fmt: skip
        return HF(tf.DistilBertModel(cfg)), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    if kind == "qwen2":  # grouped-query attention (4 query heads, 2 key/value heads), RoPE
        cfg = tf.Qwen2Config(vocab_size=128, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=64, num_hidden_layers=2, max_position_embeddings=32, use_cache=False)  # fmt: skip
        return HF(tf.Qwen2Model(cfg)), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    if kind == "gptneox":  # partial rotary: a quarter of each head's dimensions rotate
        cfg = tf.GPTNeoXConfig(vocab_size=128, num_hidden_layers=2, max_position_embeddings=32, rotary_pct=0.25,
                               use_cache=False, **small)  # fmt: skip
        return HF(tf.GPTNeoXModel(cfg)), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    if kind == "bloom":  # ALiBi position biases from the mask's cumulative sum
        cfg = tf.BloomConfig(vocab_size=128, hidden_size=32, n_layer=2, n_head=2, use_cache=False)
        return HF(tf.BloomModel(cfg)), (ids, None, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    if kind == "vit":
        cfg = tf.ViTConfig(image_size=16, patch_size=4, num_channels=3, num_hidden_layers=2, **small)
        return HF(tf.ViTModel(cfg, add_pooling_layer=False)), (torch.randn(1, 3, 16, 16),), ["pixel_values"]
    raise ValueError(kind)


def build(name):
    torch.manual_seed(0)
    if name == "resnet":
        m = ResNetBlock()
        m.eval()
        with torch.no_grad():  # non-trivial BatchNorm statistics
            for mod in m.modules():
                if isinstance(mod, nn.BatchNorm2d):
                    mod.running_mean.uniform_(-0.5, 0.5)
                    mod.running_var.uniform_(0.5, 1.5)
        return m, (torch.randn(2, 3, 16, 16),), ["x"]
    if name == "unet":
        return UNetBlock(), (torch.randn(1, 16, 16, 16), torch.randn(1, 32)), ["x", "t"]
    if name in FAMILIES:
        return FAMILIES[name]()
    return hf(name)


# the first six (issue 11), then the families of issue 20 (scripts/model_families.py and hf above)
MODELS = ["resnet", "bert", "gpt2", "llama", "vit", "unet", "t5", "whisper", "distilbert", "qwen2", "gptneox",
          "bloom", *FAMILIES]  # fmt: skip
EXPORTERS = {"torchscript": False, "dynamo": True}


def export(name, exporter):
    model, args, names = build(name)
    model.eval()
    path = os.path.join(OUT, f"{name}-{exporter}.onnx")
    kw = dict(input_names=names, output_names=["out"], opset_version=18, dynamo=EXPORTERS[exporter])
    if exporter == "dynamo":
        kw.update(external_data=False, optimize=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, path, **kw)
    strip_metadata(path)
    return path


def strip_metadata(path):
    """Drop the dynamo exporter's per-node debugging metadata (stack traces, fx nodes, name scopes):
    two thirds of a small model's bytes, none of its meaning."""
    import onnx

    m = onnx.load(path)
    if any(n.metadata_props for n in m.graph.node):
        for n in m.graph.node:
            del n.metadata_props[:]
        onnx.save(m, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=MODELS, default=MODELS)
    ap.add_argument("--exporter", nargs="*", choices=list(EXPORTERS), default=list(EXPORTERS))
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    failed = 0
    for name in a.only:
        for exporter in a.exporter:
            t0 = time.perf_counter()
            try:
                path = export(name, exporter)
            except Exception as e:  # report and skip the pair
                failed += 1
                last = traceback.format_exception_only(type(e), e)[-1].strip()
                print(f"SKIP {name}-{exporter}: {last[:500]}", flush=True)
                continue
            kb = os.path.getsize(path) / 1024
            print(f"ok   {name}-{exporter}: {kb:.0f} KiB in {time.perf_counter() - t0:.1f} s", flush=True)
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT) if f.endswith(".onnx"))
    print(f"total {total / 1024:.0f} KiB in {OUT}")
    return 1 if failed and not total else 0


if __name__ == "__main__":
    sys.exit(main())
