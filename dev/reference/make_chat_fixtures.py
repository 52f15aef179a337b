#!/usr/bin/env python3
# Regenerate (from the repo root):
#   python3 dev/reference/make_chat_fixtures.py
#
# Reference ids and loss masks for the chat format (test/test_dataloader.c), from
# transformers' tokenizer.apply_chat_template, for both template families:
#   llama2         the sentencepiece tokenizer.model of test/fixtures/tiny_gqa as
#                  LlamaTokenizer, tokenizer_config.json "legacy": false (what
#                  transformers does with a Llama-2 folder that says nothing)
#   llama2_legacy  the same with "legacy": true (text after a special token gets
#                  the dummy prefix, as Meta's llama/generation.py encodes it)
#   llama3         the byte-level BPE tokenizer.json test/fixtures/tokenizer/bpe_llama3.json
#                  (make_bpe_fixtures.py) with Llama-3's special tokens
# The templates are the families' published chat templates (Llama-2-chat's and
# Meta-Llama-3-Instruct's tokenizer_config.json), written out below; a second
# copy of each marks the assistant turns with {% generation %} so that
# return_assistant_tokens_mask gives the tokens that carry the loss. The script
# checks that both copies render the same text.
#
# Writes test/fixtures/chat/chat.jsonl, test/fixtures/chat/<family>/tokenizer_config.json
# and test/fixtures/chat/expected.json:
#   {"cases": {family: {"tokenizer": file, "chats": [{"ids": [...], "labels": [0/1 ...]}, ...]}}}
# one chat per record of chat.jsonl, in file order. (transformers reads the tokenizer
# from a scratch folder holding both files.)
import json
import os
import shutil
import tempfile

from transformers import AutoTokenizer
import transformers

OUT = "test/fixtures/chat"
SP_MODEL = "test/fixtures/tiny_gqa/tokenizer.model"
BPE_JSON = "test/fixtures/tokenizer/bpe_llama3.json"

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def marked(template, assistant_expr):
    """template with the assistant turn's output wrapped in {% generation %}"""
    out = template.replace("{{ " + assistant_expr + " }}", "{% generation %}{{ " + assistant_expr + " }}{% endgeneration %}")
    assert out != template
    return out


LLAMA2_MARKED = marked(LLAMA2, "' '  + content.strip() + ' ' + eos_token")
# Llama-3's template emits a whole turn at once: the marked copy splits it so the
# header stays outside the generation block (the rendered text is the same)
LLAMA3_MARKED = (
    "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
)

CHATS = [
    [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello friend"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "  And 3+3? "},
     {"role": "assistant", "content": " 6, of course.\n"}],
    [{"role": "user", "content": "Zo\u00eb's caf\u00e9 \u2615 costs 7 \u20ac.\n\nWhy?"},
     {"role": "assistant", "content": "\u00a0Because beans \U0001F642 are dear.\tTabs\r\nand lines"}],
    [{"role": "system", "content": "\n  You answer in lists.\n"}, {"role": "user", "content": "[INST] not a tag [/INST]"},
     {"role": "assistant", "content": "- one\n- two\n\n- three   "}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
     {"role": "user", "content": "x2"}, {"role": "assistant", "content": "y2"},
     {"role": "user", "content": "x3"}, {"role": "assistant", "content": "1234567 apples, 89 pears"}],
]


def family_dirs():
    llama2_cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>", "clean_up_tokenization_spaces": False, "tokenizer_class": "LlamaTokenizer"}
    llama3_cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
                  "tokenizer_class": "PreTrainedTokenizerFast"}
    return {
        "llama2": (SP_MODEL, dict(llama2_cfg, legacy=False, chat_template=LLAMA2), LLAMA2_MARKED),
        "llama2_legacy": (SP_MODEL, dict(llama2_cfg, legacy=True, chat_template=LLAMA2), LLAMA2_MARKED),
        "llama3": (BPE_JSON, dict(llama3_cfg, chat_template=LLAMA3), LLAMA3_MARKED),
    }


_tokenizers = {}


def hf_tokenizer(tok_file, config_dir):
    """transformers' tokenizer for tok_file with config_dir's tokenizer_config.json (read from a scratch folder)"""
    key = (tok_file, config_dir)
    if key not in _tokenizers:
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copy(os.path.join(config_dir, "tokenizer_config.json"), scratch)
            shutil.copy(tok_file, os.path.join(scratch, "tokenizer.json" if tok_file.endswith(".json") else "tokenizer.model"))
            _tokenizers[key] = AutoTokenizer.from_pretrained(scratch)
    return _tokenizers[key]


def chat_ids(tok_file, config_dir, messages, marked_template=LLAMA2_MARKED):
    """apply_chat_template's ids and assistant mask for messages"""
    tok = hf_tokenizer(tok_file, config_dir)
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == tok.apply_chat_template(messages, tokenize=False, chat_template=marked_template), config_dir
    enc = tok.apply_chat_template(messages, tokenize=True, return_dict=True, chat_template=marked_template,
                                  return_assistant_tokens_mask=True)
    assert enc["input_ids"] == tok(text, add_special_tokens=False)["input_ids"], config_dir
    return enc["input_ids"], enc["assistant_masks"]


def main():
    with open(os.path.join(OUT, "chat.jsonl"), "w", encoding="utf-8") as f:
        for c in CHATS:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
    cases = {}
    for family, (tok_file, cfg, marked_template) in family_dirs().items():
        d = os.path.join(OUT, family)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=2, ensure_ascii=False)
        chats = []
        for c in CHATS:
            ids, mask = chat_ids(tok_file, d, c, marked_template)
            chats.append({"ids": ids, "labels": mask})
        cases[family] = {"tokenizer": tok_file, "chats": chats}
        print(family, [len(c["ids"]) for c in chats])
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "cases": cases}, f, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
