#!/usr/bin/env python3
# Regenerate (from the repository root, after make_fixtures.py and make_chat_fixtures.py,
# no network needed; trl 1.16.0 and datasets for the checks against TRL):
#
#     python3 dev/reference/make_dpo_fixtures.py
#
# Preference tuning's references (issue 50; dev/reference/README.md says what each file
# holds and every convention the trainers must follow):
#   test/fixtures/preference/data.jsonl     8 plain records {"prompt", "chosen", "rejected"}
#   test/fixtures/preference/tokens.json    what TRL's DPOTrainer makes of them with tiny_gqa's
#                                           tokenizer (checked against TRL's own functions)
#   test/fixtures/tiny_gqa/dpo/peft_init/   the starting LoRA adapter (B off zero)
#   test/fixtures/tiny_gqa/dpo/expected.json, expected.safetensors: per case the
#       hyper-parameters, each step's loss, lr, gradient norm and TRL's metrics, step 1's
#       per-pair log-probabilities and gradients, the tensors after the last step.
# The losses and metrics are our own float64 code, written from the formulas
# (dpo_terms, orpo_terms); the model is make_fixtures.py's patched float64 transformers
# model. TRL's DPOTrainer and ORPOTrainer then train the same model on the same data with
# the same optimizer (check_against_trl) and must agree.
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (its float64 patches come with it)
import make_chat_fixtures as mcf  # noqa: E402
import peft  # noqa: E402
import sentencepiece as spm  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402

PREF = f"{mf.FIX}/preference"
MAX_SEQ_LEN = 32
BOS, EOS = 1, 2

# Plain preference records, in file order (the fixture runs do not shuffle). Two pairs run
# past MAX_SEQ_LEN and are cut at the end (record 2's chosen, record 6's rejected); in
# record 1 the prompt's last piece "d" merges with the chosen response's "en" into "den"
# but not with the rejected " near", so the prompt is the shorter common prefix and the
# rejected completion starts with the prompt's own last token.
RECORDS = [
    {"prompt": "Q: Where did the cat sit?\nA:", "chosen": " The cat sat on the mat.", "rejected": " On the old road."},
    {"prompt": "In the gard", "chosen": "en, by the river.", "rejected": " near the old road."},
    {"prompt": "Once upon a time the old man walked to the station.",
     "chosen": " He counted 12345 coins before the train left, then he visited the market.", "rejected": " He forgot."},
    {"prompt": "Hi", "chosen": "!", "rejected": "?"},
    {"prompt": "Zoë paid 7 €.", "chosen": " It cost $12.50.", "rejected": " Über-fast!"},
    {"prompt": "Why?", "chosen": " Because 100% of them agreed.", "rejected": " Because."},
    {"prompt": "Describe the forest.", "chosen": " The forest is green and quiet.",
     "rejected": " The little girl bought a silver coin, a wooden box and a yellow flower."},
    {"prompt": "The baker sold bread. Who sold it?", "chosen": " The baker.", "rejected": " A bird."},
]

# ---------------------------------------------------------------------------
# tokens: the rule, then TRL's own functions must give the same


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def tokenize(sp, rec):
    """prompt_ids = [BOS] + encode(prompt); each response's sequence [BOS] + encode(prompt +
    response) + [EOS]; the prompt is the shortest common prefix of prompt_ids with the two
    sequences, each completion what follows it; then each sequence cut to MAX_SEQ_LEN."""
    prompt = [BOS] + sp.encode(rec["prompt"])
    seqs = {k: [BOS] + sp.encode(rec["prompt"] + rec[k]) + [EOS] for k in ("chosen", "rejected")}
    n = min(common_prefix(prompt, s) for s in seqs.values())
    assert n < MAX_SEQ_LEN, "a prompt that fills max_seq_len leaves no completion"
    out = {"prompt_ids": prompt[:n]}
    for k, s in seqs.items():
        out[f"{k}_ids"] = s[n:]
    for k, s in seqs.items():
        out[f"{k}_input_ids"] = s[:MAX_SEQ_LEN]
    return out


