"""Sample model definitions for the apc importer / sharding tests.

Every model here (except the control_flow error case) is written so that
``torch.jit.trace``, ``torch.jit.script`` (where noted) and ``torch.export``
produce straight-line graphs once inlined: no Python control flow on tensor
values, sizes taken from ``x.size(i)`` (traced as ``aten::size``, exported as
symbolic sizes), and per-model constants (head counts, head dims) stored as
plain Python ints on the module. Attention is one
``F.scaled_dot_product_attention(..., is_causal=True)`` call.

Models whose weights would be large (gpt2_small, llama_small, llama3_8b)
are built on the ``meta`` device and then "materialized" with
zero-stride parameters (see ``make_stub_parameters``) so that the saved
TorchScript archive stays tiny while all parameter *shapes* are real.

Run with the project venv's interpreter (``.venv/bin/python``, torch 2.13). The
Hugging Face samples (``hf_llama_tiny``, ``hf_gpt2_tiny``) also need ``transformers``
(sample_models/requirements.txt); it is imported only when one of them is built.
"""

import math
from dataclasses import dataclass
from typing import Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------
# toy_block / mlp_stack
# --------------------------------------------------------------------------


@dataclass
class ToyBlockConfig:
    d_model: int = 1024
    d_hidden: int = 4096


class ToyBlock(nn.Module):
    """down(relu(up(x))), no biases. Parameters: up.weight, down.weight."""

    def __init__(self, cfg: ToyBlockConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_hidden, bias=False)
        self.relu = nn.ReLU()
        self.down = nn.Linear(cfg.d_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down(self.relu(self.up(x)))


@dataclass
class MlpStackConfig:
    n_blocks: int = 4
    d_model: int = 128
    d_hidden: int = 512


class MlpBlock(nn.Module):
    """x + down(relu(up(ln(x)))). Linear layers have no bias."""

    def __init__(self, cfg: MlpStackConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.d_hidden, bias=False)
        self.relu = nn.ReLU()
        self.down = nn.Linear(cfg.d_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        return x + self.down(self.relu(self.up(self.ln(x))))


class MlpStack(nn.Module):
    def __init__(self, cfg: MlpStackConfig):
        super().__init__()
        self.blocks = nn.ModuleList([MlpBlock(cfg) for _ in range(cfg.n_blocks)])

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x


# --------------------------------------------------------------------------
# GPT-2 (nanoGPT naming: transformer.wte / wpe / h.<i> / ln_f, lm_head)
# --------------------------------------------------------------------------


@dataclass
class GPT2Config:
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    layer_norm_eps: float = 1e-5


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPT2Config, device=None):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.head_dim = cfg.n_embd // cfg.n_head
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, device=device)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, device=device)

    def forward(self, x):
        B = x.size(0)
        T = x.size(1)
        qkv = self.c_attn(x)
        q, k, v = qkv.split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # B,H,T,D
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        # causal attention as nanoGPT / HF do it today: one aten::scaled_dot_product_attention node
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)  # B,H,T,D
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_embd)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config, device=None):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, device=device)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, device=device)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config, device=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, device=device)
        self.attn = CausalSelfAttention(cfg, device=device)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, device=device)
        self.mlp = GPT2MLP(cfg, device=device)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    """forward(idx: i64[B,T]) -> logits f32[B,T,vocab]. lm_head tied to wte."""

    def __init__(self, cfg: GPT2Config, device=None):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd, device=device),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd, device=device),
                h=nn.ModuleList([GPT2Block(cfg, device=device) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, device=device),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False, device=device)
        # weight tying: named_parameters() reports transformer.wte.weight once
        self.lm_head.weight = self.transformer.wte.weight
        if device is None or torch.device(device).type != "meta":
            self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def logits(self, idx):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)

    def forward(self, idx):
        return self.logits(idx)


class GPT2WithLoss(GPT2):
    """forward(idx, targets) -> scalar mean cross-entropy loss."""

    def forward(self, idx, targets):
        logits = self.logits(idx)
        V = logits.size(-1)
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


# --------------------------------------------------------------------------
# LLaMA (Meta naming: tok_embeddings / layers.<i>.attention.wq / ... / norm / output)
# --------------------------------------------------------------------------


