"""The source MLX generates around a `mx.fast.metal_kernel` body, written the same way.

Mirrors `write_signature` in mlx/backend/metal/custom_kernel (mlx 0.2x-0.3x): header, then
`template <...>` when template arguments are given, `[[kernel]] void custom_kernel_<name>...(`,
each input as `const device T* name [[buffer(i)]]` (`constant` when it has fewer than 8
elements, `T&` when 0-d) followed by `name_shape` / `name_strides` / `name_ndim` where the body
mentions them, each output as `device T* name`, then every Metal attribute whose name occurs
in the body, in MLX's order, and an explicit instantiation. The emulator appends an
`extern "C"` entry that calls that function once per emulated thread.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

MAX_CONSTANT_ARRAY_SIZE = 8

# (attribute, type) in the order MLX scans for them.
METAL_ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
]
# Attributes the emulator's driver can supply (see driver.h `Position`).
EMULATED_ATTRIBUTES = {
    "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup",
    "thread_index_in_simdgroup",
    "thread_index_in_threadgroup",
    "thread_position_in_grid",
    "thread_position_in_threadgroup",
    "threadgroup_position_in_grid",
    "threadgroups_per_grid",
    "threads_per_grid",
    "threads_per_simdgroup",
    "threads_per_threadgroup",
}

TYPE_NAMES = {
    mx.float32: "float",
    mx.float16: "float16_t",
    mx.bfloat16: "bfloat16_t",
    mx.int32: "int32_t",
    mx.uint32: "uint32_t",
    mx.int64: "int64_t",
    mx.bool_: "bool",
}


class InputSlot(NamedTuple):
    """One buffer parameter: what the emulator's entry passes for it."""

    kind: str  # "array", "scalar", "shape", "strides", "ndim"
    input_index: int
    c_type: str


def type_name(dtype) -> str:
    if dtype not in TYPE_NAMES:
        raise TypeError(f"the emulator has no Metal type for {dtype}")
    return TYPE_NAMES[dtype]


def used_attributes(source: str) -> list[tuple[str, str]]:
    found = [(name, kind) for name, kind in METAL_ATTRIBUTES if name in source]
    missing = [name for name, _ in found if name not in EMULATED_ATTRIBUTES]
    if missing:
        raise NotImplementedError(f"the emulator does not supply {missing}")
    return found


def template_text(template: list) -> tuple[str, str]:
    """(`template <typename T, int N>` parameters, `<float, 16>` arguments)."""
    params, args = [], []
    for name, value in template:
        if isinstance(value, bool):
            params.append(f"bool {name}")
            args.append(str(int(value)))
        elif isinstance(value, int):
            params.append(f"int {name}")
            args.append(str(value))
        else:
            params.append(f"typename {name}")
            args.append(type_name(value))
    return ", ".join(params), ", ".join(args)


def kernel_name(name: str, inputs: list, output_dtypes: list, template: list) -> str:
    """MLX's function name: the template arguments and the inputs' types and kinds in it."""
    func = f"custom_kernel_{name}"
    if template:
        func += "__" + template_text(template)[1].replace(", ", "_")
    for arr in inputs:
        kind = "s" if arr.ndim == 0 else ("c" if arr.size < MAX_CONSTANT_ARRAY_SIZE else "")
        func += f"_{type_name(arr.dtype)}{kind}"
    return func + "".join(f"_{type_name(d)}" for d in output_dtypes)


def kernel_source(
    name: str,
    input_names: list[str],
    output_names: list[str],
    body: str,
    header: str,
    inputs: list,
    output_dtypes: list,
    template: list,
) -> tuple[str, list[InputSlot], list[tuple[str, str]]]:
    """(the Metal source MLX would compile, the buffer parameters in order, the attributes)."""
    params, slots = [], []
    for i, (arg_name, arr) in enumerate(zip(input_names, inputs, strict=True)):
        c_type = type_name(arr.dtype)
        where = "constant" if arr.size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if arr.ndim == 0 else "*"
        params.append(f"  const {where} {c_type}{ref} {arg_name}")
        slots.append(InputSlot("scalar" if arr.ndim == 0 else "array", i, c_type))
        if arr.ndim == 0:
            continue
        for suffix, decl, c in (
            ("shape", "const constant int*", "int"),
            ("strides", "const constant int64_t*", "int64_t"),
            ("ndim", "const constant int&", "int"),
        ):
            if f"{arg_name}_{suffix}" in body:
                params.append(f"  {decl} {arg_name}_{suffix}")
                slots.append(InputSlot(suffix, i, c))
    for arg_name, dtype in zip(output_names, output_dtypes, strict=True):
        params.append(f"  device {type_name(dtype)}* {arg_name}")
    params = [f"{p} [[buffer({i})]]" for i, p in enumerate(params)]
    attributes = used_attributes(body)
    params += [f"  {kind} {attr} [[{attr}]]" for attr, kind in attributes]
    func = kernel_name(name, inputs, output_dtypes, template)
    template_params, template_args = template_text(template)
    text = header + (f"template <{template_params}>\n" if template else "")
    text += f"[[kernel]] void {func}(\n" + ",\n".join(params) + ") {\n" + body + "\n}\n"
    if template:
        inst = f"{func}<{template_args}>"
        text += f'\ntemplate [[host_name("{func}")]] [[kernel]] decltype({inst}) {inst};\n'
    return text, slots, attributes


def entry_source(
    func: str, slots: list[InputSlot], output_dtypes: list, attributes, template: list
) -> str:
    """The `extern "C" emu_run(buffers, grid, threadgroup, stagger_us)` the glue calls."""
    args = []
    for i, slot in enumerate(slots):
        if slot.kind in ("scalar", "ndim"):
            args.append(f"*static_cast<const {slot.c_type}*>(buffers[{i}])")
        else:
            args.append(f"static_cast<const {slot.c_type}*>(buffers[{i}])")
    for j, dtype in enumerate(output_dtypes):
        args.append(f"static_cast<{type_name(dtype)}*>(buffers[{len(slots) + j}])")
    args += [f"at.{attr}" for attr, _ in attributes]
    _, template_args = template_text(template)
    func += f"<{template_args}>" if template else ""
    call = ",\n      ".join(args)
    return (
        '\nextern "C" int emu_run(void** buffers, const int* grid, const int* group_size,'
        " int stagger_us) {\n"
        f"  auto body = [&](const emu::Position& at) {{\n    {func}(\n      {call});\n  }};\n"
        "  emu::run_grid(body, grid, group_size, stagger_us);\n  return 0;\n}\n"
    )