def trl_dpo_tokens(tok):
    """RECORDS through TRL's DPOTrainer._prepare_dataset (add_eos, tokenize_fn,
    common_prefix_length, the max_length filter) and DataCollatorForPreference's keep_start cut"""
    from datasets import Dataset
    from trl import DPOConfig
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

    class Self:  # what _prepare_dataset reads of the trainer
        _tokenizer = tok

    args = DPOConfig(output_dir="/tmp/dpo_ref_unused", max_length=MAX_SEQ_LEN, bf16=False, use_cpu=True, report_to=[])
    ds = DPOTrainer._prepare_dataset(Self(), Dataset.from_list(RECORDS), tok, args, "train")
    assert len(ds) == len(RECORDS)
    collate = DataCollatorForPreference(pad_token_id=EOS, max_length=MAX_SEQ_LEN)
    out = []
    for ex in ds:
        rec = {k: ex[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
        batch = collate([rec])
        for i, k in enumerate(("chosen", "rejected")):
            n = int(batch["attention_mask"][i].sum())
            ids = batch["input_ids"][i, :n].tolist()
            completion = batch["completion_mask"][i, :n].tolist()
            assert completion == [0] * len(rec["prompt_ids"]) + [1] * (n - len(rec["prompt_ids"]))
            rec[f"{k}_input_ids"] = ids
        out.append(rec)
    return out


def trl_orpo_prompt_lens(tok):
    """TRL's ORPOTrainer.tokenize_row on each record: (its chosen sequence, its rejected
    sequence, the prompt length it masks in each). ORPO splits each response on its own:
    the tokenized prompt's length, or one less where the last prompt token merged."""
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer

    class Self:
        processing_class = tok
        is_encoder_decoder = False
        max_length = MAX_SEQ_LEN
        build_tokenized_answer = ORPOTrainer.build_tokenized_answer

    out = []
    for rec in RECORDS:
        row = ORPOTrainer.tokenize_row(Self(), rec)
        lens = tuple(row[f"{k}_labels"].count(-100) for k in ("chosen", "rejected"))
        out.append((row["chosen_input_ids"], row["rejected_input_ids"], lens))
    return out


def make_tokens():
    """data.jsonl and tokens.json, after checking the rule against TRL's DPO tokenization
    (equal) and its ORPO tokenization (equal but for record 1's rejected prompt length)"""
    sp = spm.SentencePieceProcessor(model_file=f"{mf.FIX}/tiny_gqa/tokenizer.model")
    ours = [tokenize(sp, r) for r in RECORDS]
    tok = mcf.hf_tokenizer(mcf.SP_MODEL, f"{mcf.OUT}/llama2")
    assert trl_dpo_tokens(tok) == ours, "our tokenization is not TRL's DPOTrainer's"
    for i, (rec, (c, r, lens)) in enumerate(zip(ours, trl_orpo_prompt_lens(tok))):
        assert (c, r) == (rec["chosen_input_ids"], rec["rejected_input_ids"]), i
        n = len(rec["prompt_ids"])
        assert lens == ((n, n + 1) if i == 1 else (n, n)), (i, lens, n)
    for i, r in enumerate(ours):
        print(f"  record {i}: prompt {len(r['prompt_ids'])}, chosen {len(r['chosen_ids'])}, rejected "
              f"{len(r['rejected_ids'])} tokens; after the cut {len(r['chosen_input_ids'])}, {len(r['rejected_input_ids'])}")
    assert sum(len(r["prompt_ids"]) + len(r[k]) > MAX_SEQ_LEN for r in ours for k in ("chosen_ids", "rejected_ids")) == 2
    os.makedirs(PREF, exist_ok=True)
    with open(f"{PREF}/data.jsonl", "w", encoding="utf-8") as f:
        for r in RECORDS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(f"{PREF}/tokens.json", "w") as f:
        json.dump({"tokenizer": mcf.SP_MODEL, "max_seq_len": MAX_SEQ_LEN, "records": ours}, f, separators=(",", ":"))
        f.write("\n")
    return ours


# ---------------------------------------------------------------------------
# the reference: float64 model (make_fixtures.py's), our losses and metrics, torch's AdamW

OUT = f"{mf.FIX}/tiny_gqa/dpo"
SPEC = mf.MODELS["tiny_gqa"]
B, GA, STEPS = 2, 2, 4  # pairs per micro-batch, micro-batches per step; step s takes pairs 4s .. 4s+3 (mod 8)
VOCAB_SAMPLE = 16  # the full case's embedding and head rows stored (mf.vocab_rows)
# Each case: its objective and loss, beta, LoRA from peft_init or full fine-tuning, lr, warmup
# and a clip threshold between its steps' gradient norms (clipping on some steps, not all:
# mf.train checks it). DPO starts with the policy equal to the reference, so its cases use no
# warmup (step 1 moves the weights); ORPO has no reference and keeps make_fixtures.py's lr 0 first step.
CASES = {
    "dpo_sigmoid_lora": dict(objective="dpo", dpo_loss_type="sigmoid", beta=0.1, mode="lora", lr=1e-2,
                             warmup_steps=0, grad_clip=0.8),
    "dpo_ipo_lora": dict(objective="dpo", dpo_loss_type="ipo", beta=0.1, mode="lora", lr=1e-2,
                         warmup_steps=0, grad_clip=17.0),
    "dpo_hinge_lora": dict(objective="dpo", dpo_loss_type="hinge", beta=0.2, mode="lora", lr=1e-2,
                           warmup_steps=0, grad_clip=2.0),
    "dpo_sigmoid_full": dict(objective="dpo", dpo_loss_type="sigmoid", beta=0.1, mode="full", lr=3e-3,
                             warmup_steps=0, grad_clip=2.0),
    "orpo_lora": dict(objective="orpo", beta=0.1, mode="lora", lr=1e-2, warmup_steps=1, grad_clip=1.2),
}


def case_hparams(case):
    """make_fixtures.py's hyper-parameters (the names test_llama2.c's fixture runs read) and the
    preference options, named as the trainer's options"""
    hp = mf.hparams(dict(lr=case["lr"], grad_clip=case["grad_clip"]))
    hp.update(warmup_steps=case["warmup_steps"], max_steps=STEPS, objective=case["objective"], beta=case["beta"],
              max_seq_len=MAX_SEQ_LEN, batch_size=B, gradient_accumulation_steps=GA, shuffle=0)
    if case["objective"] == "dpo":
        hp["dpo_loss_type"] = case["dpo_loss_type"]
    if case["mode"] == "lora":
        hp["from_peft_checkpoint"] = f"{OUT}/peft_init"
        hp["lora"] = {"r": SPEC["lora"]["r"], "alpha": SPEC["lora"]["lora_alpha"],
                      "targets": SPEC["lora"]["target_modules"]}
    else:
        hp["full_finetune"] = True
    return hp


def sequence_logps(model, ids, n_prompt):
    """One sequence through the model: (sum of log p(token | before it) over the completion
    ids[n_prompt:], the completion's length, the sum of -log p over every predicted token
    ids[1:], their count)"""
    x = torch.tensor([ids])
    logits = model(input_ids=x, use_cache=False).logits[0, :-1]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, x[0, 1:, None])[:, 0]
    return lp[n_prompt - 1:].sum(), len(ids) - n_prompt, -lp.sum(), len(ids) - 1


def pair_logps(model, rec):
    n = len(rec["prompt_ids"])
    return sequence_logps(model, rec["chosen_input_ids"], n), sequence_logps(model, rec["rejected_input_ids"], n)


def logsigmoid(x):
    return -torch.nn.functional.softplus(-x)


def log1mexp(x):
    """log(1 - exp(x)) for x < 0: log(-expm1(x)) near 0, log1p(-exp(x)) below -log 2 (Maechler's split)"""
    return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def dpo_terms(loss_type, beta, pol, ref):
    """a pair's DPO loss and metrics from its policy's and reference's ((sum logp, n), (sum logp, n))"""
    (pc, nc), (pr, nr) = pol
    c, r = pc - ref[0], pr - ref[1]  # the log-ratios to the reference
    if loss_type == "sigmoid":
        loss = -logsigmoid(beta * (c - r))
    elif loss_type == "hinge":
        loss = torch.relu(1 - beta * (c - r))
        assert abs(1 - beta * (c - r).item()) > 1e-3, "a hinge pair at the kink"
    else:  # ipo: the log-ratios averaged over each completion's tokens
        loss = ((c / nc - r / nr) - 1 / (2 * beta)) ** 2
    c, r = c.item(), r.item()
    return loss, {"rewards/chosen": beta * c, "rewards/rejected": beta * r, "rewards/margins": beta * (c - r),
                  "rewards/accuracies": float(beta * c > beta * r), "logps/chosen": pc.item(), "logps/rejected": pr.item()}


def orpo_terms(beta, pol):
    """a pair's odds-ratio term -beta logsigmoid(log_odds) and metrics, from the log-probabilities
    averaged over each completion's tokens"""
    (pc, nc), (pr, nr) = pol
    pc, pr = pc / nc, pr / nr
    log_odds = (pc - pr) - (log1mexp(pc) - log1mexp(pr))
    ratio = logsigmoid(log_odds)
    pc, pr = pc.item(), pr.item()
    return -beta * ratio, {"rewards/chosen": beta * pc, "rewards/rejected": beta * pr, "rewards/margins": beta * (pc - pr),
                           "rewards/accuracies": float(beta * pc > beta * pr), "logps/chosen": pc, "logps/rejected": pr,
                           "log_odds_ratio": ratio.item(), "log_odds_chosen": log_odds.item()}


def step_pairs(s):
    return [(B * GA * s + j) % len(RECORDS) for j in range(B * GA)]


def make_step(model, named, case, recs, ref, expected, out):
    """mf.train's step_fn for case: the step's loss is the mean over its pairs of the pair losses
    (DPO), or the mean over its micro-batches of each one's chosen NLL (token-averaged within the
    micro-batch, as TRL) plus the mean over its pairs of the odds-ratio terms (ORPO); the metrics
    are means over the step's pairs (nll_loss: over its micro-batches). Step 1's gradients and
    per-pair log-probabilities go into expected and out["pairs0"]."""
    name, beta = case["name"], case["beta"]

    def step(s):
        for _, p in named:
            p.grad = None
        pairs = step_pairs(s)
        total, rows, nlls, pairs0 = 0.0, [], [], []
        for g in range(GA):
            loss, nll, nll_n = 0.0, 0.0, 0
            for i in pairs[g * B:(g + 1) * B]:
                (cs, cn, cnll, cnll_n), (rs, rn, _, _) = pair_logps(model, recs[i])
                pol = ((cs, cn), (rs, rn))
                if case["objective"] == "dpo":
                    term, m = dpo_terms(case["dpo_loss_type"], beta, pol, ref[i])
                    pairs0.append({"record": i, "chosen_logps": cs.item(), "rejected_logps": rs.item(),
                                   "ref_chosen_logps": ref[i][0], "ref_rejected_logps": ref[i][1],
                                   "chosen_tokens": cn, "rejected_tokens": rn})
                else:
                    term, m = orpo_terms(beta, pol)
                    nll, nll_n = nll + cnll, nll_n + cnll_n
                    pairs0.append({"record": i, "chosen_logps": m["logps/chosen"], "rejected_logps": m["logps/rejected"],
                                   "chosen_tokens": cn, "rejected_tokens": rn})
                loss = loss + term / len(pairs)
                rows.append(m)
            if case["objective"] == "orpo":
                loss = loss + nll / nll_n / GA
                nlls.append((nll / nll_n).item())
            loss.backward()
            total += loss.item()
        metrics = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        if nlls:
            metrics = dict(metrics, nll_loss=sum(nlls) / len(nlls))
        if s == 0:
            for k, p in named:
                assert p.grad is not None and p.grad.abs().max() > 0, k
                expected[f"{name}.grad.{k}"] = p.grad.clone()
            out["pairs0"] = pairs0
        # rewards/accuracies far from a tie (DPO's step 1 is one: the policy is the reference)
        if case["objective"] == "orpo" or s > 0:
            assert all(abs(r["rewards/margins"]) / beta > 1e-3 for r in rows), (s, [r["rewards/margins"] for r in rows])
        return total, metrics

    return step


def make_adapter():
    """the starting LoRA adapter: peft's all-linear r 4 on tiny_gqa, B drawn off zero (so that the
    reference, base + this adapter, is not the base)"""
    pm, _ = mf.peft_adapter(f"{mf.FIX}/tiny_gqa", SPEC, SPEC["lora_seed"] + 500)
    mf.save_adapter(pm, f"{OUT}/peft_init")


def load_policy(mode):
    """the float64 model to train and its trainable tensors (peft keys, or HF names)"""
    base = mf.load_base(f"{mf.FIX}/tiny_gqa", torch.float64)
    if mode == "full":
        named = list(mf.base_state(base).items())
        for _, p in named:
            p.requires_grad_(True)
        return base, named
    lm = mf.peft_load_trainable(base, f"{OUT}/peft_init").double()
    return lm, [(n.replace(".default.", "."), p) for n, p in lm.named_parameters() if p.requires_grad]


def reference(name, case, recs, expected):
    """case trained STEPS steps: its JSON entry; its gradients and final tensors into expected"""
    case = dict(case, name=name)
    hp = case_hparams(case)
    model, named = load_policy(case["mode"])
    model.train()
    ref = None
    if case["objective"] == "dpo":  # the reference: the policy as training starts, frozen
        with torch.no_grad():
            ref = [tuple(x[0].item() for x in pair_logps(model, r)) for r in recs]
    out = {"hp": hp}
    print(f"== {name}")
    out["steps"] = mf.train(model, named, None, hp, step_fn=make_step(model, named, case, recs, ref, expected, out))
    for k, p in named:
        expected[f"{name}.final.{k}"] = p.detach().clone()
    return {"hp": hp, "steps": out["steps"], "pairs0": out["pairs0"]}


# ---------------------------------------------------------------------------
# the same runs through TRL's trainers


def float64_head(hidden, weight, bias, labels, temperature, chunk_size, softcap, logit_scale, outputs):
    """TRL's fused LM head (kernels.ChunkedLogProbFunction) in float64: it computes the
    log-softmax in float32 whatever the model's dtype. The same per-token fields, plainly."""
    assert bias is None and softcap is None and temperature == 1.0 and logit_scale == 1.0
    logits = hidden @ weight.T
    lp = torch.log_softmax(logits, dim=-1)
    p = lp.exp()
    picked = lp.gather(-1, labels[:, None])[:, 0]
    with torch.no_grad():
        return (picked, -(p * lp).sum(-1), torch.log((p * p).sum(-1)), logits.mean(-1),
                logits.argmax(-1) == labels)


def trl_run(case, hp, recs, tok):
    """case trained by TRL 1.16's DPOTrainer (LoRA: its "ref" adapter copy of peft_init as the
    reference; full: a second float64 copy as ref_model) or ORPOTrainer, float64, pairs in file
    order, with our optimizer and schedule objects (transformers' Trainer would otherwise exempt
    the norms from weight decay): its logged steps and its trained tensors"""
    import tempfile
    from datasets import Dataset
    from transformers import get_cosine_schedule_with_warmup
    from trl import DPOConfig, DPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    prompt_len = {r["prompt"]: len(t["prompt_ids"]) for r, t in zip(RECORDS, recs)}

    class CommonPrefixORPO(ORPOTrainer):
        """TRL's ORPO with the prompt masked as DPO splits it (the shortest common prefix: record 1's
        rejected sequence counts the prompt's merged last token as its completion's first)"""

        def tokenize_row(self, feature, model=None):
            row = super().tokenize_row(feature, model)
            n = prompt_len[feature["prompt"]]
            for k in ("chosen", "rejected"):
                row[f"{k}_labels"] = [-100] * n + row[f"{k}_input_ids"][n:]
            return row

    model, named = load_policy(case["mode"])
    params = [p for _, p in named]
    opt = mf.make_optimizer(params, hp)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=hp["warmup_steps"], num_training_steps=hp["max_steps"])
    tok.pad_token = tok.eos_token  # (DPOTrainer does it; ORPOTrainer needs it)
    with tempfile.TemporaryDirectory() as scratch:
        args = dict(output_dir=scratch, per_device_train_batch_size=B, gradient_accumulation_steps=GA, max_steps=STEPS,
                    learning_rate=hp["lr"], max_grad_norm=hp["grad_clip"], logging_steps=1, bf16=False, use_cpu=True,
                    report_to=[], save_strategy="no", train_sampling_strategy="sequential", max_length=MAX_SEQ_LEN,
                    beta=case["beta"], disable_tqdm=True)
        data = Dataset.from_list(RECORDS)
        if case["objective"] == "dpo":
            ref_model = None if case["mode"] == "lora" else mf.load_base(f"{mf.FIX}/tiny_gqa", torch.float64)
            trainer = DPOTrainer(model=model, ref_model=ref_model, args=DPOConfig(loss_type=[case["dpo_loss_type"]], **args),
                                 train_dataset=data, processing_class=tok, optimizers=(opt, sched))
            if case["mode"] == "lora":
                assert "ref" in model.peft_config
        else:
            trainer = CommonPrefixORPO(model=model, args=ORPOConfig(**args), train_dataset=data, processing_class=tok,
                                       optimizers=(opt, sched))
        assert all(p.dtype == torch.float64 for p in model.parameters())
        # the Trainer logs the loss from a float32 accumulator: keep each micro-batch's own
        losses, compute_loss = [], trainer.compute_loss
        trainer.compute_loss = lambda *a, **kw: (lambda x: losses.append(x.item()) or x)(compute_loss(*a, **kw))
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for s, h in enumerate(logs):
        h["loss"] = sum(losses[s * GA:(s + 1) * GA]) / GA
    return logs, named


