"""The model families whose dialects the router reads, as test checkpoints carry them: each
family's real chat template (tests/data/dialects/*.jinja, sources in its README) and the
special and added tokens its real tokenizer has, with the flags the real one gives them.

tests/support/dialects/models.py builds a tiny checkpoint from a spec; the dialect tests send
requests through real processes to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "dialects"


@dataclass(frozen=True)
class FamilySpec:
    name: str  # the family, e.g. "qwen3_coder"
    template: str  # a file name under tests/data/dialects/
    special: tuple[str, ...]  # added tokens the real tokenizer marks special (decoding drops them)
    added: tuple[str, ...] = ()  # added tokens that are not special (decoding keeps them)
    bos: str | None = None  # tokenizer_config's bos_token
    eos: str = ""  # tokenizer_config's eos_token
    end_tokens: tuple[str, ...] = ()  # generation_config's eos_token_id, as token strings
    tokenizer_extra: dict = field(default_factory=dict)  # more tokenizer_config keys
    tool_arguments: str = "mapping"  # how the template wants earlier calls' arguments: or "string"
    # the template raises unless an assistant answer follows tool results before the next user turn
    answer_after_tools: bool = False
    verified: bool = True  # False: tokens read off the template, no tokenizer_config seen

    @property
    def chat_template(self) -> str:
        return (TEMPLATES / self.template).read_text()


_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN_END = ("<|im_end|>", "<|endoftext|>")
_QWEN3_ADDED = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)
_GLM_SPECIAL = (
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|endoftext|>",
)
_GLM_ADDED = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
_GLM_END = ("<|endoftext|>", "<|user|>", "<|observation|>")
_KIMI_SPECIAL = (
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|media_start|>",
    "<|media_content|>",
    "<|media_pad|>",
    "<|media_end|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
_DS_BOS, _DS_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
_DS_ADDED = (
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
_LFM_SPECIAL = (
    "<|startoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tool_list_start|>",
    "<|tool_list_end|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|tool_response_start|>",
    "<|tool_response_end|>",
)
_MISTRAL_SPECIAL = (
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)
_MAGISTRAL_SPECIAL = (
    *_MISTRAL_SPECIAL,
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[ARGS]",
    "[CALL_ID]",
    "[THINK]",
    "[/THINK]",
    "[IMG]",
)
_GEMMA4_SPECIAL = (
    "<bos>",
    "<eos>",
    "<pad>",
    "<|turn>",
    "<turn|>",
    "<|channel>",
    "<channel|>",
    "<|think|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|image|>",
    "<|audio|>",
    "<|video|>",
)


def _spec(name: str, **kw) -> FamilySpec:
    return FamilySpec(name=name, template=f"{name}.jinja", **kw)


FAMILIES: dict[str, FamilySpec] = {
    spec.name: spec
    for spec in (
        _spec(
            "qwen25",
            special=_QWEN_SPECIAL,
            added=("<tool_call>", "</tool_call>"),
            eos="<|im_end|>",
            end_tokens=_QWEN_END,
        ),
        _spec(
            "qwen3",
            special=_QWEN_SPECIAL,
            added=_QWEN3_ADDED,
            eos="<|im_end|>",
            end_tokens=_QWEN_END,
        ),
        _spec(
            "qwen3_coder",
            special=_QWEN_SPECIAL,
            added=_QWEN3_ADDED,
            eos="<|im_end|>",
            end_tokens=_QWEN_END,
        ),
        _spec(
            "glm45",
            special=_GLM_SPECIAL,
            added=_GLM_ADDED,
            eos="<|endoftext|>",
            end_tokens=_GLM_END,
        ),
        _spec(
            "glm47",
            special=_GLM_SPECIAL,
            added=_GLM_ADDED,
            eos="<|endoftext|>",
            end_tokens=_GLM_END,
        ),
        _spec(
            "kimi_k2", special=_KIMI_SPECIAL, bos="[BOS]", eos="[EOS]", end_tokens=("<|im_end|>",)
        ),
        _spec(
            "kimi_k2_thinking",
            special=(*_KIMI_SPECIAL, "<think>", "</think>"),
            bos="[BOS]",
            eos="[EOS]",
            end_tokens=("<|im_end|>",),
        ),
        _spec(
            "minimax_m2",
            special=("]~!b[", "]~b]", "[e~["),
            added=("<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"),
            bos="]~!b[",
            eos="[e~[",
            end_tokens=("[e~[",),
        ),
        _spec(
            "deepseek_v31",
            special=(_DS_BOS, _DS_EOS),
            added=_DS_ADDED,
            bos=_DS_BOS,
            eos=_DS_EOS,
            end_tokens=(_DS_EOS,),
            tool_arguments="string",
        ),
        _spec(
            "deepseek_r1",
            special=(_DS_BOS, _DS_EOS),
            added=_DS_ADDED,
            bos=_DS_BOS,
            eos=_DS_EOS,
            end_tokens=(_DS_EOS,),
            tool_arguments="string",
        ),
        _spec(
            "gpt_oss",
            special=(
                "<|startoftext|>",
                "<|endoftext|>",
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|channel|>",
                "<|constrain|>",
                "<|return|>",
                "<|call|>",
            ),
            bos="<|startoftext|>",
            eos="<|return|>",
            end_tokens=("<|return|>", "<|endoftext|>", "<|call|>"),
        ),
        _spec(
            "lfm2",
            special=_LFM_SPECIAL,
            bos="<|startoftext|>",
            eos="<|im_end|>",
            end_tokens=("<|im_end|>",),
        ),
        _spec(
            "lfm25",
            special=(*_LFM_SPECIAL, "<image>"),
            added=("<think>", "</think>"),
            bos="<|startoftext|>",
            eos="<|im_end|>",
            end_tokens=("<|im_end|>",),
            verified=False,
        ),
        _spec(
            "gemma4",
            special=_GEMMA4_SPECIAL,
            bos="<bos>",
            eos="<eos>",
            end_tokens=("<eos>", "<turn|>"),
            verified=False,
        ),
        _spec(
            "mistral_nemo",
            special=_MISTRAL_SPECIAL,
            bos="<s>",
            eos="</s>",
            end_tokens=("</s>",),
            answer_after_tools=True,
        ),
        _spec(
            "magistral",
            special=_MAGISTRAL_SPECIAL,
            bos="<s>",
            eos="</s>",
            end_tokens=("</s>",),
            answer_after_tools=True,
        ),
        _spec(
            "llama31",
            special=(
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
            ),
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
            end_tokens=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        ),
        _spec(
            "kimi_k3",
            special=(
                "<|open|>",
                "<|close|>",
                "<|sep|>",
                "<|end_of_msg|>",
                "<|kimi_image_placeholder|>",
            ),
            eos="<|end_of_msg|>",
            end_tokens=("<|end_of_msg|>",),
            verified=False,
        ),
        _spec(
            "minicpm5",
            special=("<s>", "</s>", "<|im_start|>", "<|im_end|>"),
            added=(
                "<think>",
                "</think>",
                "<tool_sep>",
                "<tool_def_sep>",
                "<tool_response>",
                "</tool_response>",
            ),
            bos="<s>",
            eos="<|im_end|>",
            end_tokens=("<|im_end|>",),
            verified=False,
        ),
        _spec(
            "laguna",
            special=(
                "〈|EOS|〉",
                "<system>",
                "</system>",
                "<user>",
                "</user>",
                "<assistant>",
                "</assistant>",
            ),
            added=(
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
                "<tool_response>",
                "</tool_response>",
                "<available_tools>",
                "</available_tools>",
            ),
            eos="〈|EOS|〉",
            end_tokens=("〈|EOS|〉", "</assistant>"),
            verified=False,
        ),
        _spec(
            "seed_oss",
            special=("<seed:bos>", "<seed:eos>", "<seed:pad>"),
            added=(
                "<seed:think>",
                "</seed:think>",
                "<seed:cot_budget_reflect>",
                "</seed:cot_budget_reflect>",
                "<seed:tool_call>",
                "</seed:tool_call>",
            ),
            bos="<seed:bos>",
            eos="<seed:eos>",
            end_tokens=("<seed:eos>",),
            verified=False,
        ),
        _spec(
            "nemotron_nano_v2",
            special=("<s>", "</s>", "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>"),
            added=(
                "<think>",
                "</think>",
                "<TOOLCALL>",
                "</TOOLCALL>",
                "<TOOL_RESPONSE>",
                "</TOOL_RESPONSE>",
                "<AVAILABLE_TOOLS>",
                "</AVAILABLE_TOOLS>",
            ),
            bos="<s>",
            eos="<SPECIAL_12>",
            end_tokens=("<SPECIAL_12>",),
            verified=False,
        ),
        _spec(
            "muse_spark",
            special=(
                "<|start|>",
                "<|message|>",
                "<|eom|>",
                "<|eot|>",
                "<|end_of_text|>",
                "<|patch|>",
                "<|video|>",
            ),
            eos="<|eot|>",
            end_tokens=("<|eot|>", "<|eom|>", "<|end_of_text|>"),
            verified=False,
        ),
    )
}
