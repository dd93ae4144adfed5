#!/usr/bin/env python3
"""An independent reference for the LoRA gradients of `choreo finetune train` (tests/train/grad_reference_test.cc).

Reads a spec (JSON: the model's shape, the messages of a choreographed run with their parents at offsets and
their targets, the LoRA pairs) and the model's frozen float32 weights (a raw file and a manifest), computes the
summed log-loss of the targets with a dense formulation written here from the definitions, and its gradient
with respect to every LoRA value with autograd (PyPI `autograd`, reverse-mode differentiation of numpy code).

The formulation differs from choreo's on purpose: a parent placed `delta` positions after where it was encoded
has its keys rotated by `delta` (the paper's destructive re-rotation) and every query is rotated at its own
position; each message's attention is one masked softmax over the concatenation of everything it sees.

Prints JSON: {"loss": L, "grad": [...]} with the gradient in the order of the spec's `lora_order`.
"""

import json
import sys

import autograd.numpy as np
import numpy as onp
from autograd import grad

TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]


def main():
    spec = json.load(open(sys.argv[1]))
    raw = onp.fromfile(sys.argv[2], dtype="<f4").astype(onp.float64)
    weights = {}
    for name, (offset, shape) in spec["weights"].items():
        n = int(onp.prod(shape))
        weights[name] = raw[offset:offset + n].reshape(shape)

    c = spec["config"]
    dim, n_heads, n_kv, hd = c["dim"], c["n_heads"], c["n_kv_heads"], c["head_dim"]
    eps, n_layers = c["rms_eps"], c["n_layers"]
    rope_dims, interleaved = c["rope_dims"], c["rope_layout"] == "interleaved"
    factors = onp.array(c["rope_factors"]) if c["rope_factors"] else onp.ones(rope_dims // 2)
    inv_freq = c["rope_base"] ** (-2.0 * onp.arange(rope_dims // 2) / rope_dims) / factors
    rank, scale = spec["lora"]["rank"], spec["lora"]["alpha"] / spec["lora"]["rank"]
    messages = spec["messages"]

    def rotate(x, pos):
        """x: (n, heads, hd) rotated by angles pos[i] * inv_freq (pos may be negative)."""
        theta = onp.outer(onp.asarray(pos, dtype=onp.float64), inv_freq)  # (n, half)
        cos, sin = onp.cos(theta)[:, None, :], onp.sin(theta)[:, None, :]
        half = rope_dims // 2
        if interleaved:
            x0, x1 = x[..., 0:rope_dims:2], x[..., 1:rope_dims:2]
            y = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
            y = np.reshape(y, x.shape[:-1] + (rope_dims,))
        else:
            x0, x1 = x[..., :half], x[..., half:rope_dims]
            y = np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
        return np.concatenate([y, x[..., rope_dims:]], axis=-1) if rope_dims < x.shape[-1] else y

    def rmsnorm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def loss_of(flat):
        # The LoRA pairs from the flat vector, in lora_order.
        pairs, at = {}, 0
        for entry in spec["lora_order"]:
            key, n_in, n_out = entry["key"], entry["n_in"], entry["n_out"]
            a = np.reshape(flat[at:at + rank * n_in], (rank, n_in))
            at += rank * n_in
            b = np.reshape(flat[at:at + n_out * rank], (n_out, rank))
            at += n_out * rank
            pairs[key] = (a, b)

        def linear(x, w, key, use):
            y = np.dot(x, weights[w].T)
            if use and key in pairs:
                a, b = pairs[key]
                y = y + scale * np.dot(np.dot(x, a.T), b.T)
            return y

        kv = []  # per message, per layer: (keys rotated at the message's own positions, values)
        total = 0.0
        for m in messages:
            tokens = m["tokens"]
            n = len(tokens)
            pos = onp.arange(m["start_pos"], m["start_pos"] + n)
            x = weights["token_embd"][tokens]
            use = m["lora"]
            layers = []
            for l in range(n_layers):
                p = "blk.%d." % l
                xn = rmsnorm(x, weights[p + "attn_norm"])
                q = np.reshape(linear(xn, p + "q", "%d.q" % l, use), (n, n_heads, hd))
                k = np.reshape(linear(xn, p + "k", "%d.k" % l, use), (n, n_kv, hd))
                v = np.reshape(linear(xn, p + "v", "%d.v" % l, use), (n, n_kv, hd))
                k = rotate(k, pos)
                layers.append((k, v))
                qr = rotate(q, pos)
                keys, values, masks = [], [], []
                for parent in m["parents"]:
                    pk, pv = kv[parent["message"]][l]
                    cnt = parent["n_tokens"]
                    delta = parent["offset"] - messages[parent["message"]]["start_pos"]
                    keys.append(rotate(pk[:cnt], onp.full(cnt, delta)))
                    values.append(pv[:cnt])
                    masks.append(onp.zeros((n, cnt)))
                keys.append(k)
                values.append(v)
                masks.append(onp.where(onp.tril(onp.ones((n, n))) > 0, 0.0, -1e30))
                K = np.concatenate(keys, axis=0)
                V = np.concatenate(values, axis=0)
                mask = onp.concatenate(masks, axis=1)
                group = n_heads // n_kv
                K = np.repeat(K, group, axis=1)
                V = np.repeat(V, group, axis=1)
                s = np.einsum("nhd,mhd->hnm", qr, K) / onp.sqrt(hd) + mask[None, :, :]
                s = s - np.max(s, axis=-1, keepdims=True)
                e = np.exp(s)
                att = np.einsum("hnm,mhd->nhd", e / np.sum(e, axis=-1, keepdims=True), V)
                x = x + linear(np.reshape(att, (n, n_heads * hd)), p + "o", "%d.o" % l, use)
                xn2 = rmsnorm(x, weights[p + "ffn_norm"])
                g = linear(xn2, p + "gate", "%d.gate" % l, use)
                u = linear(xn2, p + "up", "%d.up" % l, use)
                h = g / (1.0 + np.exp(-g)) * u
                x = x + linear(h, p + "down", "%d.down" % l, use)
            kv.append(layers)
            rows = [i for i, t in enumerate(m["targets"]) if t >= 0]
            if not rows:
                continue
            xo = rmsnorm(x[rows], weights["output_norm"])
            logits = linear(xo, "output", "output", use)
            mx = np.max(logits, axis=-1, keepdims=True)
            lse = mx[:, 0] + np.log(np.sum(np.exp(logits - mx), axis=-1))
            tgt = [m["targets"][i] for i in rows]
            total = total + np.sum(lse - logits[onp.arange(len(rows)), tgt])
        return total

    flat = onp.array(spec["lora_values"], dtype=onp.float64)
    loss = loss_of(flat)
    g = grad(loss_of)(flat)
    json.dump({"loss": float(loss), "grad": [float(v) for v in g]}, sys.stdout)


if __name__ == "__main__":
    main()
