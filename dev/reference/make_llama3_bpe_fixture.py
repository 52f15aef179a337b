#!/usr/bin/env python3
"""A Llama-3-style model folder for the GGUF export of byte-level BPE vocabularies (never run in CI).

  /tmp/venv/bin/python dev/reference/make_llama3_bpe_fixture.py

Writes test/fixtures/tiny_llama3_bpe/ (~130 KB), deterministic:
  tokenizer.json      a byte-level BPE trained here as make_bpe_fixtures.py trains bpe_llama3.json,
                      but small (400 entries: the 256 byte characters and 144 merges): Llama-3's
                      pre-tokenizer (Split on its regex, Isolated; ByteLevel without its regex),
                      ignore_merges, merges as pairs; Llama-3's first 11 special tokens after the
                      vocab (<|begin_of_text|> ... <|eot_id|>, <|python_tag|>), then one
                      non-special added token ("<tool>": user-defined in the GGUF); its
                      post_processor as Meta's (ByteLevel, then TemplateProcessing that puts
                      <|begin_of_text|> first)
  tokenizer_config.json  bos <|begin_of_text|>, eos <|eot_id|> (as Llama-3-Instruct's), a chat
                      template of its own (Llama-3's format, written here; the GGUF must carry
                      these bytes), tokenizer_class PreTrainedTokenizerFast
  config.json, generation_config.json, model.safetensors
                      tiny_llama3's model (make_fixtures.py: GQA 4/2, head_dim 12, llama3 RoPE
                      scaling, tied embeddings, bf16 weights) with vocab_size 512 (ids 412..511
                      are no token: the GGUF's [PADi]), bos_token_id <|begin_of_text|> and
                      eos_token_id a list (<|end_of_text|>, <|eom_id|>, <|eot_id|>) as Llama-3.1's
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.chdir(ROOT)

import torch  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, pre_tokenizers, processors  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from make_bpe_fixtures import LLAMA3_PATTERN, LLAMA3_SPECIAL, train  # noqa: E402
from make_fixtures import MODELS, build_model  # noqa: E402

OUT = "test/fixtures/tiny_llama3_bpe"
SPECIAL = LLAMA3_SPECIAL[:11]
# the folder's own chat template: Llama-3's format in words of our own (a comment marks it as the folder's)
CHAT_TEMPLATE = (
    "{#- tiny_llama3_bpe's chat template -#}\n"
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}\n")


def make_tokenizer():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train(400, pre, True, pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.save(os.path.join(OUT, "tokenizer.json"))
    return tok


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = make_tokenizer()
    ids = {s: tok.token_to_id(s) for s in SPECIAL}
    print(f"tokenizer: {tok.get_vocab_size()} tokens; specials {ids}; <tool> {tok.token_to_id('<tool>')}")
    spec = dict(MODELS["tiny_llama3"])
    cfg = dict(spec["config"], bos_token_id=ids["<|begin_of_text|>"],
               eos_token_id=[ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]])
    spec["config"] = cfg
    model = build_model(spec)
    model.config.architectures = ["LlamaForCausalLM"]
    model.config.save_pretrained(OUT)
    model.generation_config.save_pretrained(OUT)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(OUT, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": CHAT_TEMPLATE,
                   "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"],
                   "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
