"""Run under the vLLM venv (scripts/install-vllm.sh) by tests/vllm/test_vllm_loader.py.

    python generate.py make DIR --tied|--untied [HIDDEN VOCAB]  # 2-layer Llama, heads of 64
    python generate.py run DIR FORMAT [DTYPE [TP]]  # greedy tokens, LLM(load_format=FORMAT)

`run` prints one line "RESULT {json}": the tokens of each prompt and the wall seconds of LLM(...)
(the engine's start, weights included). vLLM starts an engine process and spawns workers, which
import this file again: what runs belongs under __main__.
"""

import json
import os
import sys
import time

if os.environ.get("CKPT_TEST_IMPORT_CKPT_VLLM") == "1":
    # Registration by import, at the top of the script: vLLM's CPU backend spawns its workers,
    # which import this file again (as __mp_main__) and so register it too.
    import ckpt.vllm  # noqa: F401

PROMPTS = [[1, 7, 42, 99, 3], [5, 250, 17]]
MAX_TOKENS = 12


def make(folder, tied, hidden=128, vocab=512):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234 if tied else 4321)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=hidden // 64,
                         num_key_value_heads=max(1, hidden // 128),
                         max_position_embeddings=256, tie_word_embeddings=tied,
                         initializer_range=0.2, dtype="float32")
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)


def run(folder, load_format, dtype, tp=1):
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=folder, load_format=load_format, dtype=dtype, skip_tokenizer_init=True,
              gpu_memory_utilization=0.1, max_model_len=256, max_num_seqs=4,
              enforce_eager=True, seed=0, tensor_parallel_size=tp)
    wall = time.perf_counter() - t0
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    print("RESULT " + json.dumps({"tokens": tokens, "init_wall_s": wall}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3] == "--tied", *[int(x) for x in sys.argv[4:6]])
    else:
        run(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "auto",
            int(sys.argv[5]) if len(sys.argv) > 5 else 1)
