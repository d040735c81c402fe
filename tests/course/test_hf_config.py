"""`planner.hf_config` and the files `plan` takes for --model and --gpu: parameter counts equal to the modules
`transformers` builds from the same config (small shapes and real ones, on the meta device: no download, no memory),
MPT as llm-foundry counts it, and every bad input an error that names it."""
import json

import pytest
from cli_in_process import run_main

from fsdp_mini.course.planner import GPUS, Layout, get_gpu, get_model, plan
from fsdp_mini.course.planner.hf_config import ARCHITECTURES, model_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
         "vocab_size": 101}
SMALL_GPT2 = {"n_embd": 48, "n_layer": 3, "n_head": 4, "vocab_size": 101, "n_positions": 32}
SMALL_MPT = {"d_model": 48, "n_heads": 4, "n_layers": 3, "expansion_ratio": 4, "vocab_size": 101, "max_seq_len": 32,
             "no_bias": True, "learned_pos_emb": False, "attn_config": {"alibi": True}}
CONFIG_CLASSES = {"LlamaForCausalLM": "LlamaConfig", "MistralForCausalLM": "MistralConfig",
                  "Qwen2ForCausalLM": "Qwen2Config", "GPT2LMHeadModel": "GPT2Config", "MPTForCausalLM": "MptConfig"}