@dataclass
class LlamaConfig:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_dim: int = 14336
    vocab_size: int = 128256
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 2048  # only sizes the rope cos/sin buffers (max usable T)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        assert cfg.dim % cfg.n_heads == 0 and cfg.n_heads % cfg.n_kv_heads == 0
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.n_rep = cfg.n_heads // cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.half_dim = self.head_dim // 2
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False, device=device)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False, device=device)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False, device=device)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False, device=device)

    def rope(self, x, cos, sin):
        # x: B,T,H,D ; cos/sin: T,D -> broadcast as 1,T,1,D
        x1 = x[..., : self.half_dim]
        x2 = x[..., self.half_dim:]
        rot = torch.cat((-x2, x1), dim=-1)
        return x * cos[None, :, None, :] + rot * sin[None, :, None, :]

    def repeat_kv(self, x, B: int, T: int):
        # B,T,Hkv,D -> B,T,Hkv*n_rep,D via expand + reshape (no repeat_interleave)
        return (
            x[:, :, :, None, :]
            .expand(B, T, self.n_kv_heads, self.n_rep, self.head_dim)
            .reshape(B, T, self.n_heads, self.head_dim)
        )

    def forward(self, x, cos, sin):
        B = x.size(0)
        T = x.size(1)
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        q = self.rope(q, cos, sin)
        k = self.rope(k, cos, sin)
        k = self.repeat_kv(k, B, T)
        v = self.repeat_kv(v, B, T)
        q = q.transpose(1, 2)  # B,H,T,D
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)
        # causal attention: one aten::scaled_dot_product_attention node (no T x T mask tensor)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)  # B,H,T,D
        out = out.transpose(1, 2).contiguous().view(B, T, self.n_heads * self.head_dim)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False, device=device)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False, device=device)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False, device=device)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)
        self.attention = Attention(cfg, device=device)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)
        self.feed_forward = FeedForward(cfg, device=device)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_seq_len, head_dim] for rotate-half RoPE (float64 math, f32 result)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    t = torch.arange(max_seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)  # T, D/2
    emb = torch.cat((freqs, freqs), dim=-1)  # T, D
    return emb.cos().float(), emb.sin().float()


class Llama(nn.Module):
    """forward(tokens: i64[B,T]) -> logits f32[B,T,vocab]. Untied output head.

    Buffers: freqs_cos, freqs_sin ([max_seq_len, head_dim], f32).
    """

    def __init__(self, cfg: LlamaConfig, device=None):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, device=device)
        self.layers = nn.ModuleList([TransformerBlock(cfg, device=device) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, device=device)
        cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        # buffers are always real CPU tensors (small)
        self.register_buffer("freqs_cos", cos)
        self.register_buffer("freqs_sin", sin)
        if device is None or torch.device(device).type != "meta":
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    continue  # RMSNorm weights stay 1
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, tokens):
        T = tokens.size(1)
        h = self.tok_embeddings(tokens)
        cos = self.freqs_cos[:T]
        sin = self.freqs_sin[:T]
        for layer in self.layers:
            h = layer(h, cos, sin)
        h = self.norm(h)
        return self.output(h).float()


# --------------------------------------------------------------------------
# cnn_small
# --------------------------------------------------------------------------


@dataclass
class CnnConfig:
    in_channels: int = 3
    channels: Tuple[int, int, int] = (16, 32, 64)
    num_classes: int = 10


