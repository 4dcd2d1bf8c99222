#!/usr/bin/python3
"""Writes a model that calls a tool, for the OpenAI client's tool test.

    make_tool_model.py OUT_DIR

A linear_attn model of one layer whose every projection is zero, so each
position's logits depend only on its own token (a bigram table in
lm_head): after "\\n" — the last token of the generation prompt — it writes
the one token that holds a whole call,

    <tool_call>\\n{"name": "get_weather", "arguments": {"location": "Paris"}}\\n</tool_call>

and after that token <|im_end|>, its end of sequence. Its tokenizer.json is
a byte-level BPE over the 256 bytes with <|im_start|>, <|im_end|> and the
call as added tokens; its chat template is tests/chat/templates/
chatml_tools.jinja (Qwen 2.5's shape: tools in the system turn, calls as
<tool_call> blocks, tool results as <tool_response> in a user turn).
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n'
        '</tool_call>')
H, V, I = 32, 260, 48
IM_START, IM_END, CALL_ID = 256, 257, 258
NEWLINE = 10  # byte 0x0A: its byte-level character is id 10 here


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main(out):
    os.makedirs(out, exist_ok=True)
    config = {"model_type": "linear_attn", "hidden_size": H, "num_hidden_layers": 1,
              "num_heads": 2, "num_kv_heads": None, "feature_map": "elu",
              "norm_feature_map": True, "hidden_act": "swish", "intermediate_size": I,
              "norm_eps": 1e-6, "vocab_size": V, "tie_word_embeddings": False,
              "bos_token_id": None, "eos_token_id": IM_END}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)

    def zeros(*shape):
        n = 1
        for d in shape:
            n *= d
        return [list(shape), [0.0] * n]

    embeddings = zeros(V, H)
    embeddings[1][NEWLINE * H + 0] = 1.0   # "\n"  → direction 0
    embeddings[1][CALL_ID * H + 1] = 1.0   # call → direction 1
    lm_head = zeros(V, H)
    lm_head[1][CALL_ID * H + 0] = 1.0      # direction 0 → the call
    lm_head[1][IM_END * H + 1] = 1.0       # direction 1 → <|im_end|>
    p = "model.layers.0."
    tensors = {
        "model.embeddings.weight": embeddings,
        p + "attn_norm.weight": [[H], [1.0] * H],
        p + "attn.q_proj.weight": zeros(H, H),
        p + "attn.k_proj.weight": zeros(H, H),
        p + "attn.v_proj.weight": zeros(H, H),
        p + "attn.norm.weight": [[H // 2], [1.0] * (H // 2)],
        p + "attn.o_proj.weight": zeros(H, H),
        p + "mlp_norm.weight": [[H], [1.0] * H],
        p + "mlp.gate_proj.weight": zeros(I, H),
        p + "mlp.up_proj.weight": zeros(I, H),
        p + "mlp.down_proj.weight": zeros(H, I),
        "model.norm.weight": [[H], [1.0] * H],
        "lm_head.weight": lm_head,
    }
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)

    b2u = bytes_to_unicode()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}

    def added(i, content, special):
        return {"id": i, "content": content, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": special}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(IM_START, "<|im_start|>", True),
                         added(IM_END, "<|im_end|>", True),
                         added(CALL_ID, CALL, False)],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {b2u[b]: b for b in range(256)}, "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(HERE, "..", "chat", "templates", "chatml_tools.jinja"),
              encoding="utf-8") as f:
        template = f.read()
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"chat_template": template, "eos_token": "<|im_end|>",
                   "bos_token": None}, f, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1])