def built_params(architecture: str, fields: dict) -> int:
    """Parameters of the module `transformers` builds from `fields` (shared tensors once, as `parameters()` yields)."""
    config = getattr(transformers, CONFIG_CLASSES[architecture])(**fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def planner_params(architecture: str, fields: dict) -> int:
    return model_from_config({"architectures": [architecture]} | fields).params


SMALL_CASES = [
    ("LlamaForCausalLM", SMALL),  # defaults: one key/value head per query head, untied, no biases
    ("LlamaForCausalLM", SMALL | {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    ("LlamaForCausalLM", SMALL | {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True}),
    ("MistralForCausalLM", SMALL | {"num_key_value_heads": 2}),
    ("MistralForCausalLM", SMALL | {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    ("Qwen2ForCausalLM", SMALL | {"num_key_value_heads": 2}),  # q, k, v biases
    ("Qwen2ForCausalLM", SMALL | {"num_key_value_heads": 1, "tie_word_embeddings": True}),
    ("GPT2LMHeadModel", SMALL_GPT2),  # tied, biases, learned positions, MLP of 4 x hidden
    ("GPT2LMHeadModel", SMALL_GPT2 | {"n_inner": 80, "tie_word_embeddings": False}),
    ("MPTForCausalLM", SMALL_MPT),  # Hugging Face's MPT: ALiBi, no biases, 4 x d_model
    ("MPTForCausalLM", SMALL_MPT | {"tie_word_embeddings": False}),
]


@pytest.mark.parametrize("architecture, fields", SMALL_CASES, ids=lambda x: x if isinstance(x, str) else "")
def test_small_configs_count_what_transformers_builds(architecture, fields):
    assert planner_params(architecture, fields) == built_params(architecture, fields)


# Real shapes: the fields of each model's config.json on the Hugging Face Hub (meta-llama/Meta-Llama-3-8B,
# mistralai/Mistral-7B-v0.1, Qwen/Qwen2-0.5B and Qwen/Qwen2-7B, openai-community/gpt2, mosaicml/mpt-7b), the fields
# the planner reads.
REAL = {
    "Meta-Llama-3-8B": ("LlamaForCausalLM", {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                                             "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                                             "tie_word_embeddings": False}),
    "Mistral-7B-v0.1": ("MistralForCausalLM", {"hidden_size": 4096, "intermediate_size": 14336,
                                               "num_attention_heads": 32, "num_hidden_layers": 32,
                                               "num_key_value_heads": 8, "vocab_size": 32000,
                                               "tie_word_embeddings": False}),
    "Qwen2-0.5B": ("Qwen2ForCausalLM", {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
                                        "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
                                        "tie_word_embeddings": True}),
    "Qwen2-7B": ("Qwen2ForCausalLM", {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                                      "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                                      "tie_word_embeddings": False}),
    "gpt2": ("GPT2LMHeadModel", {"n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257}),
    "mpt-7b": ("MPTForCausalLM", {"d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4,
                                  "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True, "learned_pos_emb": True,
                                  "attn_config": {"alibi": True}}),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_configs_count_what_transformers_builds(name):
    architecture, fields = REAL[name]
    assert planner_params(architecture, fields) == built_params(architecture, fields)


def test_real_configs_equal_the_presets_and_published_counts():
    assert planner_params(*REAL["Meta-Llama-3-8B"]) == get_model("llama3-8b").params == 8_030_261_248
    assert planner_params(*REAL["gpt2"]) == get_model("gpt2").params


def test_mpt_counts_as_llm_foundry_does():
    """llm-foundry's mpt-7b.yaml (scripts/train/yamls/pretrain: d_model 4096, 32 heads, 32 layers, expansion 4, vocab
    50368, MPTConfig's defaults otherwise: biases, a learned position table, no ALiBi) at the benchmark table's
    sequences: NumParams 6,658,859,008 at 2,048 and 6,667,247,616 at 4,096 (scripts/train/benchmarking/README.md,
    H100 80GB BF16 table)."""
    yaml = {"d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4, "vocab_size": 50368,
            "no_bias": False, "learned_pos_emb": True, "attn_config": {"alibi": False}}
    assert planner_params("MPTForCausalLM", yaml | {"max_seq_len": 2048}) == 6_658_859_008
    assert planner_params("MPTForCausalLM", yaml | {"max_seq_len": 4096}) == 6_667_247_616
    # the table is a learned one: ALiBi removes it, and no_bias every bias, norms' included
    table = 2048 * 4096
    alibi = planner_params("MPTForCausalLM", yaml | {"max_seq_len": 2048, "attn_config": {"alibi": True}})
    assert alibi == 6_658_859_008 - table
    no_bias = planner_params("MPTForCausalLM", yaml | {"max_seq_len": 2048, "no_bias": True})
    assert no_bias == 6_658_859_008 - 32 * (9 * 4096 + 2 * 4096) - 4096
    gqa = model_from_config({"architectures": ["MPTForCausalLM"]} | yaml | {
        "max_seq_len": 2048, "attn_config": {"alibi": False, "attn_type": "grouped_query_attention", "kv_n_heads": 8}})
    assert gqa.kv_heads == 8


@pytest.mark.parametrize("config, message", [
    ({"architectures": ["FalconForCausalLM"]}, "unsupported architecture 'FalconForCausalLM'; supported: "
                                               + ", ".join(ARCHITECTURES)),
    ({"model_type": "bloom"}, "unsupported architecture \"model_type 'bloom' with no 'architectures'\""),
    ({"architectures": ["LlamaForCausalLM"]} | {k: v for k, v in SMALL.items() if k != "intermediate_size"},
     "LlamaForCausalLM config has no 'intermediate_size'"),
    ({"architectures": ["Qwen2ForCausalLM"]} | SMALL, "Qwen2ForCausalLM config has no 'num_key_value_heads'"),
    ({"architectures": ["MistralForCausalLM"]} | SMALL, "MistralForCausalLM config has no 'num_key_value_heads'"),
    ({"architectures": ["MPTForCausalLM"]} | SMALL_MPT | {"attn_config": {}}, "no 'attn_config.alibi'"),
    ({"architectures": ["MPTForCausalLM"]} | {k: v for k, v in SMALL_MPT.items() if k != "no_bias"}, "no 'no_bias'"),
    ({"architectures": ["LlamaForCausalLM"]} | SMALL | {"head_dim": 32},
     "head_dim=32 differs from hidden size / heads"),
    ({"architectures": ["LlamaForCausalLM"]} | SMALL | {"attention_bias": True}, "attention_bias=True with mlp_bias"),
    ({"architectures": ["MPTForCausalLM"]} | SMALL_MPT | {"ffn_config": {"ffn_type": "mptglu"}},
     "ffn_config.ffn_type='mptglu' is not supported"),
])
def test_bad_configs_are_errors_that_name_the_field(config, message):
    with pytest.raises(ValueError) as error:
        model_from_config(config)
    assert message in str(error.value)


def test_a_model_type_names_the_architecture_when_architectures_is_absent():
    assert model_from_config({"model_type": "llama"} | SMALL).params == planner_params("LlamaForCausalLM", SMALL)


# --- the command line: files for --model and --gpu ------------------------------------------------------------

def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_plan_takes_a_config_json_and_plans_it_as_its_preset(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    config = write(folder, "config.json", {"architectures": ["LlamaForCausalLM"]} | REAL["Meta-Llama-3-8B"][1])
    args = ["--gpu", "a100-80gb", "--gpus", "64", "--seq", "8192", "--local-batch", "1", "--ac", "selective-op",
            "--json"]
    from_file, preset = run_main("plan", "--model", config, *args), run_main("plan", "--model", "llama3-8b", *args)
    assert from_file.returncode == 0, from_file.stderr
    got, expected = json.loads(from_file.stdout), json.loads(preset.stdout)
    assert got.pop("model") == "Meta-Llama-3-8B" and expected.pop("model") == "llama3-8b"
    assert got == expected


def test_plan_takes_a_gpu_file_with_a_presets_fields(tmp_path):
    fields = vars(get_gpu("h100-sxm")) | {"name": "my-h100"}
    gpu = write(tmp_path, "gpu.json", fields)
    args = ["--model", "llama3-8b", "--gpus", "16", "--seq", "8192", "--local-batch", "1", "--json"]
    from_file, preset = run_main("plan", "--gpu", gpu, *args), run_main("plan", "--gpu", "h100-sxm", *args)
    assert from_file.returncode == 0, from_file.stderr
    got, expected = json.loads(from_file.stdout), json.loads(preset.stdout)
    assert got.pop("gpu") == "my-h100" and expected.pop("gpu") == "h100-sxm"
    assert got == expected
    # fields with a default may be left out; a smaller memory moves the verdict
    required = {k: v for k, v in fields.items() if k not in ("alpha_nvlink", "alpha_network", "attention_flops")}
    small = run_main("plan", "--gpu", write(tmp_path, "small.json", required | {"memory_bytes": 8 * 1024 ** 3}), *args)
    assert small.returncode == 0 and json.loads(small.stdout)["fits"] is False


@pytest.mark.parametrize("change, message", [
    ({"tflops": 1}, "unknown field 'tflops'"),
    ({"bf16_flops": None}, "bf16_flops=None must be a positive number"),
    ({"hbm_bandwidth": "fast"}, "hbm_bandwidth='fast' must be a positive number"),
])
def test_bad_gpu_files_name_the_field(tmp_path, change, message):
    fields = vars(get_gpu("a100-80gb")) | change
    out = run_main("plan", "--model", "gpt2", "--gpu", write(tmp_path, "gpu.json", fields), "--gpus", "8", "--seq",
                   "1024", "--local-batch", "1")
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_a_gpu_file_missing_a_field_names_it(tmp_path):
    fields = {k: v for k, v in vars(get_gpu("a100-80gb")).items() if k != "nvlink_bandwidth"}
    out = run_main("plan", "--model", "gpt2", "--gpu", write(tmp_path, "gpu.json", fields), "--gpus", "8", "--seq",
                   "1024", "--local-batch", "1")
    assert out.returncode == 2 and "missing field 'nvlink_bandwidth'" in out.stderr, out.stderr


@pytest.mark.parametrize("architecture, fields, seq, table", [
    ("GPT2LMHeadModel", SMALL_GPT2 | {"n_positions": 1024}, 2048, 1024),
    ("MPTForCausalLM", SMALL_MPT | {"learned_pos_emb": True, "attn_config": {"alibi": False}, "max_seq_len": 2048},
     4096, 2048),
])
def test_a_sequence_beyond_a_learned_position_table_is_an_error_naming_both(tmp_path, architecture, fields, seq, table):
    config = write(tmp_path, "config.json", {"architectures": [architecture]} | fields)
    args = ["plan", "--model", config, "--gpu", "h100-sxm", "--gpus", "8", "--local-batch", "1", "--seq"]
    assert run_main(*args, str(table)).returncode == 0
    out = run_main(*args, str(seq))
    assert out.returncode == 2
    assert f"--seq {seq} is longer than" in out.stderr and f"table of {table} rows" in out.stderr


def test_mpt_with_alibi_has_no_table_to_run_past(tmp_path):
    config = write(tmp_path, "config.json", {"architectures": ["MPTForCausalLM"]} | SMALL_MPT)
    out = run_main("plan", "--model", config, "--gpu", "h100-sxm", "--gpus", "8", "--local-batch", "1", "--seq", "8192")
    assert out.returncode == 0, out.stderr


def test_model_and_gpu_that_are_neither_preset_nor_file_list_the_presets():
    out = run_main("plan", "--model", "llama9", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "8", "--local-batch", "1")
    assert out.returncode == 2 and "unknown model 'llama9'" in out.stderr and "llama3-8b" in out.stderr
    out = run_main("plan", "--model", "gpt2", "--gpu", "v100", "--gpus", "8", "--seq", "8", "--local-batch", "1")
    assert out.returncode == 2 and "unknown GPU 'v100'" in out.stderr and "a100-40gb" in out.stderr


def test_a100_40gb_is_the_80gb_card_with_its_own_memory():
    """NVIDIA's A100 datasheet: the 40GB SXM differs from the 80GB SXM in memory (40 GB HBM2 at 1,555 GB/s against
    80 GB HBM2e at 2,039 GB/s); peak, NVLink, PCIe and the DGX host and network are the same."""
    small, large = vars(GPUS["a100-40gb"]), vars(GPUS["a100-80gb"])
    assert {k for k in small if small[k] != large[k]} == {"name", "memory_bytes", "hbm_bandwidth"}
    assert (small["memory_bytes"], small["hbm_bandwidth"]) == (40 * 1024 ** 3, 1.555e12)
    layout = Layout(gpus=64, seq=8192, local_batch=1, ac="selective-op")
    assert plan(get_model("llama3-8b"), GPUS["a100-40gb"], layout).memory.capacity * 2 == plan(
        get_model("llama3-8b"), GPUS["a100-80gb"], layout).memory.capacity