class CnnSmall(nn.Module):
    """features: [conv3x3 -> BN -> ReLU -> maxpool2] x2, conv3x3 -> BN -> ReLU,
    adaptive avg pool (1x1), flatten, classifier Linear."""

    def __init__(self, cfg: CnnConfig):
        super().__init__()
        c0 = cfg.in_channels
        c1, c2, c3 = cfg.channels
        self.features = nn.Sequential(
            nn.Conv2d(c0, c1, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(c1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(c2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c2, c3, kernel_size=3, padding=1),
            nn.BatchNorm2d(c3),
            nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten(1)
        self.classifier = nn.Linear(c3, cfg.num_classes)
        # non-trivial (deterministic, given the caller's seed) running stats
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                with torch.no_grad():
                    m.running_mean.copy_(torch.randn_like(m.running_mean) * 0.1)
                    m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)
                    m.weight.copy_(1.0 + 0.1 * torch.randn_like(m.weight))
                    m.bias.copy_(0.1 * torch.randn_like(m.bias))

    def forward(self, x):
        return self.classifier(self.flatten(self.pool(self.features(x))))


# --------------------------------------------------------------------------
# resnet_bottleneck: torchvision's ResNet-50 structure, narrower, in training mode
# --------------------------------------------------------------------------


@dataclass
class ResNetConfig:
    layers: Tuple[int, int, int, int] = (3, 4, 6, 3)  # ResNet-50's block counts
    width: int = 16  # torchvision's ResNet-50 has 64
    num_classes: int = 10


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet V1.5): 1x1 -> 3x3 (stride here) -> 1x1 (x4 channels),
    BN after each conv, in-place ReLU, `out += identity` with a strided 1x1 conv + BN downsample
    where the shape changes."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNetBottleneck(nn.Module):
    """Stem conv7x7/2 + BN + ReLU + maxpool3/2, four stages of Bottleneck blocks (stride 2 from the
    second), adaptive avg pool, Linear. Built in training mode: BatchNorm normalizes with batch
    statistics and updates its running stats and num_batches_tracked."""

    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        w = cfg.width
        self.inplanes = w
        self.conv1 = nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(w, cfg.layers[0], 1)
        self.layer2 = self._stage(w * 2, cfg.layers[1], 2)
        self.layer3 = self._stage(w * 4, cfg.layers[2], 2)
        self.layer4 = self._stage(w * 8, cfg.layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(w * 8 * 4, cfg.num_classes)

    def _stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --------------------------------------------------------------------------
# swin_tiny: torchvision's Swin Transformer (V1) structure, small, in training mode
# --------------------------------------------------------------------------


@dataclass
class SwinConfig:
    patch: int = 4
    embed_dim: int = 24
    depths: Tuple[int, ...] = (2, 2)
    heads: Tuple[int, ...] = (2, 4)
    window: int = 4
    mlp_ratio: float = 2.0
    num_classes: int = 10


class SwinWindowAttention(nn.Module):
    """torchvision's ShiftedWindowAttention, written out: pad to whole windows, roll by the shift,
    window partition, attention with a relative position bias gathered from a table by an index
    buffer (`table[index]`: aten::index.Tensor), and for shifted windows the attention mask built
    by slice assignment into `x.new_zeros` (in-place writes through views), then the reverse."""

    def __init__(self, dim: int, window: int, shift: int, heads: int):
        super().__init__()
        self.window, self.shift, self.heads = window, shift, heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij"))
        flat = torch.flatten(coords, 1)
        rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += window - 1
        rel[:, :, 1] += window - 1
        rel[:, :, 0] *= 2 * window - 1
        self.register_buffer("relative_position_index", rel.sum(-1).flatten())

    def forward(self, x):
        B, H, W, C = x.shape
        ws = self.window
        n = ws * ws
        bias = self.relative_position_bias_table[self.relative_position_index]
        bias = bias.view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
        pad_r = (ws - W % ws) % ws
        pad_b = (ws - H % ws) % ws
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        _, pH, pW, _ = x.shape
        shift = 0 if ws >= pH or ws >= pW else self.shift
        if shift > 0:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        nw = (pH // ws) * (pW // ws)
        x = x.view(B, pH // ws, ws, pW // ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B * nw, n, C)
        qkv = self.qkv(x).reshape(x.size(0), n, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (C // self.heads) ** -0.5).matmul(k.transpose(-2, -1)) + bias
        if shift > 0:
            mask = x.new_zeros((pH, pW))
            slices = ((0, -ws), (-ws, -shift), (-shift, None))
            count = 0
            for h in slices:
                for w in slices:
                    mask[h[0]:h[1], w[0]:w[1]] = count
                    count += 1
            mask = mask.view(pH // ws, ws, pW // ws, ws).permute(0, 2, 1, 3).reshape(nw, n)
            mask = mask.unsqueeze(1) - mask.unsqueeze(2)
            mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
            attn = attn.view(x.size(0) // nw, nw, self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        x = F.softmax(attn, dim=-1).matmul(v).transpose(1, 2).reshape(x.size(0), n, C)
        x = self.proj(x)
        x = x.view(B, pH // ws, pW // ws, ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B, pH, pW, C)
        if shift > 0:
            x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
        return x[:, :H, :W, :].contiguous()


class SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SwinWindowAttention(dim, window, shift, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim),
                                 nn.Dropout(0.0))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SwinPatchMerging(nn.Module):
    """torchvision's PatchMerging: pad to even H and W, the four strided quarter grids (slices with
    step 2) concatenated on channels, LayerNorm, Linear(4C -> 2C)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        H, W = x.shape[-3:-1]
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        x = torch.cat([x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :], x[..., 0::2, 1::2, :],
                       x[..., 1::2, 1::2, :]], -1)
        return self.reduction(self.norm(x))


class SwinTiny(nn.Module):
    """Patch embedding (conv patch/patch, NHWC, LayerNorm), stages of Swin blocks alternating
    unshifted and shifted windows with PatchMerging between stages, LayerNorm, average pool,
    Linear head."""

    def __init__(self, cfg: SwinConfig):
        super().__init__()
        d = cfg.embed_dim
        self.patch = nn.Conv2d(3, d, cfg.patch, stride=cfg.patch)
        self.patch_norm = nn.LayerNorm(d)
        stages = []
        for i, (depth, heads) in enumerate(zip(cfg.depths, cfg.heads)):
            if i > 0:
                stages.append(SwinPatchMerging(d))
                d *= 2
            for j in range(depth):
                stages.append(SwinBlock(d, heads, cfg.window, 0 if j % 2 == 0 else cfg.window // 2, cfg.mlp_ratio))
        self.features = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.num_classes)

    def forward(self, x):
        x = self.patch_norm(self.patch(x).permute(0, 2, 3, 1))
        x = self.norm(self.features(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1), 1))


# --------------------------------------------------------------------------
# multi_output / control_flow
# --------------------------------------------------------------------------


class MultiOutput(nn.Module):
    """Returns a tuple holding a tensor and a dict of tensors (the importer keeps the structure)."""

    def __init__(self, d_model: int = 32, n_classes: int = 10):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, n_classes, bias=False)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        h = self.proj(x)
        return torch.relu(h), {"logits": self.head(h), "hidden": h}


class BatchSizedPatterns(nn.Module):
    """Sizes computed from the batch inside the model, as real models have them: a ViT class token
    expanded to the batch (``cls.expand(B, -1, -1)``), an RNN whose initial state is
    ``zeros(B, H) + state0.repeat(B, 1)``, per-sample positions from ``arange(B)``, and the concatenation of two branch
    outputs (inception / shufflenet). With a dynamic batch each of these must follow the run-time
    batch, not the one the model was exported at."""

    def __init__(self, d_in: int = 16, d_model: int = 32, n_classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(d_in, d_model)
        self.cls = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)
        self.cell_x = nn.Linear(d_model, d_model)
        self.cell_h = nn.Linear(d_model, d_model, bias=False)
        self.state0 = nn.Parameter(torch.randn(1, d_model) * 0.02)
        self.branch_a = nn.Linear(d_model, d_model // 2)
        self.branch_b = nn.Linear(d_model, d_model // 2)
        self.head = nn.Linear(d_model, n_classes)
        self.d_model = d_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        h = torch.cat([self.cls.expand(b, -1, -1), self.inp(x)], dim=1)
        s = torch.zeros(b, self.d_model, dtype=x.dtype, device=x.device) + self.state0.repeat(b, 1)
        for t in range(h.shape[1]):
            s = torch.tanh(self.cell_x(h[:, t]) + self.cell_h(s))
        s = s + torch.arange(b, dtype=x.dtype, device=x.device)[:, None] * 0.01
        y = torch.cat([torch.relu(self.branch_a(s)), torch.sigmoid(self.branch_b(s))], dim=-1)
        return self.head(y)


class EinsumUpsample(nn.Module):
    """Ops real vision models use that no other sample has: maxvit-style attention written with
    ``torch.einsum`` (scores ``bhid,bhjd->bhij``, weighted values ``bhij,bhjd->bhid``) over the tokens
    of a strided conv feature map, then a bilinear (align_corners=False) and a nearest upsampling
    back to the input's resolution (a decoder / FPN top-down path), fused by a conv, pooled, classified.
    Trained at several batch sizes by the dynamic-batch tests (sharded == single device)."""

    def __init__(self, dim: int = 16, heads: int = 2, n_classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 3, stride=2, padding=1)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fuse = nn.Conv2d(dim, dim, 3, padding=1)
        self.head = nn.Linear(dim, n_classes)
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.scale = self.head_dim ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.relu(self.stem(x))
        h, w = f.shape[2], f.shape[3]
        t = f.flatten(2).transpose(1, 2)
        qkv = self.qkv(t).reshape(-1, h * w, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        s = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        o = torch.einsum("bhij,bhjd->bhid", s.softmax(-1), v)
        o = self.proj(o.transpose(1, 2).reshape(-1, h * w, self.dim))
        o = o.transpose(1, 2).reshape(-1, self.dim, h, w)
        up = F.interpolate(o, scale_factor=2.0, mode="bilinear", align_corners=False)
        near = F.interpolate(f, scale_factor=2.0, mode="nearest")
        y = torch.relu(self.fuse(up + near))
        return self.head(y.mean((2, 3)))


class GatherPatterns(nn.Module):
    """Indexing and properties real models use that no other sample has: ``h[:, pos]`` and
    ``h[:, :, torch.tensor([0, 3, 5])]`` (aten::index.Tensor with an optional-tensor list
    ``[None, pos]``, as Falcon's attention exports) where ``pos`` is computed from a batch-split
    input (``idx % 6``, so a rank's piece of it would index the wrong rows), and ``.mT`` / ``.T``
    (aten::mT, aten::numpy_T)."""

    def __init__(self, d: int = 16, n_classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.mix = nn.Parameter(torch.randn(6, 6) * 0.3)
        self.head = nn.Linear(d + 3, n_classes)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))  # [B, 6, d]
        h = (h.mT @ self.mix.T).mT  # the 6 positions mixed
        g = h[:, idx % 6]  # [B, B, d]: every sample's row at each sample's position
        s = h[:, :, torch.tensor([0, 3, 5])]  # [B, 6, 3]
        return self.head(torch.cat([g.mean(1), s.mean(1)], -1))


class RandomOps(nn.Module):
    """Dropout where real models put it, in training mode: on activations the batch splits
    (``dropout(up(x))``, before any nonlinearity, so its zeros are the mask's), on a hidden dim
    tensor parallelism splits (after ``up``), and on a weight that data parallelism replicates
    (``dropout(mix)``, DropConnect). ``mix``'s dropped form is also returned, so that a test sees
    a replicated random tensor on every rank."""

    def __init__(self, d: int = 16, hidden: int = 32, n_classes: int = 10, p: float = 0.5):
        super().__init__()
        self.p = p
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)
        self.mix = nn.Parameter(torch.randn(d, d) * 0.3)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x: torch.Tensor):
        h = F.dropout(self.up(x), self.p, self.training)  # [B, hidden]
        h = self.down(torch.tanh(h))
        m = F.dropout(self.mix, self.p, self.training)  # [d, d]
        return self.head(torch.tanh(h @ m)), m


class MoeLayer(nn.Module):
    """A DeepSeek-V3-shaped mixture-of-experts FFN over tokens t [T, D]: sigmoid router scores,
    top-k selection on the scores plus a per-expert bias buffer (aux-loss-free balancing), the
    selected scores gathered and normalized as routing weights; routed experts as a batched
    matmul with each token's expert weights gathered by index (Hugging Face's
    experts_implementation="batched_mm"), a shared expert, and a load-balancing term from the
    per-expert token counts (histc) that is added to the output. `sort_tokens`: visit the
    (token, slot) pairs in expert order (sort of the expert ids, tokens perm // k) and combine
    with index_add; otherwise in token order (repeat_interleave) and combine with scatter_add."""

    def __init__(self, dim: int, n_experts: int, top_k: int, ffn: int, shared_ffn: int,
                 sort_tokens: bool):
        super().__init__()
        self.n_experts = n_experts
        self.top_k = top_k
        self.sort_tokens = sort_tokens
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.register_buffer("expert_bias", torch.linspace(-0.1, 0.1, n_experts))
        self.w_up = nn.Parameter(torch.randn(n_experts, dim, ffn) * dim ** -0.5)
        self.w_down = nn.Parameter(torch.randn(n_experts, ffn, dim) * ffn ** -0.5)
        self.shared_up = nn.Linear(dim, shared_ffn, bias=False)
        self.shared_down = nn.Linear(shared_ffn, dim, bias=False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        k = self.top_k
        scores = torch.sigmoid(self.gate(t))  # [T, E]
        _, idx = torch.topk(scores + self.expert_bias, k, dim=-1)  # [T, k]
        weights = scores.gather(1, idx)
        weights = weights / weights.sum(-1, keepdim=True)
        ids = idx.reshape(-1)  # [T*k]
        slot_weights = weights.reshape(-1)
        if self.sort_tokens:
            ids, perm = torch.sort(ids, stable=True)
            tok = torch.div(perm, k, rounding_mode="floor")
            h = t[tok]
            slot_weights = slot_weights[perm]
        else:
            tok = torch.arange(t.size(0), device=t.device).repeat_interleave(k)
            h = t.repeat_interleave(k, dim=0)
        up = torch.bmm(h.unsqueeze(1), self.w_up[ids]).squeeze(1)  # [T*k, F]
        down = torch.bmm(F.silu(up).unsqueeze(1), self.w_down[ids]).squeeze(1)  # [T*k, D]
        down = down * slot_weights.unsqueeze(-1)
        if self.sort_tokens:
            routed = torch.zeros_like(t).index_add(0, tok, down)
        else:
            index = tok.unsqueeze(-1).expand(-1, t.size(1))
            routed = torch.zeros_like(t).scatter_add(0, index, down)
        shared = self.shared_down(F.silu(self.shared_up(t)))
        counts = torch.histc(ids.float(), bins=self.n_experts, min=0, max=self.n_experts - 1)
        balance = (counts / counts.sum() * scores.mean(0)).sum() * self.n_experts
        return routed + shared + 0.01 * balance


class MoeTiny(nn.Module):
    """Two pre-norm mixture-of-experts blocks x + moe(norm(x)) over x [B, S, D] (the first sorts
    the tokens by expert, the second does not), then a final norm."""

    def __init__(self, dim: int = 32, n_experts: int = 4, top_k: int = 2, ffn: int = 64,
                 shared_ffn: int = 64):
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(2)])
        self.moes = nn.ModuleList(
            [MoeLayer(dim, n_experts, top_k, ffn, shared_ffn, sort_tokens=i == 0) for i in range(2)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        for norm, moe in zip(self.norms, self.moes):
            x = x + moe(norm(x).reshape(b * s, d)).reshape(b, s, d)
        return self.norm(x)


@dataclass
class DeepSeekConfig:
    dim: int = 7168
    n_layers: int = 61
    n_dense_layers: int = 3  # the first layers have a dense FFN, the rest mixtures of experts
    dense_ffn: int = 18432
    n_heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_head_dim: int = 192
    v_head_dim: int = 128
    n_experts: int = 256  # routed experts
    top_k: int = 8
    moe_ffn: int = 2048  # each routed expert's and the shared expert's hidden size
    vocab_size: int = 129280
    capacity_factor: float = 1.25
    norm_eps: float = 1e-6


class SwiGlu(nn.Module):
    def __init__(self, dim: int, hidden: int, device=None):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False, device=device)
        self.w2 = nn.Linear(hidden, dim, bias=False, device=device)
        self.w3 = nn.Linear(dim, hidden, bias=False, device=device)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MlaAttention(nn.Module):
    """DeepSeek-V3's multi-head latent attention projections (low-rank q and kv, each through its
    own RMSNorm; per-head qk dim 192, v dim 128 at full size), causal sdpa; the decoupled rope
    part is left out (elementwise, it changes no sharding choice)."""

    def __init__(self, cfg: DeepSeekConfig, device=None):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qk = cfg.qk_head_dim
        self.v = cfg.v_head_dim
        self.scale = cfg.qk_head_dim ** -0.5
        self.wq_a = nn.Linear(cfg.dim, cfg.q_lora_rank, bias=False, device=device)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps, device=device)
        self.wq_b = nn.Linear(cfg.q_lora_rank, cfg.n_heads * cfg.qk_head_dim, bias=False, device=device)
        self.wkv_a = nn.Linear(cfg.dim, cfg.kv_lora_rank, bias=False, device=device)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg.norm_eps, device=device)
        self.wkv_b = nn.Linear(cfg.kv_lora_rank, cfg.n_heads * (cfg.qk_head_dim + cfg.v_head_dim),
                               bias=False, device=device)
        self.wo = nn.Linear(cfg.n_heads * cfg.v_head_dim, cfg.dim, bias=False, device=device)

    def forward(self, x):
        B = x.size(0)
        T = x.size(1)
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, self.n_heads, self.qk).transpose(1, 2)
        kv = self.wkv_b(self.kv_norm(self.wkv_a(x))).view(B, T, self.n_heads, self.qk + self.v)
        k = kv[:, :, :, : self.qk].transpose(1, 2)
        v = kv[:, :, :, self.qk:].transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.n_heads * self.v))


class CapacityMoe(nn.Module):
    """A DeepSeek-V3-shaped mixture of experts with a static expert capacity (GShard / Switch
    dispatch), over x [G, S, D]: each of the G groups (sequences) routes its S tokens into its own
    C = ceil(top_k * S * capacity_factor / n_experts) slots per expert. Sigmoid router scores,
    top-k of the scores plus a per-expert bias buffer, the selected scores normalized as weights.
    A (token, choice) pair takes the next free slot of its expert in token order; a pair that
    finds its expert full is dropped (it adds nothing; the shared expert and the residual still
    carry the token). Dispatch and combine are einsums with one-hot [G, S, E, C] tensors, the
    experts SwiGLU FFNs as einsums over [E, D, F] weights: cutting the experts (E) and the groups
    (G) on one mesh dim exchanges tokens by all-to-all."""

    def __init__(self, dim: int, n_experts: int, top_k: int, ffn: int, capacity_factor: float,
                 device=None):
        super().__init__()
        self.n_experts = n_experts
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.gate = nn.Linear(dim, n_experts, bias=False, device=device)
        buffer_device = None if device is None or torch.device(device).type == "meta" else device
        self.register_buffer("expert_bias", torch.linspace(-0.1, 0.1, n_experts, device=buffer_device))
        self.w1 = nn.Parameter(torch.empty(n_experts, dim, ffn, device=device))
        self.w3 = nn.Parameter(torch.empty(n_experts, dim, ffn, device=device))
        self.w2 = nn.Parameter(torch.empty(n_experts, ffn, dim, device=device))
        self.shared = SwiGlu(dim, ffn, device=device)
        if device is None or torch.device(device).type != "meta":
            for w, fan_in in ((self.w1, dim), (self.w3, dim), (self.w2, ffn)):
                nn.init.normal_(w, std=fan_in ** -0.5)

    def forward(self, x):
        G = x.size(0)
        S = x.size(1)
        E = self.n_experts
        k = self.top_k
        # ceil(k * S * capacity_factor / E) in integers (the factor in hundredths): tracing
        # and scripting both keep it a size computation
        cf = int(round(self.capacity_factor * 100))
        C = (k * S * cf + E * 100 - 1) // (E * 100)
        scores = torch.sigmoid(self.gate(x))  # [G, S, E]
        _, idx = torch.topk(scores + self.expert_bias, k, dim=-1)  # [G, S, k]
        weights = scores.gather(-1, idx)
        weights = weights / weights.sum(-1, keepdim=True)
        chosen = F.one_hot(idx, E).to(x.dtype).reshape(G, S * k, E)
        position = torch.cumsum(chosen, dim=1) - 1  # each pair's place in its expert's queue
        slots = torch.arange(C, dtype=x.dtype, device=x.device)
        slot = (position.unsqueeze(-1) == slots).to(x.dtype) * chosen.unsqueeze(-1)  # [G, S*k, E, C]
        slot = slot.reshape(G, S, k, E, C)
        dispatch = slot.sum(2)  # [G, S, E, C]
        combine = (slot * weights.reshape(G, S, k, 1, 1)).sum(2)
        xe = torch.einsum("gsec,gsd->egcd", dispatch, x)
        h = F.silu(torch.einsum("egcd,edf->egcf", xe, self.w1)) * torch.einsum("egcd,edf->egcf", xe, self.w3)
        y = torch.einsum("egcf,efd->egcd", h, self.w2)
        return torch.einsum("gsec,egcd->gsd", combine, y) + self.shared(x)


class DeepSeekBlock(nn.Module):
    def __init__(self, cfg: DeepSeekConfig, moe: bool, device=None):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)
        self.attention = MlaAttention(cfg, device=device)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)
        self.feed_forward = (CapacityMoe(cfg.dim, cfg.n_experts, cfg.top_k, cfg.moe_ffn,
                                         cfg.capacity_factor, device=device)
                             if moe else SwiGlu(cfg.dim, cfg.dense_ffn, device=device))

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class DeepSeekV3(nn.Module):
    """forward(tokens: i64[B,T]) -> logits f32[B,T,vocab]: embedding, n_dense_layers dense blocks,
    then mixture-of-experts blocks (CapacityMoe: shared expert + routed top-k experts), final
    RMSNorm, untied output head."""

    def __init__(self, cfg: DeepSeekConfig, device=None):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, device=device)
        self.layers = nn.ModuleList([DeepSeekBlock(cfg, i >= cfg.n_dense_layers, device=device)
                                     for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, device=device)
        if device is None or torch.device(device).type != "meta":
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or name.endswith(".w1") or name.endswith(".w2") \
                        or name.endswith(".w3"):
                    continue  # norms stay 1; expert weights have their own scale
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


class DataDependentBranch(nn.Module):
    """A branch on a tensor's value: control flow the importer cannot flatten (an error case)."""

    def __init__(self, d_model: int = 16):
        super().__init__()
        self.lin = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if bool(h.sum() > 0):
            h = h * 2.0
        else:
            h = h - 1.0
        return h


class DataDependentCond(DataDependentBranch):
    """DataDependentBranch with the branch written as ``torch.cond`` (same parameters, same outputs).

    torch.export cannot trace the Python ``if`` on a tensor value; this form exports to a graph with a
    ``torch.ops.higher_order.cond`` node and two subgraphs (still an importer error case).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return torch.cond(h.sum() > 0, _times_two, _minus_one, (h,))


def _times_two(h):
    return h * 2.0


def _minus_one(h):
    return h - 1.0


# --------------------------------------------------------------------------
# Hugging Face transformers models (random weights from a config; no hub download)
# --------------------------------------------------------------------------

# Keyword arguments of the transformers config classes (recorded in the manifest).
HF_LLAMA_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                     rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                     bos_token_id=1, eos_token_id=2, pad_token_id=None,
                     use_cache=False, attn_implementation="sdpa")
HF_GPT2_TINY = dict(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                    bos_token_id=255, eos_token_id=255, pad_token_id=None,
                    use_cache=False, attn_implementation="sdpa")

# Mixtral with 4 experts, top-2, and transformers' batched_mm experts (each slot's expert weights
# gathered by index, then bmm): the export apc plans. The default grouped_mm experts export
# transformers::grouped_mm_fallback with f32 weights, which apc refuses in one line.
HF_MIXTRAL_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
                       rope_theta=10000.0, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=None,
                       use_cache=False, attn_implementation="sdpa",
                       experts_implementation="batched_mm")
# Qwen3-MoE: its default experts loop over the experts a batch hits (data-dependent, torch.export
# refuses it) and its grouped_mm form exports transformers::grouped_mm_fallback; batched_mm exports.
HF_QWEN3_MOE_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=128, num_experts=4, num_experts_per_tok=2,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=None,
                         use_cache=False, attn_implementation="sdpa",
                         experts_implementation="batched_mm", router_aux_loss_coef=0.0,
                         output_router_logits=False)


# DeepSeek-V3 as transformers writes it: multi-head latent attention (q and kv LoRA ranks, a
# rotary part of the head), the first layer dense, then MoE layers with one shared expert and
# sigmoid top-2 routing within groups (written with an in-place scatter_ and slice assignments,
# which export functionalizes into scatter and copy).
HF_DEEPSEEK_V3_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                           max_position_embeddings=128, n_routed_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=48, n_shared_experts=1, first_k_dense_replace=1,
                           n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=32,
                           qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                           rope_scaling=None, rms_norm_eps=1e-6, tie_word_embeddings=False,
                           bos_token_id=1, eos_token_id=2, pad_token_id=None, use_cache=False,
                           attn_implementation="sdpa", experts_implementation="batched_mm")


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def hf_llama_tiny() -> nn.Module:
    """transformers' LlamaForCausalLM (sdpa attention) whose forward(input_ids) returns the logits.

    A subclass, not a wrapper: parameter names are the Hugging Face ones
    (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``). Weights come from the
    model's own init under the caller's seed.
    """
    transformers = _quiet_transformers()

    class LlamaForCausalLMLogits(transformers.LlamaForCausalLM):
        def forward(self, input_ids):
            return super().forward(input_ids=input_ids, use_cache=False).logits

    return LlamaForCausalLMLogits(transformers.LlamaConfig(**HF_LLAMA_TINY))


def hf_gpt2_tiny() -> nn.Module:
    """transformers' GPT2LMHeadModel (sdpa attention, lm_head tied to transformer.wte) returning logits."""
    transformers = _quiet_transformers()

    class GPT2LMHeadModelLogits(transformers.GPT2LMHeadModel):
        def forward(self, input_ids):
            return super().forward(input_ids=input_ids, use_cache=False).logits

    return GPT2LMHeadModelLogits(transformers.GPT2Config(**HF_GPT2_TINY))


def hf_mixtral_tiny() -> nn.Module:
    """transformers' MixtralForCausalLM (sdpa attention, batched_mm experts) returning logits."""
    transformers = _quiet_transformers()

    class MixtralForCausalLMLogits(transformers.MixtralForCausalLM):
        def forward(self, input_ids):
            return super().forward(input_ids=input_ids, use_cache=False).logits

    return MixtralForCausalLMLogits(transformers.MixtralConfig(**HF_MIXTRAL_TINY))


def hf_qwen3_moe_tiny() -> nn.Module:
    """transformers' Qwen3MoeForCausalLM (sdpa attention, batched_mm experts) returning logits."""
    transformers = _quiet_transformers()

    class Qwen3MoeForCausalLMLogits(transformers.Qwen3MoeForCausalLM):
        def forward(self, input_ids):
            return super().forward(input_ids=input_ids, use_cache=False).logits

    return Qwen3MoeForCausalLMLogits(transformers.Qwen3MoeConfig(**HF_QWEN3_MOE_TINY))


def hf_deepseek_v3_tiny() -> nn.Module:
    """transformers' DeepseekV3ForCausalLM (MLA attention, a dense first layer, then a shared
    expert and group-limited top-2 routing over 4 experts; batched_mm experts) returning logits."""
    transformers = _quiet_transformers()

    class DeepseekV3ForCausalLMLogits(transformers.DeepseekV3ForCausalLM):
        def forward(self, input_ids):
            return super().forward(input_ids=input_ids, use_cache=False).logits

    return DeepseekV3ForCausalLMLogits(transformers.DeepseekV3Config(**HF_DEEPSEEK_V3_TINY))


def with_grouped_mm_experts(build):
    """`build`'s model with transformers' default experts implementation, "grouped_mm".

    from_pretrained and the classes themselves pick "grouped_mm" when none is asked for; the logits
    subclasses above cannot (transformers reads the class's source for its experts decorator), so
    the implementation is switched after construction: the weights are the same, and with f32
    weights on the CPU the experts export transformers::grouped_mm_fallback (apc imports it as
    aten::_grouped_mm)."""

    def grouped():
        model = build()
        model.config._experts_implementation = "grouped_mm"
        return model

    return grouped


# --------------------------------------------------------------------------
# named configurations used by generate.py
# --------------------------------------------------------------------------

TOY_BLOCK = ToyBlockConfig(d_model=1024, d_hidden=4096)
MLP_STACK = MlpStackConfig(n_blocks=4, d_model=128, d_hidden=512)
# Tiny dims are chosen to differ from the batch (8) and sequence (64 / 128)
# sizes so that a mixed-up dimension in shape propagation cannot go unnoticed.
GPT2_TINY = GPT2Config(vocab_size=50257, block_size=128, n_layer=2, n_head=4, n_embd=48)
GPT2_SMALL = GPT2Config(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
LLAMA_TINY = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=160,
                         vocab_size=256, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=2048)
LLAMA_SMALL = LlamaConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, ffn_dim=1408,
                          vocab_size=32000, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=2048)
# llama_small with half the layers: the pair checks that layer clustering's optimum does not
# depend on the repeat count (tests/solver/models_test.cpp).
LLAMA_SMALL_4L = LlamaConfig(dim=512, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=1408,
                             vocab_size=32000, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=2048)
LLAMA3_8B = LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                        vocab_size=128256, norm_eps=1e-5, rope_theta=500000.0, max_seq_len=2048)
LLAMA3_8B_PARAMS = 8_030_261_248
# A LLaMA-3-405B-shaped model (126 layers): the planner's cluster-scale benchmark.
LLAMA3_405B = LlamaConfig(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim=53248,
                          vocab_size=128256, norm_eps=1e-5, rope_theta=500000.0, max_seq_len=2048)
LLAMA3_405B_PARAMS = 405_853_388_800
# DeepSeek-V3's dims (61 layers, 3 dense, 256 routed experts top-8, MLA), stub weights: the
# planner's mixture-of-experts benchmark. The tiny one trains in the tests; capacity factor 1 at
# 8 tokens per sequence drops some (token, expert) pairs, as the model defines.
DEEPSEEK_V3 = DeepSeekConfig()
DEEPSEEK_V3_PARAMS = 671_254_273_024
DEEPSEEK_TINY = DeepSeekConfig(dim=32, n_layers=3, n_dense_layers=1, dense_ffn=64, n_heads=4,
                               q_lora_rank=16, kv_lora_rank=16, qk_head_dim=12, v_head_dim=8,
                               n_experts=4, top_k=2, moe_ffn=48, vocab_size=96,
                               capacity_factor=1.0, norm_eps=1e-6)
CNN_SMALL = CnnConfig(in_channels=3, channels=(16, 32, 64), num_classes=10)
RESNET_BOTTLENECK = ResNetConfig(layers=(3, 4, 6, 3), width=16, num_classes=10)
SWIN_TINY = SwinConfig(patch=4, embed_dim=24, depths=(2, 2), heads=(2, 4), window=4, mlp_ratio=2.0, num_classes=10)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def make_stub_parameters(model: nn.Module) -> nn.Module:
    """Replace every parameter by a zero-stride view of a one-element storage.

    ``nn.Parameter(torch.full((1,), v).expand(shape))``: full logical shape,
    4 bytes of storage. Tied parameters stay tied (same replacement object).
    Values: 1.0 for norm weights, 0.0 for biases, 0.02 otherwise.
    Works for modules built on the meta device.
    """
    replaced = {}
    for mod in model.modules():
        for pname, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in replaced:
                if isinstance(mod, (nn.LayerNorm, RMSNorm, nn.BatchNorm2d)) and pname == "weight":
                    v = 1.0
                elif pname == "bias":
                    v = 0.0
                else:
                    v = 0.02
                base = torch.full((1,), v, dtype=p.dtype, device="cpu")
                replaced[id(p)] = nn.Parameter(base.expand(p.shape), requires_grad=p.requires_grad)
            mod._parameters[pname] = replaced[id(p)]
    for mod in model.modules():
        for bname, b in mod._buffers.items():
            if b is not None and b.device.type == "meta":
                mod._buffers[bname] = torch.zeros(1, dtype=b.dtype).expand(b.shape)
    return model