def check_against_trl(name, case, ours, expected, recs, tok, head64):
    """TRL's run of case against ours: every logged step's loss, lr, gradient norm and metrics,
    and the trained tensors; prints the largest differences, asserts they are rounding.
    head64: TRL's fused LM head replaced by float64_head (DPO only; ORPO does not use it)."""
    import trl.trainer.utils as trl_utils
    hp = ours["hp"]
    fused = trl_utils._ChunkedLogProbFunction
    if head64:
        trl_utils._ChunkedLogProbFunction = type("Float64Head", (), {"apply": staticmethod(float64_head)})
    try:
        logs, named = trl_run(case, hp, recs, tok)
    finally:
        trl_utils._ChunkedLogProbFunction = fused
    assert len(logs) == len(ours["steps"])
    worst = {}
    for mine, theirs in zip(ours["steps"], logs):
        for k, v in mine.items():
            if k == "step":
                continue
            t = theirs["learning_rate" if k == "lr" else k]
            worst[k] = max(worst.get(k, 0.0), abs(t - v) / max(abs(v), 1e-2))
    w = max(((p.detach() - expected[f"{name}.final.{k}"]).abs().max() / expected[f"{name}.final.{k}"].abs().max()).item()
            for k, p in named)
    # float32 inside TRL: its fused LM head's log-softmax (DPO, unless head64), ORPO's odds ratio
    # (odds_ratio_loss casts the log-probabilities) and the float32 tensor it averages metrics in
    tol = 1e-9 if head64 else 1e-4
    print(f"    TRL{' (float64 head)' if head64 else ''} vs ours, worst over {len(logs)} steps (relative, floor 1e-2): "
          + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()) + f"; final tensors {w:.1e} of their largest")
    assert max(worst.values()) < tol and w < tol, (worst, w)


def main():
    os.chdir(mf.ROOT)
    recs = make_tokens()
    mf.fresh_folder(OUT)
    make_adapter()
    expected, cases = {}, {}
    tok = mcf.hf_tokenizer(mcf.SP_MODEL, f"{mcf.OUT}/llama2")
    for name, case in CASES.items():
        cases[name] = reference(name, case, recs, expected)
        check_against_trl(name, case, cases[name], expected, recs, tok, head64=False)
        if case["objective"] == "dpo":
            check_against_trl(name, case, cases[name], expected, recs, tok, head64=True)
    expected = mf.vocab_rows(expected, [r[k] for r in recs for k in ("chosen_input_ids", "rejected_input_ids")],
                             SPEC["config"]["vocab_size"], VOCAB_SAMPLE)
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                "peft": peft.__version__, "trl": trl.__version__, "sentencepiece": spm.__version__}
    mf.write_expected(OUT, expected, {"versions": versions, "model": "tiny_gqa", "data": f"{PREF}/data.jsonl",
                                      "cases": cases})
    print("done")


if __name__ == "__main__":
    main()
